package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

// AKS's LocalDNS fallback (AgentBaker PR 9486) beside dnsstandby: its
// coredns design (a second CoreDNS in localdns-fallback.service on
// 169.254.10.11) and its nat design (a LOCALDNS-FALLBACK chain DNATing
// the listener to kube-dns). docs/design.md, Beside AKS's LocalDNS
// fallback.

// fallbackCorefile is the fallback's minimal Corefile as the PR describes
// it: 169.254.10.11, forwarding to kube-dns; nsid tells its answers.
var fallbackCorefile = `.:53 {
	bind ` + standbyIP + `
	nsid fallback
	forward . ` + kubeDNS + `
}`

// startFallbackCoreDNS runs the fallback's CoreDNS in the node namespace,
// in a cgroup named as systemd names the unit's, from its first
// instruction; the test skips where no cgroup can be made.
func startFallbackCoreDNS(t *testing.T, l *lab) *nstest.CoreDNS {
	t.Helper()
	var root string
	for _, dir := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd", "/sys/fs/cgroup"} {
		if _, err := os.Stat(filepath.Join(dir, "cgroup.procs")); err == nil {
			root = dir
			break
		}
	}
	if root == "" {
		t.Skip("no cgroup hierarchy to make a unit's cgroup in")
	}
	top := filepath.Join(root, fmt.Sprintf("dnsstandby-e2e-%d", os.Getpid()))
	dir := filepath.Join(top, "localdns-fallback.service")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Skipf("cgroup %s not writable: %v", dir, err)
	}
	t.Cleanup(func() {
		for range 50 {
			if err := os.Remove(dir); err == nil || os.IsNotExist(err) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		os.Remove(top)
	})
	// `ip netns exec` mounts a /sys of its own: the shell writes through
	// our descriptor of the file.
	f, err := os.OpenFile(filepath.Join(dir, "cgroup.procs"), os.O_WRONLY, 0)
	must(t, err)
	t.Cleanup(func() { f.Close() })
	wrapper := filepath.Join(t.TempDir(), "coredns-in-unit")
	script := fmt.Sprintf("#!/bin/sh\necho $$ > /proc/%d/fd/%d || exit 1\nexec %s \"$@\"\n", os.Getpid(), f.Fd(), nstest.CoreDNSBinary(t))
	must(t, os.WriteFile(wrapper, []byte(script), 0o755))
	return nstest.StartCoreDNS(t, l.node, nstest.CoreDNSConfig{Binary: wrapper, Corefile: fallbackCorefile, Probe: standbyAddr})
}

// whoAnswers sends n queries for name to 169.254.10.11 from the node
// namespace, each from a new port and asking for the NSID, and counts the
// answers by NSID ("" none). Every query must be answered.
func whoAnswers(t *testing.T, l *lab, name string, n int) map[string]int {
	t.Helper()
	got := map[string]int{}
	for i := range n {
		m := svcQuery(name)
		o := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
		o.SetUDPSize(1232)
		o.Option = append(o.Option, &dns.EDNS0_NSID{Code: dns.EDNS0NSID})
		m.Extra = append(m.Extra, o)
		r, err := l.node.Exchange("udp", "", standbyAddr, m, timeout)
		if err != nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
			t.Fatalf("query %d for %s: %v %v", i, name, r, err)
		}
		nsid := ""
		if opt := r.IsEdns0(); opt != nil {
			for _, op := range opt.Option {
				if n, ok := op.(*dns.EDNS0_NSID); ok {
					b := make([]byte, len(n.Nsid)/2)
					fmt.Sscanf(n.Nsid, "%x", &b)
					nsid = string(b)
				}
			}
		}
		got[nsid]++
	}
	return got
}

// TestFallbackCoreDNS: LocalDNS failed for good, dnsstandby answering
// alone, AKS's fallback CoreDNS joins the reuseport group on
// 169.254.10.11. At adopt and own dnsstandby reports it, stays in
// takeover and keeps every query (the fallback gets none, so nothing is
// queued on it when LocalDNS's ExecStartPre stops it). Without the unit
// name (what dnsstandby did before it knew of the fallback) the fallback
// is taken for LocalDNS back: held, probed, trusted, and given every
// query in mirror.
func TestFallbackCoreDNS(t *testing.T) {
	tests := []struct {
		name   string
		flags  []string
		ours   bool   // dnsstandby keeps every query
		mode   string // after the hold-down would have passed
		metric float64
	}{
		{"adopt", []string{"--steering", "adopt"}, true, "takeover", 1},
		{"own", []string{"--steering", "own"}, true, "takeover", 1},
		{"adopt, no unit name: taken for LocalDNS", []string{"--steering", "adopt", "--localdns-fallback-unit", ""}, false, "mirror", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLab(t)
			s := l.startStandby(t, tt.flags...)
			name := l.zones.Services[0].FQDN
			if got := whoAnswers(t, l, name, 20); got["dnsstandby"] != 20 {
				t.Fatalf("before the fallback: answers by NSID %v, want all dnsstandby's", got)
			}
			fb := startFallbackCoreDNS(t, l)
			if tt.metric == 1 {
				l.eventuallyMetric(t, s, 2*time.Second, "the fallback reported", func() bool {
					return l.metric(t, s, "dnsstandby_localdns_fallback", "design", "coredns") == 1
				}, "localdns_fallback", "dnsstandby_mode")
			}
			// Past the hold-down (5 probes over 4 s) a LocalDNS back would
			// be in mirror.
			time.Sleep(7 * time.Second)
			if v := l.metric(t, s, "dnsstandby_mode", "mode", tt.mode); v != 1 {
				t.Errorf("mode %s: %v, want 1", tt.mode, v)
			}
			got := whoAnswers(t, l, name, 300)
			t.Logf("with the fallback bound: answers by NSID %v", got)
			if tt.ours && got["dnsstandby"] != 300 {
				t.Errorf("answers by NSID %v, want all 300 dnsstandby's (steered to our socket)", got)
			}
			if !tt.ours && got["fallback"] != 300 {
				t.Errorf("answers by NSID %v: without the unit name the fallback, in mirror, was expected to get all", got)
			}
			if v := l.metric(t, s, "dnsstandby_localdns_fallback", "design", "coredns"); v != tt.metric {
				t.Errorf("dnsstandby_localdns_fallback{design=coredns} = %v, want %v", v, tt.metric)
			}

			// Hand-back: localdns.service's ExecStartPre stops the fallback.
			must(t, fb.Signal(syscall.SIGTERM))
			<-fb.Done()
			l.eventuallyMetric(t, s, 2*time.Second, "the fallback gone", func() bool {
				return l.metric(t, s, "dnsstandby_localdns_fallback", "design", "coredns") == 0
			}, "localdns_fallback")
			if got := whoAnswers(t, l, name, 20); got["dnsstandby"] != 20 {
				t.Errorf("after the fallback stopped: answers by NSID %v, want all dnsstandby's", got)
			}
		})
	}
}

// TestFallbackNAT: AKS's nat fallback (a LOCALDNS-FALLBACK chain first in
// PREROUTING DNATing 169.254.10.11 to kube-dns) takes a pod's queries
// before any socket: dnsstandby notices within a few seconds, its cache
// keeps warming from the queries its tap still sees, and once the chain
// is gone it serves those names from the cache and clears the report.
// The pod's every query is answered throughout.
func TestFallbackNAT(t *testing.T) {
	l := newLab(t)
	pod := nstest.New(t, "pod")
	must(t, nstest.AddVeth(nstest.End{NS: l.node, Name: "veth-pod", Addrs: []string{"10.213.0.1/24"}},
		nstest.End{NS: pod, Name: "eth0", Addrs: []string{"10.213.0.2/24"}}))
	must(t, pod.AddRoute(nstest.Route{Dst: "default", Via: "10.213.0.1"}))
	must(t, l.kube.AddRoute(nstest.Route{Dst: "10.213.0.0/24", Via: "10.200.0.1"}))
	nstest.Run(t, l.node, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	s := l.startStandby(t)

	ask := func(from *nstest.Namespace, names []string) {
		t.Helper()
		for _, n := range names {
			r, err := from.Exchange("udp", "", standbyAddr, svcQuery(n), timeout)
			if err != nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
				t.Fatalf("pod's query for %s: %v %v", n, r, err)
			}
		}
	}
	var before, during []string
	for i, svc := range l.zones.Services[:40] {
		if i < 10 {
			before = append(before, svc.FQDN)
		} else {
			during = append(during, svc.FQDN)
		}
	}
	ask(pod, before)
	if v := l.metric(t, s, "dnsstandby_localdns_fallback", "design", "nat"); v != 0 {
		t.Fatalf("served: dnsstandby_localdns_fallback{design=nat} = %v, want 0", v)
	}

	chain := func(args ...string) {
		nstest.Run(t, l.node, "iptables", append([]string{"-w", "-t", "nat"}, args...)...)
	}
	chain("-N", "LOCALDNS-FALLBACK")
	chain("-A", "LOCALDNS-FALLBACK", "-d", standbyIP, "-p", "udp", "--dport", "53", "-j", "DNAT", "--to-destination", kubeDNS)
	chain("-I", "PREROUTING", "1", "-j", "LOCALDNS-FALLBACK")
	switched := time.Now()
	var seenAfter time.Duration
	for time.Since(switched) < 8*time.Second {
		ask(pod, during) // 30 names, each from a new port
		if seenAfter == 0 && l.metric(t, s, "dnsstandby_localdns_fallback", "design", "nat") == 1 {
			seenAfter = time.Since(switched)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if seenAfter == 0 {
		t.Fatalf("nat fallback not reported within 8 s")
	}
	t.Logf("nat fallback reported %v after the chain was added", seenAfter.Round(time.Millisecond))
	if v := l.metric(t, s, "dnsstandby_mode", "mode", "takeover"); v != 1 {
		t.Errorf("mode takeover %v, want 1", v)
	}

	// Hand-back: the chain goes. The names asked only through the DNAT
	// are in the cache: dnsstandby answers them without asking upstream.
	// (Asked from the node: a pod's query from a port that a DNATed flow
	// used still follows that flow's conntrack entry, for 30 s, to
	// kube-dns, which answers it.)
	chain("-D", "PREROUTING", "-j", "LOCALDNS-FALLBACK")
	upstream := l.metric(t, s, "dnsstandby_queries_total", "source", "upstream")
	cached := l.metric(t, s, "dnsstandby_queries_total", "source", "cache")
	for range 2 {
		ask(l.node, during)
		time.Sleep(600 * time.Millisecond)
	}
	hits := l.metric(t, s, "dnsstandby_queries_total", "source", "cache") - cached
	misses := l.metric(t, s, "dnsstandby_queries_total", "source", "upstream") - upstream
	t.Logf("after the chain went: %v of %d answered from the cache warmed through the DNAT, %v from upstream", hits, 2*len(during), misses)
	if misses != 0 || hits != float64(2*len(during)) {
		t.Errorf("after the chain went: %v cache hits, %v upstream, want all %d from the cache", hits, misses, 2*len(during))
	}
	l.eventuallyMetric(t, s, 5*time.Second, "the nat fallback gone", func() bool {
		ask(l.node, during[:10])
		return l.metric(t, s, "dnsstandby_localdns_fallback", "design", "nat") == 0
	}, "localdns_fallback")
}
