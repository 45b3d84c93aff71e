package steer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"
)

// These tests steer real reuseport groups in a network namespace: a "peer"
// socket stands in for LocalDNS, "our" socket for dnsstandby. They need
// root (namespaces, BPF, pidfd_getfd) and skip without it.

// testStall keeps stall phases short; the heartbeat loop beats every
// testBeat, well inside it even under the race detector. testUnread is
// the read test's limit: long enough that a reader goroutine under the
// race detector on a busy machine is never taken for stalled.
const (
	testStall  = 600 * time.Millisecond
	testBeat   = 25 * time.Millisecond
	testUnread = 300 * time.Millisecond
)

var listenAddr = netip.MustParseAddrPort("127.0.0.1:53")

// lab is one namespace with a Steerer at level Adopt and a heartbeat loop.
type lab struct {
	t      *testing.T
	ns     *nstest.Namespace
	s      *Steerer
	paused atomic.Bool // stops the heartbeat loop (a stalled dnsstandby)
}

func newLab(t *testing.T) *lab {
	t.Helper()
	nstest.RequireRoot(t)
	s, err := New(labConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if s.Level() != Adopt {
		t.Skipf("steering level here is %v, these tests need adopt: %s", s.Level(), s.Why())
	}
	l := &lab{t: t, ns: nstest.New(t, "steer"), s: s}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		tick := time.NewTicker(testBeat)
		defer tick.Stop()
		for {
			if !l.paused.Load() {
				if err := s.Heartbeat(); err != nil && !errors.Is(err, ErrClosed) {
					t.Errorf("heartbeat: %v", err)
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return l
}

func (l *lab) must(err error) {
	l.t.Helper()
	if err != nil {
		l.t.Fatal(err)
	}
}

// labConfig is the lab's Steerer config: the best level, a short stall
// limit, and the test's log.
func labConfig(t *testing.T) Config {
	cfg := DefaultConfig()
	cfg.StallAfter = testStall
	cfg.UnreadAfter = testUnread
	cfg.Logger = testkit.Logger(t)
	return cfg
}

// stall stops the heartbeat and waits until the program must see it stale.
func (l *lab) stall() {
	l.paused.Store(true)
	time.Sleep(testStall + 2*testBeat)
}

// resume beats once at once, then lets the loop go on.
func (l *lab) resume() {
	l.must(l.s.Heartbeat())
	l.paused.Store(false)
}

// reuseport joins the group, with a receive queue deep enough for a whole
// phase's datagrams even if the reader is slow to be scheduled.
func reuseport(network, address string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		if serr == nil && network[:3] == "udp" {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20)
		}
	})
	return errors.Join(err, serr)
}

// udpSock is a reuseport UDP socket in the namespace counting what it reads.
type udpSock struct {
	conn *net.UDPConn
	n    atomic.Int64
	done chan struct{}
}

func (l *lab) listenUDP() *udpSock {
	l.t.Helper()
	var conn *net.UDPConn
	l.must(l.ns.Do(func() error {
		lc := net.ListenConfig{Control: reuseport}
		pc, err := lc.ListenPacket(context.Background(), "udp4", listenAddr.String())
		if err != nil {
			return err
		}
		conn = pc.(*net.UDPConn)
		return nil
	}))
	u := &udpSock{conn: conn, done: make(chan struct{})}
	l.t.Cleanup(func() { u.close() })
	go func() {
		defer close(u.done)
		buf := make([]byte, 512)
		for {
			if _, _, err := conn.ReadFromUDPAddrPort(buf); err != nil {
				return
			}
			u.n.Add(1)
		}
	}()
	return u
}

func (u *udpSock) close() { u.conn.Close(); <-u.done }

func rawConn(t *testing.T, c syscall.Conn) syscall.RawConn {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

// dupViaPidfd duplicates fd the way the caller takes LocalDNS's sockets:
// pidfd_open on the owner (here ourselves), then pidfd_getfd.
func dupViaPidfd(t *testing.T, c syscall.Conn) int {
	t.Helper()
	pidfd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pidfd)
	var dup int
	var derr error
	if err := rawConn(t, c).Control(func(fd uintptr) { dup, derr = unix.PidfdGetfd(pidfd, int(fd), 0) }); err != nil {
		t.Fatal(err)
	}
	if derr != nil {
		t.Fatalf("pidfd_getfd: %v", derr)
	}
	return dup
}

// adopt adopts c's socket through a pidfd duplicate and closes the
// duplicate at once, as the caller does.
func (l *lab) adopt(group string, c syscall.Conn) int {
	l.t.Helper()
	dup := dupViaPidfd(l.t, c)
	slot, err := l.s.Adopt(group, dup)
	unix.Close(dup)
	l.must(err)
	return slot
}

// sendUDP sends one datagram from each of n source ports (first, first+1,
// ...) to listenAddr, from inside the namespace.
func (l *lab) sendUDP(n, first int) {
	l.t.Helper()
	l.must(l.ns.Do(func() error {
		for i := range n {
			c, err := net.DialUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: first + i}, net.UDPAddrFromAddrPort(listenAddr))
			if err != nil {
				return err
			}
			_, err = c.Write([]byte("q"))
			c.Close()
			if err != nil {
				return err
			}
		}
		return nil
	}))
}

// sendProbes sends n datagrams from the one source address and port.
func (l *lab) sendProbes(n int, from netip.AddrPort) {
	l.t.Helper()
	l.must(l.ns.Do(func() error {
		c, err := net.DialUDP("udp4", net.UDPAddrFromAddrPort(from), net.UDPAddrFromAddrPort(listenAddr))
		if err != nil {
			return err
		}
		defer c.Close()
		for range n {
			if _, err := c.Write([]byte("p")); err != nil {
				return err
			}
		}
		return nil
	}))
}

type counter interface{ count() int64 }

func (u *udpSock) count() int64 { return u.n.Load() }

// measure beats (unless the heartbeat is paused), runs send, and returns
// how many of want packets each counter got, waiting until all arrived.
func (l *lab) measure(want int64, send func(), cs ...counter) []int64 {
	l.t.Helper()
	if !l.paused.Load() {
		if err := l.s.Heartbeat(); err != nil && !errors.Is(err, ErrClosed) {
			l.t.Fatal(err)
		}
	}
	before := make([]int64, len(cs))
	for i, c := range cs {
		before[i] = c.count()
	}
	send()
	got := make([]int64, len(cs))
	var sum int64
	arrived := func() bool {
		sum = 0
		for i, c := range cs {
			got[i] = c.count() - before[i]
			sum += got[i]
		}
		return sum >= want
	}
	defer func() {
		if sum != want {
			l.t.Logf("%d of %d packets arrived (per socket %v); namespace counters:\n%s", sum, want, got, l.snmp())
		}
	}()
	testkit.Eventually(l.t, 3*time.Second, fmt.Sprintf("%d packets", want), arrived)
	if sum != want {
		l.t.Fatalf("%d packets arrived, want %d", sum, want)
	}
	return got
}

// snmp returns the namespace's UDP and TCP counters, to tell a full
// receive queue from a misrouted packet.
func (l *lab) snmp() string {
	var out []byte
	err := l.ns.Do(func() error {
		var err error
		out, err = os.ReadFile("/proc/thread-self/net/snmp")
		return err
	})
	if err != nil {
		return err.Error()
	}
	return string(out)
}

// results collects the measured counts for the test log (and the report).
type results struct {
	t    *testing.T
	mu   sync.Mutex
	rows []string
}

func (r *results) add(phase string, got []int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rows = append(r.rows, fmt.Sprintf("%-58s %v", phase, got))
}

func (r *results) log() {
	for _, row := range r.rows {
		r.t.Log(row)
	}
}

// check fails unless got matches want, where a want of -1 means "about
// half" (35–65%, the kernel hash over two sockets).
func check(t *testing.T, phase string, got []int64, want ...int64) {
	t.Helper()
	var total int64
	for _, g := range got {
		total += g
	}
	for i := range want {
		if want[i] == -1 {
			if got[i] < total*35/100 || got[i] > total*65/100 {
				t.Errorf("%s: %v, want about half each", phase, got)
				return
			}
		} else if got[i] != want[i] {
			t.Errorf("%s: %v (ours, peer), want %v", phase, got, want)
			return
		}
	}
}

func TestUDPSteering(t *testing.T) {
	l := newLab(t)
	res := &results{t: t}
	defer res.log()
	const n = 1000
	port := 20000
	phase := func(name string, want ...int64) func(cs ...counter) {
		return func(cs ...counter) {
			t.Helper()
			got := l.measure(n, func() { l.sendUDP(n, port) }, cs...)
			port += n
			res.add(name, got)
			check(t, name, got, want...)
		}
	}

	peer := l.listenUDP()
	our := l.listenUDP()
	l.must(l.s.AddGroup("udp", rawConn(t, our.conn), true))

	phase("hash", -1, -1)(our, peer)
	l.must(l.s.SetMode(ToUs))
	phase("to-us", n, 0)(our, peer)

	l.must(l.s.SetMode(ToPeer))
	phase("to-peer, nothing adopted: falls back to us", n, 0)(our, peer)
	slot := l.adopt("udp", peer.conn)
	if slot != 1 {
		t.Errorf("first adopted slot %d, want 1", slot)
	}
	if again := l.adopt("udp", peer.conn); again != slot {
		t.Errorf("adopting the same socket again: slot %d, want %d", again, slot)
	}
	if n, err := l.s.Peers("udp"); err != nil || n != 1 {
		t.Errorf("Peers = %d, %v; want 1", n, err)
	}
	if err := testutil.CollectAndCompare(l.s, strings.NewReader(`
# HELP dnsstandby_steer_adoptions_total LocalDNS sockets adopted into a steering map.
# TYPE dnsstandby_steer_adoptions_total counter
dnsstandby_steer_adoptions_total 1
# HELP dnsstandby_steer_group_level Steering level of each reuseport group (1) among own and adopt.
# TYPE dnsstandby_steer_group_level gauge
dnsstandby_steer_group_level{group="udp",level="adopt"} 1
dnsstandby_steer_group_level{group="udp",level="own"} 0
# HELP dnsstandby_steer_level Steering level in use (1) among off, own and adopt.
# TYPE dnsstandby_steer_level gauge
dnsstandby_steer_level{level="adopt"} 1
dnsstandby_steer_level{level="off"} 0
dnsstandby_steer_level{level="own"} 0
# HELP dnsstandby_steer_level_wanted Highest steering level asked for (1) among off, own and adopt; auto asks for adopt.
# TYPE dnsstandby_steer_level_wanted gauge
dnsstandby_steer_level_wanted{level="adopt"} 1
dnsstandby_steer_level_wanted{level="off"} 0
dnsstandby_steer_level_wanted{level="own"} 0
# HELP dnsstandby_steer_mode Steering mode the program applies (1) among hash, to-peer and to-us.
# TYPE dnsstandby_steer_mode gauge
dnsstandby_steer_mode{mode="hash"} 0
dnsstandby_steer_mode{mode="to-peer"} 1
dnsstandby_steer_mode{mode="to-us"} 0
# HELP dnsstandby_steer_peers LocalDNS sockets adopted into the group's steering map and still open.
# TYPE dnsstandby_steer_peers gauge
dnsstandby_steer_peers{group="udp"} 1
`), "dnsstandby_steer_adoptions_total", "dnsstandby_steer_group_level", "dnsstandby_steer_level", "dnsstandby_steer_level_wanted",
		"dnsstandby_steer_mode", "dnsstandby_steer_peers"); err != nil {
		t.Error(err)
	}
	phase("to-peer, peer adopted (dup closed)", 0, n)(our, peer)

	// A probe from the probe port reaches the peer while we hold.
	l.must(l.s.SetMode(ToUs))
	l.must(l.s.SetProbe(probeSource))
	got := l.measure(100, func() { l.sendProbes(100, probeSource) }, our, peer)
	res.add("to-us, 100 probes from the probe port", got)
	check(t, "to-us, probes", got, 0, 100)
	phase("to-us, other ports with a probe port set", n, 0)(our, peer)

	// A stalled dnsstandby loses its traffic to the peer, then gets it back.
	l.stall()
	phase("to-us, heartbeat stale, peer adopted", 0, n)(our, peer)
	l.resume()
	phase("to-us, heartbeat fresh again", n, 0)(our, peer)

	// How soon after the last beat does the program stop selecting us?
	// One datagram every 10 ms until one reaches the peer.
	l.must(l.s.Heartbeat())
	l.paused.Store(true)
	last := time.Now()
	var took time.Duration
	for p := 45000; ; p++ {
		got := l.measure(1, func() { l.sendUDP(1, p) }, our, peer)
		if got[1] == 1 {
			took = time.Since(last)
			break
		}
		if time.Since(last) > 3*testStall {
			t.Fatalf("still selected %v after the last heartbeat (stall limit %v)", time.Since(last), testStall)
		}
		time.Sleep(10 * time.Millisecond)
	}
	res.add(fmt.Sprintf("stall noticed %v after the last beat (limit %v)", took.Round(time.Millisecond), testStall), nil)
	if took < testStall-20*time.Millisecond || took > testStall+250*time.Millisecond {
		t.Errorf("stall noticed after %v, want about %v", took, testStall)
	}
	l.resume()

	// Stalled with no peer adopted: the kernel hash.
	l.must(l.s.ClearPeers("udp"))
	l.stall()
	phase("to-us, heartbeat stale, no peer: hash", -1, -1)(our, peer)
	l.resume()
	phase("to-us, fresh, no peer", n, 0)(our, peer)

	// The peer closes: its slot empties by itself and we get everything.
	l.must(l.s.SetMode(ToPeer))
	l.adopt("udp", peer.conn)
	phase("to-peer, re-adopted", 0, n)(our, peer)
	peer.close()
	if n, err := l.s.Peers("udp"); err != nil || n != 0 {
		t.Errorf("after the peer closed: Peers = %d, %v; want 0", n, err)
	}
	if err := testutil.CollectAndCompare(l.s, strings.NewReader(`
# HELP dnsstandby_steer_peers LocalDNS sockets adopted into the group's steering map and still open.
# TYPE dnsstandby_steer_peers gauge
dnsstandby_steer_peers{group="udp"} 0
`), "dnsstandby_steer_peers"); err != nil {
		t.Errorf("after the peer closed: %v", err)
	}
	phase("to-peer, peer closed: slot empty, all to us", n)(our)

	// Close detaches: a new peer shares by hash again, and no program is
	// left on the group.
	peer2 := l.listenUDP()
	l.must(l.s.SetMode(ToUs))
	phase("to-us, new peer not adopted", n, 0)(our, peer2)
	l.must(l.s.Close())
	l.must(l.s.Close())
	phase("after Close: hash", -1, -1)(our, peer2)
	assertDetached(t, our.conn)
}

// assertDetached checks that the group has no program: detaching again
// reports ENOENT.
func assertDetached(t *testing.T, c syscall.Conn) {
	t.Helper()
	var serr error
	if err := rawConn(t, c).Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_DETACH_REUSEPORT_BPF, 0)
	}); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(serr, unix.ENOENT) {
		t.Errorf("SO_DETACH_REUSEPORT_BPF after Close: %v, want ENOENT (no program left)", serr)
	}
}

// tcpListener is a reuseport TCP listener counting accepted connections.
type tcpListener struct {
	ln   *net.TCPListener
	n    atomic.Int64
	done chan struct{}
}

func (t *tcpListener) count() int64 { return t.n.Load() }

// listenTCP listens on listenAddr; mptcp says whether the listener is MPTCP
// (Go's default for listeners since 1.24, so CoreDNS's may be).
func (l *lab) listenTCP(mptcp bool) *tcpListener {
	l.t.Helper()
	var ln *net.TCPListener
	l.must(l.ns.Do(func() error {
		lc := net.ListenConfig{Control: reuseport}
		lc.SetMultipathTCP(mptcp)
		x, err := lc.Listen(context.Background(), "tcp4", listenAddr.String())
		if err != nil {
			return err
		}
		ln = x.(*net.TCPListener)
		return nil
	}))
	tl := &tcpListener{ln: ln, done: make(chan struct{})}
	l.t.Cleanup(func() { ln.Close(); <-tl.done })
	go func() {
		defer close(tl.done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tl.n.Add(1)
			c.Close()
		}
	}()
	return tl
}

// probeSource is where the lab's prober sends from.
var probeSource = netip.MustParseAddrPort("127.0.0.1:40000")

// TestProbeSource: while we hold, only what comes from the prober's own
// address and port goes to LocalDNS. A pod that sends from the probe's
// port, from its own address, is steered as any other query: to us.
// (127.0.0.2 is another local address here, as a pod's is another source
// address on the node; the kernel drops a packet that arrives from
// outside with one of the node's own addresses as its source, so a pod
// cannot pass for the prober.)
func TestProbeSource(t *testing.T) {
	l := newLab(t)
	res := &results{t: t}
	defer res.log()
	udpPeer, udpOur := l.listenUDP(), l.listenUDP()
	tcpPeer, tcpOur := l.listenTCP(false), l.listenTCP(false)
	l.must(l.s.AddGroup("udp", rawConn(t, udpOur.conn), true))
	l.must(l.s.AddGroup("tcp", rawConn(t, tcpOur.ln), false))
	l.adopt("udp", udpPeer.conn)
	l.adopt("tcp", tcpPeer.ln)
	l.must(l.s.SetMode(ToUs))
	l.must(l.s.SetProbe(probeSource))

	other := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), probeSource.Port())
	tests := []struct {
		name   string
		from   netip.AddrPort
		toPeer bool
	}{
		{"from the prober", probeSource, true},
		{"from the probe port, another address", other, false},
		{"from the prober's address, another port", netip.AddrPortFrom(probeSource.Addr(), probeSource.Port()+1), false},
	}
	for _, tt := range tests {
		want := []int64{100, 0}
		if tt.toPeer {
			want = []int64{0, 100}
		}
		got := l.measure(100, func() { l.sendProbes(100, tt.from) }, udpOur, udpPeer)
		res.add("udp "+tt.name, got)
		check(t, "udp "+tt.name, got, want...)

		want = []int64{1, 0}
		if tt.toPeer {
			want = []int64{0, 1}
		}
		got = l.measure(1, func() { l.dialTCPFrom(tt.from) }, tcpOur, tcpPeer)
		res.add("tcp "+tt.name, got)
		check(t, "tcp "+tt.name, got, want...)
	}

	// Off: no packet is a probe.
	l.must(l.s.SetProbe(netip.AddrPort{}))
	got := l.measure(100, func() { l.sendProbes(100, probeSource) }, udpOur, udpPeer)
	check(t, "udp, probe off", got, 100, 0)
}

// dialTCPFrom opens and closes one connection from the address and port
// from, inside the namespace.
func (l *lab) dialTCPFrom(from netip.AddrPort) {
	l.t.Helper()
	l.must(l.ns.Do(func() error {
		d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(from), Timeout: time.Second}
		c, err := d.Dial("tcp4", listenAddr.String())
		if err != nil {
			return err
		}
		return c.Close()
	}))
}

// dialTCP opens and closes n connections from inside the namespace.
func (l *lab) dialTCP(n int) {
	l.t.Helper()
	l.must(l.ns.Do(func() error {
		for range n {
			c, err := net.DialTimeout("tcp4", listenAddr.String(), time.Second)
			if err != nil {
				return err
			}
			c.Close()
		}
		return nil
	}))
}

func TestTCPSteering(t *testing.T) {
	l := newLab(t)
	res := &results{t: t}
	defer res.log()
	const n = 300
	phase := func(name string, want ...int64) func(cs ...counter) {
		return func(cs ...counter) {
			t.Helper()
			got := l.measure(n, func() { l.dialTCP(n) }, cs...)
			res.add(name, got)
			check(t, name, got, want...)
		}
	}
	peer := l.listenTCP(false)
	our := l.listenTCP(false)
	l.must(l.s.AddGroup("tcp", rawConn(t, our.ln), false))

	phase("tcp hash", -1, -1)(our, peer)
	l.must(l.s.SetMode(ToUs))
	phase("tcp to-us", n, 0)(our, peer)
	l.adopt("tcp", peer.ln)
	l.must(l.s.SetMode(ToPeer))
	phase("tcp to-peer, peer adopted", 0, n)(our, peer)
	l.must(l.s.SetMode(ToUs))
	l.stall()
	phase("tcp to-us, heartbeat stale", 0, n)(our, peer)
	l.resume()
	phase("tcp to-us, fresh again", n, 0)(our, peer)
	l.must(l.s.Close())
	phase("tcp after Close: hash", -1, -1)(our, peer)
	assertDetached(t, our.ln)
}

// Adopting a socket of another address, protocol, or our own is refused.
func TestAdoptChecks(t *testing.T) {
	l := newLab(t)
	our := l.listenUDP()
	l.must(l.s.AddGroup("udp", rawConn(t, our.conn), true))
	tcp := l.listenTCP(false)
	var other *net.UDPConn
	l.must(l.ns.Do(func() error {
		var err error
		other, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 54})
		return err
	}))
	defer other.Close()
	for name, c := range map[string]syscall.Conn{"our own": our.conn, "tcp": tcp.ln, "other port": other} {
		dup := dupViaPidfd(t, c)
		_, err := l.s.Adopt("udp", dup)
		unix.Close(dup)
		if !errors.Is(err, ErrWrongSocket) {
			t.Errorf("adopt %s: %v, want ErrWrongSocket", name, err)
		}
	}
	if _, err := l.s.Adopt("nope", 0); !errors.Is(err, ErrNoGroup) {
		t.Errorf("adopt into an unknown group: %v, want ErrNoGroup", err)
	}
	// MaxPeers sockets fill the group; one more is refused.
	for i := range MaxPeers {
		p := l.listenUDP()
		if slot := l.adopt("udp", p.conn); slot != i+1 {
			t.Errorf("peer %d went to slot %d", i, slot)
		}
	}
	p := l.listenUDP()
	dup := dupViaPidfd(t, p.conn)
	defer unix.Close(dup)
	if _, err := l.s.Adopt("udp", dup); !errors.Is(err, ErrGroupFull) {
		t.Errorf("adopt beyond MaxPeers: %v, want ErrGroupFull", err)
	}
}

// A dnsstandby that dies or stops (Leave) leaves its program on the group;
// traffic must still flow (to the peer), and a successor must take over the
// group and adopt the peer although the dead one's map still held it.
func TestDeathWithoutDetach(t *testing.T) {
	l := newLab(t)
	res := &results{t: t}
	defer res.log()
	const n = 1000
	port := 20000
	send := func() { l.sendUDP(n, port); port += n }

	peer := l.listenUDP()
	our := l.listenUDP()
	l.must(l.s.AddGroup("udp", rawConn(t, our.conn), true))
	l.adopt("udp", peer.conn)
	l.must(l.s.SetMode(ToUs))
	got := l.measure(n, send, our, peer)
	res.add("first instance, to-us", got)
	check(t, "first instance, to-us", got, n, 0)

	// Leave, or SIGKILL: our handles go, our socket closes, the program
	// stays.
	l.paused.Store(true)
	l.must(l.s.Leave())
	our.close()
	got = l.measure(n, send, peer)
	res.add("first instance dead (program left attached)", got)
	check(t, "first instance dead", got, n)

	// The successor binds, attaches its own program (replacing the dead
	// one's), and adopts the peer.
	s2, err := New(labConfig(t))
	l.must(err)
	defer s2.Close()
	our2 := l.listenUDP()
	l.must(s2.AddGroup("udp", rawConn(t, our2.conn), true))
	dup := dupViaPidfd(t, peer.conn)
	start := time.Now()
	_, err = s2.Adopt("udp", dup)
	unix.Close(dup)
	l.must(err)
	t.Logf("successor adopted the peer after %v (the dead instance's map had to be freed first)", time.Since(start).Round(time.Millisecond))
	l.must(s2.Heartbeat())
	l.must(s2.SetMode(ToPeer))
	got = l.measure(n, send, our2, peer)
	res.add("successor, to-peer", got)
	check(t, "successor, to-peer", got, 0, n)
	l.must(s2.Heartbeat())
	l.must(s2.SetMode(ToUs))
	got = l.measure(n, send, our2, peer)
	res.add("successor, to-us", got)
	check(t, "successor, to-us", got, n, 0)
	l.must(s2.Close())
	assertDetached(t, our2.conn)
}

// While Adopt waits for a socket to leave another steering map, the
// heartbeat goes on: Adopt pauses between tries without the lock that
// Heartbeat needs, so a slow adoption never stalls our traffic away.
func TestAdoptBusyKeepsHeartbeat(t *testing.T) {
	l := newLab(t)
	peer := l.listenUDP()
	our := l.listenUDP()
	l.must(l.s.AddGroup("udp", rawConn(t, our.conn), true))
	l.adopt("udp", peer.conn) // the peer stays in l.s's map: busy for s2

	s2, err := New(labConfig(t))
	l.must(err)
	defer s2.Close()
	our2 := l.listenUDP()
	l.must(s2.AddGroup("udp", rawConn(t, our2.conn), true))
	dup := dupViaPidfd(t, peer.conn)
	defer unix.Close(dup)

	adopted := make(chan error, 1)
	start := time.Now()
	go func() { _, err := s2.Adopt("udp", dup); adopted <- err }()
	beats := 0
	for done := false; !done; {
		select {
		case err := <-adopted:
			if !errors.Is(err, unix.EBUSY) {
				t.Errorf("Adopt of a socket in another live map: %v, want EBUSY", err)
			}
			done = true
		default:
			l.must(s2.Heartbeat())
			beats++
		}
	}
	took := time.Since(start)
	t.Logf("Adopt gave up after %v; %d heartbeats meanwhile", took.Round(time.Millisecond), beats)
	if took < adoptBusyWait {
		t.Errorf("Adopt gave up after %v, before adoptBusyWait %v", took, adoptBusyWait)
	}
	// Holding the lock through the wait lets a beat through only when
	// Adopt returns; without it, thousands go through.
	if beats < 500 {
		t.Errorf("%d heartbeats during a %v Adopt: the heartbeat waited for it", beats, took)
	}
}

// Go listeners are MPTCP by default (Go 1.24+, net.mptcp.enabled=1), and
// so is the TCP listener of a CoreDNS built with such a Go. A sockarray
// refuses MPTCP sockets: our listener must be plain TCP, LocalDNS's cannot
// be adopted, but steering SYNs to our plain listener still works.
func TestTCPWithMPTCPPeer(t *testing.T) {
	l := newLab(t)
	res := &results{t: t}
	defer res.log()
	if err := l.ns.Do(func() error {
		// Is MPTCP available here at all?
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_MPTCP)
		if err != nil {
			return err
		}
		return unix.Close(fd)
	}); err != nil {
		t.Skipf("no MPTCP here: %v", err)
	}
	peer := l.listenTCP(true)
	ourMPTCP := l.listenTCP(true)
	if err := l.s.AddGroup("tcp", rawConn(t, ourMPTCP.ln), false); !errors.Is(err, ErrMPTCP) {
		t.Fatalf("AddGroup with an MPTCP listener: %v, want ErrMPTCP", err)
	}
	ourMPTCP.ln.Close()
	our := l.listenTCP(false)
	l.must(l.s.AddGroup("tcp", rawConn(t, our.ln), false))
	dup := dupViaPidfd(t, peer.ln)
	_, err := l.s.Adopt("tcp", dup)
	unix.Close(dup)
	if !errors.Is(err, ErrMPTCP) {
		t.Errorf("adopting an MPTCP listener: %v, want ErrMPTCP", err)
	}
	if gl, err := l.s.GroupLevel("tcp"); err != nil || gl != Own {
		t.Errorf("GroupLevel after an MPTCP peer = %v, %v; want own", gl, err)
	}
	const n = 300
	phase := func(name string, want ...int64) {
		t.Helper()
		got := l.measure(n, func() { l.dialTCP(n) }, our, peer)
		res.add(name, got)
		check(t, name, got, want...)
	}
	phase("tcp, MPTCP peer, hash", -1, -1)
	l.must(l.s.SetMode(ToPeer))
	phase("tcp, MPTCP peer, to-peer (group at own): hash", -1, -1)
	l.must(l.s.SetMode(ToUs))
	phase("tcp, MPTCP peer, to-us", n, 0)
	l.stall()
	phase("tcp, MPTCP peer, to-us, stale: hash", -1, -1)
	l.resume()
}

// coreDNSSockets duplicates the sockets of process pid bound to addr of
// the given type (SOCK_DGRAM, SOCK_STREAM), as the caller finds LocalDNS's:
// every fd through pidfd_getfd, kept if getsockname and SO_TYPE match.
func coreDNSSockets(t *testing.T, pid int, addr netip.AddrPort, typ int) []int {
	t.Helper()
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pidfd)
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	var fds []int
	for _, e := range entries {
		target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name()))
		if err != nil || len(target) < 7 || target[:7] != "socket:" {
			continue
		}
		var n int
		fmt.Sscan(e.Name(), &n)
		dup, err := unix.PidfdGetfd(pidfd, n, 0)
		if err != nil {
			t.Fatalf("pidfd_getfd(%d, %d): %v", pid, n, err)
		}
		got, err := unix.GetsockoptInt(dup, unix.SOL_SOCKET, unix.SO_TYPE)
		sa, serr := unix.Getsockname(dup)
		in4, ok := sa.(*unix.SockaddrInet4)
		if err == nil && serr == nil && ok && got == typ &&
			netip.AddrPortFrom(netip.AddrFrom4(in4.Addr), uint16(in4.Port)) == addr {
			fds = append(fds, dup)
			continue
		}
		unix.Close(dup)
	}
	return fds
}

// A real CoreDNS as LocalDNS: its UDP socket adopted through pidfd_getfd,
// queries counted by who got them (CoreDNS answers; our socket only
// counts), and CoreDNS SIGKILLed.
func TestCoreDNSPeer(t *testing.T) {
	l := newLab(t)
	res := &results{t: t}
	defer res.log()
	core := nstest.StartCoreDNS(t, l.ns, nstest.CoreDNSConfig{
		Corefile: ".:53 {\n\tbind 127.0.0.1\n\twhoami\n}\n",
		Probe:    listenAddr.String(),
	})
	our := l.listenUDP()
	l.must(l.s.AddGroup("udp", rawConn(t, our.conn), true))
	ourTCP := l.listenTCP(false)
	l.must(l.s.AddGroup("tcp", rawConn(t, ourTCP.ln), false))

	fds := coreDNSSockets(t, core.Pid(), listenAddr, unix.SOCK_DGRAM)
	if len(fds) == 0 {
		t.Fatal("no UDP socket of CoreDNS's on", listenAddr)
	}
	for _, fd := range fds {
		_, err := l.s.Adopt("udp", fd)
		unix.Close(fd)
		l.must(err)
	}
	for _, fd := range coreDNSSockets(t, core.Pid(), listenAddr, unix.SOCK_STREAM) {
		_, err := l.s.Adopt("tcp", fd)
		unix.Close(fd)
		res.add(fmt.Sprintf("adopting CoreDNS's TCP listener: %v", err), nil)
	}

	const n = 300
	port := 30000
	// queries sends n queries from distinct ports and returns how many our
	// socket got and how many CoreDNS answered.
	queries := func(name string, want ...int64) {
		t.Helper()
		answered := &atomicCounter{}
		var done func()
		got := l.measure(n, func() { done = l.query(n, port, answered, our) }, our, answered)
		done()
		port += n
		res.add(name+" (ours, CoreDNS)", got)
		check(t, name, got, want...)
	}
	l.must(l.s.SetMode(ToPeer))
	queries("coredns adopted, to-peer", 0, n)
	l.must(l.s.SetMode(ToUs))
	queries("coredns adopted, to-us", n, 0)
	l.must(l.s.SetMode(ToPeer))
	l.must(core.Signal(syscall.SIGKILL))
	<-core.Done()
	if n, err := l.s.Peers("udp"); err != nil || n != 0 {
		t.Errorf("after CoreDNS died: Peers = %d, %v; want 0", n, err)
	}
	got := l.measure(n, func() { l.sendUDP(n, port) }, our)
	res.add("coredns SIGKILLed, to-peer", got)
	check(t, "coredns SIGKILLed", got, n)
}

type atomicCounter struct{ n atomic.Int64 }

func (c *atomicCounter) count() int64 { return c.n.Load() }

// query sends one DNS query from each of n ports and counts the answers in
// answered; queries our socket got are not answered. It sends in windows
// of 25, each once the last has been answered or reached ours, so a
// CoreDNS slowed by a busy machine does not overflow its receive queue.
// done closes the clients and waits for their readers.
func (l *lab) query(n, first int, answered *atomicCounter, ours counter) (done func()) {
	l.t.Helper()
	const window = 25
	q := []byte{0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 7, 'e', 'x', 'a', 'm', 'p', 'l', 'e', 0, 0, 1, 0, 1}
	var wg sync.WaitGroup
	conns := make([]*net.UDPConn, 0, n)
	done = func() {
		for _, c := range conns {
			c.Close()
		}
		wg.Wait()
	}
	base := answered.count() + ours.count()
	for sent := 0; sent < n; {
		batch := min(window, n-sent)
		l.must(l.ns.Do(func() error {
			for i := range batch {
				c, err := net.DialUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: first + sent + i}, net.UDPAddrFromAddrPort(listenAddr))
				if err != nil {
					return err
				}
				conns = append(conns, c)
				if _, err := c.Write(q); err != nil {
					return err
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					buf := make([]byte, 512)
					if _, err := c.Read(buf); err == nil {
						answered.n.Add(1)
					}
				}()
			}
			return nil
		}))
		sent += batch
		// Up to a second for the batch's answers; what is still missing
		// then is counted by the caller as lost.
		_ = testkit.Poll(context.Background(), time.Second, func() (bool, error) {
			return answered.count()+ours.count()-base >= int64(sent), nil
		})
	}
	return done
}

// Adding a group again moves it to a new socket of ours (the responder
// re-opened its socket while LocalDNS kept the group alive).
func TestReAddGroup(t *testing.T) {
	l := newLab(t)
	res := &results{t: t}
	defer res.log()
	const n = 1000
	peer := l.listenUDP()
	our := l.listenUDP()
	l.must(l.s.AddGroup("udp", rawConn(t, our.conn), true))
	l.must(l.s.SetMode(ToUs))
	got := l.measure(n, func() { l.sendUDP(n, 20000) }, our, peer)
	res.add("to-us", got)
	check(t, "to-us", got, n, 0)
	our.close()
	our2 := l.listenUDP()
	got = l.measure(n, func() { l.sendUDP(n, 21000) }, our2, peer)
	res.add("our socket re-opened, not yet re-added: slot 0 empty", got)
	check(t, "not re-added", got, -1, -1)
	l.must(l.s.AddGroup("udp", rawConn(t, our2.conn), true))
	got = l.measure(n, func() { l.sendUDP(n, 22000) }, our2, peer)
	res.add("re-added", got)
	check(t, "re-added", got, n, 0)
	tcp := l.listenTCP(false)
	if err := l.s.AddGroup("udp", rawConn(t, tcp.ln), false); err == nil {
		t.Error("re-adding a udp group as tcp: no error")
	}
	l.must(l.s.Close())
	assertDetached(t, our2.conn)
}

// A successor at level Off finds the program its predecessor left (Leave)
// and detaches it: Off shares by the kernel's hash, as it says.
func TestOffDetachesLeftover(t *testing.T) {
	l := newLab(t)
	peer := l.listenUDP()
	our := l.listenUDP()
	l.must(l.s.AddGroup("udp", rawConn(t, our.conn), true))
	l.adopt("udp", peer.conn)
	l.must(l.s.Heartbeat())
	l.must(l.s.SetMode(ToPeer))
	l.must(l.s.Leave())
	our.close()

	offCfg := labConfig(t)
	offCfg.Want = WantOff
	off, err := New(offCfg)
	l.must(err)
	defer off.Close()
	our2 := l.listenUDP()
	l.must(off.AddGroup("udp", rawConn(t, our2.conn), true))
	assertDetached(t, our2.conn)
	const n = 1000
	got := l.measure(n, func() { l.sendUDP(n, 30000) }, our2, peer)
	if got[0] < n/5 || got[1] < n/5 {
		t.Errorf("after the leftover was detached: %v to us and the peer, want both a share of %d (the hash)", got, n)
	}
}

// TestHandedOverSocket: a restart through systemd's fd store keeps our
// socket open across processes, so the successor adds the very socket the
// predecessor's program (left attached by Leave) still holds in its map.
// AddGroup attaches first and fills our slot once that map lets go.
func TestHandedOverSocket(t *testing.T) {
	l := newLab(t)
	const n = 1000
	port := 20000
	send := func() { l.sendUDP(n, port); port += n }

	peer := l.listenUDP()
	our := l.listenUDP()
	l.must(l.s.AddGroup("udp", rawConn(t, our.conn), true))
	l.adopt("udp", peer.conn)
	l.must(l.s.SetMode(ToUs))
	l.paused.Store(true)
	l.must(l.s.Leave())

	s2, err := New(labConfig(t))
	l.must(err)
	defer s2.Close()
	start := time.Now()
	l.must(s2.AddGroup("udp", rawConn(t, our.conn), true))
	t.Logf("successor put the handed-over socket in its map after %v", time.Since(start).Round(time.Millisecond))
	l.must(s2.Heartbeat())
	l.must(s2.SetMode(ToUs))
	got := l.measure(n, send, our, peer)
	check(t, "successor on the handed-over socket, to-us", got, n, 0)
	l.must(s2.Close())
	assertDetached(t, our.conn)
}

// TestForeignPrograms: New warns about sk_reuseport programs someone
// else loaded, since attaching ours replaces one on a group, and not about
// dnsstandby's own: a predecessor's (left attached across a restart by
// design, Leave) is listed by the kernel under the name truncated to 15
// bytes. A program that only takes our name is still foreign. Programs
// are matched by id: other tests on the same kernel may load their own.
func TestForeignPrograms(t *testing.T) {
	nstest.RequireRoot(t)
	trivial := func(name string) func(t *testing.T) *ebpf.Program {
		return func(t *testing.T) *ebpf.Program {
			p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
				Name: name,
				Type: ebpf.SkReuseport,
				Instructions: asm.Instructions{
					asm.Mov.Imm(asm.R0, 1), // SK_PASS
					asm.Return(),
				},
				License: "GPL",
			})
			if err != nil {
				t.Fatalf("load sk_reuseport program %s: %v", name, err)
			}
			return p
		}
	}
	for _, tc := range []struct {
		name string
		load func(t *testing.T) *ebpf.Program
		warn bool
	}{
		{"previous process's program", func(t *testing.T) *ebpf.Program {
			prev, err := loadGroup("previous", true)
			if err != nil {
				t.Fatal(err)
			}
			// The program stays loaded after the maps' handles close, as
			// an attached program outlives the process that loaded it.
			prog := prev.prog
			prev.prog = nil
			prev.closeObjects()
			return prog
		}, false},
		{"foreign program", trivial("other_steerer"), true},
		{"foreign program under our name", trivial(programName), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prog := tc.load(t)
			defer prog.Close()
			info, err := prog.Info()
			if err != nil {
				t.Fatal(err)
			}
			id, _ := info.ID()
			var logs bytes.Buffer
			cfg := labConfig(t)
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			s, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if s.Level() == Off {
				t.Skipf("steering level here is off: %s", s.Why())
			}
			named := strings.Contains(logs.String(), fmt.Sprintf("id %d name", id))
			if named != tc.warn {
				t.Errorf("program id %d named in the warning: %v, want %v; log:\n%s", id, named, tc.warn, logs.String())
			}
		})
	}
}

// countingSock is our UDP socket read as the responder reads it: each
// read that returns a datagram adds 1 to the group's read counter, once
// it has one; stop makes it stop reading (a SIGSTOPped dnsstandby) until
// resumed.
type countingSock struct {
	conn    *net.UDPConn
	n       atomic.Int64
	reads   atomic.Pointer[atomic.Uint64]
	stopped atomic.Bool
	done    chan struct{}
}

func (l *lab) listenCounting() *countingSock {
	l.t.Helper()
	u := l.listenUDPConn()
	c := &countingSock{conn: u, done: make(chan struct{})}
	l.t.Cleanup(func() { c.stopped.Store(false); c.conn.Close(); <-c.done })
	go func() {
		defer close(c.done)
		buf := make([]byte, 512)
		for {
			for c.stopped.Load() {
				time.Sleep(time.Millisecond)
			}
			if _, _, err := c.conn.ReadFromUDPAddrPort(buf); err != nil {
				return
			}
			if r := c.reads.Load(); r != nil {
				r.Add(1)
			}
			c.n.Add(1)
		}
	}()
	return c
}

func (c *countingSock) count() int64 { return c.n.Load() }

// listenUDPConn binds a reuseport UDP socket on listenAddr in the
// namespace.
func (l *lab) listenUDPConn() *net.UDPConn {
	l.t.Helper()
	var conn *net.UDPConn
	l.must(l.ns.Do(func() error {
		lc := net.ListenConfig{Control: reuseport}
		pc, err := lc.ListenPacket(context.Background(), "udp4", listenAddr.String())
		if err != nil {
			return err
		}
		conn = pc.(*net.UDPConn)
		return nil
	}))
	return conn
}

// settled returns c's count once it has not changed for 60 ms.
func settled(c counter) int64 {
	last := c.count()
	for same := 0; same < 3; {
		time.Sleep(20 * time.Millisecond)
		now := c.count()
		if now == last {
			same++
		} else {
			last, same = now, 0
		}
	}
	return last
}

// steerMetric is the value of one of the Steerer's series, by name and
// group label.
func steerMetric(t *testing.T, s *Steerer, name, group string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(s)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "group" && lp.GetValue() == group {
					if c := m.GetCounter(); c != nil {
						return c.GetValue()
					}
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{group=%q}", name, group)
	return 0
}

// TestReadTest: with our reads counted, a dnsstandby that stops reading
// while it holds the traffic loses it to the peer about UnreadAfter after
// the first packet left waiting, with the heartbeat still fresh; it gets
// it back as soon as it reads again; and waiting idle for longer than
// the limit takes nothing away.
func TestReadTest(t *testing.T) {
	l := newLab(t)
	res := &results{t: t}
	defer res.log()
	const n = 1000
	port := 20000
	phase := func(name string, want ...int64) func(cs ...counter) {
		return func(cs ...counter) {
			t.Helper()
			got := l.measure(n, func() { l.sendUDP(n, port) }, cs...)
			port += n
			res.add(name, got)
			check(t, name, got, want...)
		}
	}
	peer := l.listenUDP()
	our := l.listenCounting()
	l.must(l.s.AddGroup("udp", rawConn(t, our.conn), true))
	l.adopt("udp", peer.conn)
	l.must(l.s.SetMode(ToUs))
	phase("to-us, reads not counted", n, 0)(our, peer)

	reads, err := l.s.Reads("udp")
	l.must(err)
	if again, err := l.s.Reads("udp"); err != nil || again != reads {
		t.Errorf("Reads again = %p, %v; want the same counter %p", again, err, reads)
	}
	our.reads.Store(reads)
	phase("to-us, reads counted", n, 0)(our, peer)
	if reads.Load() == 0 {
		t.Fatal("the reader counted no reads")
	}

	// Idle for three limits, then a burst: nothing waited, nothing moves.
	time.Sleep(3 * testUnread)
	phase("to-us, after idling 3 limits", n, 0)(our, peer)

	// Stop reading; one datagram every 5 ms until one reaches the peer.
	// The heartbeat loop beats on: only the read test can see it.
	our.stopped.Store(true)
	time.Sleep(50 * time.Millisecond) // let the reader park
	before := []int64{our.count(), peer.count()}
	first := time.Now()
	var took time.Duration
	sent := int64(0)
	for p := 45000; ; p++ {
		l.sendUDP(1, p)
		sent++
		if peer.count() > before[1] {
			took = time.Since(first)
			break
		}
		if time.Since(first) > 3*testUnread+testStall {
			t.Fatalf("still selected %v after we stopped reading (limit %v)", time.Since(first), testUnread)
		}
		time.Sleep(5 * time.Millisecond)
	}
	res.add(fmt.Sprintf("not reading: bypassed %v after the first datagram left waiting (limit %v)", took.Round(time.Millisecond), testUnread), nil)
	if took < testUnread-20*time.Millisecond || took > testUnread+250*time.Millisecond {
		t.Errorf("not reading noticed after %v, want about %v", took, testUnread)
	}
	// The peer's reader may be a datagram behind: let it settle.
	toPeer := settled(peer) - before[1]
	phase("to-us, not reading, heartbeat fresh: all to the peer", 0, n)(our, peer)
	if got := steerMetric(t, l.s, "dnsstandby_steer_unread_bypassed_total", "udp"); got != float64(n+toPeer) {
		t.Errorf("bypassed %v, want %d (the phase's datagrams and the %d kept from us before)", got, n+toPeer, toPeer)
	}

	// With the read test off (the peer does not answer: a hung LocalDNS)
	// the datagrams wait for us, however long; the heartbeat decides.
	l.must(l.s.SetReadTest(false))
	l.sendUDP(n, port)
	port += n
	if got := settled(peer) - before[1]; got != toPeer+n {
		t.Errorf("read test off, not reading: the peer got %d, want none of %d", got-toPeer-n, n)
	} else {
		res.add("to-us, not reading, read test off: all wait for us", []int64{n, 0})
	}
	l.must(l.s.SetReadTest(true))

	// Reading again: the datagrams that waited are read, and the next
	// ones are ours.
	our.stopped.Store(false)
	testkit.Eventually(t, 3*time.Second, "the waiting datagrams read", func() bool { return our.count()-before[0] == sent-toPeer+n })
	phase("to-us, reading again", n, 0)(our, peer)
	if w := steerMetric(t, l.s, "dnsstandby_steer_unread_max_wait_seconds", "udp"); w <= 0 || w > testUnread.Seconds() {
		t.Errorf("max wait %vs, want some, within the limit %v", w, testUnread)
	}

	// TCP groups have no read test.
	tcp := l.listenTCP(false)
	l.must(l.s.AddGroup("tcp", rawConn(t, tcp.ln), false))
	if _, err := l.s.Reads("tcp"); err == nil {
		t.Error("Reads of a TCP group: no error")
	}

	// After Close the counter is anonymous memory: a loop still adding
	// to it neither faults nor keeps the map.
	l.must(l.s.Close())
	v := reads.Load()
	reads.Add(1)
	if reads.Load() != v+1 {
		t.Errorf("counter after Close: %d, want %d", reads.Load(), v+1)
	}
	if _, err := l.s.Reads("udp"); !errors.Is(err, ErrClosed) {
		t.Errorf("Reads after Close: %v, want ErrClosed", err)
	}
}
