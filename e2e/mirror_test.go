package e2e

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// forgedIP is the address forged replies carry: a pod that gets it was
// poisoned.
const forgedIP = "192.0.2.66"

// bridgedPods are two pods on a Linux bridge in the node namespace, as
// kubenet's cbr0 (and bridge-mode CNIs) join them: the node routes a
// pod's queries to LocalDNS, and the bridge forwards frames between the
// pods without the node's routing (and its check that no packet from
// outside carries a local source address) ever seeing them.
type bridgedPods struct {
	victim, attacker *nstest.Namespace
	victimIP         netip.Addr
}

func (l *lab) bridgedPods(t *testing.T) bridgedPods {
	t.Helper()
	p := bridgedPods{
		victim:   nstest.New(t, "victim"),
		attacker: nstest.New(t, "attacker"),
		victimIP: netip.MustParseAddr("10.211.0.2"),
	}
	must(t, l.node.AddLink("cbr0", "bridge", "10.211.0.1/24"))
	for i, pod := range []*nstest.Namespace{p.victim, p.attacker} {
		port := fmt.Sprintf("veth-pod%d", i)
		must(t, nstest.AddVeth(nstest.End{NS: l.node, Name: port},
			nstest.End{NS: pod, Name: "eth0", Addrs: []string{fmt.Sprintf("10.211.0.%d/24", i+2)}}))
		nstest.Run(t, l.node, "ip", "link", "set", port, "master", "cbr0")
		must(t, pod.AddRoute(nstest.Route{Dst: "169.254.10.0/24", Via: "10.211.0.1"}))
	}
	// The bridge forwards once it has carrier from its ports.
	testkit.Eventually(t, 5*time.Second, "cbr0 up", func() bool {
		out := nstest.Run(t, l.node, "ip", "-o", "link", "show", "cbr0")
		return !strings.Contains(out, "NO-CARRIER") && !strings.Contains(out, "state DOWN")
	})
	return p
}

// forge sends, from the attacker pod, a reply for name with LocalDNS's
// source address and port to the victim, its A record the forged address
// with a TTL of a day: a raw IPv4 packet, as any pod with the default
// NET_RAW capability can send. The bridge forwards it to the victim's
// port, where it leaves the node namespace as an outgoing UDP reply from
// 169.254.10.11:53, like LocalDNS's own.
func (p bridgedPods) forge(t *testing.T, name string) {
	t.Helper()
	q := new(dns.Msg)
	q.SetQuestion(name, dns.TypeA)
	m := new(dns.Msg)
	m.SetReply(q)
	m.RecursionAvailable = true
	r, err := dns.NewRR(name + " 86400 IN A " + forgedIP)
	must(t, err)
	m.Answer = append(m.Answer, r)
	payload, err := m.Pack()
	must(t, err)
	put16 := func(b []byte, v int) { b[0], b[1] = byte(v>>8), byte(v) }
	pkt := make([]byte, 28+len(payload))
	pkt[0] = 0x45 // IPv4, 20-byte header
	put16(pkt[2:], len(pkt))
	pkt[8] = 64
	pkt[9] = syscall.IPPROTO_UDP
	src, dst := netip.MustParseAddr(standbyIP).As4(), p.victimIP.As4()
	copy(pkt[12:], src[:])
	copy(pkt[16:], dst[:])
	put16(pkt[20:], 53)
	put16(pkt[22:], 40000)
	put16(pkt[24:], 8+len(payload))
	copy(pkt[28:], payload)
	must(t, p.attacker.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
		if err != nil {
			return fmt.Errorf("raw socket: %w", err)
		}
		defer unix.Close(fd)
		// The kernel fills in the IP checksum; a UDP checksum of 0 is none.
		return unix.Sendto(fd, pkt, 0, &unix.SockaddrInet4{Addr: dst})
	}))
}

// askFrom sends a query for name from pod over network and returns the
// reply, failing the test if none comes.
func askFrom(t *testing.T, pod *nstest.Namespace, network, name string) *dns.Msg {
	t.Helper()
	m := svcQuery(name)
	m.SetEdns0(1232, false)
	m.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_NSID{Code: dns.EDNS0NSID}}
	r, err := pod.Exchange(network, "", standbyAddr, m, timeout)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return r
}

// poisoned reports whether r carries the forged address.
func poisoned(r *dns.Msg) bool {
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok && a.A.Equal(net.ParseIP(forgedIP)) {
			return true
		}
	}
	return false
}

// mirrored is how many replies the tap has handed on or rejected so far.
func (l *lab) mirrored(t *testing.T, s *standby) float64 {
	return l.metric(t, s, "dnsstandby_mirror_records_total", "source", "tap")
}

// TestMirrorForgedBridgedReply: a reply forged by one pod with LocalDNS's
// source address, which a Linux bridge forwards to another pod, must never
// reach dnsstandby's cache: not while LocalDNS answers (TCP, which is not
// fully steered to LocalDNS when its listener is MPTCP), not in hold, not
// in takeover, and not from the snapshot after a restart.
func TestMirrorForgedBridgedReply(t *testing.T) {
	l := newLab(t)
	p := l.bridgedPods(t)
	ref := l.startReference(t)
	state := t.TempDir()
	admin := filepath.Join(t.TempDir(), "admin.sock")
	flags := []string{"--steering", "adopt", "--mirror", "tap", "--state-dir", state}
	s := l.startStandby(t, append(flags, "--admin-socket", admin)...)
	l.eventuallyMetric(t, s, 5*time.Second, "tap enabled", func() bool {
		return l.metric(t, s, "dnsstandby_mirror_tap_enabled") == 1
	}, "dnsstandby_mode", "dnsstandby_steer", "mirror", "peer_sockets")
	t.Logf("tap filter local only: %v", l.metric(t, s, "dnsstandby_mirror_tap_local_only"))

	// known is asked first and cached genuinely; fresh is forged before any
	// pod asks it, then asked (LocalDNS's genuine reply must win); never is
	// forged and never asked of LocalDNS.
	known, fresh, never, marker := l.zones.Services[0], l.zones.Services[1], l.zones.Services[2], l.zones.Services[3]
	for range 3 {
		if r := askFrom(t, p.victim, "udp", known.FQDN); len(r.Answer) != 1 {
			t.Fatalf("%s: %v", known.FQDN, r)
		}
	}
	before := l.mirrored(t, s)
	for _, svc := range []string{known.FQDN, fresh.FQDN, never.FQDN} {
		p.forge(t, svc)
	}
	// The tap reads in order: once the marker's reply is counted, so were
	// the forged frames before it, whatever was done with them.
	askFrom(t, p.victim, "udp", marker.FQDN)
	l.eventuallyMetric(t, s, 5*time.Second, "the tap to read the marker's reply", func() bool {
		return l.mirrored(t, s) > before
	}, "dnsstandby_mirror")
	for range 3 {
		if r := askFrom(t, p.victim, "udp", fresh.FQDN); poisoned(r) || len(r.Answer) != 1 {
			t.Fatalf("LocalDNS's answer for %s: %v", fresh.FQDN, r)
		}
	}
	checkClean := func(when string, names ...string) {
		t.Helper()
		for _, name := range names {
			r := askFrom(t, p.victim, "udp", name)
			if poisoned(r) {
				t.Errorf("%s: %s answered with the forged record: %v", when, name, r.Answer)
			}
		}
	}

	// Healthy: TCP connections are hashed over LocalDNS and dnsstandby
	// when LocalDNS listens with MPTCP, and dnsstandby answers from its
	// cache.
	byStandby := 0
	for range 20 {
		r := askFrom(t, p.victim, "tcp", fresh.FQDN)
		if nsid(r) == "dnsstandby" {
			byStandby++
		}
		if poisoned(r) {
			t.Errorf("healthy, TCP (answered by %s): %s answered with the forged record", nsid(r), fresh.FQDN)
		}
	}
	t.Logf("healthy: %d of 20 TCP queries answered by dnsstandby", byStandby)

	// Hold: dnsstandby answers everything, LocalDNS still bound.
	nstest.Run(t, l.node, binary, "hold", "--admin-socket", admin)
	l.eventuallyMetric(t, s, 5*time.Second, "hold", func() bool { return l.metric(t, s, "dnsstandby_mode", "mode", "hold") == 1 })
	checkClean("hold", known.FQDN, fresh.FQDN, never.FQDN)
	nstest.Run(t, l.node, binary, "release", "--admin-socket", admin)

	// Takeover with kube-dns unreachable: only the cache answers.
	nstest.Run(t, l.node, "ip", "link", "set", "to-kubedns", "down")
	must(t, ref.Stop())
	l.eventuallyMetric(t, s, 5*time.Second, "takeover", func() bool { return l.metric(t, s, "dnsstandby_mode", "mode", "takeover") == 1 })
	checkClean("takeover", known.FQDN, fresh.FQDN, never.FQDN)
	if r := askFrom(t, p.victim, "udp", known.FQDN); len(r.Answer) != 1 {
		t.Errorf("takeover: %s not answered from the mirrored cache: %v", known.FQDN, r)
	}

	// A restart loads the snapshot written at stop.
	must(t, s.Signal(syscall.SIGTERM))
	select {
	case <-s.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("dnsstandby did not exit after SIGTERM")
	}
	s = l.startStandby(t, flags...)
	checkClean("after a restart, from the snapshot", known.FQDN, fresh.FQDN, never.FQDN)
	if r := askFrom(t, p.victim, "udp", known.FQDN); len(r.Answer) != 1 {
		t.Errorf("after a restart: %s not answered from the snapshot: %v", known.FQDN, r)
	}
}

// TestMirrorFloodKeepsUsedEntry: a pod's flood of names nobody else asks
// — replies forged across the bridge, and real queries to LocalDNS for
// made-up names — must not evict an entry that pods use from a cache
// much smaller than the flood.
func TestMirrorFloodKeepsUsedEntry(t *testing.T) {
	l := newLab(t)
	p := l.bridgedPods(t)
	ref := l.startReference(t)
	s := l.startStandby(t, "--steering", "adopt", "--mirror", "tap", "--cache-max-entries", "200")
	l.eventuallyMetric(t, s, 5*time.Second, "tap enabled", func() bool {
		return l.metric(t, s, "dnsstandby_mirror_tap_enabled") == 1
	}, "dnsstandby_mode", "dnsstandby_steer", "mirror", "peer_sockets")

	used := l.zones.Services[0].FQDN
	for range 3 {
		if r := askFrom(t, p.victim, "udp", used); len(r.Answer) != 1 {
			t.Fatalf("%s: %v", used, r)
		}
	}
	const flood = 400
	before := l.mirrored(t, s)
	conn, err := p.attacker.Dial("udp", "", standbyAddr, timeout)
	must(t, err)
	defer conn.Close()
	c := dns.Client{Net: "udp", Timeout: timeout}
	for i := range flood {
		name := fmt.Sprintf("flood-%d.default.svc.cluster.local.", i)
		p.forge(t, fmt.Sprintf("forged-%d.default.svc.cluster.local.", i))
		if _, _, err := c.ExchangeWithConn(svcQuery(name), &dns.Conn{Conn: conn}); err != nil {
			t.Fatalf("flood query %s: %v", name, err)
		}
	}
	// Each real reply leaves on the bridge and on the attacker's port: at
	// least flood records, whatever becomes of the forged ones.
	l.eventuallyMetric(t, s, 10*time.Second, "the tap to read the flood", func() bool {
		return l.mirrored(t, s) >= before+flood
	}, "dnsstandby_mirror", "dnsstandby_cache")

	nstest.Run(t, l.node, "ip", "link", "set", "to-kubedns", "down")
	must(t, ref.Stop())
	l.eventuallyMetric(t, s, 5*time.Second, "takeover", func() bool { return l.metric(t, s, "dnsstandby_mode", "mode", "takeover") == 1 })
	if r := askFrom(t, p.victim, "udp", used); len(r.Answer) != 1 || poisoned(r) {
		_, body, _ := l.get(s, "/metrics")
		t.Fatalf("after the flood, %s from the cache: %v\n%s", used, r, grepLines(body, "dnsstandby_cache", "dnsstandby_mirror"))
	}
	t.Logf("after the flood: %v entries, %v on probation, %v evicted",
		l.metric(t, s, "dnsstandby_cache_entries"), l.metric(t, s, "dnsstandby_cache_probation_entries"), l.metric(t, s, "dnsstandby_cache_evictions_total"))
}
