package tap

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/dnsstandby/dnsstandby/internal/cgroupv2"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// newRingBed is newBed with CoreDNS in a cgroup of its own, as systemd
// starts LocalDNS in localdns.service's.
func newRingBed(t *testing.T, bridged bool) *bed {
	t.Helper()
	nstest.RequireRoot(t)
	dir, err := cgroupv2.Make(fmt.Sprintf("dnsstandby-tap-test-%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "-")))
	if err != nil {
		t.Skipf("no cgroup2 hierarchy to start LocalDNS in: %v", err)
	}
	// Registered first, so it runs last: after CoreDNS has stopped.
	t.Cleanup(func() {
		if err := cgroupv2.Remove(dir); err != nil {
			t.Error(err)
		}
	})
	return newBedIn(t, bridged, dir)
}

// toRing names the bed's CoreDNS to the taps as LocalDNS and checks that
// they went to ring mode.
func toRing(t *testing.T, b *bed, taps ...*Tap) {
	t.Helper()
	for _, tp := range taps {
		tp.SetLocalDNS([]int{b.coredns.Pid()})
		if !tp.Stats().Ring {
			t.Fatal("the tap stayed in packet mode after SetLocalDNS")
		}
	}
}

// packetSocketStats is what the taps' packet sockets passed since the
// taps' counters last read them, in a string to compare with "[0 0]...".
func packetSocketStats(t *testing.T, taps ...*Tap) string {
	t.Helper()
	var s string
	for _, tp := range taps {
		tp.mu.Lock()
		p, d, err := kernelStats(tp.fd)
		tp.mu.Unlock()
		must(t, err)
		s += fmt.Sprintf("[%d %d]", p, d)
	}
	return s
}

// TestRingPrograms loads the ring mode's programs into the kernel, as the
// tap builds them for each kind of address list: the verifier must take
// every one.
func TestRingPrograms(t *testing.T) {
	nstest.RequireRoot(t)
	a4, b4 := netip.MustParseAddr("169.254.10.10"), netip.MustParseAddr("169.254.10.11")
	a6 := netip.MustParseAddr("fd00:10::11")
	tests := []struct {
		name  string
		addrs []netip.Addr
		mark  uint32
	}{
		{"one IPv4", []netip.Addr{b4}, 0},
		{"two IPv4 and a mark", []netip.Addr{a4, b4}, 0x1234},
		{"one IPv6", []netip.Addr{a6}, 0},
		{"both", []netip.Addr{a4, a6}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec, err := newFilterSpec(tt.addrs, 53, tt.mark, true)
			must(t, err)
			for _, netns := range []uint64{0, 12345} {
				r, err := newRing(spec, 1<<16, loadLocal, netns)
				must(t, err)
				r.close()
			}
		})
	}
	// The record block alone, the part both programs share, is small
	// enough to read: four classes.
	if n := len(recordBlock("r", recordReply, 1)); n > 140 {
		t.Errorf("record block is %d instructions", n)
	}
}

// TestTapRingLocalDNSRestarts: LocalDNS restarted by systemd runs in a new
// cgroup at the same path; the egress program, attached to the old one,
// sees nothing of it until SetLocalDNS names the new process, and then
// every reply again. A LocalDNS whose cgroup cannot be found sends the
// tap back to packet mode, where it still sees every reply.
func TestTapRingLocalDNSRestarts(t *testing.T) {
	nstest.RequireRoot(t)
	name := fmt.Sprintf("dnsstandby-tap-test-%d-restart", os.Getpid())
	dir, err := cgroupv2.Make(name)
	if err != nil {
		t.Skipf("no cgroup2 hierarchy to start LocalDNS in: %v", err)
	}
	t.Cleanup(func() { _ = cgroupv2.Remove(dir) }) // the last one; it may be gone already
	b := newBedIn(t, false, dir)
	rec := newRecorder(t)
	tp := startTap(t, b.node, ringConfig(t), rec.sink)
	toRing(t, b, tp)
	server := bedAddr4 + ":53"
	asked := 0
	askAll := func(prefix string) []string {
		var names []string
		for i := range 20 {
			name := fmt.Sprintf("%s-%d.%s", prefix, i, bedZone)
			ask(t, b.pod, server, name, dns.TypeA)
			names = append(names, name)
			asked++
		}
		return names
	}
	inserted := func(names []string) int {
		n := 0
		for _, name := range names {
			n += rec.count(name)
		}
		return n
	}

	first := askAll("first")
	testkit.Eventually(t, 5*time.Second, "the first LocalDNS's replies", func() bool { return inserted(first) == len(first) })

	// systemd stops the unit (its cgroup goes) and starts it again.
	must(t, b.coredns.Stop())
	must(t, cgroupv2.Remove(dir))
	again, err := cgroupv2.Make(name)
	must(t, err)
	if again != dir {
		t.Fatalf("cgroup made again at %s, not %s", again, dir)
	}
	b.coredns = nstest.StartCoreDNS(t, b.node, nstest.CoreDNSConfig{
		Binary: nstest.CoreDNSBinary(t), Corefile: bedCorefile, Probe: server, Cgroup: dir,
	})
	unseen := askAll("unseen")
	tp.SetLocalDNS([]int{b.coredns.Pid()})
	if !tp.Stats().Ring {
		t.Fatal("not in ring mode after the restart")
	}
	second := askAll("second")
	testkit.Eventually(t, 5*time.Second, "the restarted LocalDNS's replies", func() bool { return inserted(second) == len(second) })
	if n := inserted(unseen); n != 0 {
		t.Errorf("%d replies of the restarted LocalDNS seen before SetLocalDNS named it (the egress program was on the old cgroup)", n)
	}

	// A process whose cgroup cannot be read: back to packet mode.
	tp.SetLocalDNS([]int{1 << 30})
	if tp.Stats().Ring {
		t.Fatal("still in ring mode with LocalDNS's cgroup unknown")
	}
	third := askAll("packet")
	if testkit.Poll(context.Background(), 5*time.Second, func() (bool, error) { return inserted(third) == len(third), nil }) != nil {
		t.Fatalf("replies through the packet socket: %d of %d inserted; tap %+v", inserted(third), len(third), tp.Stats())
	}
	t.Logf("%d exchanges; ring, restart, packet mode: %+v", asked, tp.Stats())
}

// BenchmarkRingPrograms runs the ring mode's programs in the kernel
// (BPF_PROG_TEST_RUN) on one packet each: a reply the egress program
// records, a packet LocalDNS sends that it only looks at (a forward to an
// upstream), a query the query filter records, and a packet it drops (a
// reply to a node-local client received on lo). What the kernel adds per
// packet LocalDNS sends or the node receives; the ring is drained by a
// reader between rounds, as the tap drains it.
func BenchmarkRingPrograms(b *testing.B) {
	nstest.RequireRoot(b)
	local := netip.MustParseAddrPort("169.254.10.11:53")
	pod := netip.MustParseAddrPort("10.211.0.2:40000")
	upstream := netip.MustParseAddrPort("10.0.0.10:53")
	spec, err := newFilterSpec([]netip.Addr{local.Addr()}, local.Port(), 0, true)
	must(b, err)
	r, err := newRing(spec, 1<<22, loadLocal, 0)
	must(b, err)
	defer r.close()
	resp, q := dnsReply(b, "svc-1.default.svc.cluster.local"), dnsQuery(b, "svc-1.default.svc.cluster.local")
	tests := []struct {
		name string
		prog *ebpf.Program
		pkt  []byte
	}{
		{"egress/reply", r.egress, udpPacket(local, pod, resp)},
		{"egress/other", r.egress, udpPacket(netip.MustParseAddrPort("10.211.0.1:41000"), upstream, q)},
		{"query/query", r.query, udpPacket(pod, local, q)},
		{"query/other", r.query, udpPacket(local, pod, resp)},
	}
	for _, tt := range tests {
		b.Run(tt.name, func(b *testing.B) {
			// The packet socket's and the egress program's context both
			// start at the IP header; test runs take an Ethernet frame.
			frame := append(make([]byte, 14), tt.pkt...)
			frame[12], frame[13] = 0x08, 0x00
			const batch = 1000
			var per time.Duration
			for done := 0; done < b.N; done += batch {
				n := min(batch, b.N-done)
				_, d, err := tt.prog.Benchmark(frame, n, nil)
				if err != nil {
					b.Skipf("BPF_PROG_TEST_RUN: %v", err)
				}
				per += d * time.Duration(n)
				r.rd.each(func([]byte) {})
			}
			b.ReportMetric(float64(per.Nanoseconds())/float64(b.N), "ns/run")
		})
	}
}

// TestEgressNetns runs the egress program in the kernel (BPF_PROG_TEST_RUN,
// in the test's network namespace) on one of LocalDNS's replies: recorded
// when the program was made for this namespace's cookie or for none, not
// when made for another's. Every run lets the packet pass.
func TestEgressNetns(t *testing.T) {
	nstest.RequireRoot(t)
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	must(t, err)
	defer unix.Close(fd)
	here, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, soNetnsCookie)
	if err != nil {
		t.Skipf("no SO_NETNS_COOKIE: %v", err)
	}
	local := netip.MustParseAddrPort("169.254.10.11:53")
	spec, err := newFilterSpec([]netip.Addr{local.Addr()}, local.Port(), 0, false)
	must(t, err)
	frame := append(make([]byte, 14), udpPacket(local, netip.MustParseAddrPort("10.211.0.2:40000"), dnsReply(t, "a.example"))...)
	frame[12], frame[13] = 0x08, 0x00
	tests := []struct {
		name    string
		netns   uint64
		records int
	}{
		{"no check", 0, 1},
		{"this namespace", here, 1},
		{"another namespace", here + 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := newRing(spec, 1<<16, loadLocal, tt.netns)
			must(t, err)
			defer r.close()
			if tt.netns != 0 && !r.netnsChecked {
				t.Skip("the kernel has no bpf_get_netns_cookie for cgroup skb programs")
			}
			ret, err := r.egress.Run(&ebpf.RunOptions{Data: frame})
			must(t, err)
			if n := r.rd.each(func([]byte) {}); n != tt.records || ret != 1 {
				t.Errorf("%d records, verdict %d; want %d records, verdict 1 (pass)", n, ret, tt.records)
			}
		})
	}
}
