package dnat_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
	"github.com/dnsstandby/dnsstandby/mirror/tap"
	"github.com/dnsstandby/dnsstandby/takeover/dnat"
)

const kubeDNS = "10.0.0.10"

var listen = netip.MustParseAddrPort(testkit.PodListener + ":53")

// TestNATFallback builds AKS's v3 fallback in a namespace: a pod behind a
// veth queries 169.254.10.11, where "our" socket serves, until an
// iptables nat chain LOCALDNS-FALLBACK, first in PREROUTING, DNATs it to
// a CoreDNS standing in for kube-dns. The tap (seen) and our socket
// (received) then disagree, conntrack confirms, and the Detector says
// diverted; with the chain gone, it says so again. Every query is
// answered throughout: the detection touches none.
func TestNATFallback(t *testing.T) {
	nstest.RequireRoot(t)
	bin := nstest.CoreDNSBinary(t)
	node, pod := nstest.New(t, "node"), nstest.New(t, "pod")
	must(t, node.AddLink("localdns", "", testkit.PodListener+"/32"))
	must(t, node.AddLink("kubedns", "", kubeDNS+"/32"))
	must(t, nstest.AddVeth(nstest.End{NS: node, Name: "veth-pod", Addrs: []string{"10.212.0.1/24"}},
		nstest.End{NS: pod, Name: "eth0", Addrs: []string{"10.212.0.2/24"}}))
	must(t, pod.AddRoute(nstest.Route{Dst: "default", Via: "10.212.0.1"}))
	nstest.StartCoreDNS(t, node, nstest.CoreDNSConfig{Binary: bin, Probe: kubeDNS + ":53", Corefile: `.:53 {
	bind ` + kubeDNS + `
	template IN A test {
		answer "{{ .Name }} 60 IN A 192.0.2.53"
	}
}`})

	// Our socket: answers every query with 192.0.2.11, counting them.
	var received atomic.Uint64
	var conn *net.UDPConn
	must(t, node.Do(func() error {
		c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(listen))
		conn = c
		return err
	}))
	t.Cleanup(func() { conn.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			received.Add(1)
			var q dns.Msg
			if q.Unpack(buf[:n]) != nil {
				continue
			}
			r := new(dns.Msg)
			r.SetReply(&q)
			rr, _ := dns.NewRR(q.Question[0].Name + " 60 IN A 192.0.2.11")
			r.Answer = append(r.Answer, rr)
			b, _ := r.Pack()
			conn.WriteToUDPAddrPort(b, from)
		}
	}()

	tc := tap.DefaultConfig()
	tc.Addrs, tc.Queries, tc.Logger = []netip.Addr{listen.Addr()}, true, testkit.Logger(t)
	var tp *tap.Tap
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	must(t, node.Do(func() error {
		var err error
		tp, err = tap.Start(ctx, tc, func([]byte) error { return nil })
		return err
	}))
	t.Cleanup(func() { tp.Close() })
	counts := func() dnat.Counts { return dnat.Counts{Seen: tp.Stats().Queries, Received: received.Load()} }
	flows := func() (f []dnat.Flow, err error) {
		err = node.Do(func() error { f, err = dnat.Flows(); return err })
		return f, err
	}

	det, err := dnat.New(dnat.DefaultConfig())
	must(t, err)
	det.Step(counts(), 1, flows, []netip.AddrPort{listen})
	// queries sends n queries from the pod, each from a new port (as
	// glibc does), and returns the address that answered them.
	queries := func(n int) string {
		var answered string
		for i := range n {
			q := new(dns.Msg)
			q.SetQuestion(dns.Fqdn("q"+string(rune('a'+i%26))+".test"), dns.TypeA)
			r, err := pod.Exchange("udp", "", listen.String(), q, time.Second)
			if err != nil || len(r.Answer) != 1 {
				t.Fatalf("query %d: %v %v: every query must be answered", i, r, err)
			}
			answered = r.Answer[0].(*dns.A).A.String()
		}
		// The tap reads in batches; let it catch up with what was sent.
		time.Sleep(100 * time.Millisecond)
		return answered
	}
	step := func(what string, wantChanged, wantDiverted bool) dnat.Flow {
		t.Helper()
		changed, by, err := det.Step(counts(), 1, flows, []netip.AddrPort{listen})
		if err != nil {
			t.Errorf("%s: %v", what, err)
		}
		if changed != wantChanged || det.Diverted() != wantDiverted {
			t.Fatalf("%s: changed %v diverted %v, want %v %v (counts %+v)", what, changed, det.Diverted(), wantChanged, wantDiverted, counts())
		}
		return by
	}

	if a := queries(30); a != "192.0.2.11" {
		t.Fatalf("before the fallback, answered by %s, want our socket", a)
	}
	step("served by our socket", false, false)

	// AKS's v3 fallback starts.
	nstest.Run(t, node, "iptables", "-w", "-t", "nat", "-N", "LOCALDNS-FALLBACK")
	nstest.Run(t, node, "iptables", "-w", "-t", "nat", "-A", "LOCALDNS-FALLBACK", "-d", testkit.PodListener, "-p", "udp", "--dport", "53",
		"-j", "DNAT", "--to-destination", kubeDNS+":53")
	nstest.Run(t, node, "iptables", "-w", "-t", "nat", "-I", "PREROUTING", "1", "-j", "LOCALDNS-FALLBACK")
	before := received.Load()
	if a := queries(30); a != "192.0.2.53" {
		t.Fatalf("with the chain, answered by %s, want kube-dns", a)
	}
	if got := received.Load() - before; got != 0 {
		t.Errorf("our socket received %d queries through the DNAT, want 0", got)
	}
	by := step("DNATed", true, true)
	if by.OrigDst != listen || by.ReplySrc != netip.MustParseAddrPort(kubeDNS+":53") {
		t.Errorf("confirmed by flow %+v, want %s answered from %s:53", by, listen, kubeDNS)
	}
	began := time.Now()
	all, err := flows()
	must(t, err)
	t.Logf("tap saw %d queries, our socket received %d; confirmed by conntrack flow %s -> %s; a dump of %d UDP flows took %v",
		counts().Seen, counts().Received, by.OrigDst, by.ReplySrc, len(all), time.Since(began))

	// Hand-back: localdns.service's ExecStartPre stops the fallback, which
	// removes its chain.
	nstest.Run(t, node, "iptables", "-w", "-t", "nat", "-D", "PREROUTING", "-j", "LOCALDNS-FALLBACK")
	// Cleared after ClearAfter clear intervals without a new DNATed flow
	// (the flows it DNATed stay in conntrack meanwhile).
	for i := range dnat.DefaultConfig().ClearAfter {
		if a := queries(30); a != "192.0.2.11" {
			t.Fatalf("after the chain went, answered by %s, want our socket", a)
		}
		last := i == dnat.DefaultConfig().ClearAfter-1
		step(fmt.Sprintf("served again, interval %d", i+1), last, !last)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestClearListenFlows builds what AKS's nat fallback leaves behind on a
// node whose nat table stays in use (kube-proxy's): a client port that
// asked 169.254.10.11 through the DNAT holds a conntrack entry with that
// query's tuple, and once the DNAT is gone and LocalDNS's NOTRACK rules are
// back, LocalDNS's reply to the same port collides with it and can have its
// source port rewritten, which the client's connected socket drops, then
// and at every retry. ClearListenFlows deletes the entries: the next try
// from that port is answered, from port 53.
func TestClearListenFlows(t *testing.T) {
	nstest.RequireRoot(t)
	bin := nstest.CoreDNSBinary(t)
	node := nstest.New(t, "node")
	must(t, node.AddLink("localdns", "", testkit.PodListener+"/32"))
	must(t, node.AddLink("kubedns", "", kubeDNS+"/32"))
	nstest.StartCoreDNS(t, node, nstest.CoreDNSConfig{Binary: bin, Probe: kubeDNS + ":53", Corefile: `.:53 {
	bind ` + kubeDNS + `
	template IN A test {
		answer "{{ .Name }} 60 IN A 192.0.2.53"
	}
}`})
	nstest.StartCoreDNS(t, node, nstest.CoreDNSConfig{Binary: bin, Probe: listen.String(), Corefile: `.:53 {
	bind ` + testkit.PodListener + `
	template IN A test {
		answer "{{ .Name }} 60 IN A 192.0.2.11"
	}
}`})
	// kube-proxy's rules match conntrack states (its INVALID drop), which
	// keeps conntrack on for every packet; one such rule does here.
	nstest.Run(t, node, "iptables", "-w", "-t", "mangle", "-A", "POSTROUTING", "-m", "conntrack", "--ctstate", "INVALID", "-j", "RETURN")
	notrack := func(op string) {
		for _, chain := range []string{"OUTPUT", "PREROUTING"} {
			nstest.Run(t, node, "iptables", "-w", "-t", "raw", op, chain, "-d", testkit.PodListener, "-p", "udp", "--dport", "53", "-j", "NOTRACK")
		}
	}
	// ask asks from a connected socket on port, as glibc does, and
	// returns the answer's address, or "" if nothing came.
	ask := func(port int) string {
		var answer string
		must(t, node.Do(func() error {
			c := &dns.Client{Net: "udp", Timeout: 500 * time.Millisecond, Dialer: &net.Dialer{LocalAddr: &net.UDPAddr{Port: port}}}
			q := new(dns.Msg)
			q.SetQuestion("a.test.", dns.TypeA)
			r, _, err := c.Exchange(q, listen.String())
			if err == nil && len(r.Answer) == 1 {
				answer = r.Answer[0].(*dns.A).A.String()
			}
			return nil
		}))
		return answer
	}
	// Ports: LocalDNS's reply to a port makes an entry whose reply
	// direction is that port's next query, which no DNAT then touches.
	const before, during = 40001, 40000
	notrack("-A")
	if a := ask(before); a != "192.0.2.11" {
		t.Fatalf("before the fallback: answered by %q, want LocalDNS", a)
	}
	// The fallback: LocalDNS's cleanup removed its NOTRACK rules, and the
	// chain DNATs the listen address to kube-dns.
	notrack("-D")
	nstest.Run(t, node, "iptables", "-w", "-t", "nat", "-N", "LOCALDNS-FALLBACK")
	nstest.Run(t, node, "iptables", "-w", "-t", "nat", "-A", "LOCALDNS-FALLBACK", "-d", testkit.PodListener, "-p", "udp", "--dport", "53",
		"-j", "DNAT", "--to-destination", kubeDNS+":53")
	nstest.Run(t, node, "iptables", "-w", "-t", "nat", "-I", "OUTPUT", "1", "-j", "LOCALDNS-FALLBACK")
	if a := ask(during); a != "192.0.2.53" {
		t.Fatalf("during the fallback: answered by %q, want kube-dns", a)
	}
	// The hand-back: the chain gone, LocalDNS's NOTRACK rules back.
	nstest.Run(t, node, "iptables", "-w", "-t", "nat", "-D", "OUTPUT", "-j", "LOCALDNS-FALLBACK")
	nstest.Run(t, node, "iptables", "-w", "-t", "nat", "-F", "LOCALDNS-FALLBACK")
	nstest.Run(t, node, "iptables", "-w", "-t", "nat", "-X", "LOCALDNS-FALLBACK")
	notrack("-A")
	if a := ask(during); a != "" {
		t.Logf("after the hand-back, before the entries went: answered by %s (this kernel kept the reply's port)", a)
	} else {
		t.Logf("after the hand-back, before the entries went: no answer (the reply's port rewritten)")
	}
	var n int
	must(t, node.Do(func() (err error) { n, err = dnat.ClearListenFlows([]netip.AddrPort{listen}); return err }))
	if n == 0 {
		t.Errorf("ClearListenFlows deleted no entry; the fallback's query left one")
	}
	if a := ask(during); a != "192.0.2.11" {
		t.Errorf("after ClearListenFlows (%d entries): answered by %q, want LocalDNS", n, a)
	}
}
