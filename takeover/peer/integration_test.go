package peer_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"sort"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
	"github.com/dnsstandby/dnsstandby/takeover/internal/sockname"
	"github.com/dnsstandby/dnsstandby/takeover/peer"
)

// The namespace holds LocalDNS's two addresses on an anchor link, as
// localdns.sh sets them up (a bridge: this machine has no dummy driver).
const (
	nodeListener = testkit.NodeListener
	podListener  = testkit.PodListener
)

var listen = netip.MustParseAddrPort(podListener + ":53")

// corefile is AgentBaker's LocalDNS Corefile (the whoami health-check
// block on both listeners, with no nsid plugin in it, and the pod
// listener's root block with `nsid localdns-pod`), where a template stands
// in for the forward to kube-dns, answering probeName locally.
var corefile = testkit.Corefile{Extra: `
template IN A localdns.test {
    answer "{{ .Name }} 60 IN A 192.0.2.1"
}
template ANY ANY {
    rcode NXDOMAIN
}`}.String()

const probeName = "probe.localdns.test."

// exitBound is how soon after SIGKILL a test wants the exit seen. It takes
// 2-5 ms on an idle machine; three race-enabled test binaries on this
// 2-core machine stretched the kernel's teardown of CoreDNS to 150 ms.
// The bound still tells the pidfd from a rescan (an hour in TestWatcher).
const exitBound = 300 * time.Millisecond

// env is a namespace with LocalDNS's addresses, a CoreDNS as LocalDNS, and
// "our" sockets in its reuseport groups on podListener:53: a UDP socket
// answering every query as dnsstandby does (NSID dnsstandby) and a TCP
// listener.
type env struct {
	ns      *nstest.Namespace
	coredns *nstest.CoreDNS
	ours    map[uint64]bool // our sockets' inodes
}

func (e *env) exclude(inode uint64) bool { return e.ours[inode] }

func newEnv(t *testing.T) *env {
	t.Helper()
	nstest.RequireRoot(t)
	nstest.CoreDNSBinary(t)
	e := &env{ns: nstest.New(t, "peer"), ours: map[uint64]bool{}}
	must(t, e.ns.AddLink("localdns", "", nodeListener+"/32", podListener+"/32"))
	e.coredns = startCoreDNS(t, e.ns)
	waitBound(t, e.ns, listen, e.exclude)

	lc := net.ListenConfig{Control: reusePortControl}
	var (
		udp *net.UDPConn
		tcp *net.TCPListener
	)
	must(t, e.ns.Do(func() error {
		pc, err := lc.ListenPacket(context.Background(), "udp4", listen.String())
		if err != nil {
			return fmt.Errorf("our udp socket: %w", err)
		}
		udp = pc.(*net.UDPConn)
		ln, err := lc.Listen(context.Background(), "tcp4", listen.String())
		if err != nil {
			udp.Close()
			return fmt.Errorf("our tcp socket: %w", err)
		}
		tcp = ln.(*net.TCPListener)
		return nil
	}))
	t.Cleanup(func() { tcp.Close() })
	for _, c := range []syscall.Conn{udp, tcp} {
		rc, err := c.SyscallConn()
		must(t, err)
		inode, err := peer.SocketInode(rc)
		must(t, err)
		e.ours[inode] = true
	}
	serveFake(t, udp, withNSID(peer.SelfNSID))
	return e
}

// startCoreDNS starts LocalDNS's CoreDNS; it is ready once the node
// listener (which only it serves) answers.
func startCoreDNS(t *testing.T, ns *nstest.Namespace) *nstest.CoreDNS {
	t.Helper()
	return nstest.StartCoreDNS(t, ns, nstest.CoreDNSConfig{Corefile: corefile, Probe: nodeListener + ":53"})
}

// find runs FindSockets inside ns.
func find(t *testing.T, ns *nstest.Namespace, addr netip.AddrPort, proto peer.Proto, exclude func(uint64) bool) []peer.Socket {
	t.Helper()
	var socks []peer.Socket
	must(t, ns.Do(func() error {
		var err error
		socks, err = peer.FindSockets(addr, proto, exclude)
		return err
	}))
	return socks
}

// waitBound waits until a socket other than ours is bound to addr over
// UDP and TCP (CoreDNS answering on one listener need not have bound the
// other yet).
func waitBound(t *testing.T, ns *nstest.Namespace, addr netip.AddrPort, exclude func(uint64) bool) {
	t.Helper()
	testkit.Eventually(t, 5*time.Second, "LocalDNS bound to "+addr.String()+" over UDP and TCP", func() bool {
		return len(find(t, ns, addr, peer.UDP, exclude)) > 0 && len(find(t, ns, addr, peer.TCP, exclude)) > 0
	})
}

func TestFindSockets(t *testing.T) {
	e := newEnv(t)
	pid := e.coredns.Pid()
	self := os.Getpid()
	tests := []struct {
		name    string
		addr    netip.AddrPort
		proto   peer.Proto
		exclude func(uint64) bool
		pids    []int // owners of the sockets found, in inode order
	}{
		{"udp", listen, peer.UDP, e.exclude, []int{pid}},
		{"tcp", listen, peer.TCP, e.exclude, []int{pid}},
		{"udp-with-ours", listen, peer.UDP, nil, []int{pid, self}},
		{"tcp-with-ours", listen, peer.TCP, nil, []int{pid, self}},
		{"node-listener", netip.MustParseAddrPort(nodeListener + ":53"), peer.UDP, e.exclude, []int{pid}},
		{"other-port", netip.MustParseAddrPort(podListener + ":54"), peer.UDP, nil, nil},
		{"other-address", netip.MustParseAddrPort("169.254.10.12:53"), peer.TCP, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			socks := find(t, e.ns, tt.addr, tt.proto, tt.exclude)
			var pids []int
			for _, s := range socks {
				pids = append(pids, s.PID)
				if s.Addr != tt.addr || s.Proto != tt.proto || s.UID != 0 || s.Inode == 0 {
					t.Errorf("socket %v: want %s/%s, UID 0", s, tt.addr, tt.proto)
				}
				if s.PID == pid && s.Comm != "coredns" {
					t.Errorf("socket %v: comm %q, want coredns", s, s.Comm)
				}
				if (s.PID == self) != e.ours[s.Inode] {
					t.Errorf("socket %v: ours %v", s, e.ours[s.Inode])
				}
			}
			slices.Sort(pids)
			want := slices.Sorted(slices.Values(tt.pids))
			if !slices.Equal(pids, want) {
				t.Errorf("owners %v, want %v (sockets %v)", pids, want, socks)
			}
		})
	}
	if _, err := peer.FindSockets(listen, "sctp", nil); err == nil {
		t.Error("FindSockets(sctp): no error")
	}
}

func TestProcess(t *testing.T) {
	e := newEnv(t)
	pid := e.coredns.Pid()
	udp := find(t, e.ns, listen, peer.UDP, e.exclude)
	tcp := find(t, e.ns, listen, peer.TCP, e.exclude)
	if len(udp) != 1 || len(tcp) != 1 {
		t.Fatalf("CoreDNS sockets: udp %v tcp %v, want one each", udp, tcp)
	}

	p, err := peer.OpenProcess(pid)
	must(t, err)
	defer p.Close()
	if p.PID() != pid || !p.HoldsSocket(udp[0].Inode) || !p.HoldsSocket(tcp[0].Inode) {
		t.Fatalf("process %d does not hold its sockets", p.PID())
	}

	for _, s := range []peer.Socket{udp[0], tcp[0]} {
		t.Run("dup-"+string(s.Proto), func(t *testing.T) {
			fd, err := p.DupSocket(s.Inode)
			must(t, err)
			defer unix.Close(fd)
			addr, err := sockname.Of(fd)
			must(t, err)
			var st unix.Stat_t
			must(t, unix.Fstat(fd, &st))
			if addr != listen || st.Ino != s.Inode {
				t.Errorf("duplicate: getsockname %s inode %d, want %s inode %d", addr, st.Ino, listen, s.Inode)
			}
			reuse, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT)
			must(t, err)
			if reuse != 1 {
				t.Error("duplicate has no SO_REUSEPORT: not CoreDNS's listener")
			}
			flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
			must(t, err)
			if flags&unix.FD_CLOEXEC == 0 {
				t.Error("duplicate is not close-on-exec")
			}
		})
	}
	for inode := range e.ours {
		if _, err := p.DupSocket(inode); !errors.Is(err, peer.ErrSocketNotHeld) {
			t.Errorf("DupSocket of a socket CoreDNS does not hold: %v, want ErrSocketNotHeld", err)
		}
	}

	select {
	case <-p.Exited():
		t.Fatal("Exited before the process exited")
	default:
	}
	start := time.Now()
	must(t, e.coredns.Signal(syscall.SIGKILL))
	select {
	case <-p.Exited():
	case <-time.After(2 * time.Second):
		t.Fatal("Exited not closed 2s after SIGKILL")
	}
	latency := time.Since(start)
	// The kernel closes a process's files before it reports the exit.
	if socks := find(t, e.ns, listen, peer.UDP, e.exclude); len(socks) != 0 {
		t.Errorf("sockets still bound when Exited fired: %v", socks)
	}
	t.Logf("exit seen through the pidfd %v after SIGKILL", latency)
	if latency > exitBound {
		t.Errorf("exit seen %v after SIGKILL, want under %v", latency, exitBound)
	}
	if _, err := p.DupSocket(udp[0].Inode); err == nil {
		t.Error("DupSocket after exit: no error")
	}
	must(t, p.Close())
	must(t, p.Close())

	if _, err := peer.OpenProcess(0); err == nil {
		t.Error("OpenProcess(0): no error")
	}
	waitNoPeerGoroutines(t)
}

// stateWait reads w's updates until one satisfies ok, and returns it with
// the time it arrived.
func stateWait(t *testing.T, w *peer.Watcher, within time.Duration, what string, ok func(peer.State) bool) (peer.State, time.Time) {
	t.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	for {
		select {
		case s := <-w.Updates():
			if ok(s) {
				return s, time.Now()
			}
		case <-timer.C:
			t.Fatalf("no state with %s within %v; current %+v", what, within, w.Current())
		}
	}
}

// watcherConfig is DefaultWatcherConfig watching addr, logging to t.
func watcherConfig(t *testing.T, addr netip.AddrPort) peer.WatcherConfig {
	cfg := peer.DefaultWatcherConfig()
	cfg.Addrs = []netip.AddrPort{addr}
	cfg.Logger = testkit.Logger(t)
	return cfg
}

func startWatcher(t *testing.T, ns *nstest.Namespace, cfg peer.WatcherConfig) *peer.Watcher {
	t.Helper()
	var w *peer.Watcher
	must(t, ns.Do(func() error {
		var err error
		w, err = peer.StartWatcher(context.Background(), cfg)
		return err
	}))
	t.Cleanup(func() { w.Close() })
	return w
}

func boundBy(pid int) func(peer.State) bool {
	return func(s peer.State) bool { return s.Bound && slices.Equal(s.PIDs, []int{pid}) }
}

func notBound(s peer.State) bool { return !s.Bound && len(s.Sockets) == 0 }

func TestWatcher(t *testing.T) {
	e := newEnv(t)
	const rescan = 200 * time.Millisecond
	cfg := watcherConfig(t, listen)
	cfg.Exclude, cfg.Rescan = e.exclude, rescan
	w := startWatcher(t, e.ns, cfg)
	// A watcher that never rescans in this test: it can see the exit only
	// through the pidfd.
	cfg.Rescan = time.Hour
	slow := startWatcher(t, e.ns, cfg)

	first, _ := stateWait(t, w, time.Second, "LocalDNS bound", boundBy(e.coredns.Pid()))
	if len(first.Sockets) != 2 || first.Sockets[0].Proto != peer.TCP || first.Sockets[1].Proto != peer.UDP ||
		len(first.UIDMismatch) != 0 || first.Err != nil || first.At.IsZero() {
		t.Errorf("first state %+v: want CoreDNS's TCP and UDP sockets, no warnings", first)
	}
	if cur := w.Current(); !cur.Bound || !slices.Equal(cur.Sockets, first.Sockets) {
		t.Errorf("Current %+v, want the first state", cur)
	}
	stateWait(t, slow, time.Second, "LocalDNS bound", boundBy(e.coredns.Pid()))

	// SIGKILL: not bound at once.
	killed := time.Now()
	must(t, e.coredns.Signal(syscall.SIGKILL))
	_, at := stateWait(t, w, time.Second, "LocalDNS gone", notBound)
	_, slowAt := stateWait(t, slow, time.Second, "LocalDNS gone (pidfd)", notBound)
	exitLatency, slowLatency := at.Sub(killed), slowAt.Sub(killed)
	t.Logf("exit: not bound %v after SIGKILL (rescan %v), %v with no rescan", exitLatency, rescan, slowLatency)
	if exitLatency > exitBound || slowLatency > exitBound {
		t.Errorf("exit seen after %v and %v, want under %v", exitLatency, slowLatency, exitBound)
	}
	<-e.coredns.Done()

	// CoreDNS again: bound within a rescan.
	launched := time.Now()
	again := startCoreDNS(t, e.ns)
	ready := time.Now()
	s, at := stateWait(t, w, 2*time.Second, "LocalDNS bound again", boundBy(again.Pid()))
	t.Logf("rebind: bound %v after the new CoreDNS answered (%v after launch; CoreDNS took %v to answer)",
		at.Sub(ready), at.Sub(launched), ready.Sub(launched))
	if at.Sub(ready) > rescan+100*time.Millisecond {
		t.Errorf("rebind seen %v after CoreDNS answered, want within the rescan interval %v", at.Sub(ready), rescan)
	}
	if len(s.Sockets) != 2 {
		t.Errorf("after rebind: %v, want CoreDNS's UDP and TCP sockets", s.Sockets)
	}

	must(t, w.Close())
	must(t, w.Close())
	must(t, slow.Close())
	// No State comes after Close (one may still be pending from before).
	select {
	case <-w.Updates():
	default:
	}
	select {
	case s := <-w.Updates():
		t.Errorf("state after Close: %+v", s)
	case <-time.After(2 * rescan):
	}
	waitNoPeerGoroutines(t)
}

// portNamespace is a namespace holding the pod listener's address, and
// the address on port 5300 where a test binds plain sockets (ours, not
// excluded: stand-ins for LocalDNS's, held by this process).
func portNamespace(t *testing.T, name string) (*nstest.Namespace, netip.AddrPort) {
	nstest.RequireRoot(t)
	ns := nstest.New(t, name)
	must(t, ns.AddLink("localdns", "", podListener+"/32"))
	return ns, netip.MustParseAddrPort(podListener + ":5300")
}

// listenIn binds a UDP socket with SO_REUSEPORT on addr in ns, closed at
// the test's end if not before.
func listenIn(t *testing.T, ns *nstest.Namespace, addr netip.AddrPort) net.PacketConn {
	var conn net.PacketConn
	must(t, ns.Do(func() error {
		var err error
		conn, err = (&net.ListenConfig{Control: reusePortControl}).ListenPacket(context.Background(), "udp4", addr.String())
		return err
	}))
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestWatcherRebindLatency binds and closes a plain socket (ours, not
// excluded: a stand-in for LocalDNS whose bind time is known) and measures
// how long the watcher takes to see each change by rescan alone.
func TestWatcherRebindLatency(t *testing.T) {
	ns, addr := portNamespace(t, "rebind")
	const rescan = 200 * time.Millisecond
	cfg := watcherConfig(t, addr)
	// Rescan throughout: the socket's holder (this process) is watched by
	// a pidfd, so the watcher would otherwise settle on it.
	cfg.Rescan, cfg.RescanSettled = rescan, 0
	w := startWatcher(t, ns, cfg)
	stateWait(t, w, time.Second, "nothing bound", notBound)

	var bindLat, closeLat []time.Duration
	for range 5 {
		// A random moment between two rescans: the test reacts to the
		// last update, which came right after a rescan.
		time.Sleep(rand.N(rescan))
		conn := listenIn(t, ns, addr)
		bound := time.Now()
		_, at := stateWait(t, w, 2*rescan, "bound", boundBy(os.Getpid()))
		bindLat = append(bindLat, at.Sub(bound))
		conn.Close()
		closed := time.Now()
		_, at = stateWait(t, w, 2*rescan, "not bound", notBound)
		closeLat = append(closeLat, at.Sub(closed))
	}
	slices.Sort(bindLat)
	slices.Sort(closeLat)
	t.Logf("rescan %v: bind seen after %v (sorted), close after %v", rescan, bindLat, closeLat)
	if bindLat[len(bindLat)-1] > rescan+50*time.Millisecond {
		t.Errorf("a bind went unseen for %v, want at most the rescan interval %v", bindLat[len(bindLat)-1], rescan)
	}
}

// TestWatcherSettled checks that a watcher rescans seldom only once
// LocalDNS is settled: a bind is seen within Rescan while nothing is
// bound, and a second socket of the same, pidfd-watched holder (a reload's)
// is not seen while RescanSettled runs.
func TestWatcherSettled(t *testing.T) {
	ns, addr := portNamespace(t, "settled")
	const rescan = 20 * time.Millisecond
	cfg := watcherConfig(t, addr)
	cfg.Rescan, cfg.RescanSettled = rescan, time.Hour
	w := startWatcher(t, ns, cfg)
	stateWait(t, w, time.Second, "nothing bound", notBound)

	listenIn(t, ns, addr)
	first, _ := stateWait(t, w, 10*rescan, "bound while unsettled", boundBy(os.Getpid()))
	// Two scans alike settle it: give it many.
	time.Sleep(25 * rescan)
	listenIn(t, ns, addr)
	select {
	case s := <-w.Updates():
		t.Fatalf("settled, a new socket was seen within %v: %+v (before: %+v)", 25*rescan, s, first)
	case <-time.After(25 * rescan):
	}
	if n := len(w.Current().Sockets); n != 1 {
		t.Errorf("settled: %d sockets in the current state, want the first one only", n)
	}
}

// TestWatcherUIDMismatch binds a peer socket as UID 101 and checks the
// warning, and the kernel fact behind it: our socket cannot join.
func TestWatcherUIDMismatch(t *testing.T) {
	nstest.RequireRoot(t)
	ns := nstest.New(t, "uid")
	must(t, ns.AddLink("localdns", "", podListener+"/32"))
	addr := netip.MustParseAddrPort(podListener + ":5301")
	const uid = 101

	var fds []int
	must(t, asUID(ns, uid, func() error {
		for _, typ := range []int{unix.SOCK_DGRAM, unix.SOCK_STREAM} {
			fd, err := unix.Socket(unix.AF_INET, typ|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return err
			}
			fds = append(fds, fd)
			if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
				return err
			}
			if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: addr.Addr().As4(), Port: int(addr.Port())}); err != nil {
				return fmt.Errorf("bind as uid %d: %w", uid, err)
			}
			if typ == unix.SOCK_STREAM {
				if err := unix.Listen(fd, 16); err != nil {
					return err
				}
			}
		}
		return nil
	}))
	t.Cleanup(func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	})

	w := startWatcher(t, ns, watcherConfig(t, addr))
	s := w.Current()
	want := []string{
		peer.UIDWarning(peer.Socket{Proto: peer.TCP, Addr: addr, UID: uid}, 0),
		peer.UIDWarning(peer.Socket{Proto: peer.UDP, Addr: addr, UID: uid}, 0),
	}
	if !s.Bound || !slices.Equal(s.UIDMismatch, want) {
		t.Errorf("state %+v\nwant bound with warnings %q", s, want)
	}
	for _, sock := range s.Sockets {
		if sock.UID != uid {
			t.Errorf("socket %v: UID %d, want %d", sock, sock.UID, uid)
		}
	}
	// The warning's reason: a root SO_REUSEPORT socket cannot join.
	err := ns.Do(func() error {
		c, err := (&net.ListenConfig{Control: reusePortControl}).ListenPacket(context.Background(), "udp4", addr.String())
		if err == nil {
			c.Close()
		}
		return err
	})
	if !errors.Is(err, unix.EADDRINUSE) {
		t.Errorf("root bind beside a UID %d reuseport socket: %v, want EADDRINUSE", uid, err)
	}
}

// asUID runs fn inside ns on a thread whose effective UID is uid. Linux
// credentials belong to a thread, so only that thread changes; the thread
// is never handed back to the Go scheduler (the goroutine exits locked).
func asUID(ns *nstest.Namespace, uid int, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with us
		nsfd, err := unix.Open(ns.Path(), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		defer unix.Close(nsfd)
		if err := unix.Setns(nsfd, unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		// The raw syscall changes this thread only (syscall.Setresuid
		// would change every thread of the process).
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(uid), ^uintptr(0)); e != 0 {
			errc <- fmt.Errorf("setresuid: %w", e)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// TestProbe probes a real CoreDNS sharing its UDP group with a socket that
// answers as dnsstandby: the kernel's 4-tuple hash sends each source port
// to one of them, and the NSID tells which.
func TestProbe(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()

	var toLocalDNS, toSelf uint16
	for i := 0; i < 64 && (toLocalDNS == 0 || toSelf == 0); i++ {
		var p *peer.Prober
		must(t, e.ns.Do(func() error {
			var err error
			p, err = peer.NewProber(probeConfig(listen, nil))
			return err
		}))
		res := p.Probe(ctx)
		switch {
		case res.OK:
			if res.NSID != "" || res.Rcode != 0 {
				t.Errorf("health-check reply: NSID %q rcode %d, want none (the whoami block has no nsid) and NOERROR", res.NSID, res.Rcode)
			}
			toLocalDNS = p.SourcePort()
		case errors.Is(res.Err, peer.ErrSelfReply):
			if res.NSID != peer.SelfNSID {
				t.Errorf("self reply with NSID %q", res.NSID)
			}
			toSelf = p.SourcePort()
		default:
			t.Fatalf("probe from port %d: %v", p.SourcePort(), res.Err)
		}
		p.Close()
	}
	if toLocalDNS == 0 || toSelf == 0 {
		t.Fatalf("64 source ports did not reach both sockets (CoreDNS port %d, ours %d)", toLocalDNS, toSelf)
	}
	newProber := func(port uint16, name string, timeout time.Duration) *peer.Prober {
		var p *peer.Prober
		must(t, e.ns.Do(func() error {
			var err error
			p, err = peer.NewProber(probeConfig(listen, func(c *peer.ProbeConfig) { c.SourcePort, c.Name, c.Timeout = port, name, timeout }))
			return err
		}))
		t.Cleanup(func() { p.Close() })
		return p
	}

	t.Run("self", func(t *testing.T) {
		p := newProber(toSelf, probeName, peer.DefaultProbeConfig().Timeout)
		res := p.Probe(ctx)
		if res.OK || !errors.Is(res.Err, peer.ErrSelfReply) || res.NSID != peer.SelfNSID {
			t.Errorf("probe answered by our socket: %+v, want not OK with ErrSelfReply", res)
		}
	})

	const stopTimeout = 300 * time.Millisecond
	p := newProber(toLocalDNS, probeName, stopTimeout)
	var rtts []time.Duration
	for range 50 {
		res := p.Probe(ctx)
		if !res.OK || res.NSID != "localdns-pod" || res.Rcode != 0 {
			t.Fatalf("probe to CoreDNS: %+v, want OK with NSID localdns-pod", res)
		}
		rtts = append(rtts, res.RTT)
	}
	sort.Slice(rtts, func(i, j int) bool { return rtts[i] < rtts[j] })
	t.Logf("probe RTT to CoreDNS over 50 probes: min %v median %v p90 %v max %v",
		rtts[0], rtts[len(rtts)/2], rtts[len(rtts)*9/10], rtts[len(rtts)-1])

	must(t, e.coredns.Freeze())
	stopped := true
	defer func() {
		if stopped {
			e.coredns.Signal(syscall.SIGCONT)
		}
	}()
	start := time.Now()
	res := p.Probe(ctx)
	took := time.Since(start)
	if res.OK || !errors.Is(res.Err, os.ErrDeadlineExceeded) {
		t.Errorf("probe to a stopped CoreDNS: %+v, want a timeout", res)
	}
	if took < stopTimeout || took > stopTimeout+250*time.Millisecond {
		t.Errorf("probe to a stopped CoreDNS gave up after %v, want %v", took, stopTimeout)
	}
	must(t, e.coredns.Signal(syscall.SIGCONT))
	stopped = false
	// CoreDNS answers the queued probe first; its late reply is skipped.
	res = p.Probe(ctx)
	if !res.OK || res.NSID != "localdns-pod" {
		t.Errorf("probe after SIGCONT: %+v, want OK", res)
	}
	t.Logf("stopped: timed out after %v; after SIGCONT: OK in %v", took, res.RTT)
}
