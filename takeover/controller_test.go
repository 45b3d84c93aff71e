package takeover

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"

	"github.com/dnsstandby/dnsstandby/internal/testkit"
	"github.com/dnsstandby/dnsstandby/takeover/anchor"
	"github.com/dnsstandby/dnsstandby/takeover/peer"
	"github.com/dnsstandby/dnsstandby/takeover/steer"
)

// The controller's unit tests drive it with fakes of its parts inside a
// synctest bubble: the machine's timers (probes, ticks, operator holds)
// run on the bubble's clock, and synctest.Wait lets the controller's
// goroutines act on each input before the test looks.

var listenAddr = netip.MustParseAddrPort("169.254.10.11:53")

const (
	udpGroup = "169.254.10.11:53/udp"
	tcpGroup = "169.254.10.11:53/tcp"
)

// fakeSteer stands in for steer.Steerer.
type fakeSteer struct {
	level steer.Level

	mu    sync.Mutex
	mode  steer.Mode
	beats int
	// log is the heartbeats and mode changes in order, at the bubble's
	// time.
	log   []steerCall
	probe netip.AddrPort
	peers map[string]int // group -> sockets adopted
	left  bool
	reads map[string]*atomic.Uint64 // group -> read counter handed out
	tests []bool                    // SetReadTest calls, in order
}

func (s *fakeSteer) Describe(chan<- *prometheus.Desc) {}
func (s *fakeSteer) Collect(chan<- prometheus.Metric) {}
func (s *fakeSteer) Level() steer.Level               { return s.level }
func (s *fakeSteer) Why() string                      { return s.level.String() + ": fake" }
func (s *fakeSteer) AddGroup(string, syscall.RawConn, bool) error {
	return nil
}

func (s *fakeSteer) SetMode(m steer.Mode) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mode = m
	s.log = append(s.log, steerCall{at: time.Now(), mode: m})
	return nil
}

// steerCall is a Heartbeat (beat) or a SetMode (mode).
type steerCall struct {
	at   time.Time
	beat bool
	mode steer.Mode
}

func (s *fakeSteer) SetProbe(src netip.AddrPort) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.probe = src
	return nil
}

func (s *fakeSteer) Heartbeat() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.beats++
	s.log = append(s.log, steerCall{at: time.Now(), beat: true})
	return nil
}

func (s *fakeSteer) Reads(name string) (*atomic.Uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reads == nil {
		s.reads = map[string]*atomic.Uint64{}
	}
	if s.reads[name] == nil {
		s.reads[name] = new(atomic.Uint64)
	}
	return s.reads[name], nil
}

func (s *fakeSteer) SetReadTest(on bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tests = append(s.tests, on)
	return nil
}

func (s *fakeSteer) readTests() []bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.tests)
}

func (s *fakeSteer) Adopt(name string, fd int) (int, error) {
	if s.level != steer.Adopt {
		return 0, steer.ErrNotAdopt
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.peers[name]++
	return s.peers[name], nil
}

func (s *fakeSteer) ClearPeers(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.peers, name)
	return nil
}

func (s *fakeSteer) Leave() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.left = true
	return nil
}

func (s *fakeSteer) state() (steer.Mode, int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mode, s.beats, s.left
}

// fakeWatch stands in for peer.Watcher: the test sends States.
type fakeWatch struct {
	ctx     context.Context // StartWatcher's
	first   peer.State
	updates chan peer.State
	closed  bool
}

func (w *fakeWatch) Current() peer.State        { return w.first }
func (w *fakeWatch) Updates() <-chan peer.State { return w.updates }
func (w *fakeWatch) Close() error               { w.closed = true; return nil }

// fakeProber stands in for peer.Prober: LocalDNS answers while ok.
type fakeProber struct {
	mu     sync.Mutex
	ok     bool
	self   bool // the probes reach dnsstandby's own socket
	stuck  bool // a probe waits out its whole timeout, as on a hung LocalDNS
	probes int
	closed bool
}

func (p *fakeProber) Probe(ctx context.Context) peer.ProbeResult {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.probes++
	if p.stuck {
		p.mu.Unlock()
		<-ctx.Done()
		p.mu.Lock()
		return peer.ProbeResult{Rcode: -1, Err: ctx.Err()}
	}
	if p.self {
		return peer.ProbeResult{RTT: 50 * time.Microsecond, NSID: peer.SelfNSID, Err: peer.ErrSelfReply}
	}
	if !p.ok {
		return peer.ProbeResult{Rcode: -1, Err: errors.New("no reply within 300ms")}
	}
	return peer.ProbeResult{OK: true, RTT: 100 * time.Microsecond, Rcode: 0}
}
func (p *fakeProber) Source() netip.AddrPort { return netip.MustParseAddrPort("169.254.10.11:40000") }
func (p *fakeProber) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	return nil
}

func (p *fakeProber) set(ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ok = ok
}

// fakeAnchor stands in for anchor.Anchor.
type fakeAnchor struct {
	ctx    context.Context // Start's
	closed bool
}

func (a *fakeAnchor) Describe(chan<- *prometheus.Desc) {}
func (a *fakeAnchor) Collect(chan<- prometheus.Metric) {}
func (a *fakeAnchor) Ready() bool                      { return !a.closed }
func (a *fakeAnchor) Close() error                     { a.closed = true; return nil }

// fakeProcess stands in for peer.Process: DupSocket returns a descriptor
// of /dev/null, which the controller closes after Adopt.
type fakeProcess struct{}

func (fakeProcess) DupSocket(uint64) (int, error) {
	return unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
}
func (fakeProcess) Close() error { return nil }

// rig is a controller on fakes, and what it told OnMirrorSafe.
type rig struct {
	t      *testing.T
	c      *Controller
	cancel context.CancelFunc
	steer  *fakeSteer
	watch  *fakeWatch
	prober *fakeProber
	anchor *fakeAnchor
	gen    uint64 // inode generation of LocalDNS's sockets

	mu   sync.Mutex
	safe []bool // OnMirrorSafe calls, in order
}

func (r *rig) safeCalls() []bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.safe)
}

// localDNS is LocalDNS's State: bound with a UDP socket and a TCP
// listener (inodes of generation gen), or not bound.
func localDNS(bound bool, gen uint64) peer.State {
	if !bound {
		return peer.State{}
	}
	return peer.State{Bound: true, PIDs: []int{42}, Sockets: []peer.Socket{
		{Proto: peer.TCP, Addr: listenAddr, Inode: 1000*gen + 1, PID: 42, Comm: "coredns"},
		{Proto: peer.UDP, Addr: listenAddr, Inode: 1000*gen + 2, PID: 42, Comm: "coredns"},
	}}
}

// newRig starts a controller on fakes: LocalDNS bound (and answering
// probes) or not, at the given steering level, with the Config changed by
// change. Call it inside a bubble.
func newRig(t *testing.T, bound bool, level steer.Level, change ...func(*Config)) *rig {
	r := &rig{
		t:      t,
		steer:  &fakeSteer{level: level, peers: map[string]int{}},
		watch:  &fakeWatch{first: localDNS(bound, 1), updates: make(chan peer.State, 1)},
		prober: &fakeProber{ok: bound},
		gen:    1,
	}
	inode := uint64(0)
	p := parts{
		startAnchor: func(ctx context.Context, cfg anchor.Config) (anchorPart, error) {
			r.anchor = &fakeAnchor{ctx: ctx}
			return r.anchor, nil
		},
		newSteering: func(steer.Config) (steering, error) { return r.steer, nil },
		startWatch: func(ctx context.Context, cfg peer.WatcherConfig) (peerWatch, error) {
			r.watch.ctx = ctx
			return r.watch, nil
		},
		newProber:   func(peer.ProbeConfig) (prober, error) { return r.prober, nil },
		openProcess: func(int) (peerProcess, error) { return fakeProcess{}, nil },
		socketInode: func(syscall.RawConn) (uint64, error) { inode++; return inode, nil },
	}
	cfg := DefaultConfig()
	cfg.Sockets = []OurSocket{{Addr: listenAddr, UDP: true}, {Addr: listenAddr}}
	cfg.Anchor = &anchor.Config{Link: "dnsstandby", Kind: "dummy", Addrs: []netip.Addr{listenAddr.Addr()}}
	cfg.OnMirrorSafe = func(safe bool) { r.mu.Lock(); defer r.mu.Unlock(); r.safe = append(r.safe, safe) }
	cfg.Logger = testkit.Logger(t)
	for _, ch := range change {
		ch(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c, err := start(ctx, cfg, p)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	r.c, r.cancel = c, cancel
	t.Cleanup(func() {
		cancel()
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return r
}

// do applies one input and lets the controller act on it:
//
//	gone, bound       LocalDNS's sockets go, or come back (new inodes)
//	hang, answer      LocalDNS stops answering probes, or answers again
//	self              the probes reach dnsstandby's own socket
//	silent            the wire shows LocalDNS answering nothing
//	stuck             each probe waits out its whole timeout
//	hold, hold:D      an operator hold, until released or for D
//	release           an operator release
//	wait:D            time passes
func (r *rig) do(input string) {
	r.t.Helper()
	verb, arg, _ := strings.Cut(input, ":")
	switch verb {
	case "gone":
		r.watch.updates <- localDNS(false, 0)
	case "bound":
		r.gen++
		r.watch.updates <- localDNS(true, r.gen)
	case "hang":
		r.prober.set(false)
	case "answer":
		r.prober.set(true)
	case "stuck":
		r.prober.mu.Lock()
		r.prober.stuck = true
		r.prober.mu.Unlock()
	case "silent":
		r.c.Silent(Silence{Listener: netip.MustParseAddrPort("169.254.10.11:53"), Unanswered: 8, Since: time.Now()})
	case "self":
		r.prober.mu.Lock()
		r.prober.self = true
		r.prober.mu.Unlock()
	case "hold":
		var d time.Duration
		if arg != "" {
			d = mustDuration(r.t, arg)
		}
		if _, _, err := r.c.Hold(d); err != nil {
			r.t.Fatalf("Hold(%v): %v", d, err)
		}
	case "release":
		if err := r.c.Release(); err != nil {
			r.t.Fatalf("Release: %v", err)
		}
	case "wait":
		time.Sleep(mustDuration(r.t, arg)) // the bubble's clock
	default:
		r.t.Fatalf("unknown input %q", input)
	}
	synctest.Wait()
}

func mustDuration(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// With the default machine (hung after 3 failed probes, trusted after 5
// good ones over 4 s) and 1 s probes: a hang is held within 2 s (1 s to
// the first failed probe, then one each 200 ms), and a LocalDNS that
// answers again is trusted within 6 s.
const (
	holdHang = "wait:2s"
	trust    = "wait:6s"
)

func TestController(t *testing.T) {
	tests := []struct {
		name    string
		bound   bool        // LocalDNS bound at start
		level   steer.Level // steering level
		inputs  []string
		mode    string // Status: "mode/reason"
		holding bool
		until   bool       // Status.HoldUntil set
		steer   steer.Mode // mode the steering was set to
		safe    []bool     // OnMirrorSafe calls
		events  []string   // Events: "mode/reason"
		adopted map[string]int
	}{
		{
			name: "healthy LocalDNS at start: mirror, its sockets adopted", bound: true, level: steer.Adopt,
			inputs: []string{"wait:10s"},
			mode:   "mirror/start", steer: steer.ToPeer, safe: []bool{true},
			events:  []string{"mirror/start"},
			adopted: map[string]int{udpGroup: 1, tcpGroup: 1},
		},
		{
			name: "no LocalDNS at start: takeover", level: steer.Adopt,
			inputs: []string{"wait:10s"},
			mode:   "takeover/start", steer: steer.ToUs, safe: []bool{false},
			events:  []string{"takeover/start"},
			adopted: map[string]int{},
		},
		{
			name: "crash: takeover at once", bound: true, level: steer.Adopt,
			inputs: []string{"gone"},
			mode:   "takeover/peer-exit", steer: steer.ToUs, safe: []bool{true, false},
			events:  []string{"mirror/start", "takeover/peer-exit"},
			adopted: map[string]int{udpGroup: 0, tcpGroup: 0},
		},
		{
			name: "crash and return: held until trusted, then mirror", bound: true, level: steer.Adopt,
			inputs: []string{"gone", "bound", "wait:3s"},
			mode:   "hold/peer-restarted", steer: steer.ToUs, safe: []bool{true, false},
			events:  []string{"mirror/start", "takeover/peer-exit", "hold/peer-restarted"},
			adopted: map[string]int{udpGroup: 1, tcpGroup: 1},
		},
		{
			name: "crash, return and hold-down passed", bound: true, level: steer.Adopt,
			inputs: []string{"gone", "bound", trust},
			mode:   "mirror/peer-healthy", steer: steer.ToPeer, safe: []bool{true, false, true},
			events:  []string{"mirror/start", "takeover/peer-exit", "hold/peer-restarted", "mirror/peer-healthy"},
			adopted: map[string]int{udpGroup: 1, tcpGroup: 1},
		},
		{
			name: "hang: hold", bound: true, level: steer.Adopt,
			inputs: []string{"hang", holdHang},
			mode:   "hold/peer-hung", steer: steer.ToUs, safe: []bool{true, false},
			events:  []string{"mirror/start", "hold/peer-hung"},
			adopted: map[string]int{udpGroup: 1, tcpGroup: 1},
		},
		{
			name: "hang, then answers again: mirror after the hold-down", bound: true, level: steer.Adopt,
			inputs: []string{"hang", holdHang, "answer", trust},
			mode:   "mirror/peer-healthy", steer: steer.ToPeer, safe: []bool{true, false, true},
			events:  []string{"mirror/start", "hold/peer-hung", "mirror/peer-healthy"},
			adopted: map[string]int{udpGroup: 1, tcpGroup: 1},
		},
		{
			name: "silent on the wire: hold at once", bound: true, level: steer.Adopt,
			inputs: []string{"silent"},
			mode:   "hold/peer-silent", steer: steer.ToUs, safe: []bool{true, false},
			events:  []string{"mirror/start", "hold/peer-silent"},
			adopted: map[string]int{udpGroup: 1, tcpGroup: 1},
		},
		{
			// A probe of a hung LocalDNS waits out its second; the wire's
			// report must not wait for it.
			name: "silent while a probe waits: hold at once", bound: true, level: steer.Adopt,
			inputs: []string{"wait:1s", "stuck", "wait:1100ms", "silent"},
			mode:   "hold/peer-silent", steer: steer.ToUs, safe: []bool{true, false},
			events:  []string{"mirror/start", "hold/peer-silent"},
			adopted: map[string]int{udpGroup: 1, tcpGroup: 1},
		},
		{
			name: "silent, then the probes pass: mirror after the hold-down", bound: true, level: steer.Adopt,
			inputs: []string{"silent", trust},
			mode:   "mirror/peer-healthy", steer: steer.ToPeer, safe: []bool{true, false, true},
			events:  []string{"mirror/start", "hold/peer-silent", "mirror/peer-healthy"},
			adopted: map[string]int{udpGroup: 1, tcpGroup: 1},
		},
		{
			name: "operator hold", bound: true, level: steer.Adopt,
			inputs: []string{"hold", "wait:1h"},
			mode:   "hold/operator", holding: true, steer: steer.ToUs, safe: []bool{true, false},
			events:  []string{"mirror/start", "hold/operator"},
			adopted: map[string]int{udpGroup: 1, tcpGroup: 1},
		},
		{
			name: "operator hold and release", bound: true, level: steer.Adopt,
			inputs: []string{"hold", "wait:1m", "release"},
			mode:   "mirror/operator-release", steer: steer.ToPeer, safe: []bool{true, false, true},
			events:  []string{"mirror/start", "hold/operator", "mirror/operator-release"},
			adopted: map[string]int{udpGroup: 1, tcpGroup: 1},
		},
		{
			name: "operator hold for 30s, not run out", bound: true, level: steer.Adopt,
			inputs: []string{"hold:30s", "wait:29s"},
			mode:   "hold/operator", holding: true, until: true, steer: steer.ToUs, safe: []bool{true, false},
			events:  []string{"mirror/start", "hold/operator"},
			adopted: map[string]int{udpGroup: 1, tcpGroup: 1},
		},
		{
			name: "operator hold for 30s runs out", bound: true, level: steer.Adopt,
			inputs: []string{"hold:30s", "wait:32s"},
			mode:   "mirror/operator-release", steer: steer.ToPeer, safe: []bool{true, false, true},
			events:  []string{"mirror/start", "hold/operator", "mirror/operator-release"},
			adopted: map[string]int{udpGroup: 1, tcpGroup: 1},
		},
		{
			name: "operator hold while LocalDNS is gone, release: takeover", level: steer.Adopt,
			inputs: []string{"hold", "release"},
			mode:   "takeover/operator-release", steer: steer.ToUs, safe: []bool{false},
			events:  []string{"takeover/start", "hold/operator", "takeover/operator-release"},
			adopted: map[string]int{},
		},
		{
			name: "level own: mirror, but never safe to mirror answers", bound: true, level: steer.Own,
			inputs: []string{"wait:10s"},
			mode:   "mirror/start", steer: steer.ToPeer, safe: []bool{false},
			events:  []string{"mirror/start"},
			adopted: map[string]int{},
		},
		{
			// Below adopt the kernel's hash may give a probe to our own
			// socket on the probe address (when dnsstandby serves it too):
			// that says nothing of LocalDNS, and is no failure.
			name: "level own: probes answered by dnsstandby itself hold nothing", bound: true, level: steer.Own,
			inputs: []string{"self", "wait:30s"},
			mode:   "mirror/start", steer: steer.ToPeer, safe: []bool{false},
			events:  []string{"mirror/start"},
			adopted: map[string]int{},
		},
		{
			name: "level off: crash still takes over", bound: true, level: steer.Off,
			inputs: []string{"gone"},
			mode:   "takeover/peer-exit", steer: steer.ToUs, safe: []bool{false},
			events:  []string{"mirror/start", "takeover/peer-exit"},
			adopted: map[string]int{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := newRig(t, tt.bound, tt.level)
				for _, in := range tt.inputs {
					r.do(in)
				}
				st := r.c.Status()
				if got := st.Mode + "/" + st.Reason; got != tt.mode {
					t.Errorf("Status mode %s, want %s", got, tt.mode)
				}
				if st.Holding != tt.holding || (st.HoldUntil != nil) != tt.until {
					t.Errorf("Status holding %v until %v, want %v (until set: %v)", st.Holding, st.HoldUntil, tt.holding, tt.until)
				}
				if r.c.Mode().String() != st.Mode {
					t.Errorf("Mode() %s, Status %s", r.c.Mode(), st.Mode)
				}
				if mode, beats, left := r.steer.state(); mode != tt.steer || beats == 0 || left {
					t.Errorf("steering mode %s, %d heartbeats, left %v; want %s, beating, attached", mode, beats, left, tt.steer)
				}
				if got := r.safeCalls(); !slices.Equal(got, tt.safe) {
					t.Errorf("OnMirrorSafe calls %v, want %v", got, tt.safe)
				}
				var events []string
				for _, e := range r.c.Events() {
					events = append(events, e.Mode+"/"+e.Reason)
				}
				if !slices.Equal(events, tt.events) || !slices.Equal(events, eventNames(st.Events)) {
					t.Errorf("Events %v (Status: %v), want %v", events, eventNames(st.Events), tt.events)
				}
				if fmt.Sprint(st.Peer.Adopted) != fmt.Sprint(tt.adopted) {
					t.Errorf("Status adopted %v, want %v", st.Peer.Adopted, tt.adopted)
				}
				// The steering program knows the prober by its address
				// and port, at adopt (the only level with peers to send
				// it to), once the prober exists.
				r.steer.mu.Lock()
				probe := r.steer.probe
				r.steer.mu.Unlock()
				r.prober.mu.Lock()
				probed := r.prober.probes > 0
				r.prober.mu.Unlock()
				if want := r.prober.Source(); tt.level == steer.Adopt && probed && probe != want || tt.level != steer.Adopt && probe.IsValid() {
					t.Errorf("steering probe source %v at level %s, want %v at adopt, none else", probe, tt.level, want)
				}
				if st.Steering.Level != tt.level.String() || st.AnchorReady == nil || !*st.AnchorReady {
					t.Errorf("Status steering %q anchor ready %v, want %q and ready", st.Steering.Level, st.AnchorReady, tt.level)
				}
				if bound := r.watch.first.Bound; len(tt.inputs) == 1 && tt.inputs[0] == "wait:10s" {
					if st.Peer.Bound != bound || st.Peer.LastProbe.OK != bound {
						t.Errorf("Status peer bound %v last probe %+v, want bound and OK %v", st.Peer.Bound, st.Peer.LastProbe, bound)
					}
				}
			})
		})
	}
}

func eventNames(evs []Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Mode+"/"+e.Reason)
	}
	return out
}

// TestControllerLifetime: the controller's goroutines and its parts' stop
// when Start's ctx ends, without detaching the steering or closing the
// anchor (Close does that, after the daemon drained); Close still works
// after it, once, and twice is safe. Close alone stops them too.
func TestControllerLifetime(t *testing.T) {
	tests := []struct {
		name   string
		cancel bool // end Start's ctx before Close
	}{
		{"ctx ends, then Close", true},
		{"Close alone", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := newRig(t, true, steer.Adopt)
				r.do("wait:3s")
				stopped := make(chan struct{})
				go func() { r.c.wg.Wait(); close(stopped) }()
				synctest.Wait()
				select {
				case <-stopped:
					t.Fatal("goroutines stopped before ctx ended or Close")
				default:
				}

				if tt.cancel {
					r.cancel()
					synctest.Wait()
					select {
					case <-stopped:
					default:
						t.Fatal("goroutines still running after ctx ended")
					}
					if r.watch.ctx.Err() == nil || r.anchor.ctx.Err() == nil {
						t.Error("peer watch or anchor not started under Start's ctx")
					}
					if _, _, left := r.steer.state(); left || r.anchor.closed || r.watch.closed {
						t.Errorf("ctx ending released parts: steering left %v, anchor closed %v, watch closed %v", left, r.anchor.closed, r.watch.closed)
					}
					if _, _, err := r.c.Hold(0); err == nil {
						t.Error("Hold after ctx ended: no error")
					}
				}

				if err := r.c.Close(); err != nil {
					t.Fatal(err)
				}
				synctest.Wait() // for the goroutine waiting on wg to close stopped
				select {
				case <-stopped:
				default:
					t.Fatal("goroutines still running after Close")
				}
				if err := r.c.Close(); err != nil {
					t.Errorf("second Close: %v", err)
				}
				mode, _, left := r.steer.state()
				if !left || mode != steer.ToPeer || !r.anchor.closed || !r.watch.closed || !r.prober.closed {
					t.Errorf("after Close: steering left %v in %s, anchor closed %v, watch closed %v, prober closed %v; want all, in to-peer",
						left, mode, r.anchor.closed, r.watch.closed, r.prober.closed)
				}
				if st := r.c.Status(); st.Mode != "mirror" {
					t.Errorf("Status after Close: mode %s", st.Mode)
				}
			})
		})
	}
}

// TestHoldAfterHold: a hold replaces the one in force, timed or not, and
// Hold returns the one it replaced; the replaced one's end does not end
// the new one.
func TestHoldAfterHold(t *testing.T) {
	tests := []struct {
		first, second string        // "": none; "hold" until released; "hold:D" for D
		wasHolding    bool          // what the second Hold says it replaced
		wasUntil      time.Duration // after the first (0: until released)
		until         time.Duration // Status.HoldUntil after the second (0: none)
	}{
		{"", "hold", false, 0, 0},
		{"", "hold:30s", false, 0, 30 * time.Second},
		{"hold:30s", "hold", true, 30 * time.Second, 0},
		{"hold:30s", "hold:10s", true, 30 * time.Second, 10 * time.Second},
		{"hold:30s", "hold:60s", true, 30 * time.Second, 60 * time.Second},
		{"hold", "hold:30s", true, 0, 30 * time.Second},
		{"hold", "hold", true, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.first+" then "+tt.second, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := newRig(t, true, steer.Adopt)
				if tt.first != "" {
					r.do(tt.first)
				}
				start := time.Now()
				var d time.Duration
				if _, arg, ok := strings.Cut(tt.second, ":"); ok {
					d = mustDuration(t, arg)
				}
				holding, until, err := r.c.Hold(d)
				if err != nil {
					t.Fatal(err)
				}
				synctest.Wait()
				var want time.Time
				if tt.wasUntil > 0 {
					want = start.Add(tt.wasUntil)
				}
				if holding != tt.wasHolding || !until.Equal(want) {
					t.Errorf("replaced: holding %v until %v, want %v until %v", holding, until, tt.wasHolding, want)
				}
				st := r.c.Status()
				switch {
				case !st.Holding:
					t.Errorf("not holding after the second hold")
				case tt.until == 0 && st.HoldUntil != nil:
					t.Errorf("held until %v, want until released", st.HoldUntil)
				case tt.until > 0 && (st.HoldUntil == nil || !st.HoldUntil.Equal(start.Add(tt.until))):
					t.Errorf("held until %v, want %v", st.HoldUntil, start.Add(tt.until))
				}
				// Past the end of the first: the second alone decides.
				r.do("wait:45s")
				if held := r.c.Status().Holding; held != (tt.until == 0 || tt.until > 45*time.Second) {
					t.Errorf("45s on: holding %v", held)
				}
				if err := r.c.Close(); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}

// TestHeartbeatFollowsHealthy: the steering hears from us only while our
// serving loops are healthy.
func TestHeartbeatFollowsHealthy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var sick error
		setSick := func(err error) { mu.Lock(); defer mu.Unlock(); sick = err }
		r := newRig(t, true, steer.Adopt, func(c *Config) {
			c.Healthy = func() error { mu.Lock(); defer mu.Unlock(); return sick }
		})
		r.do("wait:1s")
		_, healthy, _ := r.steer.state()
		setSick(errors.New("read loop stalled"))
		r.do("wait:5s")
		_, unhealthy, _ := r.steer.state()
		setSick(nil)
		r.do("wait:1s")
		_, again, _ := r.steer.state()
		if healthy == 0 || unhealthy != healthy || again <= unhealthy {
			t.Errorf("heartbeats: %d while healthy, %d after 5s unhealthy, %d healthy again; want none while unhealthy", healthy, unhealthy, again)
		}
	})
}

// TestHeartbeatCadence: while the steering sends LocalDNS the traffic
// the heartbeat is written once a second; steered to us it is written at
// once and then every 250 ms, and back in mirror once a second again. At
// no time is it older than a second, half a second inside the stall
// limit.
func TestHeartbeatCadence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, true, steer.Adopt)
		r.do("wait:5s")
		r.do("hold")
		r.do("wait:3s")
		r.do("release")
		r.do("wait:5s")
		r.steer.mu.Lock()
		calls := slices.Clone(r.steer.log)
		r.steer.mu.Unlock()

		// The beats in each period of one steering mode.
		type period struct {
			mode  steer.Mode
			start time.Time
			beats []time.Time
		}
		var ps []period
		for _, c := range calls {
			switch {
			case !c.beat:
				ps = append(ps, period{mode: c.mode, start: c.at})
			case len(ps) > 0:
				ps[len(ps)-1].beats = append(ps[len(ps)-1].beats, c.at)
			}
		}
		var modes []steer.Mode
		for _, p := range ps {
			modes = append(modes, p.mode)
		}
		if want := []steer.Mode{steer.ToPeer, steer.ToUs, steer.ToPeer}; !slices.Equal(modes, want) {
			t.Fatalf("modes set %v, want %v", modes, want)
		}
		last := calls[0].at
		for _, c := range calls {
			if c.beat {
				if gap := c.at.Sub(last); gap > time.Second {
					t.Errorf("a beat %v after the one before it, want at most 1s", gap)
				}
				last = c.at
			}
		}
		for i, p := range ps {
			if len(p.beats) < 2 {
				t.Fatalf("%v from %v: beats %v, want several", p.mode, p.start, p.beats)
			}
			want := time.Second
			if p.mode == steer.ToUs {
				want = 250 * time.Millisecond
			}
			if i > 0 && p.beats[0] != p.start {
				t.Errorf("%v: first beat %v after the mode was set, want at once", p.mode, p.beats[0].Sub(p.start))
			}
			for j := 2; j < len(p.beats); j++ {
				if gap := p.beats[j].Sub(p.beats[j-1]); gap != want {
					t.Errorf("%v: beats %v apart, want %v", p.mode, gap, want)
				}
			}
		}
		if stallAfter-time.Second < 500*time.Millisecond {
			t.Errorf("a heartbeat a second old leaves less than half a second of the stall limit %v", stallAfter)
		}
	})
}

// TestReadCountersHandedOver: each steered UDP group's read counter goes
// to the read loops of its listen address; TCP groups have none, and at
// level off nothing is steered, so nothing is handed over.
func TestReadCountersHandedOver(t *testing.T) {
	for _, level := range []steer.Level{steer.Adopt, steer.Off} {
		t.Run(level.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				type handed struct {
					listen netip.AddrPort
					reads  *atomic.Uint64
				}
				var got []handed
				r := newRig(t, true, level, func(c *Config) {
					c.CountReads = func(listen netip.AddrPort, reads *atomic.Uint64) { got = append(got, handed{listen, reads}) }
				})
				r.steer.mu.Lock()
				want := r.steer.reads[udpGroup]
				r.steer.mu.Unlock()
				switch {
				case level == steer.Off && len(got) != 0:
					t.Errorf("at off: %d counters handed over, want none", len(got))
				case level == steer.Adopt && (len(got) != 1 || got[0].listen != listenAddr || got[0].reads == nil || got[0].reads != want):
					t.Errorf("handed over %+v; want the UDP group's counter %p, for %v, once", got, want, listenAddr)
				}
			})
		})
	}
}

// TestReadTestFollowsLocalDNS: the read test is on while LocalDNS
// answers, off from the moment it is seen not to (a failed probe, a
// silence, a restart before its first good probe), and on again once a
// probe passes; an operator hold leaves it on.
func TestReadTestFollowsLocalDNS(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, true, steer.Adopt)
		want := []bool{true} // at start: LocalDNS bound and trusted
		check := func(when string, more ...bool) {
			t.Helper()
			want = append(want, more...)
			if got := r.steer.readTests(); !slices.Equal(got, want) {
				t.Errorf("%s: SetReadTest calls %v, want %v", when, got, want)
			}
		}
		r.do("wait:2s")
		check("healthy")
		r.do("hold")
		check("operator hold")
		r.do("release")
		r.do("silent")
		check("silent", false)
		r.do("hang")
		r.do("wait:3s")
		check("hung: still off")
		r.do("answer")
		r.do("wait:1s")
		check("answering in the hold-down", true)
		r.do("gone")
		check("gone", false)
		r.do("bound")
		r.do("wait:1500ms")
		check("restarted, a good probe", true)
	})
}

// TestControllerMetrics: a crash is counted as a failover, and every
// possible transition's counter (peer-silent's too), both modes' duration
// histograms and the heartbeat errors under their new and their old name
// are there from the start.
func TestControllerMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, true, steer.Adopt)
		r.do("gone")
		const want = `
# HELP dnsstandby_failbacks_total Changes back to mirror, by reason.
# TYPE dnsstandby_failbacks_total counter
dnsstandby_failbacks_total{reason="operator-release"} 0
dnsstandby_failbacks_total{reason="peer-healthy"} 0
# HELP dnsstandby_failovers_total Changes from mirror to hold or takeover, by reason.
# TYPE dnsstandby_failovers_total counter
dnsstandby_failovers_total{reason="operator"} 0
dnsstandby_failovers_total{reason="peer-exit"} 1
dnsstandby_failovers_total{reason="peer-hung"} 0
dnsstandby_failovers_total{reason="peer-silent"} 0
# HELP dnsstandby_mode 1 for the current mode: mirror (LocalDNS answers), hold (LocalDNS bound but kept from traffic), takeover (LocalDNS gone).
# TYPE dnsstandby_mode gauge
dnsstandby_mode{mode="hold"} 0
dnsstandby_mode{mode="mirror"} 0
dnsstandby_mode{mode="takeover"} 1
# HELP dnsstandby_mode_transitions_total Mode changes by from, to and reason.
# TYPE dnsstandby_mode_transitions_total counter
dnsstandby_mode_transitions_total{from="hold",reason="operator-release",to="mirror"} 0
dnsstandby_mode_transitions_total{from="hold",reason="operator-release",to="takeover"} 0
dnsstandby_mode_transitions_total{from="hold",reason="peer-exit",to="takeover"} 0
dnsstandby_mode_transitions_total{from="hold",reason="peer-healthy",to="mirror"} 0
dnsstandby_mode_transitions_total{from="mirror",reason="operator",to="hold"} 0
dnsstandby_mode_transitions_total{from="mirror",reason="peer-exit",to="takeover"} 1
dnsstandby_mode_transitions_total{from="mirror",reason="peer-hung",to="hold"} 0
dnsstandby_mode_transitions_total{from="mirror",reason="peer-silent",to="hold"} 0
dnsstandby_mode_transitions_total{from="takeover",reason="operator",to="hold"} 0
dnsstandby_mode_transitions_total{from="takeover",reason="peer-restarted",to="hold"} 0
# HELP dnsstandby_peer_sockets LocalDNS sockets seen in our reuseport groups.
# TYPE dnsstandby_peer_sockets gauge
dnsstandby_peer_sockets 0
# HELP dnsstandby_peer_sockets_adopted LocalDNS sockets in the steering maps.
# TYPE dnsstandby_peer_sockets_adopted gauge
dnsstandby_peer_sockets_adopted 0
# HELP dnsstandby_steer_heartbeat_errors_total Heartbeats that could not be written to the steering program.
# TYPE dnsstandby_steer_heartbeat_errors_total counter
dnsstandby_steer_heartbeat_errors_total 0
# HELP dnsstandby_steering_heartbeat_errors_total Deprecated: dnsstandby_steer_heartbeat_errors_total under its old name, removed in the release after the first tagged one.
# TYPE dnsstandby_steering_heartbeat_errors_total counter
dnsstandby_steering_heartbeat_errors_total 0
`
		if err := testutil.CollectAndCompare(r.c, strings.NewReader(want), "dnsstandby_failbacks_total", "dnsstandby_failovers_total",
			"dnsstandby_mode", "dnsstandby_mode_transitions_total", "dnsstandby_peer_sockets", "dnsstandby_peer_sockets_adopted",
			"dnsstandby_steer_heartbeat_errors_total", "dnsstandby_steering_heartbeat_errors_total"); err != nil {
			t.Error(err)
		}
		// Hold's and takeover's histograms are there before any stretch
		// of either ended.
		if n := testutil.CollectAndCount(r.c, "dnsstandby_mode_duration_seconds"); n != 2 {
			t.Errorf("dnsstandby_mode_duration_seconds: %d series, want hold's and takeover's", n)
		}
	})
}

func TestStartRejectsBadConfig(t *testing.T) {
	sockets := []OurSocket{{Addr: listenAddr, UDP: true}}
	tests := []struct {
		name    string
		change  func(*Config)
		wantErr string
	}{
		{"no sockets", func(c *Config) { c.Sockets = nil }, "takeover: Sockets must not be empty"},
		{"zero probe interval", func(c *Config) { c.ProbeInterval = 0 }, "takeover: ProbeInterval must be positive, got 0s"},
		{"no probe address", func(c *Config) { c.ProbeAddr = netip.AddrPort{} }, "takeover: ProbeAddr must be set"},
		{"no probe name", func(c *Config) { c.ProbeName = "" }, "takeover: ProbeName must be set"},
		{"hung after 0", func(c *Config) { c.Machine.HungAfter = 0 }, "takeover: Machine.HungAfter must be at least 1, got 0"},
		{"fallback unit a path", func(c *Config) { c.FallbackUnit = "/x" }, `takeover: FallbackUnit must name a .service or .scope unit, or be empty, got "/x"`},
		{"fallback unit no unit", func(c *Config) { c.FallbackUnit = "localdns-fallback" }, `takeover: FallbackUnit must name a .service or .scope unit, or be empty, got "localdns-fallback"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Sockets = sockets
			tt.change(&cfg)
			p := parts{
				newSteering: func(steer.Config) (steering, error) { return &fakeSteer{level: steer.Off}, nil },
				startWatch: func(context.Context, peer.WatcherConfig) (peerWatch, error) {
					return &fakeWatch{updates: make(chan peer.State, 1)}, nil
				},
				newProber:   func(peer.ProbeConfig) (prober, error) { return &fakeProber{}, nil },
				socketInode: func(syscall.RawConn) (uint64, error) { return 1, nil },
			}
			c, err := start(context.Background(), cfg, p)
			if err == nil {
				c.Close()
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("start: %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}
