package takeover

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dnsstandby/dnsstandby/clock"
	"github.com/dnsstandby/dnsstandby/takeover/anchor"
	"github.com/dnsstandby/dnsstandby/takeover/dnat"
	"github.com/dnsstandby/dnsstandby/takeover/peer"
	"github.com/dnsstandby/dnsstandby/takeover/steer"
)

// OurSocket is one of dnsstandby's listening sockets.
type OurSocket struct {
	Addr netip.AddrPort
	UDP  bool
	Conn syscall.RawConn
}

// Config configures the controller.
type Config struct {
	// Sockets are our listening sockets, at least one: their groups are
	// steered, and they are told apart from LocalDNS's.
	Sockets []OurSocket

	// Anchor keeps the listen addresses on a link of our own; nil: none.
	Anchor *anchor.Config
	// Steering is the highest steering level to try: auto, adopt, own or
	// off (steer.Config.Want).
	Steering string
	// ProbeInterval is how often LocalDNS is probed while bound.
	ProbeInterval time.Duration
	// ProbeAddr is where LocalDNS is probed when the steering program
	// cannot route a probe to its socket on the listen address (levels
	// own and off): its node-facing address, 169.254.10.10:53, which the
	// same CoreDNS serves.
	ProbeAddr netip.AddrPort
	// ProbeName is asked in probes: LocalDNS's whoami block answers it
	// without going upstream, so a kube-dns outage does not look like a
	// hung LocalDNS.
	ProbeName string
	// Machine holds the mode machine's thresholds.
	Machine MachineConfig
	// TCPMigrate sets net.ipv4.tcp_migrate_req, so connections queued on
	// a dying LocalDNS listener move to ours instead of being reset.
	TCPMigrate bool

	// Healthy reports whether our serving loops make progress; the
	// steering heartbeat is sent only while it returns nil. Nil: always.
	Healthy func() error
	// CountReads, if set, is handed the steering program's read counter
	// of each UDP socket's group (steer.Steerer.Reads), for the read loops
	// of the sockets on listen to add 1 to per batch they receive: the
	// program then takes the traffic from a dnsstandby that stops reading
	// within steer's UnreadAfter, well before the heartbeat's stall limit.
	// Called from Start, once per UDP group steered.
	CountReads func(listen netip.AddrPort, reads *atomic.Uint64)
	// Answered is the running total of queries dnsstandby answered, for
	// the event log; nil counts none.
	Answered func() uint64
	// OnMirrorSafe, if set, is told whether a packet tap may mirror
	// LocalDNS's replies into the cache: only while LocalDNS gets every
	// query (mirror mode with its UDP sockets adopted), so that replies
	// on the wire from the listen address are LocalDNS's, never our own.
	// Called at start and whenever that changes, from one goroutine.
	OnMirrorSafe func(bool)
	// OnLocalDNS, if set, is told the processes holding LocalDNS's
	// sockets (peer.State.PIDs) at start and whenever they change, before
	// OnMirrorSafe: the packet tap reads LocalDNS's replies at their
	// cgroup. Called from one goroutine.
	OnLocalDNS func(pids []int)
	// FallbackUnit is the systemd unit of AKS's LocalDNS fallback
	// (peer.WatcherConfig.FallbackUnit): a CoreDNS in it on the listen
	// address is reported, never taken for LocalDNS. "": none is told
	// apart.
	FallbackUnit string
	// QueryCounts, if set, returns the running totals of the UDP queries
	// to the listen addresses the packet tap saw and of those our
	// sockets received: with them the controller notices AKS's nat
	// fallback, which DNATs the queries away before any socket (package
	// dnat). Called once a second from one goroutine. Nil: not noticed.
	QueryCounts func() dnat.Counts
	// OnFallback, if set, is told the design of AKS's LocalDNS fallback
	// seen (FallbackNone, FallbackCoreDNS, FallbackNAT) whenever it
	// changes, from one goroutine.
	OnFallback func(design string)
	// Logger receives the controller's lines (component=takeover) and its
	// parts' (anchor, peer, steer); nil discards.
	Logger *slog.Logger
}

// DefaultConfig returns the defaults for everything but Sockets, Healthy
// and Answered.
func DefaultConfig() Config {
	return Config{
		Steering:      "auto",
		ProbeInterval: time.Second,
		ProbeAddr:     netip.MustParseAddrPort("169.254.10.10:53"),
		ProbeName:     "health-check.localdns.local.",
		Machine:       DefaultMachineConfig(),
		FallbackUnit:  peer.DefaultFallbackUnit,
	}
}

// Probe timing. A probe waits probeTimeout for LocalDNS's whoami answer
// (a healthy LocalDNS answers in well under a millisecond; 300 ms covers a
// GC pause); after a failed probe the next comes retryProbeAfter later. With
// 1 s probes and HungAfter 3, a hang is held within about 2.5 s.
const (
	probeTimeout    = 300 * time.Millisecond
	retryProbeAfter = 200 * time.Millisecond
)

// heartbeatEvery is how often the steering program hears that we are
// alive; after stallAfter without one it stops selecting our socket, so a
// stalled dnsstandby gives the traffic back within about that long (the
// takeover issue asks for 2 s) while five missed beats are tolerated.
// It is the slow test: UDP groups whose read loops count their reads
// (Config.CountReads) lose their traffic within steer's UnreadAfter of
// packets waiting unread; the heartbeat still covers TCP, and a
// dnsstandby that finds its own loops stuck (Healthy) and stops beating.
//
// heartbeatStandby is the beat while the steering sends LocalDNS the
// traffic (mirror). Then only a LocalDNS with no socket in the map makes
// the program look at ours: a fresh heartbeat sends us those queries, a
// stale one leaves them to the kernel's hash, which finds ours too once
// LocalDNS's sockets are closed. A beat a second keeps the heartbeat
// fresh with half a second to spare, and each beat is a wake-up of an
// otherwise idle process: three fewer a second halved what an idle
// dnsstandby costs (bench/README.md). Steering to us beats at once and
// then every heartbeatEvery.
const (
	heartbeatEvery   = 250 * time.Millisecond
	heartbeatStandby = time.Second
	stallAfter       = 1500 * time.Millisecond
)

// operatorWait bounds how long Hold and Release wait for the controller's
// loop to take the command.
const operatorWait = 5 * time.Second

// Controller runs takeover: anchor, peer watch, probes, mode machine and
// steering. Hold, Release, Status and Events serve the admin socket; it is
// a prometheus.Collector (metrics.go).
type Controller struct {
	cfg      Config
	log      *slog.Logger // always non-nil; component=takeover
	parts    parts
	anchor   anchorPart // or nil: none asked for, or it could not be made
	steer    steering
	watch    peerWatch
	prober   prober // or nil until it can be made; owned by run
	probeCfg peer.ProbeConfig
	events   *EventLog
	stats    *stats
	det      *dnat.Detector // nil without QueryCounts; owned by run
	// udpAddrs and udpSockets are cfg.Sockets' UDP listen addresses and
	// sockets (udpListen), for the nat detector.
	udpAddrs   []netip.AddrPort
	udpSockets int

	// conntrackWarned: conntrack could not be listed, said once.
	conntrackWarned bool

	// anchorFailed: an anchor was asked for and could not be made.
	anchorFailed bool

	// safe is the last OnMirrorSafe value told: -1 none yet, 0 false, 1
	// true. Owned by the goroutine that runs the machine (Start, then
	// run).
	safe int8
	// toldPIDs is the last OnLocalDNS value told; nil none yet. Owned as
	// safe is.
	toldPIDs []int

	ops       chan operatorCmd
	silent    chan Silence    // LocalDNS seen answering nothing; buffered, never blocks the sender
	toUs      atomic.Bool     // the steering was last set to send us the traffic (apply)
	beatNow   chan struct{}   // apply's word to the heartbeat that it did; buffered
	ctx       context.Context // the goroutines': Start's ctx, ended early by Close
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error

	mu       sync.Mutex // guards following
	machine  *Machine
	readTest bool // the read test as last set: on while LocalDNS answers (Machine.PeerAnswers)
	peer     peer.State
	adopted  map[string][]uint64 // group -> peer socket inodes handled: in its map, or MPTCP
	mptcp    map[string]int      // group -> how many of those are MPTCP, so not in the map
	lastProb peer.ProbeResult
	nat      bool         // the nat detector says the listen addresses are DNATed away
	fallback fallbackSeen // as last reported
}

type operatorCmd struct {
	hold bool
	d    time.Duration
	done chan operatorDone
}

// operatorDone is the operator hold that stood before a command.
type operatorDone struct {
	holding bool
	until   time.Time
}

// Start brings takeover up: the anchor first (so the addresses are local
// before anything is decided), then the steering program on every socket,
// then the peer watch; it applies the first mode before returning, so that
// a caller reporting READY afterwards reports a standby in place.
//
// Every goroutine of the controller and its parts (anchor watch, peer
// watch, heartbeat, the machine's loop) runs under a context derived from
// ctx: it stops when ctx is done or when Close is called, whichever comes
// first. Ending ctx only stops them — the heartbeat too, so the programs
// stop selecting our sockets after the stall limit; it neither detaches
// the steering nor removes the anchor. Close must be called even after
// ctx is done: it releases the parts, leaving the steering programs
// attached in their last mode.
func Start(ctx context.Context, cfg Config) (*Controller, error) {
	return start(ctx, cfg, realParts())
}

// Validate checks c's settings as Start takes them, leaving out what only
// the running daemon has (Sockets, Healthy, CountReads, Answered, OnMirrorSafe,
// Anchor); errors name the field. The daemon calls it for `dnsstandby run
// --validate`.
func (c *Config) Validate() error {
	switch {
	case c.ProbeInterval <= 0:
		return fmt.Errorf("takeover: ProbeInterval must be positive, got %s", c.ProbeInterval)
	case !c.ProbeAddr.IsValid():
		return errors.New("takeover: ProbeAddr must be set")
	case c.ProbeName == "":
		return errors.New("takeover: ProbeName must be set")
	case c.FallbackUnit != "" && (strings.Contains(c.FallbackUnit, "/") ||
		!strings.HasSuffix(c.FallbackUnit, ".service") && !strings.HasSuffix(c.FallbackUnit, ".scope")):
		// The unit is matched against the cgroup path's elements: a name
		// that cannot be one would never match.
		return fmt.Errorf("takeover: FallbackUnit must name a .service or .scope unit, or be empty, got %q", c.FallbackUnit)
	}
	if _, err := steer.ParseLevel(c.Steering); err != nil {
		return fmt.Errorf("takeover: Steering: %w", err)
	}
	return c.Machine.validate()
}

func start(ctx context.Context, cfg Config, p parts) (c *Controller, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(cfg.Sockets) == 0 {
		return nil, errors.New("takeover: Sockets must not be empty")
	}
	if cfg.Healthy == nil {
		cfg.Healthy = func() error { return nil }
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c = &Controller{cfg: cfg, log: log.With("component", "takeover"), parts: p, ops: make(chan operatorCmd),
		silent: make(chan Silence, 1), beatNow: make(chan struct{}, 1),
		adopted: map[string][]uint64{}, mptcp: map[string]int{}, stats: newStats(), safe: -1}
	c.ctx, c.cancel = context.WithCancel(ctx)
	defer func() {
		if err != nil {
			c.shutdown()
			c = nil
		}
	}()

	if cfg.Anchor != nil {
		c.anchor = c.startAnchor(*cfg.Anchor)
	}
	if cfg.TCPMigrate {
		if err := os.WriteFile("/proc/sys/net/ipv4/tcp_migrate_req", []byte("1\n"), 0o644); err != nil {
			c.log.Warn("tcp_migrate_req not set: TCP connections queued on a dying LocalDNS will be reset", slog.Any("err", err))
		}
	}

	sc := steer.DefaultConfig()
	sc.Want, sc.StallAfter, sc.Logger = cfg.Steering, stallAfter, cfg.Logger
	c.steer, err = p.newSteering(sc)
	if err != nil {
		return c, fmt.Errorf("takeover: %w", err)
	}
	ours := map[uint64]bool{}
	for _, s := range cfg.Sockets {
		// A group the program cannot steer stays plain SO_REUSEPORT: we
		// keep serving; the level is reported per group.
		if err := c.steer.AddGroup(groupName(s.Addr, s.UDP), s.Conn, s.UDP); err != nil {
			c.log.Warn("steering not attached: this group shares by the kernel's hash", "group", groupName(s.Addr, s.UDP), slog.Any("err", err))
		} else if s.UDP && c.steer.Level() != steer.Off && cfg.CountReads != nil {
			c.countReads(s.Addr)
		}
		ino, err := p.socketInode(s.Conn)
		if err != nil {
			return c, fmt.Errorf("takeover: %w", err)
		}
		ours[ino] = true
	}

	c.probeCfg = peer.DefaultProbeConfig()
	c.probeCfg.Server, c.probeCfg.Name, c.probeCfg.Timeout = cfg.ProbeAddr, cfg.ProbeName, probeTimeout
	if c.steer.Level() == steer.Adopt {
		c.probeCfg.Server = firstUDP(cfg.Sockets) // the program routes the probe's source to LocalDNS's socket
	} else if slices.ContainsFunc(cfg.Sockets, func(o OurSocket) bool { return o.UDP && o.Addr == cfg.ProbeAddr }) {
		// Nothing steers probes to LocalDNS below adopt: on an address
		// dnsstandby serves too, a probe reaches LocalDNS only when the
		// hash picks its socket (and never in hold, when ours takes all).
		c.log.Warn("LocalDNS is probed on an address dnsstandby serves too, without adopt steering: probes that reach dnsstandby say nothing, and a held LocalDNS may stay held; give ProbeAddr an address only LocalDNS serves",
			"probe_addr", cfg.ProbeAddr.String(), "level", c.steer.Level().String())
	}
	c.ensureProber()

	wc := peer.DefaultWatcherConfig()
	for _, s := range cfg.Sockets {
		if !slices.Contains(wc.Addrs, s.Addr) {
			wc.Addrs = append(wc.Addrs, s.Addr)
		}
	}
	wc.Exclude = func(ino uint64) bool { return ours[ino] }
	wc.FallbackUnit = cfg.FallbackUnit
	wc.Logger = cfg.Logger
	c.watch, err = p.startWatch(c.ctx, wc)
	if err != nil {
		return c, fmt.Errorf("takeover: %w", err)
	}

	now := time.Now()
	c.peer = c.watch.Current()
	if c.machine, err = NewMachine(cfg.Machine, now, c.peer.Bound); err != nil {
		return c, err
	}
	mode, reason, _ := c.machine.Mode()
	c.readTest = c.machine.PeerAnswers()
	c.setReadTest(c.readTest)
	c.events = NewEventLog(mode, reason, now, cfg.Answered)
	c.tellLocalDNS(c.peer)
	c.adopt(c.peer)
	if err := c.apply(mode); err != nil {
		return c, err
	}
	c.stats.setMode(mode)
	c.tellMirrorSafe()
	c.log.Info("takeover started", "mode", mode.String(), "peer_bound", c.peer.Bound, "peer_sockets", len(c.peer.Sockets))
	c.reportFallback()
	c.udpAddrs, c.udpSockets = udpListen(cfg.Sockets)
	if cfg.QueryCounts != nil {
		if c.det, err = dnat.New(dnat.DefaultConfig()); err != nil {
			return c, fmt.Errorf("takeover: %w", err)
		}
	}

	c.wg.Add(2)
	go func() { defer c.wg.Done(); c.heartbeat(c.ctx) }()
	go func() { defer c.wg.Done(); c.run(c.ctx) }()
	return c, nil
}

// countReads hands the read counter of listen's UDP group to the read
// loops. Without one (a kernel before 5.5) only the heartbeat takes the
// traffic from a stalled dnsstandby, after stallAfter.
func (c *Controller) countReads(listen netip.AddrPort) {
	name := groupName(listen, true)
	reads, err := c.steer.Reads(name)
	if err != nil {
		c.log.Warn("steering: no read test: a dnsstandby that stops reading keeps this group's traffic until its heartbeat stalls",
			"group", name, "stall_after", stallAfter.String(), slog.Any("err", err))
		return
	}
	c.cfg.CountReads(listen, reads)
}

// startAnchor starts the address anchor. A node without the dummy driver
// gets a bridge (an empty bridge holds local addresses just as well),
// which the anchor knows as dnsstandby's at the next start; an
// anchor that cannot be made at all is logged and reported as not ready,
// but never stops dnsstandby from serving.
func (c *Controller) startAnchor(cfg anchor.Config) anchorPart {
	cfg.Logger = c.cfg.Logger
	a, err := c.parts.startAnchor(c.ctx, cfg)
	if errors.Is(err, anchor.ErrUnknownKind) && cfg.Kind != "bridge" {
		c.log.Warn("anchor: link kind unavailable, using bridge", "kind", cfg.Kind, slog.Any("err", err))
		cfg.Kind = "bridge"
		a, err = c.parts.startAnchor(c.ctx, cfg)
	}
	if err != nil {
		c.anchorFailed = true
		c.log.Error("anchor not in place: the listen addresses disappear with LocalDNS's link", slog.Any("err", err))
		return nil
	}
	return a
}

func groupName(ap netip.AddrPort, udp bool) string {
	if udp {
		return ap.String() + "/udp"
	}
	return ap.String() + "/tcp"
}

func firstUDP(socks []OurSocket) netip.AddrPort {
	for _, s := range socks {
		if s.UDP {
			return s.Addr
		}
	}
	return socks[0].Addr
}

// ensureProber makes the probe socket if there is none yet. It can fail
// while the probe address has no route (LocalDNS's link gone): then probes
// fail, which is what they should report, and it is tried again next time.
func (c *Controller) ensureProber() bool {
	if c.prober != nil {
		return true
	}
	p, err := c.parts.newProber(c.probeCfg)
	if err != nil {
		return false
	}
	if c.steer.Level() == steer.Adopt {
		// The probe's address with its port: a pod can send from the port.
		if err := c.steer.SetProbe(p.Source()); err != nil {
			c.log.Warn("steering: probe source not set; probes may reach dnsstandby itself", slog.Any("err", err))
		}
	}
	c.prober = p
	return true
}

// heartbeat tells the steering program we are alive while our read loops
// make progress: a stalled dnsstandby must not keep the traffic.
func (c *Controller) heartbeat(ctx context.Context) {
	t := time.NewTimer(clock.UntilNext(c.beatEvery()))
	defer t.Stop()
	for {
		if err := c.cfg.Healthy(); err == nil {
			if err := c.steer.Heartbeat(); err != nil {
				c.stats.heartbeatErrors.Add(1)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.beatNow:
			t.Stop()
		}
		t.Reset(clock.UntilNext(c.beatEvery()))
	}
}

// beatEvery is the heartbeat's period: heartbeatEvery while the steering
// sends us the traffic, heartbeatStandby otherwise.
func (c *Controller) beatEvery() time.Duration {
	if c.toUs.Load() {
		return heartbeatEvery
	}
	return heartbeatStandby
}

// run feeds the machine: peer updates, probes, operator commands, ticks.
func (c *Controller) run(ctx context.Context) {
	// The probe and the tick wait for the shared instants (clock.UntilNext).
	probe := time.NewTimer(clock.UntilNext(c.cfg.ProbeInterval))
	defer probe.Stop()
	tick := time.NewTimer(clock.UntilNext(time.Second))
	defer tick.Stop()
	// One probe at a time: the timer is reset only once its result is in,
	// so the buffer always has room for it.
	probed := make(chan peer.ProbeResult, 1)
	for {
		select {
		case <-ctx.Done():
			return
		case st := <-c.watch.Updates():
			c.mu.Lock()
			c.peer = st
			c.mu.Unlock()
			c.tellLocalDNS(st)
			c.adopt(st)
			c.handle(func(m *Machine, now time.Time) *Transition { return m.PeerBound(now, st.Bound) })
			c.tellMirrorSafe()
			c.reportFallback()
		case <-probe.C:
			c.mu.Lock()
			bound := c.peer.Bound
			c.mu.Unlock()
			if !bound {
				probe.Reset(clock.UntilNext(c.cfg.ProbeInterval))
				continue
			}
			if !c.ensureProber() {
				probed <- peer.ProbeResult{Err: errors.New("no probe socket: LocalDNS's probe address is unreachable")}
				continue
			}
			// The probe waits up to a second for a hung LocalDNS; the loop
			// must meanwhile take the wire's word that it is silent.
			c.wg.Add(1)
			go func(p prober) {
				defer c.wg.Done()
				pctx, cancel := context.WithTimeout(ctx, c.cfg.ProbeInterval)
				res := p.Probe(pctx)
				cancel()
				probed <- res
			}(c.prober)
		case s := <-c.silent:
			tr := c.step(func(m *Machine, now time.Time) *Transition { return m.Silent(now) })
			if tr != nil {
				c.log.Warn("LocalDNS silent: it answered none of the queries seen reaching it", "listener", s.Listener.String(),
					"unanswered", s.Unanswered, "since", s.Since.Format(time.RFC3339Nano))
			}
			c.carry(tr)
		case res := <-probed:
			if ctx.Err() != nil {
				return
			}
			c.mu.Lock()
			c.lastProb = res
			c.mu.Unlock()
			if errors.Is(res.Err, peer.ErrSelfReply) {
				// Below adopt, with dnsstandby on the probe address too,
				// the kernel's hash gave the probe to one of our sockets:
				// it says nothing of LocalDNS. Ask again soon.
				probe.Reset(min(c.cfg.ProbeInterval, retryProbeAfter))
				continue
			}
			c.stats.probe(res.OK, res.RTT)
			// After a failure, look again soon: a hung LocalDNS is held
			// after HungAfter failures in a row, and those should take
			// a second or two, not HungAfter intervals.
			if res.OK {
				probe.Reset(clock.UntilNext(c.cfg.ProbeInterval))
			} else {
				probe.Reset(min(c.cfg.ProbeInterval, retryProbeAfter))
			}
			hung := false
			tr := c.step(func(m *Machine, now time.Time) *Transition {
				was := m.Trusted()
				tr := m.ProbeResult(now, res.OK)
				hung = was && !m.Trusted()
				return tr
			})
			if hung {
				c.log.Warn("LocalDNS hung: it is bound but failed its probes", "failed_in_a_row", c.cfg.Machine.HungAfter,
					slog.Any("err", res.Err))
			}
			c.carry(tr)
		case op := <-c.ops:
			var was operatorDone
			c.handle(func(m *Machine, now time.Time) *Transition {
				was.holding, was.until = m.Holding()
				if op.hold {
					return m.OperatorHold(now, op.d)
				}
				return m.OperatorRelease(now)
			})
			op.done <- was
		case <-tick.C:
			tick.Reset(clock.UntilNext(time.Second))
			c.handle(func(m *Machine, now time.Time) *Transition { return m.Tick(now) })
			c.natStep()
		}
	}
}

// handle runs one input through the machine and carries out a transition.
func (c *Controller) handle(input func(*Machine, time.Time) *Transition) {
	c.carry(c.step(input))
}

// step runs one input through the machine, and turns the steering
// program's read test on or off as LocalDNS now answers or not.
func (c *Controller) step(input func(*Machine, time.Time) *Transition) *Transition {
	c.mu.Lock()
	tr := input(c.machine, time.Now())
	on := c.machine.PeerAnswers()
	changed := on != c.readTest
	c.readTest = on
	c.mu.Unlock()
	if changed {
		c.setReadTest(on)
	}
	return tr
}

// setReadTest turns the read test on while LocalDNS answers and off while
// it does not: a dnsstandby that stops reading (or only seems to, off the
// CPU for a moment) loses its traffic to LocalDNS within steer's
// UnreadAfter, which helps only if LocalDNS answers it; in a hang the
// heartbeat alone decides, so a scheduler stall of ours never hands the
// traffic to the hung LocalDNS.
func (c *Controller) setReadTest(on bool) {
	if err := c.steer.SetReadTest(on); err != nil {
		c.log.Warn("steering: read test not set", "on", on, slog.Any("err", err))
	}
}

// carry carries out a transition (nil: none): steering, OnMirrorSafe,
// events, metrics and the log.
func (c *Controller) carry(tr *Transition) {
	if tr == nil {
		return
	}
	if err := c.apply(tr.To); err != nil {
		c.log.Error("steering not applied", "mode", tr.To.String(), slog.Any("err", err))
	}
	c.tellMirrorSafe()
	ended := c.events.Record(*tr)
	c.stats.transition(*tr, ended.DurationS)
	lasted := time.Duration(ended.DurationS * float64(time.Second)).Round(time.Millisecond)
	c.log.Info("mode change", "from", tr.From.String(), "to", tr.To.String(), "reason", string(tr.Reason),
		"after", lasted.String(), "answered", ended.Answered)
}

// mirrorSafe reports whether every query goes to LocalDNS: mirror mode,
// level adopt, and a LocalDNS socket in every UDP group's map.
func (c *Controller) mirrorSafe() bool {
	if c.steer.Level() != steer.Adopt {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if m, _, _ := c.machine.Mode(); m != Mirror {
		return false
	}
	for _, s := range c.cfg.Sockets {
		if s.UDP && len(c.adopted[groupName(s.Addr, true)]) == 0 {
			return false
		}
	}
	return true
}

// tellLocalDNS calls OnLocalDNS when LocalDNS's processes changed.
func (c *Controller) tellLocalDNS(st peer.State) {
	if c.cfg.OnLocalDNS == nil || (c.toldPIDs != nil && slices.Equal(c.toldPIDs, st.PIDs)) {
		return
	}
	c.toldPIDs = append([]int{}, st.PIDs...)
	c.cfg.OnLocalDNS(st.PIDs)
}

// tellMirrorSafe calls OnMirrorSafe when the answer changed.
func (c *Controller) tellMirrorSafe() {
	if c.cfg.OnMirrorSafe == nil {
		return
	}
	v := int8(0)
	if c.mirrorSafe() {
		v = 1
	}
	if v == c.safe {
		return
	}
	c.safe = v
	c.cfg.OnMirrorSafe(v == 1)
}

// apply points the steering program at whoever the mode says.
func (c *Controller) apply(m Mode) error {
	want := steer.ToUs
	if m == Mirror {
		want = steer.ToPeer // at level own this is the kernel's hash
	}
	// Beating once a second (heartbeatStandby), the heartbeat is at most
	// a second old here, fresh for half a second more: the heartbeat
	// goroutine beats again long before that.
	if c.toUs.Swap(want == steer.ToUs) != (want == steer.ToUs) {
		select {
		case c.beatNow <- struct{}{}:
		default:
		}
	}
	return c.steer.SetMode(want)
}

// adopt puts LocalDNS's sockets into the steering maps (level adopt), so
// that mirror can send it everything and probes can reach it even while we
// hold its traffic. Duplicated fds are closed at once: a socket LocalDNS
// closes must leave the map by itself.
func (c *Controller) adopt(st peer.State) {
	if c.steer.Level() != steer.Adopt {
		return
	}
	byGroup := map[string][]peer.Socket{}
	for _, s := range st.Sockets {
		g := groupName(s.Addr, s.Proto == peer.UDP)
		byGroup[g] = append(byGroup[g], s)
	}
	procs := map[int]peerProcess{}
	defer func() {
		for _, p := range procs {
			p.Close()
		}
	}()
	for _, s := range c.cfg.Sockets {
		g := groupName(s.Addr, s.UDP)
		socks := byGroup[g]
		inodes := make([]uint64, 0, len(socks))
		for _, ps := range socks {
			inodes = append(inodes, ps.Inode)
		}
		c.mu.Lock()
		same := slices.Equal(c.adopted[g], inodes)
		c.mu.Unlock()
		if same {
			continue
		}
		if err := c.steer.ClearPeers(g); err != nil {
			c.log.Warn("steering: clear peers", "group", g, slog.Any("err", err))
		}
		var done []uint64
		mptcp := 0
		for _, ps := range socks {
			if ps.PID == 0 {
				continue
			}
			p := procs[ps.PID]
			if p == nil {
				var err error
				if p, err = c.parts.openProcess(ps.PID); err != nil {
					c.stats.adoptErrors.Add(1)
					c.log.Warn("cannot adopt LocalDNS socket", "group", g, "pid", ps.PID, slog.Any("err", err))
					continue
				}
				procs[ps.PID] = p
			}
			fd, err := p.DupSocket(ps.Inode)
			if err != nil {
				c.stats.adoptErrors.Add(1)
				c.log.Warn("cannot adopt LocalDNS socket", "group", g, "pid", ps.PID, slog.Any("err", err))
				continue
			}
			_, err = c.steer.Adopt(g, fd)
			syscall.Close(fd)
			switch {
			case errors.Is(err, steer.ErrMPTCP):
				// CoreDNS built with Go ≥ 1.24 listens with MPTCP where the
				// node enables it; such a socket cannot be in a socket map,
				// now or on the next try: this TCP group hashes in mirror.
				c.log.Warn("LocalDNS's TCP listener is MPTCP and cannot be steered to; its TCP group shares by hash in mirror", "group", g)
				mptcp++ // handled: not tried again until the sockets change
			case err != nil:
				c.stats.adoptErrors.Add(1)
				c.log.Warn("cannot adopt LocalDNS socket", "group", g, slog.Any("err", err))
				continue
			}
			done = append(done, ps.Inode)
		}
		c.mu.Lock()
		c.adopted[g], c.mptcp[g] = done, mptcp
		c.mu.Unlock()
	}
}

// Hold keeps the traffic away from LocalDNS for d (0: until Release), as
// `dnsstandby hold` asks. It replaces the hold in force, if any (see
// Machine.OperatorHold), and returns it: wasHolding false when there was
// none, wasUntil zero when it was until released.
func (c *Controller) Hold(d time.Duration) (wasHolding bool, wasUntil time.Time, err error) {
	was, err := c.operator(operatorCmd{hold: true, d: d})
	return was.holding, was.until, err
}

// Release ends an operator hold, as `dnsstandby release` asks.
func (c *Controller) Release() error {
	_, err := c.operator(operatorCmd{})
	return err
}

func (c *Controller) operator(op operatorCmd) (operatorDone, error) {
	op.done = make(chan operatorDone, 1)
	t := time.NewTimer(operatorWait)
	defer t.Stop()
	select {
	case c.ops <- op:
		return <-op.done, nil
	case <-c.ctx.Done():
		return operatorDone{}, errors.New("controller stopped")
	case <-t.C:
		return operatorDone{}, errors.New("controller busy")
	}
}

// Silence is the wire's evidence that LocalDNS answers nothing: on
// Listener, Unanswered queries it should have answered at once, none
// answered since Since.
type Silence struct {
	Listener   netip.AddrPort
	Unanswered int
	Since      time.Time
}

// Silent tells the controller that LocalDNS, bound, answers none of the
// queries seen reaching it (the hedger's fast detection): a trusted
// LocalDNS is held at once. It never blocks; a report arriving while one
// is pending is dropped, as it says the same.
func (c *Controller) Silent(s Silence) {
	select {
	case c.silent <- s:
	default:
	}
}

// Events returns the mode history, current stretch last.
func (c *Controller) Events() []Event { return c.events.List(time.Now()) }

// Status is what `dnsstandby status` shows.
type Status struct {
	Mode      string     `json:"mode"`
	Reason    string     `json:"reason"`
	Since     time.Time  `json:"since"`
	Holding   bool       `json:"operator_hold"`
	HoldUntil *time.Time `json:"hold_until,omitempty"`
	Steering  struct {
		Level string `json:"level"`
		Why   string `json:"why,omitempty"`
	} `json:"steering"`
	Peer struct {
		Bound     bool          `json:"bound"`
		Sockets   []peer.Socket `json:"sockets"`
		Warnings  []string      `json:"warnings,omitempty"`
		LastProbe struct {
			OK    bool    `json:"ok"`
			RTTms float64 `json:"rtt_ms"`
			NSID  string  `json:"nsid,omitempty"`
			Error string  `json:"error,omitempty"`
		} `json:"last_probe"`
		Adopted map[string]int `json:"adopted"`
		// Unadoptable counts LocalDNS sockets no socket map takes (MPTCP
		// listeners): such a group hashes in mirror.
		Unadoptable map[string]int `json:"unadoptable,omitempty"`
	} `json:"peer"`
	// LocalDNSFallback is the design of AKS's LocalDNS fallback seen:
	// "" none, "coredns" (LocalDNSFallbackPID its process, 0 if not
	// visible) or "nat".
	LocalDNSFallback    string  `json:"localdns_fallback"`
	LocalDNSFallbackPID int     `json:"localdns_fallback_pid,omitempty"`
	AnchorReady         *bool   `json:"anchor_ready,omitempty"`
	Events              []Event `json:"events"`
}

// FallbackText names the AKS LocalDNS fallback seen as `dnsstandby
// status` and `dnsstandby check` print it: none, coredns (pid N) (the pid
// when visible) or nat.
func (s Status) FallbackText() string {
	switch {
	case s.LocalDNSFallback == FallbackNone:
		return "none"
	case s.LocalDNSFallback == FallbackCoreDNS && s.LocalDNSFallbackPID != 0:
		return fmt.Sprintf("%s (pid %d)", s.LocalDNSFallback, s.LocalDNSFallbackPID)
	}
	return s.LocalDNSFallback
}

// Status returns what `dnsstandby status` shows.
func (c *Controller) Status() Status {
	var s Status
	c.mu.Lock()
	mode, reason, since := c.machine.Mode()
	holding, until := c.machine.Holding()
	s.Peer.Bound = c.peer.Bound
	s.Peer.Sockets = c.peer.Sockets
	s.Peer.Warnings = c.peer.UIDMismatch
	s.Peer.LastProbe.OK = c.lastProb.OK
	s.Peer.LastProbe.RTTms = float64(c.lastProb.RTT.Microseconds()) / 1000
	s.Peer.LastProbe.NSID = c.lastProb.NSID
	if c.lastProb.Err != nil {
		s.Peer.LastProbe.Error = c.lastProb.Err.Error()
	}
	s.LocalDNSFallback, s.LocalDNSFallbackPID = c.fallback.design, c.fallback.pid
	s.Peer.Adopted = map[string]int{}
	for g, in := range c.adopted {
		s.Peer.Adopted[g] = len(in) - c.mptcp[g]
		if c.mptcp[g] > 0 {
			if s.Peer.Unadoptable == nil {
				s.Peer.Unadoptable = map[string]int{}
			}
			s.Peer.Unadoptable[g] = c.mptcp[g]
		}
	}
	c.mu.Unlock()
	s.Mode, s.Reason, s.Since, s.Holding = mode.String(), string(reason), since, holding
	if holding && !until.IsZero() {
		s.HoldUntil = &until
	}
	s.Steering.Level, s.Steering.Why = c.steer.Level().String(), c.steer.Why()
	if c.anchor != nil {
		r := c.anchor.Ready()
		s.AnchorReady = &r
	}
	s.Events = c.Events()
	return s
}

// Mode returns the current mode.
func (c *Controller) Mode() Mode {
	c.mu.Lock()
	defer c.mu.Unlock()
	m, _, _ := c.machine.Mode()
	return m
}

// Close stops the controller: goroutines first (if ctx has not already),
// then steering ends with the programs left attached in their last mode
// (steer.Leave: in mirror, LocalDNS keeps every query while our sockets
// close, and a successor replaces the program), then the peer watch, the
// prober and the anchor (kept unless configured to clean up). It is safe
// to call more than once, and after Start's ctx is done.
func (c *Controller) Close() error {
	c.closeOnce.Do(func() { c.closeErr = c.shutdown() })
	return c.closeErr
}

func (c *Controller) shutdown() error {
	c.cancel()
	c.wg.Wait()
	var errs []error
	if c.steer != nil {
		errs = append(errs, c.steer.Leave())
	}
	if c.watch != nil {
		errs = append(errs, c.watch.Close())
	}
	if c.prober != nil {
		errs = append(errs, c.prober.Close())
	}
	if c.anchor != nil {
		errs = append(errs, c.anchor.Close())
	}
	return errors.Join(errs...)
}
