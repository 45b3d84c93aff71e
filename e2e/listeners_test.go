package e2e

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// vnetIP is the VNet's DNS, where AgentBaker's node-listener root block
// forwards (Azure's 168.63.129.16); here an address of the test's own
// kube-dns namespace.
const vnetIP = "168.63.129.16"

// vnetAnswer is what the stand-in VNet DNS answers every A query with.
const vnetAnswer = "192.0.2.168"

// TestAgentBakerCorefileBothListeners runs one dnsstandby on both of
// LocalDNS's listeners with the Corefile AgentBaker renders
// (corefile/testdata/agentbaker.corefile), LocalDNS down: each listener is
// answered from its own blocks' upstreams, as LocalDNS would — names
// outside the cluster go to the VNet's DNS on the node listener and to
// kube-dns on the pods' — and cluster.local from kube-dns on both.
func TestAgentBakerCorefileBothListeners(t *testing.T) {
	l := newLab(t)
	must(t, l.kube.AddAddr("kubedns", vnetIP+"/32"))
	must(t, l.node.AddRoute(nstest.Route{Dst: vnetIP + "/32", Via: "10.200.0.2"}))
	nstest.StartCoreDNS(t, l.kube, nstest.CoreDNSConfig{
		Corefile: ".:53 {\n  bind " + vnetIP + "\n  template IN A {\n    answer \"{{ .Name }} 60 IN A " + vnetAnswer + "\"\n  }\n  template ANY ANY {\n    rcode NXDOMAIN\n  }\n}\n",
		Probe:    vnetIP + ":53",
	})
	corefile, err := filepath.Abs("../corefile/testdata/agentbaker.corefile")
	must(t, err)
	p := nstest.Start(t, l.node, binary, "run", "--localdns-corefile", corefile,
		"--listen", testkit.NodeListener+":53", "--listen", testkit.PodListener+":53",
		"--metrics-addr", "127.0.0.1:9355", "--log-format", "text",
		"--anchor-kind", "bridge", "--admin-socket", "", "--state-dir", t.TempDir())
	s := &standby{Process: p, metrics: "127.0.0.1:9355"}
	testkit.Eventually(t, 10*time.Second, "dnsstandby ready", func() bool {
		select {
		case <-p.Done():
			t.Fatalf("dnsstandby exited: %v", p.Err())
		default:
		}
		code, _, err := l.get(s, "/readyz")
		return err == nil && code == http.StatusOK
	})

	svc := l.zones.Services[0].FQDN
	tests := []struct {
		listener string
		name     string
		want     string // the A record's address, from the upstream the block names
	}{
		{testkit.NodeListener, "www.example.com.", vnetAnswer},
		{testkit.PodListener, "www.example.com.", ""},
		{testkit.NodeListener, svc, ""},
		{testkit.PodListener, svc, ""},
	}
	for _, tt := range tests {
		m := new(dns.Msg)
		m.SetQuestion(tt.name, dns.TypeA)
		want := tt.want
		if want == "" { // what kube-dns itself answers
			r, err := l.node.Exchange("udp", "", kubeDNS, m, timeout)
			must(t, err)
			if len(r.Answer) == 0 {
				t.Fatalf("kube-dns has no answer for %s: %v", tt.name, r)
			}
			want = r.Answer[len(r.Answer)-1].(*dns.A).A.String()
		}
		for range 2 { // from upstream, then from the listener's cache
			r, err := l.node.Exchange("udp", "", tt.listener+":53", m, timeout)
			if err != nil {
				t.Fatalf("%s via %s: %v", tt.name, tt.listener, err)
			}
			if len(r.Answer) == 0 || r.Answer[len(r.Answer)-1].(*dns.A).A.String() != want {
				t.Errorf("%s via %s: %v, want %s", tt.name, tt.listener, r.Answer, want)
			}
		}
	}
	// Both listeners' routes, as LocalDNS's blocks name them.
	for _, series := range [][]string{
		{"listener", testkit.NodeListener + ":53", "zone", ".", "server", vnetIP + ":53"},
		{"listener", testkit.PodListener + ":53", "zone", ".", "server", kubeDNS},
		{"listener", testkit.NodeListener + ":53", "zone", "cluster.local.", "server", kubeDNS},
		{"listener", testkit.PodListener + ":53", "zone", "cluster.local.", "server", kubeDNS},
	} {
		if got := l.metric(t, s, "dnsstandby_upstream_healthy", series...); got != 1 {
			t.Errorf("dnsstandby_upstream_healthy%v = %v, want 1", series, got)
		}
	}
	// cluster.local goes to kube-dns over TCP (force_tcp), from both.
	if got := l.metric(t, s, "dnsstandby_upstream_requests_total", "zone", "cluster.local.", "proto", "tcp"); got < 2 {
		t.Errorf("cluster.local. requests over TCP: %v, want at least 2", got)
	}
	if out := p.Output(); !strings.Contains(out, "plugin hosts not imitated") {
		t.Errorf("the start log does not list the hosts plugin as not imitated:\n%s", out)
	}
}
