// Package steer owns dnsstandby's sk_reuseport eBPF program: the program,
// its maps, attaching it to the reuseport groups our sockets share with
// LocalDNS, adopting LocalDNS's sockets into it, and the steering level.
//
// Each group (one per listen address and protocol) has its own program, a
// REUSEPORT_SOCKARRAY (slot 0 our socket, slots 1..MaxPeers the LocalDNS
// sockets the caller adopts) and a one-entry ARRAY config map with the mode,
// our heartbeat and the probe's source address and port. The config is per group so that
// a group whose LocalDNS socket cannot be adopted (an MPTCP listener) can
// hash in mirror while the others steer to LocalDNS. The program always
// returns SK_PASS: what it does not select, the kernel hashes.
//
// Levels: Adopt (program and peers), Own (program, our slot
// only), Off (no program). New picks the best level the kernel and our
// privileges allow and says why a better one was not possible; Off is
// always possible, so a missing feature never stops dnsstandby.
package steer

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// Config configures a Steerer. Start from DefaultConfig.
type Config struct {
	// Want is the highest level to try: "auto" for the best level
	// available, or "adopt", "own", "off" (see ParseLevel). A level that
	// is not available falls back to a lower one (never an error): Level
	// and Why report what was chosen.
	Want string
	// StallAfter is how old our heartbeat may get before the program stops
	// selecting our socket; positive.
	StallAfter time.Duration
	// UnreadAfter is how long packets the program gave our UDP socket may
	// wait with no read of ours before it stops selecting the socket,
	// once our read loops count their reads (Reads); positive. It never
	// fires while nothing is sent to us, however long we wait in recvmmsg.
	UnreadAfter time.Duration
	// Logger receives the level decision and problems; nil discards.
	Logger *slog.Logger
}

// DefaultConfig returns the defaults.
//
// StallAfter is 2 s: with a heartbeat every 250 ms that is eight missed
// beats, so a GC pause or a slow syscall never trips it. It is the slow
// test, for what the read test does not cover: TCP listeners, a reader
// that does not count its reads, the read test turned off (SetReadTest),
// a dnsstandby that stops beating because it finds its own loops stuck.
//
// UnreadAfter is 150 ms. A dnsstandby that stops reading must lose its
// UDP traffic within 250 ms (issue 20): the program notices at the first
// packet after the limit (about 1 ms later at a pod's 1,000 queries a
// second), and LocalDNS answers at once, which leaves about 100 ms for
// slower rates and a loaded node. A dnsstandby that reads waits for a CPU
// for less: Go's stop-the-world pauses are under a millisecond, a CFS
// quota throttles for at most its 100 ms period, and in the lab's hang on
// its shared two-core machine the longest wait was 47 ms at a load
// average of 11, 95 ms at 20. Not at 34: hence SetReadTest, which turns
// the test off where moving the traffic would lose it (a hung LocalDNS).
func DefaultConfig() Config {
	return Config{Want: WantAuto, StallAfter: 2 * time.Second, UnreadAfter: 150 * time.Millisecond}
}

// Errors returned by a Steerer.
var (
	// ErrNotAdopt: adopting needs level Adopt.
	ErrNotAdopt = errors.New("steering level is not adopt")
	// ErrNoGroup: the group was never added (or the level is Off).
	ErrNoGroup = errors.New("no such steering group")
	// ErrGroupFull: all MaxPeers peer slots hold live sockets.
	ErrGroupFull = errors.New("every peer slot of the group is taken")
	// ErrWrongSocket: the socket to adopt is not of the group (another
	// address, port or protocol) or is our own.
	ErrWrongSocket = errors.New("socket does not belong in this group")
	// ErrMPTCP: the socket is an MPTCP listener, which a
	// REUSEPORT_SOCKARRAY refuses (it takes plain TCP and UDP sockets
	// only). Go listeners are MPTCP by default since Go 1.24 when the
	// kernel has net.mptcp.enabled=1: create ours with
	// net.ListenConfig.SetMultipathTCP(false). A LocalDNS (CoreDNS) built
	// with Go 1.24+ has MPTCP TCP listeners, which cannot be adopted: its
	// TCP group steers at most like level Own.
	ErrMPTCP = errors.New("socket is MPTCP (IPPROTO_MPTCP); a REUSEPORT_SOCKARRAY takes plain TCP or UDP sockets only")
	// ErrClosed: the Steerer was closed.
	ErrClosed = errors.New("steerer closed")
)

// Steerer steers the reuseport groups of our sockets. Its methods are safe
// for concurrent use. It is a prometheus.Collector (see metrics.go).
type Steerer struct {
	log    *slog.Logger // always non-nil
	level  Level        // fixed by New
	want   Level        // the highest level asked for (auto asks for adopt); fixed by New
	why    string       // fixed by New
	stall  time.Duration
	unread time.Duration
	now    func() (uint64, error) // CLOCK_MONOTONIC ns, the clock of bpf_ktime_get_ns

	configErrors    atomic.Uint64 // failed writes to a config map
	sockarrayErrors atomic.Uint64 // failed writes to a sockarray (adopt, our slot)
	adoptions       atomic.Uint64 // sockets put into a peer slot

	mu       sync.Mutex  // guards following
	cfg      configValue // every group's config; Mode as asked (writeGroupLocked adapts it)
	lastBeat time.Time
	groups   map[string]*group
	order    []string // group names in the order added
	closed   bool
}

// New decides the steering level. The only error is an invalid cfg; a
// missing kernel feature or privilege lowers the level instead (see Level
// and Why), logged once: at warning level when the level is below the one
// asked for (auto asks for adopt).
func New(cfg Config) (*Steerer, error) {
	max, auto, err := parseWant(cfg.Want)
	if err != nil {
		return nil, fmt.Errorf("steer: Want: %w", err)
	}
	if cfg.StallAfter <= 0 {
		return nil, fmt.Errorf("steer: StallAfter must be positive, got %s", cfg.StallAfter)
	}
	if cfg.UnreadAfter <= 0 {
		return nil, fmt.Errorf("steer: UnreadAfter must be positive, got %s", cfg.UnreadAfter)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Steerer{
		log:    log.With("component", "steer"),
		stall:  cfg.StallAfter,
		unread: cfg.UnreadAfter,
		now:    monotonicNow,
		groups: map[string]*group{},
	}
	s.cfg = configValue{Mode: Hash, Stall: uint64(s.stall), Unread: uint64(cfg.UnreadAfter)}
	s.want = max
	s.level, s.why = decide(max, auto, probes{bpf: probeBPF, pidfd: probePidfd, ptrace: probePtrace})
	logf := s.log.Info
	if s.level < max {
		logf = s.log.Warn
	}
	logf("steering level", "level", s.level.String(), "want", cfg.Want, "why", s.why)
	if s.level != Off {
		// Reported, not refused: LocalDNS's groups have no program of their
		// own on AKS, and one we cannot see must not keep us from serving.
		switch foreign, err := foreignPrograms(); {
		case err != nil:
			s.log.Debug("steering: other sk_reuseport programs not listed", slog.Any("err", err))
		case len(foreign) > 0:
			s.log.Warn("steering: sk_reuseport programs that are not dnsstandby's are loaded on this node; one attached to a listen address's group is replaced by dnsstandby's",
				"programs", strings.Join(foreign, ", "))
		}
	}
	return s, nil
}

// probeBPF creates a group's maps and loads its program, as AddGroup will,
// and closes them again.
func probeBPF() error {
	// Before 5.11 BPF memory counts against RLIMIT_MEMLOCK; from 5.11 on
	// (memcg accounting) this does nothing. Failing it is not fatal: the
	// load below says whether memory was short.
	_ = rlimit.RemoveMemlock()
	g, err := loadGroup("probe", true)
	if err != nil {
		return explainBPF(err)
	}
	return g.closeObjects()
}

// Level is the steering level New chose.
func (s *Steerer) Level() Level { return s.level }

// Why says why Level is what it is: the level, and what ruled out each
// better one (for logs, status and metrics).
func (s *Steerer) Why() string { return s.why }

// StallAfter is the heartbeat age beyond which the program stops selecting
// our socket.
func (s *Steerer) StallAfter() time.Duration { return s.stall }

// Mode is the mode last set with SetMode (Hash at first).
func (s *Steerer) Mode() Mode {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.Mode
}

// Effective is the mode the programs apply at this level: Hash at Off, and
// Hash for ToPeer at Own. A group whose LocalDNS socket could not be
// adopted applies ToPeer as Hash too (see GroupLevel).
func (s *Steerer) Effective() Mode {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.Mode.effective(s.level)
}

// SetMode sets where the program sends packets, in every group. At Off it
// only records m (nothing can be steered); at Own, ToPeer is applied as
// Hash.
func (s *Steerer) SetMode(m Mode) error {
	if m > ToUs {
		return fmt.Errorf("set steering mode: unknown %s", m)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.cfg.Mode = m
	if err := s.writeConfigLocked(); err != nil {
		return fmt.Errorf("set steering mode %s: %w", m, err)
	}
	return nil
}

// SetProbe sets the source address and port of the prober: UDP and TCP
// packets from exactly there go to a LocalDNS socket (if one is adopted;
// else the kernel hash), whatever the mode, so that the prober can reach
// LocalDNS while we hold all other traffic. A pod's query from the same
// port is steered as any other: the address is one of the node's own,
// which the kernel does not accept as the source of a packet from
// outside. The zero AddrPort turns it off.
func (s *Steerer) SetProbe(src netip.AddrPort) error {
	addr := src.Addr().Unmap()
	if src.IsValid() && (addr.IsUnspecified() || src.Port() == 0) {
		return fmt.Errorf("set probe source %s: want a specific address and port", src)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.cfg.ProbePort, s.cfg.ProbeAddr = src.Port(), addr
	if err := s.writeConfigLocked(); err != nil {
		return fmt.Errorf("set probe source %s: %w", src, err)
	}
	return nil
}

// SetReadTest turns the read test (Reads) on or off in every group; it is
// on from New. Turn it off while the peers are known not to answer (a
// hung LocalDNS): then giving them the packets that wait on a dnsstandby
// that does not read, or only seems not to (off the CPU for a moment),
// loses them for sure, and the heartbeat alone decides.
func (s *Steerer) SetReadTest(on bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.cfg.Unread = 0
	if on {
		s.cfg.Unread = uint64(s.unread)
	}
	if err := s.writeConfigLocked(); err != nil {
		return fmt.Errorf("set read test %v: %w", on, err)
	}
	return nil
}

// Heartbeat tells the program we are alive: it writes CLOCK_MONOTONIC now.
// Call it every ~250 ms from the loop whose stall should take our traffic
// away (the serving loop's liveness check); if it stops for StallAfter,
// the program stops selecting our socket.
func (s *Steerer) Heartbeat() error {
	now, err := s.now()
	if err != nil {
		return fmt.Errorf("heartbeat: read CLOCK_MONOTONIC: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.cfg.Heartbeat = now
	if err := s.writeConfigLocked(); err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	s.lastBeat = time.Now()
	return nil
}

// writeConfigLocked writes s.cfg to every group's config map (no group
// at Off).
func (s *Steerer) writeConfigLocked() error {
	var errs []error
	for _, name := range s.order {
		if err := s.writeGroupLocked(s.groups[name]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// writeGroupLocked writes g's config: s.cfg with the mode g applies.
func (s *Steerer) writeGroupLocked(g *group) error {
	v := s.cfg
	v.Mode = v.Mode.effective(g.level(s.level))
	if err := g.config.Update(uint32(0), v.encode(), ebpf.UpdateAny); err != nil {
		s.configErrors.Add(1)
		return fmt.Errorf("write config map of group %s: %w", g.name, err)
	}
	return nil
}

// Leave ends steering the way a stop without a gap needs it: the programs
// stay attached in their current mode, and only our handles on them and
// their maps are closed. In mode ToPeer (mirror) every query keeps going
// to LocalDNS while our sockets are closed, so none is hashed to a socket
// that no longer reads, as Close's detach would allow for a moment. The
// kernel drops our sockets from the maps as they close; a successor's
// AddGroup replaces the program (and adopts LocalDNS's sockets once the
// old map is freed); with no successor the program ends with the group.
// It is exactly what a dnsstandby that dies leaves behind, which the
// program is built for: a stale heartbeat and empty slots fall back to
// the kernel's hash. Safe to call twice, and after Close.
func (s *Steerer) Leave() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	return s.endLocked(nil, (*group).closeObjects)
}

// endLocked marks s closed and ends every group with end, after first
// (if any); it joins their errors.
func (s *Steerer) endLocked(first error, end func(*group) error) error {
	s.closed = true
	errs := []error{first}
	for _, name := range s.order {
		if err := end(s.groups[name]); err != nil {
			errs = append(errs, fmt.Errorf("group %s: %w", name, err))
		}
	}
	s.groups = map[string]*group{}
	s.order = nil
	return errors.Join(errs...)
}

// Close sets the mode to Hash, detaches the program from every group
// (SO_DETACH_REUSEPORT_BPF through our socket, so LocalDNS's group is left
// as it was found) and closes the maps and programs. Call it before closing
// our sockets: once they are closed it cannot reach the groups (the program
// then stays attached, in mode Hash, until the group ends). Safe to call
// twice.
func (s *Steerer) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	// First make the programs inert, in case a detach below fails.
	s.cfg.Mode = Hash
	return s.endLocked(s.writeConfigLocked(), (*group).close)
}

// monotonicNow reads CLOCK_MONOTONIC, the clock bpf_ktime_get_ns reads.
func monotonicNow() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, err
	}
	return uint64(ts.Nano()), nil
}
