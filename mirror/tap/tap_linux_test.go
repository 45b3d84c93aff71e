package tap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/miekg/dns"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/dnsstandby/dnsstandby/cache"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// The test bed: a node namespace holding LocalDNS's addresses on an anchor
// link, a real CoreDNS bound there (as LocalDNS: nsid localdns-pod,
// answers made up by template, no upstream), and a pod namespace behind a
// veth. With bridged, the node's end of the veth is a port of a bridge
// holding the pod's gateway address, as kubenet's cbr0 is.
const (
	bedAddr4     = "169.254.10.11"
	bedAddr6     = "fd00:10::11"
	bedOtherAddr = "169.254.10.12" // CoreDNS answers here too; not the tap's
	bedOtherPort = 5353            // and on bedAddr4 at this port
	bedZone      = "tap.test."
)

var bedCorefile = fmt.Sprintf(`.:53 {
	bind %[1]s %[2]s %[3]s
	nsid localdns-pod
	template IN A %[4]s {
		answer "{{ .Name }} 60 IN A 192.0.2.1"
	}
	template IN AAAA %[4]s {
		answer "{{ .Name }} 60 IN AAAA 2001:db8::1"
	}
}
.:%[5]d {
	bind %[1]s
	template IN A %[4]s {
		answer "{{ .Name }} 60 IN A 192.0.2.2"
	}
}
`, bedAddr4, bedAddr6, bedOtherAddr, bedZone, bedOtherPort)

type bed struct {
	node, pod *nstest.Namespace
	coredns   *nstest.CoreDNS
}

func newBed(t *testing.T, bridged bool) *bed { t.Helper(); return newBedIn(t, bridged, "") }

// newBedIn is newBed with CoreDNS started in the cgroup2 directory cgroup
// ("" for the test's own).
func newBedIn(t *testing.T, bridged bool, cgroup string) *bed {
	t.Helper()
	nstest.RequireRoot(t)
	bin := nstest.CoreDNSBinary(t)
	b := &bed{node: nstest.New(t, "node"), pod: nstest.New(t, "pod")}
	must(t, b.node.AddLink("localdns", "", bedAddr4+"/32", bedOtherAddr+"/32", bedAddr6+"/128"))
	gw4, gw6 := "10.211.0.1", "fd00:211::1"
	podEnd := nstest.End{NS: b.pod, Name: "eth0", Addrs: []string{"10.211.0.2/24", "fd00:211::2/64"}}
	if bridged {
		must(t, b.node.AddLink("cbr0", "bridge", gw4+"/24", gw6+"/64"))
		must(t, nstest.AddVeth(nstest.End{NS: b.node, Name: "veth-pod"}, podEnd))
		nstest.Run(t, b.node, "ip", "link", "set", "veth-pod", "master", "cbr0")
		waitUp(t, b.node, "cbr0")
	} else {
		must(t, nstest.AddVeth(nstest.End{NS: b.node, Name: "veth-pod", Addrs: []string{gw4 + "/24", gw6 + "/64"}}, podEnd))
	}
	must(t, b.pod.AddRoute(nstest.Route{Dst: "169.254.10.0/24", Via: gw4}))
	must(t, b.pod.AddRoute(nstest.Route{Dst: "fd00:10::/64", Via: gw6}))
	b.coredns = nstest.StartCoreDNS(t, b.node, nstest.CoreDNSConfig{
		Binary: bin, Corefile: bedCorefile, Probe: bedAddr4 + ":53", Cgroup: cgroup,
	})
	return b
}

// waitUp waits until a bridge forwards (its port left the listening and
// learning states, which take no time with STP off, but carrier comes
// from the link watch).
func waitUp(t *testing.T, ns *nstest.Namespace, link string) {
	t.Helper()
	var out string
	testkit.Eventually(t, 5*time.Second, link+" up", func() bool {
		out = nstest.Run(t, ns, "ip", "-o", "link", "show", link)
		return !strings.Contains(out, "NO-CARRIER") && !strings.Contains(out, "state DOWN")
	})
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// recorder is a Sink into a real cache that also counts, per question
// name, how often it was called.
type recorder struct {
	cache *cache.Cache
	mu    sync.Mutex
	calls map[string]int
}

func newRecorder(t testing.TB) *recorder {
	return &recorder{cache: newCache(t), calls: map[string]int{}}
}

func (r *recorder) sink(resp []byte) error {
	var m dns.Msg
	if err := m.Unpack(resp); err == nil && len(m.Question) == 1 {
		r.mu.Lock()
		r.calls[m.Question[0].Name]++
		r.mu.Unlock()
	}
	return r.cache.Insert(resp)
}

func (r *recorder) count(name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[name]
}

// bedConfig is DefaultConfig for the bed's LocalDNS addresses, logging to
// the test, in packet mode (RingSize 0): the bed's CoreDNS runs in the
// test's cgroup. ringConfig is the same in ring mode.
func bedConfig(t testing.TB) Config {
	cfg := ringConfig(t)
	cfg.RingSize = 0
	return cfg
}

func ringConfig(t testing.TB) Config {
	cfg := DefaultConfig()
	cfg.Addrs = []netip.Addr{netip.MustParseAddr(bedAddr4), netip.MustParseAddr(bedAddr6)}
	cfg.Logger = testkit.Logger(t)
	return cfg
}

// startTap starts a tap with cfg as given in the namespace ns.
func startTap(t *testing.T, ns *nstest.Namespace, cfg Config, sink Sink) *Tap {
	t.Helper()
	var tp *Tap
	must(t, ns.Do(func() error {
		var err error
		tp, err = Start(context.Background(), cfg, sink)
		return err
	}))
	t.Cleanup(func() { tp.Close() })
	return tp
}

// ask sends one query from ns to server and checks that an answer came.
func ask(t testing.TB, ns *nstest.Namespace, server, name string, qtype uint16) {
	t.Helper()
	q := new(dns.Msg)
	q.SetQuestion(name, qtype)
	r, err := ns.Exchange("udp", "", server, q, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Fatalf("%s %s at %s: %v", name, dns.TypeToString[qtype], server, r)
	}
}

// drained waits until the tap has read every packet the kernel queued for
// it, and returns its counters. Called once the replies it should see have
// reached their clients, it is exact, with no wait for packets that should
// not come: the kernel hands the tap its copy of a packet as it transmits
// it (dev_queue_xmit_nit, in the sender's call), before any receiver can
// have it, and counts it then in PACKET_STATISTICS (KernelPackets, which
// includes the drops).
func drained(t testing.TB, tp *Tap) Stats {
	t.Helper()
	var st Stats
	testkit.Eventually(t, 10*time.Second, "the tap to read and handle what the kernel queued", func() bool {
		st = tp.Stats()
		// Seen counts a packet as its handling starts: wait for its
		// verdict too.
		handled := st.Accepted + st.RejectedTotal() + st.Queries + st.QueriesRejectedTotal()
		return st.Seen+st.KernelDrops == st.KernelPackets && handled == st.Seen
	})
	return st
}

func checkStats(t testing.TB, st Stats, seen, accepted uint64, rejected map[string]uint64) {
	t.Helper()
	if st.Seen != seen || st.Accepted != accepted || fmt.Sprint(st.Rejected) != fmt.Sprint(rejected) || st.KernelDrops != 0 {
		t.Errorf("seen %d, accepted %d, rejected %v, drops %d; want %d, %d, %v, 0",
			st.Seen, st.Accepted, st.Rejected, st.KernelDrops, seen, accepted, rejected)
	}
}

// TestTapMirrors is the tap against a real CoreDNS: every reply to a pod
// (IPv4 and IPv6) and to a client on the node itself (over lo, where the
// kernel shows each packet twice) is inserted exactly once; replies from
// another address or port never reach user space; pausing stops inserts.
func TestTapMirrors(t *testing.T) {
	b := newBed(t, false)
	rec := newRecorder(t)
	tp := startTap(t, b.node, bedConfig(t), rec.sink)
	server4, server6 := bedAddr4+":53", "["+bedAddr6+"]:53"

	const pods, pods6, locals = 200, 50, 50
	var names []string
	for i := range pods {
		name := fmt.Sprintf("pod-%d.%s", i, bedZone)
		ask(t, b.pod, server4, name, dns.TypeA)
		names = append(names, name)
	}
	for i := range pods6 {
		name := fmt.Sprintf("pod6-%d.%s", i, bedZone)
		ask(t, b.pod, server6, name, dns.TypeAAAA)
		names = append(names, name)
	}
	for i := range locals {
		name := fmt.Sprintf("local-%d.%s", i, bedZone)
		ask(t, b.node, server4, name, dns.TypeA) // over lo
		names = append(names, name)
	}
	n := uint64(len(names))
	st := drained(t, tp)
	checkStats(t, st, n, n, map[string]uint64{})
	for _, name := range names {
		if c := rec.count(name); c != 1 {
			t.Errorf("%s handed to the cache %d times", name, c)
		}
	}
	cs := rec.cache.Stats()
	if cs.Inserts != n || cs.Entries != int(n) {
		t.Errorf("cache: %d inserts, %d entries, want %d", cs.Inserts, cs.Entries, n)
	}
	t.Logf("%d pod replies (%d IPv4, %d IPv6) and %d over lo: seen %d, accepted %d, kernel passed %d",
		pods+pods6, pods, pods6, locals, st.Seen, st.Accepted, st.KernelPackets)

	// Replies from another address, or from LocalDNS's address but another
	// port, are dropped in the kernel: user space never sees them.
	before := st
	for i := range 50 {
		ask(t, b.pod, bedOtherAddr+":53", fmt.Sprintf("other-addr-%d.%s", i, bedZone), dns.TypeA)
		ask(t, b.pod, fmt.Sprintf("%s:%d", bedAddr4, bedOtherPort), fmt.Sprintf("other-port-%d.%s", i, bedZone), dns.TypeA)
		ask(t, b.node, fmt.Sprintf("%s:%d", bedAddr4, bedOtherPort), fmt.Sprintf("other-port-lo-%d.%s", i, bedZone), dns.TypeA)
	}
	st = drained(t, tp)
	if st.Seen != before.Seen || st.KernelPackets != before.KernelPackets {
		t.Errorf("replies from elsewhere reached the tap: seen %d -> %d, kernel passed %d -> %d",
			before.Seen, st.Seen, before.KernelPackets, st.KernelPackets)
	}

	// Paused, the tap reads on but inserts nothing.
	tp.SetEnabled(false)
	for i := range 20 {
		ask(t, b.pod, server4, fmt.Sprintf("paused-%d.%s", i, bedZone), dns.TypeA)
	}
	st = drained(t, tp)
	checkStats(t, st, n+20, n, map[string]uint64{"disabled": 20})
	if got := rec.cache.Stats().Inserts; got != n {
		t.Errorf("paused tap inserted: %d inserts, want %d", got, n)
	}
	tp.SetEnabled(true)
	ask(t, b.pod, server4, "resumed."+bedZone, dns.TypeA)
	st = drained(t, tp)
	checkStats(t, st, n+21, n+1, map[string]uint64{"disabled": 20})
	if rec.count("resumed."+bedZone) != 1 || rec.count("paused-0."+bedZone) != 0 {
		t.Error("resume: wrong names inserted")
	}
}

// TestTapBridge is kubenet's layout: the pod's gateway is a bridge, so a
// reply leaves twice, on the bridge and then on its port (the veth). The
// tap reads both copies and inserts one.
func TestTapBridge(t *testing.T) {
	b := newBed(t, true)
	rec := newRecorder(t)
	tp := startTap(t, b.node, bedConfig(t), rec.sink)
	const n = 100
	for i := range n {
		ask(t, b.pod, bedAddr4+":53", fmt.Sprintf("bridged-%d.%s", i, bedZone), dns.TypeA)
	}
	st := drained(t, tp)
	checkStats(t, st, 2*n, n, map[string]uint64{"duplicate": n})
	for i := range n {
		if c := rec.count(fmt.Sprintf("bridged-%d.%s", i, bedZone)); c != 1 {
			t.Errorf("bridged-%d handed to the cache %d times", i, c)
		}
	}
	t.Logf("bridged pod: %d replies, seen %d, accepted %d, duplicates %d", n, st.Seen, st.Accepted, st.Rejected["duplicate"])
}

// TestTapBridgeForged: a second pod on the bridge sends replies with
// LocalDNS's source address and port to the first, which the bridge
// forwards out of the first pod's port as outgoing packets. The tap's
// eBPF filter passes none of them (they were received, not sent, by the
// node); the classic filter, which the tap falls back to when the kernel
// refuses eBPF, takes them all, as it would a reply from LocalDNS. Both
// take LocalDNS's genuine replies.
func TestTapBridgeForged(t *testing.T) {
	b := newBed(t, true)
	attacker := nstest.New(t, "attacker")
	must(t, nstest.AddVeth(nstest.End{NS: b.node, Name: "veth-attacker"},
		nstest.End{NS: attacker, Name: "eth0", Addrs: []string{"10.211.0.3/24"}}))
	nstest.Run(t, b.node, "ip", "link", "set", "veth-attacker", "master", "cbr0")
	waitUp(t, b.node, "cbr0")

	for _, tc := range []struct {
		name      string
		load      localLoader
		localOnly bool
	}{
		{"local", loadLocal, true},
		{"classic fallback", refuseLocal, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := newRecorder(t)
			tp := startTapWith(t, b.node, bedConfig(t), rec.sink, tc.load)
			if st := tp.Stats(); st.LocalOnly != tc.localOnly {
				t.Fatalf("LocalOnly %v, want %v", st.LocalOnly, tc.localOnly)
			}
			const n = 20
			victim := netip.AddrPortFrom(netip.MustParseAddr("10.211.0.2"), 40000)
			for i := range n {
				name := fmt.Sprintf("forged-%d.%s", i, bedZone)
				forge(t, attacker, udpPacket(netip.MustParseAddrPort(bedAddr4+":53"), victim, dnsReply(t, name)))
				ask(t, b.pod, bedAddr4+":53", fmt.Sprintf("genuine-%d.%s", i, bedZone), dns.TypeA)
			}
			st := drained(t, tp)
			forged := 0
			for i := range n {
				forged += rec.count(fmt.Sprintf("forged-%d.%s", i, bedZone))
				if c := rec.count(fmt.Sprintf("genuine-%d.%s", i, bedZone)); c != 1 {
					t.Errorf("genuine-%d handed to the cache %d times, want 1", i, c)
				}
			}
			want := 0
			if !tc.localOnly {
				want = n
			}
			if forged != want {
				t.Errorf("%d forged replies handed to the cache, want %d", forged, want)
			}
			t.Logf("%s: %d forged and %d genuine replies; kernel passed %d, accepted %d, forged inserted %d",
				tc.name, n, n, st.KernelPackets, st.Accepted, forged)
		})
	}
}

// startTapWith is startTap with the loader of the local-only filter given.
func startTapWith(t *testing.T, ns *nstest.Namespace, cfg Config, sink Sink, load localLoader) *Tap {
	t.Helper()
	var tp *Tap
	must(t, ns.Do(func() error {
		var err error
		tp, err = start(context.Background(), cfg, sink, load)
		return err
	}))
	t.Cleanup(func() { tp.Close() })
	return tp
}

// forge sends the IPv4 packet pkt from ns through a raw socket, as any pod
// with the default NET_RAW capability can: the kernel fills in the header
// checksum and keeps the forged source address.
func forge(t *testing.T, ns *nstest.Namespace, pkt []byte) {
	t.Helper()
	must(t, ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
		if err != nil {
			return fmt.Errorf("raw socket: %w", err)
		}
		defer unix.Close(fd)
		var dst [4]byte
		copy(dst[:], pkt[16:20])
		return unix.Sendto(fd, pkt, 0, &unix.SockaddrInet4{Addr: dst})
	}))
}

// TestTapClose checks that Close stops a tap blocked in its read at once
// and can be repeated, and that a cancelled context stops it too.
func TestTapClose(t *testing.T) {
	nstest.RequireRoot(t)
	node := nstest.New(t, "node")
	cfg := bedConfig(t)
	cfg.Addrs = cfg.Addrs[:1]
	var tp *Tap
	must(t, node.Do(func() (err error) {
		tp, err = Start(context.Background(), cfg, func([]byte) error { return nil })
		return err
	}))
	testkit.Eventually(t, 5*time.Second, "the reader to wait for packets", func() bool {
		buf := make([]byte, 1<<20)
		return bytes.Contains(buf[:runtime.Stack(buf, true)], []byte("(*waiter).forPackets"))
	})
	start := time.Now()
	must(t, tp.Close())
	if d := time.Since(start); d > time.Second {
		t.Errorf("Close took %v", d)
	}
	must(t, tp.Close())
	select {
	case <-tp.Done():
	default:
		t.Error("Done not closed after Close")
	}

	ctx, cancel := context.WithCancel(context.Background())
	must(t, node.Do(func() (err error) { tp, err = Start(ctx, cfg, func([]byte) error { return nil }); return err }))
	cancel()
	select {
	case <-tp.Done():
	case <-time.After(time.Second):
		t.Fatal("tap still running a second after its context ended")
	}
	must(t, tp.Close())
}

// The load helper: run as a separate process (so its CPU is not the
// tap's), it sends queries for distinct names to a server as fast as a
// window of outstanding queries allows, and prints how many were answered.
const loadEnv = "DNSSTANDBY_TAP_LOAD" // "SERVER COUNT PREFIX"

func TestTapLoadHelper(t *testing.T) {
	spec := os.Getenv(loadEnv)
	if spec == "" {
		t.Skip("helper process for the tap's load tests")
	}
	var server, prefix string
	var count int
	if _, err := fmt.Sscan(spec, &server, &count, &prefix); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	got, err := blast(server, count, prefix)
	fmt.Printf("answered %d of %d in %d µs\n", got, count, time.Since(start).Microseconds())
	if err != nil {
		t.Fatal(err)
	}
}

// TestFilterLoopbackKernel shows, in the kernel, what the packet-type test
// is for: a socket with the tap's filter less its first two instructions
// (load pkt_type; drop unless PACKET_OUTGOING) gets every reply over lo
// twice, the tap's filter once; with the eBPF filter and the classic one.
func TestFilterLoopbackKernel(t *testing.T) {
	b := newBed(t, false)
	spec, err := newFilterSpec([]netip.Addr{netip.MustParseAddr(bedAddr4)}, 53, 0, false)
	must(t, err)
	prog, err := spec.program(kernelLoads)
	must(t, err)
	if _, ok := prog[0].(bpf.LoadExtension); !ok || prog[0].(bpf.LoadExtension).Num != bpf.ExtType {
		t.Fatalf("program does not start with the packet type:\n%s", spec.listing(kernelLoads))
	}
	for _, tc := range []struct {
		name string
		load localLoader
	}{{"local", loadLocal}, {"classic", refuseLocal}} {
		t.Run(tc.name, func(t *testing.T) {
			var full, anyDir int
			must(t, b.node.Do(func() error {
				var err error
				if full, _, err = openSocket(prog, 0, tc.load); err != nil {
					return err
				}
				anyDir, _, err = openSocket(prog[2:], 0, tc.load) // jumps are relative: the rest stands alone
				return err
			}))
			defer unix.Close(full)
			defer unix.Close(anyDir)
			const n = 20
			for i := range n {
				ask(t, b.node, bedAddr4+":53", fmt.Sprintf("lo-%s-%d.%s", tc.name, i, bedZone), dns.TypeA)
			}
			count := func(fd int) int {
				bt := newBatch(64, slotSize)
				total := 0
				for {
					k, err := bt.recv(fd)
					must(t, err)
					if k == 0 {
						return total
					}
					total += k
				}
			}
			// No wait: the kernel queued both copies of each reply before the
			// reply reached its client (an outgoing one as it was sent, the
			// incoming one on lo before IP took it), so ask returned after both.
			// Over lo the incoming copy has been received (ingress ifindex lo):
			// without the direction test, only the classic filter passes it.
			if got := count(full); got != n {
				t.Errorf("tap's filter: %d packets for %d replies over lo, want %d", got, n, n)
			}
			want := 2 * n
			if tc.name == "local" {
				want = n
			}
			if got := count(anyDir); got != want {
				t.Errorf("filter without the direction test: %d packets for %d replies over lo, want %d", got, n, want)
			}
		})
	}
}

// refuseLocal is a localLoader the kernel refuses, as one without eBPF
// would: the tap falls back to the classic filter.
func refuseLocal(asm.Instructions) (*ebpf.Program, error) {
	return nil, fmt.Errorf("load refused: %w", unix.EPERM)
}

// TestTapExcludeMark answers from a responder whose socket marks its
// packets (SO_MARK), as dnsstandby's own could: a tap with ExcludeMark
// never sees them, one without takes them all.
func TestTapExcludeMark(t *testing.T) {
	nstest.RequireRoot(t)
	node, pod := nstest.New(t, "node"), nstest.New(t, "pod")
	must(t, node.AddLink("localdns", "", bedAddr4+"/32"))
	must(t, nstest.AddVeth(
		nstest.End{NS: node, Name: "veth-pod", Addrs: []string{"10.211.0.1/24"}},
		nstest.End{NS: pod, Name: "eth0", Addrs: []string{"10.211.0.2/24"}}))
	must(t, pod.AddRoute(nstest.Route{Dst: "169.254.10.0/24", Via: "10.211.0.1"}))
	const mark = 0x5d5
	var conn net.PacketConn
	must(t, node.Do(func() (err error) {
		lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, mark) })
			return errors.Join(err, serr)
		}}
		conn, err = lc.ListenPacket(context.Background(), "udp4", bedAddr4+":53")
		return err
	}))
	defer conn.Close()
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := conn.ReadFrom(buf)
			if err != nil {
				return
			}
			var q dns.Msg
			if q.Unpack(buf[:n]) != nil {
				continue
			}
			r := new(dns.Msg)
			r.SetReply(&q)
			rr, _ := dns.NewRR(q.Question[0].Name + " 60 IN A 192.0.2.9")
			r.Answer = []dns.RR{rr}
			out, _ := r.Pack()
			conn.WriteTo(out, from)
		}
	}()
	addrs := []netip.Addr{netip.MustParseAddr(bedAddr4)}
	cfg := bedConfig(t)
	cfg.Addrs, cfg.ExcludeMark = addrs, mark
	excluding := startTap(t, node, cfg, func([]byte) error { return nil })
	cfg.ExcludeMark = mark + 1
	other := startTap(t, node, cfg, func([]byte) error { return nil })
	const n = 30
	for i := range n {
		ask(t, pod, bedAddr4+":53", fmt.Sprintf("marked-%d.%s", i, bedZone), dns.TypeA)
	}
	if st := drained(t, other); st.Accepted != n {
		t.Errorf("tap excluding another mark took %d of %d replies", st.Accepted, n)
	}
	if st := excluding.Stats(); st.Seen != 0 || st.KernelPackets != 0 {
		t.Errorf("tap excluding the responder's mark saw %d (kernel passed %d)", st.Seen, st.KernelPackets)
	}
}
