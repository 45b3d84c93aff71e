package anchor

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

const (
	// testKind is what this project's machines have; they lack dummy.
	testKind = "bridge"
	// repairBudget is how fast a removal must be undone. It is measured
	// well under a millisecond here; the budget leaves room for -race and a
	// loaded machine.
	repairBudget = 100 * time.Millisecond
)

var (
	addr11 = netip.MustParseAddr("169.254.10.11")
	addr10 = netip.MustParseAddr("169.254.10.10")
	addrV6 = netip.MustParseAddr("fd53::11")
)

// fixture is a namespace with a netlink handle into it.
type fixture struct {
	ns *nstest.Namespace
	nl *netlink.Handle
}

func newFixture(t *testing.T, role string) *fixture {
	t.Helper()
	nstest.RequireRoot(t)
	ns := nstest.New(t, role)
	h, err := netns.GetFromPath(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nl.Close)
	return &fixture{ns: ns, nl: nl}
}

// testConfig is the anchor config of these tests: DefaultConfig with the
// link kind this machine has, holding addrs, logging to t.
func testConfig(t testing.TB, addrs ...netip.Addr) Config {
	cfg := DefaultConfig()
	cfg.Kind = testKind
	cfg.Addrs = addrs
	cfg.Logger = testkit.Logger(t)
	return cfg
}

// startAnchor starts an anchor in f's namespace, closed when the test ends.
func (f *fixture) startAnchor(t *testing.T, cfg Config, tune tuning) *Anchor {
	t.Helper()
	cfg.Netns = f.ns.Path()
	a, err := start(context.Background(), cfg, tune)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.Close(); err != nil {
			t.Errorf("close anchor: %v", err)
		}
	})
	return a
}

// state is the anchor link as the kernel has it.
type state struct {
	index int
	kind  string
	up    bool
	addrs []netip.Addr // sorted
}

func (f *fixture) state(t *testing.T, name string) (state, bool) {
	t.Helper()
	link, err := f.nl.LinkByName(name)
	if errors.As(err, &netlink.LinkNotFoundError{}) {
		return state{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	s := state{index: link.Attrs().Index, kind: link.Type(), up: link.Attrs().Flags&net.FlagUp != 0}
	// An address counts once it is usable: it has a local route through
	// the link (an IPv6 one gets it a moment after it is listed).
	routed := map[netip.Addr]bool{}
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := f.nl.RouteListFiltered(family, &netlink.Route{Table: unix.RT_TABLE_LOCAL, LinkIndex: s.index},
			netlink.RT_FILTER_TABLE|netlink.RT_FILTER_OIF)
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			t.Fatal(err)
		}
		for _, r := range routes {
			if ip, ok := netip.AddrFromSlice(r.Dst.IP); ok && r.Type == unix.RTN_LOCAL {
				routed[ip.Unmap()] = true
			}
		}
	}
	addrs, err := f.nl.AddrList(link, netlink.FAMILY_ALL)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		t.Fatal(err)
	}
	for _, a := range addrs {
		ip, _ := netip.AddrFromSlice(a.IP)
		ip = ip.Unmap()
		if ip.IsLinkLocalUnicast() && ip.Is6() {
			continue // the kernel's own fe80:: address
		}
		if routed[ip] && a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) == 0 {
			s.addrs = append(s.addrs, ip)
		}
	}
	slices.SortFunc(s.addrs, netip.Addr.Compare)
	return s, true
}

// whole reports whether the link exists, is up and holds exactly want.
func (f *fixture) whole(t *testing.T, name string, want []netip.Addr) (state, bool) {
	s, ok := f.state(t, name)
	want = slices.SortedFunc(slices.Values(want), netip.Addr.Compare)
	return s, ok && s.up && slices.Equal(s.addrs, want)
}

// waitWhole waits, polling every 100 µs, until the link is whole again and
// returns how long that took since from.
func (f *fixture) waitWhole(t *testing.T, name string, want []netip.Addr, from time.Time, cond func(state) bool) time.Duration {
	t.Helper()
	deadline := from.Add(5 * time.Second)
	for {
		s, ok := f.whole(t, name, want)
		if ok && (cond == nil || cond(s)) {
			return time.Since(from)
		}
		if time.Now().After(deadline) {
			t.Fatalf("link %s not whole after 5s: %+v (exists %v), want up with %v", name, s, ok, want)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

func summarize(d []time.Duration) string {
	d = slices.Clone(d)
	slices.Sort(d)
	return fmt.Sprintf("n=%d min=%v median=%v max=%v", len(d), d[0], d[len(d)/2], d[len(d)-1])
}

// TestStart: the link is created up, of the configured kind, with every
// address usable at once (the IPv6 one not tentative), and Ready says so.
func TestStart(t *testing.T) {
	f := newFixture(t, "start")
	want := []netip.Addr{addr11, addrV6}
	a := f.startAnchor(t, testConfig(t, want...), tuning{})
	s, ok := f.whole(t, DefaultLink, want)
	if !ok || s.kind != testKind {
		t.Fatalf("after Start: %+v (exists %v); want an up %s link with %v", s, ok, testKind, want)
	}
	if !a.Ready() {
		t.Error("Ready() = false after Start")
	}
	// Marked dnsstandby's, for the next start (TestOwnLinkOfAnotherKind).
	if link, err := f.nl.LinkByName(DefaultLink); err != nil || link.Attrs().Alias != ownerAlias {
		t.Errorf("link alias: %v, want %q", link, ownerAlias)
	}
	st := a.Stats()
	if st.LinkIndex != s.index || st.Addresses != 2 || st.LinkReadds+st.UpReadds+st.AddressReadds != 0 {
		t.Errorf("Stats = %+v, want index %d, 2 addresses, no re-adds", st, s.index)
	}
	// The link adds no route of its own to the main table (/32 and
	// NOPREFIXROUTE /128); its addresses are in the local table.
	out := nstest.Run(t, f.ns, "ip", "-6", "route", "show", "table", "main")
	if strings.Contains(out, "fd53::11") {
		t.Errorf("IPv6 anchor address has a main-table route:\n%s", out)
	}
	for _, cmd := range [][]string{{"ip", "-4", "route", "show", "table", "local"}, {"ip", "-6", "route", "show", "table", "local"}} {
		out := nstest.Run(t, f.ns, cmd[0], cmd[1:]...)
		if !strings.Contains(out, " dev "+DefaultLink) {
			t.Errorf("%s: no local route through %s:\n%s", strings.Join(cmd, " "), DefaultLink, out)
		}
	}
	reg := prometheus.NewPedanticRegistry()
	must(t, reg.Register(a))
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP dnsstandby_anchor_addresses Listen addresses present on the anchor link.
# TYPE dnsstandby_anchor_addresses gauge
dnsstandby_anchor_addresses 2
# HELP dnsstandby_anchor_readds_total Things someone removed from the anchor link and the anchor put back, by what (link, up, address).
# TYPE dnsstandby_anchor_readds_total counter
dnsstandby_anchor_readds_total{what="address"} 0
dnsstandby_anchor_readds_total{what="link"} 0
dnsstandby_anchor_readds_total{what="up"} 0
# HELP dnsstandby_anchor_ready 1 while the anchor link is up and holds every listen address, else 0.
# TYPE dnsstandby_anchor_ready gauge
dnsstandby_anchor_ready 1
# HELP dnsstandby_anchor_repair_errors_total Anchor repair passes that failed and were retried.
# TYPE dnsstandby_anchor_repair_errors_total counter
dnsstandby_anchor_repair_errors_total 0
# HELP dnsstandby_anchor_resyncs_total Full resyncs of the anchor after a netlink subscription failed (events were dropped).
# TYPE dnsstandby_anchor_resyncs_total counter
dnsstandby_anchor_resyncs_total 0
`)); err != nil {
		t.Error(err)
	}
}

// TestAdopt: an existing link of the right name and kind is kept (same
// index), and what it lacks is added; that is not a re-add.
func TestAdopt(t *testing.T) {
	f := newFixture(t, "adopt")
	if err := f.ns.AddLink(DefaultLink, testKind, "169.254.10.11/32"); err != nil {
		t.Fatal(err)
	}
	before, _ := f.state(t, DefaultLink)
	want := []netip.Addr{addr11, addr10}
	a := f.startAnchor(t, testConfig(t, want...), tuning{})
	after, ok := f.whole(t, DefaultLink, want)
	if !ok || after.index != before.index {
		t.Fatalf("after Start: %+v (whole %v), want the existing link (index %d) with %v", after, ok, before.index, want)
	}
	if st := a.Stats(); st.AddressReadds != 0 || !st.Ready {
		t.Errorf("Stats = %+v, want ready and no re-adds", st)
	}
}

// TestLinkDeleted: the link is re-created with its addresses at once after
// each deletion, by `ip link del` or netlink.
func TestLinkDeleted(t *testing.T) {
	f := newFixture(t, "linkdel")
	want := []netip.Addr{addr11, addrV6}
	a := f.startAnchor(t, testConfig(t, want...), tuning{})

	// Once as an operator would.
	s, _ := f.state(t, DefaultLink)
	t0 := time.Now()
	nstest.Run(t, f.ns, "ip", "link", "del", DefaultLink)
	took := f.waitWhole(t, DefaultLink, want, t0, func(n state) bool { return n.index != s.index })
	t.Logf("`ip link del %s`: whole again %v after the command started (includes the ip process)", DefaultLink, took)

	// Deleting a link holds the kernel's rtnl lock through RCU grace
	// periods (tens of ms for a bridge here); nobody can create a link until
	// it returns. So the latency that is ours is the one after it returns.
	const rounds = 20
	var total, after, del []time.Duration
	for range rounds {
		s, _ := f.state(t, DefaultLink)
		link, err := f.nl.LinkByIndex(s.index)
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		if err := f.nl.LinkDel(link); err != nil {
			t.Fatal(err)
		}
		t1 := time.Now()
		d := f.waitWhole(t, DefaultLink, want, t0, func(n state) bool { return n.index != s.index })
		total, del, after = append(total, d), append(del, t1.Sub(t0)), append(after, d-t1.Sub(t0))
	}
	t.Logf("netlink delete call itself: %s", summarize(del))
	t.Logf("link whole again, from the delete's start: %s", summarize(total))
	t.Logf("link whole again, after the delete returned: %s", summarize(after))
	if m := slices.Max(after); m > repairBudget {
		t.Errorf("slowest re-creation %v after the delete returned, want under %v", m, repairBudget)
	}
	waitStats(t, a, func(st Stats) bool { return st.LinkReadds == rounds+1 && st.Ready })
	if st := a.Stats(); st.AddressReadds != 0 {
		t.Errorf("Stats = %+v: addresses of a re-created link counted as address re-adds", st)
	}
}

// TestAddressDeleted: an address removed from the link (which stays) is
// put back at once.
func TestAddressDeleted(t *testing.T) {
	f := newFixture(t, "addrdel")
	want := []netip.Addr{addr11, addrV6}
	a := f.startAnchor(t, testConfig(t, want...), tuning{})
	s, _ := f.state(t, DefaultLink)

	t0 := time.Now()
	nstest.Run(t, f.ns, "ip", "addr", "del", "169.254.10.11/32", "dev", DefaultLink)
	t.Logf("`ip addr del 169.254.10.11/32`: whole again %v after the command started", f.waitWhole(t, DefaultLink, want, t0, nil))

	const rounds = 20
	var lat4, lat6 []time.Duration
	for range rounds {
		for _, ip := range want {
			link, err := f.nl.LinkByIndex(s.index)
			if err != nil {
				t.Fatal(err)
			}
			t0 := time.Now()
			if err := f.nl.AddrDel(link, hostAddr(ip)); err != nil {
				t.Fatalf("delete %s: %v", ip, err)
			}
			d := f.waitWhole(t, DefaultLink, want, t0, nil)
			if ip.Is4() {
				lat4 = append(lat4, d)
			} else {
				lat6 = append(lat6, d)
			}
		}
	}
	t.Logf("IPv4 address re-added: %s", summarize(lat4))
	t.Logf("IPv6 address re-added: %s", summarize(lat6))
	if m := max(slices.Max(lat4), slices.Max(lat6)); m > repairBudget {
		t.Errorf("slowest re-add %v, want under %v", m, repairBudget)
	}
	if now, _ := f.state(t, DefaultLink); now.index != s.index {
		t.Errorf("link re-created (index %d, was %d) for a missing address", now.index, s.index)
	}
	waitStats(t, a, func(st Stats) bool { return st.AddressReadds == 2*rounds+1 && st.Ready })
	if st := a.Stats(); st.LinkReadds != 0 {
		t.Errorf("Stats = %+v, want no link re-adds", st)
	}
}

// TestLinkSetDown: a link set down is set up again, with the IPv6 address
// the kernel removed on the way down.
func TestLinkSetDown(t *testing.T) {
	f := newFixture(t, "linkdown")
	want := []netip.Addr{addr11, addrV6}
	a := f.startAnchor(t, testConfig(t, want...), tuning{})
	t0 := time.Now()
	nstest.Run(t, f.ns, "ip", "link", "set", DefaultLink, "down")
	t.Logf("`ip link set %s down`: whole again %v after the command started", DefaultLink, f.waitWhole(t, DefaultLink, want, t0, nil))
	waitStats(t, a, func(st Stats) bool { return st.UpReadds == 1 && st.Ready })
}

func waitStats(t *testing.T, a *Anchor, ok func(Stats) bool) {
	t.Helper()
	defer func() {
		if !ok(a.Stats()) {
			t.Logf("Stats = %+v", a.Stats())
		}
	}()
	testkit.Eventually(t, 2*time.Second, "anchor stats", func() bool { return ok(a.Stats()) })
}

// TestLocalDNSLinkFlaps: LocalDNS's `localdns` link, holding the same /32,
// is deleted and re-created over and over (as localdns.sh does on every
// stop and start) while a client in another namespace queries
// 169.254.10.11:53 through a veth. Without the anchor a deleted `localdns`
// loses every query; with it none is lost, and the anchor never touches
// `localdns`.
func TestLocalDNSLinkFlaps(t *testing.T) {
	node := newFixture(t, "node")
	pod := newFixture(t, "pod")
	for _, f := range []*fixture{node, pod} {
		noDAD(t, f.ns)
	}
	must(t, nstest.AddVeth(
		nstest.End{NS: node.ns, Name: "to-pod", Addrs: []string{"10.200.0.1/30", "fd00:200::1/64"}},
		nstest.End{NS: pod.ns, Name: "to-node", Addrs: []string{"10.200.0.2/30", "fd00:200::2/64"}}))
	must(t, pod.ns.AddRoute(nstest.Route{Dst: "169.254.10.11/32", Via: "10.200.0.1"}))
	must(t, pod.ns.AddRoute(nstest.Route{Dst: "fd53::11/128", Via: "fd00:200::1"}))
	localdns := []string{"169.254.10.10/32", "169.254.10.11/32"}
	must(t, node.ns.AddLink("localdns", testKind, localdns...))

	// Two members of one reuseport group, as LocalDNS and dnsstandby; and
	// an IPv6 one on an address only the anchor holds (bound before it
	// exists, as dnsstandby does).
	var answered [3]atomic.Int64
	echo(t, node.ns, "udp4", "169.254.10.11:53", &answered[0])
	echo(t, node.ns, "udp4", "169.254.10.11:53", &answered[1])
	echo(t, node.ns, "udp6", "[fd53::11]:53", &answered[2])
	// Several client sockets, so that the 4-tuple hash spreads them over
	// the group's members.
	var clients []net.Conn
	for range 8 {
		clients = append(clients, dialUDP(t, pod.ns, "udp4", "169.254.10.11:53"))
	}
	c6 := dialUDP(t, pod.ns, "udp6", "[fd53::11]:53")
	var seq uint64
	query := func(c net.Conn, timeout time.Duration) bool {
		seq++
		if c == nil {
			c = clients[seq%uint64(len(clients))]
		}
		return exchange(c, seq, timeout)
	}
	if !query(nil, time.Second) {
		t.Fatal("no answer from 169.254.10.11 with `localdns` up")
	}

	// Control: without the anchor, deleting `localdns` takes .11 away.
	must(t, node.ns.DelLink("localdns"))
	for i := range 3 {
		if query(nil, 50*time.Millisecond) {
			t.Fatalf("control: query %d answered with `localdns` deleted and no anchor: the test cannot see a loss", i)
		}
	}
	must(t, node.ns.AddLink("localdns", testKind, localdns...))

	a := node.startAnchor(t, testConfig(t, addr11, addrV6), tuning{})
	anchorState, _ := node.state(t, DefaultLink)
	link, err := node.nl.LinkByName(DefaultLink)
	must(t, err)
	t.Logf("anchor link %s: flags %v, oper state %s", DefaultLink, link.Attrs().Flags, link.Attrs().OperState)
	if !query(c6, time.Second) {
		for _, f := range []*fixture{node, pod} {
			out, _ := f.ns.Run(context.Background(), "sh", "-c", "ip -6 addr; ip -6 route show table all; ip -6 neigh; nstat -az | grep -v ' 0 '")
			t.Logf("%s:\n%s", f.ns, out)
		}
		t.Fatal("no answer from [fd53::11]:53, held only by the anchor")
	}

	// One deletion by hand: .11 stays local through the anchor.
	must(t, node.ns.DelLink("localdns"))
	out := nstest.Run(t, node.ns, "ip", "-4", "route", "show", "table", "local")
	if !strings.Contains(out, "local 169.254.10.11 dev "+DefaultLink) {
		t.Errorf("with `localdns` deleted, no local route for .11 through %s:\n%s", DefaultLink, out)
	}
	if !query(nil, time.Second) {
		t.Fatal("no answer with `localdns` deleted and the anchor holding .11")
	}
	must(t, node.ns.AddLink("localdns", testKind, localdns...))

	// The flapping, with the client querying all the while.
	const flaps = 25
	flapErr := make(chan error, 1)
	go func() {
		defer close(flapErr)
		for range flaps {
			if err := node.ns.DelLink("localdns"); err != nil {
				flapErr <- err
				return
			}
			time.Sleep(10 * time.Millisecond)
			if err := node.ns.AddLink("localdns", testKind, localdns...); err != nil {
				flapErr <- err
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	var sent, lost int
	for running := true; running; {
		select {
		case err, ok := <-flapErr:
			if ok {
				t.Fatal(err)
			}
			running = false
		default:
		}
		sent++
		if !query(nil, 200*time.Millisecond) {
			lost++
		}
	}
	t.Logf("%d queries while `localdns` was deleted and re-created %d times: %d lost; answered by the two group members %d/%d",
		sent, flaps, lost, answered[0].Load(), answered[1].Load())
	if lost != 0 {
		t.Errorf("%d of %d queries lost", lost, sent)
	}
	if sent < 2*flaps {
		t.Errorf("only %d queries sent during %d flaps", sent, flaps)
	}
	if st := a.Stats(); st.LinkReadds+st.UpReadds+st.AddressReadds != 0 || !st.Ready {
		t.Errorf("Stats = %+v: LocalDNS's flapping made the anchor repair something", st)
	}
	if s, _ := node.state(t, DefaultLink); s.index != anchorState.index {
		t.Errorf("anchor link re-created during the flapping")
	}
	if _, ok := node.whole(t, "localdns", []netip.Addr{addr10, addr11}); !ok {
		t.Errorf("`localdns` not as the flapper left it")
	}
}

// noDAD turns off duplicate address detection for links made later in ns.
// Otherwise the veth's own fe80:: address stays tentative for a second or
// two after it comes up, and until then the kernel sends no neighbour
// solicitation for a reply whose source (fd53::11) is on another link: the
// first IPv6 answers would wait for DAD, not for anything the anchor does.
func noDAD(t *testing.T, ns *nstest.Namespace) {
	t.Helper()
	must(t, ns.Do(func() error {
		return os.WriteFile("/proc/sys/net/ipv6/conf/default/accept_dad", []byte("0"), 0o644)
	}))
}

// echo answers every datagram on a SO_REUSEPORT socket made in ns, counting.
func echo(t *testing.T, ns *nstest.Namespace, network, addr string, count *atomic.Int64) {
	t.Helper()
	lc := net.ListenConfig{Control: func(network, address string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = errors.Join(unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1),
				unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_FREEBIND, 1))
			if strings.HasSuffix(network, "6") {
				serr = errors.Join(serr, unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_FREEBIND, 1))
			}
		})
		return errors.Join(err, serr)
	}}
	var pc net.PacketConn
	must(t, ns.Do(func() error {
		var err error
		pc, err = lc.ListenPacket(context.Background(), network, addr)
		return err
	}))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 64)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			count.Add(1)
			pc.WriteTo(buf[:n], from)
		}
	}()
	t.Cleanup(func() { pc.Close(); wg.Wait() })
}

func dialUDP(t *testing.T, ns *nstest.Namespace, network, addr string) net.Conn {
	t.Helper()
	c, err := ns.Dial(network, "", addr, time.Second)
	must(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// exchange sends seq and waits for its echo, skipping late echoes of
// earlier ones; errors (an ICMP unreachable) count as no answer.
func exchange(c net.Conn, seq uint64, timeout time.Duration) bool {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], seq)
	deadline := time.Now().Add(timeout)
	c.SetDeadline(deadline)
	if _, err := c.Write(b[:]); err != nil {
		return false
	}
	for {
		var r [64]byte
		n, err := c.Read(r[:])
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return false
			}
			if time.Now().After(deadline) {
				return false
			}
			continue // ICMP error from an earlier query; keep waiting
		}
		if n == 8 && binary.BigEndian.Uint64(r[:8]) == seq {
			return true
		}
	}
}

// TestClose: Close stops the watch; the link stays unless Cleanup; Close is
// safe twice and leaves no goroutine behind.
func TestClose(t *testing.T) {
	for _, cleanup := range []bool{false, true} {
		t.Run(fmt.Sprintf("cleanup=%v", cleanup), func(t *testing.T) {
			f := newFixture(t, "close")
			settle := runtime.NumGoroutine()
			want := []netip.Addr{addr11, addrV6}
			cfg := testConfig(t, want...)
			cfg.Cleanup, cfg.Netns = cleanup, f.ns.Path()
			a, err := Start(context.Background(), cfg)
			must(t, err)
			must(t, a.Close())
			must(t, a.Close())
			select {
			case <-a.done:
			default:
				t.Error("watch still running after Close")
			}
			if a.Ready() {
				t.Error("Ready() after Close")
			}
			_, exists := f.whole(t, DefaultLink, want)
			if exists == cleanup {
				t.Fatalf("after Close with Cleanup=%v: link whole = %v", cleanup, exists)
			}
			waitGoroutines(t, settle)
		})
	}
}

// TestContextEnds: the watch stops with the caller's context, and leaves
// the link as it is (no cleanup: that is Close's); Close still works after
// it.
func TestContextEnds(t *testing.T) {
	f := newFixture(t, "ctx")
	ctx, cancel := context.WithCancel(context.Background())
	cfg := testConfig(t, addr11)
	cfg.Cleanup, cfg.Netns = true, f.ns.Path()
	a, err := Start(ctx, cfg)
	must(t, err)
	cancel()
	<-a.done
	if _, ok := f.whole(t, DefaultLink, []netip.Addr{addr11}); !ok {
		t.Error("link not whole after the context ended: only Close with Cleanup removes it")
	}
	must(t, a.Close())
	if _, ok := f.state(t, DefaultLink); ok {
		t.Error("link left after Close with Cleanup")
	}
}

// waitGoroutines waits until no more goroutines run than want.
func waitGoroutines(t *testing.T, want int) {
	t.Helper()
	testkit.Eventually(t, 2*time.Second, fmt.Sprintf("at most %d goroutines", want), func() bool {
		return runtime.NumGoroutine() <= want
	})
}

// TestWrongKind: a link of the anchor's name but another kind is refused
// with a clear error, and left as it was.
func TestWrongKind(t *testing.T) {
	f := newFixture(t, "wrongkind")
	must(t, f.nl.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: DefaultLink}, PeerName: "peer"}))
	before, _ := f.state(t, DefaultLink)
	cfg := testConfig(t, addr11)
	cfg.Netns = f.ns.Path()
	_, err := Start(context.Background(), cfg)
	if !errors.Is(err, ErrWrongKind) {
		t.Fatalf("Start over a veth named %s: err = %v, want ErrWrongKind", DefaultLink, err)
	}
	t.Logf("error: %v", err)
	for _, s := range []string{`"veth"`, `"bridge"`, "another Link"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error does not mention %s", s)
		}
	}
	if after, _ := f.state(t, DefaultLink); after.index != before.index || after.kind != "veth" || len(after.addrs) != 0 || after.up {
		t.Errorf("the foreign link was touched: before %+v, after %+v", before, after)
	}
}

// TestOwnLinkOfAnotherKind: a link an earlier anchor made is its own on
// the next start even when that start asks for another kind. The daemon
// asks for dummy, falls back to bridge on a kernel without it (takeover's
// startAnchor), and asks for dummy again after a restart: the bridge it
// made is adopted, not refused, and kept a bridge when re-created. A link
// of that name that someone else made is still refused and left alone.
func TestOwnLinkOfAnotherKind(t *testing.T) {
	want := []netip.Addr{addr11, addrV6}
	tests := []struct {
		name string
		// prepare makes the link the start finds, of kind testKind.
		prepare func(t *testing.T, f *fixture)
		ours    bool
	}{
		{"made by an earlier anchor", func(t *testing.T, f *fixture) {
			cfg := testConfig(t, want...) // testKind: the fallback
			cfg.Netns = f.ns.Path()
			a, err := Start(context.Background(), cfg)
			must(t, err)
			must(t, a.Close()) // no Cleanup: the link stays for the next start
		}, true},
		{"someone else's", func(t *testing.T, f *fixture) {
			must(t, f.ns.AddLink(DefaultLink, testKind, "169.254.10.11/32"))
		}, false},
		{"someone else's with an alias of its own", func(t *testing.T, f *fixture) {
			must(t, f.ns.AddLink(DefaultLink, testKind, "169.254.10.11/32"))
			link, err := f.nl.LinkByName(DefaultLink)
			must(t, err)
			must(t, f.nl.LinkSetAlias(link, "uplink to the lab"))
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, "ownlink")
			tt.prepare(t, f)
			before, _ := f.state(t, DefaultLink)
			cfg := testConfig(t, want...)
			cfg.Kind, cfg.Cleanup, cfg.Netns = "dummy", true, f.ns.Path()
			a, err := Start(context.Background(), cfg)
			if !tt.ours {
				if !errors.Is(err, ErrWrongKind) {
					t.Fatalf("Start over someone else's %s named %s: err = %v, want ErrWrongKind", testKind, DefaultLink, err)
				}
				if after, _ := f.state(t, DefaultLink); after.index != before.index || after.kind != testKind || !slices.Equal(after.addrs, before.addrs) {
					t.Errorf("the foreign link was touched: before %+v, after %+v", before, after)
				}
				return
			}
			if err != nil {
				t.Fatalf("Start over the %s link an earlier anchor made: %v", testKind, err)
			}
			defer a.Close()
			if after, ok := f.whole(t, DefaultLink, want); !ok || after.index != before.index || after.kind != testKind {
				t.Fatalf("after Start: %+v (whole %v), want the earlier link (index %d, %s) kept", after, ok, before.index, testKind)
			}
			// Deleted, it comes back of the kind the kernel is known to
			// have, not of the one configured.
			link, err := f.nl.LinkByIndex(before.index)
			must(t, err)
			must(t, f.nl.LinkDel(link))
			again := f.waitWhole(t, DefaultLink, want, time.Now(), func(n state) bool { return n.index != before.index })
			t.Logf("re-created in %v", again)
			if s, _ := f.state(t, DefaultLink); s.kind != testKind {
				t.Errorf("re-created as %q, want %q", s.kind, testKind)
			}
			waitStats(t, a, func(st Stats) bool { return st.LinkReadds == 1 && st.Ready })
			// Close with Cleanup deletes it: it is ours.
			must(t, a.Close())
			if s, ok := f.state(t, DefaultLink); ok {
				t.Errorf("link left after Close with Cleanup: %+v", s)
			}
		})
	}
}

// TestUnknownKind: a kind the kernel has no driver for (a made-up one, and
// dummy where it is missing, as on this project's machines) is refused
// with an error that points at Kind bridge.
func TestUnknownKind(t *testing.T) {
	f := newFixture(t, "nokind")
	kinds := []string{"nosuchkind"}
	if err := f.nl.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: "probe"}}); errors.Is(err, unix.EOPNOTSUPP) {
		kinds = append(kinds, "dummy")
	} else {
		t.Logf("this kernel has the dummy driver (%v): testing only a made-up kind", err)
	}
	for _, kind := range kinds {
		cfg := testConfig(t, addr11)
		cfg.Kind, cfg.Netns = kind, f.ns.Path()
		_, err := Start(context.Background(), cfg)
		if !errors.Is(err, ErrUnknownKind) {
			t.Fatalf("kind %q: err = %v, want ErrUnknownKind", kind, err)
		}
		t.Logf("kind %q: %v", kind, err)
		if !strings.Contains(err.Error(), "Kind this kernel has, e.g. bridge") {
			t.Errorf("kind %q: error does not suggest Kind bridge", kind)
		}
		if _, ok := f.state(t, DefaultLink); ok {
			t.Errorf("kind %q: a link was left behind", kind)
		}
	}
}

// TestResyncAfterOverflow: when the watch falls behind and the kernel drops
// events (ENOBUFS), the anchor renews its subscriptions and repairs in full,
// catching a removal whose event may be lost.
func TestResyncAfterOverflow(t *testing.T) {
	f := newFixture(t, "overflow")
	var gate sync.Mutex
	want := []netip.Addr{addr11, addrV6}
	// The smallest receive buffer the kernel allows (a few KiB).
	a := f.startAnchor(t, testConfig(t, want...), tuning{rcvbuf: 1, gate: &gate})
	s, _ := f.state(t, DefaultLink)

	// A link of someone else's whose changes flood both subscriptions;
	// changing its alias and addresses costs no RCU grace period, unlike
	// creating and deleting links.
	must(t, f.ns.AddLink("flood", testKind))
	flood, err := f.nl.LinkByName("flood")
	must(t, err)
	gate.Lock()
	// The first event stalls the watch on the gate; the flood fills the
	// queue and then the socket behind it.
	for i := range 300 {
		must(t, f.nl.LinkSetAlias(flood, fmt.Sprintf("flood %d", i)))
		a := hostAddr(netip.AddrFrom4([4]byte{10, 99, byte(i >> 8), byte(i)}))
		must(t, f.nl.AddrAdd(flood, a))
		must(t, f.nl.AddrDel(flood, a))
	}
	link, err := f.nl.LinkByIndex(s.index)
	must(t, err)
	for _, ip := range want {
		must(t, f.nl.AddrDel(link, hostAddr(ip)))
	}
	t0 := time.Now()
	gate.Unlock()
	t.Logf("whole again %v after the watch resumed", f.waitWhole(t, DefaultLink, want, t0, nil))
	waitStats(t, a, func(st Stats) bool { return st.Resyncs >= 1 && st.Ready })
	t.Logf("Stats = %+v", a.Stats())
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestNodeSource: with SourceToward, the node's own packets to a held
// address leave from the node's address toward that address's upstream
// (what a DNAT of them needs), LocalDNS's route to the same address is
// never touched, and the routes follow the node's address away and back.
func TestNodeSource(t *testing.T) {
	f := newFixture(t, "source")
	// Two networks, as a node whose VNet DNS and kube-dns are reached from
	// different addresses: .10's upstream on the first, .11's on the other.
	node10, node11 := netip.MustParseAddr("10.9.0.2"), netip.MustParseAddr("10.8.0.2")
	for _, l := range []struct{ name, addr string }{{"uplink", "10.9.0.2/24"}, {"uplink2", "10.8.0.2/24"}} {
		nstest.Run(t, f.ns, "ip", "link", "add", l.name, "type", "bridge")
		nstest.Run(t, f.ns, "ip", "link", "set", l.name, "up")
		nstest.Run(t, f.ns, "ip", "addr", "add", l.addr, "dev", l.name)
	}
	cfg := testConfig(t, addr10, addr11, addrV6)
	cfg.SourceToward = map[netip.Addr]netip.Addr{
		addr10: netip.MustParseAddr("10.9.0.53"),
		addr11: netip.MustParseAddr("10.8.0.10"),
	}
	a := f.startAnchor(t, cfg, tuning{})

	// sourceOf is the source a UDP socket connected to addr gets: the
	// kernel's choice for the node's own lookups; the zero Addr while addr
	// has no route. (When a node address goes, the kernel deletes the
	// local routes naming it as their source, and addr is unreachable
	// until the anchor has put its route back, about a millisecond.)
	sourceOf := func(addr netip.Addr) netip.Addr {
		c, err := f.ns.Dial("udp", "", netip.AddrPortFrom(addr, 53).String(), time.Second)
		if err != nil {
			return netip.Addr{}
		}
		defer c.Close()
		return c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap()
	}
	// waitSources waits for .10's and .11's sources to be want10 and
	// want11 (the zero Addr: the address itself), as the kernel chooses
	// and as Stats says.
	waitSources := func(what string, want10, want11 netip.Addr) {
		t.Helper()
		want := map[netip.Addr]netip.Addr{}
		for held, src := range map[netip.Addr]netip.Addr{addr10: want10, addr11: want11} {
			if src.IsValid() {
				want[held] = src
			}
		}
		err := testkit.PollEvery(context.Background(), 2*time.Second, time.Millisecond, func() (bool, error) {
			return sourceOf(addr10) == cmp.Or(want10, addr10) && sourceOf(addr11) == cmp.Or(want11, addr11) &&
				maps.Equal(a.Stats().Sources, want) && a.Ready(), nil
		})
		if err != nil {
			t.Fatalf("%s: sources %s and %s, Stats().Sources %v, ready %v; want %s", what, sourceOf(addr10), sourceOf(addr11),
				a.Stats().Sources, a.Ready(), sourcesText(cfg.Addrs, want))
		}
	}
	waitSources("started", node10, node11)
	if src := sourceOf(addrV6); src != addrV6 {
		t.Errorf("IPv6 %s: source %s, want itself (only IPv4 routes get the node's source)", addrV6, src)
	}

	// LocalDNS's link holds .10 too: its route keeps its own source, ours
	// stays first, and deleting LocalDNS's link leaves ours.
	nstest.Run(t, f.ns, "ip", "link", "add", "localdns", "type", "bridge")
	nstest.Run(t, f.ns, "ip", "link", "set", "localdns", "up")
	nstest.Run(t, f.ns, "ip", "addr", "add", "169.254.10.10/32", "dev", "localdns")
	theirs, err := f.nl.LinkByName("localdns")
	must(t, err)
	routes, err := f.nl.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_LOCAL, LinkIndex: theirs.Attrs().Index},
		netlink.RT_FILTER_TABLE|netlink.RT_FILTER_OIF)
	must(t, err)
	if len(routes) != 1 || !routes[0].Src.Equal(addr10.AsSlice()) {
		t.Errorf("LocalDNS's local routes %v, want one from %s", routes, addr10)
	}
	waitSources("LocalDNS's link added", node10, node11)
	nstest.Run(t, f.ns, "ip", "link", "del", "localdns")
	waitSources("LocalDNS's link deleted", node10, node11)

	// A node address goes: the kernel deletes the routes naming it; the
	// anchor puts them back, from the address itself, and moves to the
	// node's address again when it returns.
	nstest.Run(t, f.ns, "ip", "addr", "del", "10.9.0.2/24", "dev", "uplink")
	waitSources("node address removed", netip.Addr{}, node11)
	nstest.Run(t, f.ns, "ip", "addr", "add", "10.9.0.2/24", "dev", "uplink")
	waitSources("node address back", node10, node11)
}
