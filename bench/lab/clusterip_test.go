package lab_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/bench/lab"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

// TestKubeProxyRules: per protocol, a KUBE-SVC chain whose rules pick each
// endpoint with kube-proxy's probabilities (1/n, 1/(n-1), ..., the last
// unconditionally), a KUBE-SEP chain per endpoint DNATing to it, every
// chain made before a rule jumps to it, and the node's own traffic sent
// through KUBE-SERVICES.
func TestKubeProxyRules(t *testing.T) {
	tests := []struct {
		name      string
		endpoints []string
		probs     []string // the KUBE-SVC rules' probabilities, "" for none
	}{
		{"three pods", []string{"10.244.1.2", "10.244.1.3", "10.244.1.4"}, []string{"0.33333333333", "0.50000000000", ""}},
		{"one pod", []string{"10.244.1.2"}, []string{""}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rules := lab.KubeProxyRules("10.0.0.10", 53, tc.endpoints)
			made := map[string]bool{"OUTPUT": true} // built in
			var jumps int
			for _, r := range rules {
				switch r[0] {
				case "-N":
					made[r[1]] = true
					continue
				case "-A":
				default:
					t.Fatalf("rule %q: want -N or -A", r)
				}
				if !made[r[1]] {
					t.Errorf("rule %q appends to a chain not yet made", r)
				}
				if i := slices.Index(r, "-j"); i >= 0 && strings.HasPrefix(r[i+1], "KUBE-") {
					jumps++
					if !made[r[i+1]] {
						t.Errorf("rule %q jumps to a chain not yet made", r)
					}
				}
			}
			if !slices.ContainsFunc(rules, func(r []string) bool { return slices.Equal(r, []string{"-A", "OUTPUT", "-j", "KUBE-SERVICES"}) }) {
				t.Errorf("no jump from OUTPUT to KUBE-SERVICES:\n%q", rules)
			}
			for _, proto := range []string{"udp", "tcp"} {
				svc := lab.KubeDNSServiceChains[proto]
				var probs, dnat []string
				for _, r := range rules {
					if r[0] == "-A" && r[1] == svc {
						p := ""
						if i := slices.Index(r, "--probability"); i >= 0 {
							p = r[i+1]
						}
						probs = append(probs, p)
					}
					if i := slices.Index(r, "--to-destination"); r[0] == "-A" && i >= 0 && slices.Contains(r, proto) {
						dnat = append(dnat, r[i+1])
					}
				}
				if !slices.Equal(probs, tc.probs) {
					t.Errorf("%s: probabilities %q, want %q", svc, probs, tc.probs)
				}
				var want []string
				for _, ep := range tc.endpoints {
					want = append(want, ep+":53")
				}
				if !slices.Equal(dnat, want) {
					t.Errorf("%s: DNAT to %q, want %q", proto, dnat, want)
				}
			}
		})
	}
}

// TestWithPrometheus: every block gets a prometheus line, right after its
// bind, and nothing else changes.
func TestWithPrometheus(t *testing.T) {
	in := "a.:53 {\n    bind 10.0.0.10\n    errors\n}\n.:53 {\n    bind 10.0.0.10\n    whoami\n}\n"
	want := "a.:53 {\n    bind 10.0.0.10\n    prometheus 10.0.0.10:9153\n    errors\n}\n.:53 {\n    bind 10.0.0.10\n    prometheus 10.0.0.10:9153\n    whoami\n}\n"
	if got := lab.WithPrometheus(in, "10.0.0.10"); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

// TestClusterIP: kube-dns's pods behind the ClusterIP each get new flows
// (each query from a socket of its own is a flow) and count what they get;
// once one is stopped, part of the new flows go unanswered, the rest are
// answered by the others, and its count stands still. The second VNet DNS
// answers on its own address until blackholed.
func TestClusterIP(t *testing.T) {
	nstest.RequireRoot(t)
	coredns, err := nstest.FindCoreDNS()
	if err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	node := nstest.New(t, "node")
	zones := nstest.KubeDNSZones(nstest.ZoneOptions{Services: 3})
	// The route the lab's node has to its plain kube-dns, by a link of its
	// own here: what the nat rules redirect.
	if err := node.AddLink("clusterip", "", "10.200.0.1/32"); err != nil {
		t.Fatal(err)
	}
	if err := node.AddRoute(nstest.Route{Dst: lab.LocalDNSKubeDNS + "/32", Dev: "clusterip", Src: "10.200.0.1"}); err != nil {
		t.Fatal(err)
	}
	c, err := lab.StartClusterIP(ctx, node, coredns, zones)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	ask := func(server string, n int) (answered int) {
		for i := range n {
			q := lab.LoadName{FQDN: fmt.Sprintf("q%d.%s", i, lab.FreshZone), Type: dns.TypeA}.Query()
			if r, err := node.Exchange("udp", "", server+":53", q, 300*time.Millisecond); err == nil && r.Rcode == dns.RcodeSuccess {
				answered++
			}
		}
		return answered
	}
	if got := ask(lab.LocalDNSKubeDNS, 30); got != 30 {
		t.Fatalf("all pods up: %d of 30 answered", got)
	}
	var before []float64
	for i, p := range c.Pods {
		n, err := p.Requests(ctx, lab.KubeDNSPodIPs[i])
		if err != nil {
			t.Fatal(err)
		}
		// Each gets a third of 30 flows; none at all is a 1e-5 chance.
		if n == 0 {
			t.Errorf("pod %d got no query of 30", i)
		}
		before = append(before, n)
	}
	total, err := c.Requests(ctx)
	if err != nil || total != before[0]+before[1]+before[2] {
		t.Errorf("Requests %v, %v; pods' %v", total, err, before)
	}
	if err := c.StopPod(ctx, 0); err != nil {
		t.Fatal(err)
	}
	// A stopped pod's count can still be read, from inside its namespace.
	if _, err := c.Requests(ctx); err != nil {
		t.Errorf("Requests with a pod stopped: %v", err)
	}
	// A third of 60 new flows go to the stopped pod: none or all of them
	// is a chance under 1e-10.
	if got := ask(lab.LocalDNSKubeDNS, 60); got == 0 || got == 60 {
		t.Errorf("one pod of three stopped: %d of 60 answered, want some but not all", got)
	}

	vnet2, err := lab.StartVnetDNS2(node, coredns, zones)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = vnet2.Close() })
	if got := ask(lab.LocalDNSVnetDNS2, 3); got != 3 {
		t.Fatalf("second VNet DNS: %d of 3 answered", got)
	}
	if err := vnet2.Blackhole(ctx); err != nil {
		t.Fatal(err)
	}
	if got := ask(lab.LocalDNSVnetDNS2, 3); got != 0 {
		t.Errorf("second VNet DNS blackholed: %d of 3 answered", got)
	}
}
