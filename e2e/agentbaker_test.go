package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
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

// aksHosts is a hosts file shaped like AKS's /etc/localdns/hosts.
const aksHosts = `# critical AKS names
192.0.2.71 mcr.microsoft.com
2001:db8::71 mcr.microsoft.com
192.0.2.72 login.microsoftonline.com
192.0.2.73 packages.aks.azure.com
`

// TestAgentBakerCorefile runs LocalDNS (CoreDNS) with the Corefile
// AgentBaker renders (corefile/testdata/agentbaker.corefile, its hosts
// file moved into the test's directory) on both listeners, asks it a set
// of questions covering every block, then runs one dnsstandby on both
// listeners with the same Corefile, kills LocalDNS, and asks again:
// dnsstandby must answer as LocalDNS did — same rcode and answer RRset,
// TTLs not above LocalDNS's — each listener from its own blocks: the
// VNet's DNS for outside names on the node listener, kube-dns on the
// pods', cluster.local from kube-dns on both, the template and hosts
// answers made locally.
func TestAgentBakerCorefile(t *testing.T) {
	l := newLab(t)
	must(t, l.kube.AddAddr("kubedns", vnetIP+"/32"))
	must(t, l.node.AddRoute(nstest.Route{Dst: vnetIP + "/32", Via: "10.200.0.2"}))
	nstest.StartCoreDNS(t, l.kube, nstest.CoreDNSConfig{
		Corefile: ".:53 {\n  bind " + vnetIP + "\n  template IN A {\n    answer \"{{ .Name }} 60 IN A " + vnetAnswer + "\"\n  }\n  template ANY ANY {\n    rcode NXDOMAIN\n  }\n}\n",
		Probe:    vnetIP + ":53",
	})
	dir := t.TempDir()
	hosts := filepath.Join(dir, "hosts")
	must(t, os.WriteFile(hosts, []byte(aksHosts), 0o644))
	text, err := os.ReadFile("../corefile/testdata/agentbaker.corefile")
	must(t, err)
	cf := strings.ReplaceAll(string(text), "/etc/localdns/hosts", hosts)
	corefile := filepath.Join(dir, "Corefile")
	must(t, os.WriteFile(corefile, []byte(cf), 0o644))

	svc := l.zones.Services[0].FQDN
	node, pod := testkit.NodeListener+":53", testkit.PodListener+":53"
	type query struct {
		server, name string
		qtype        uint16
		tcp          bool
	}
	var queries []query
	for _, server := range []string{node, pod} {
		for _, q := range []struct {
			name  string
			qtype uint16
		}{
			{"www.example.com.", dns.TypeA},                  // root block: VNet DNS on .10, kube-dns on .11
			{"nosuch.example.com.", dns.TypeA},               // NXDOMAIN from kube-dns on .11
			{svc, dns.TypeA},                                 // cluster.local: kube-dns over TCP
			{svc, dns.TypeSRV},                               //
			{"nosuch.default.svc.cluster.local.", dns.TypeA}, //
			{"a.testdomain456.com.", dns.TypeA},              // override zones
			{"a.testdomain567.com.", dns.TypeA},              //
			{"a.b.c.d.internal.cloudapp.net.", dns.TypeA},    // template: NXDOMAIN, made locally
			{"node1.internal.cloudapp.net.", dns.TypeA},      // template does not match: forwarded
			{"x.reddog.microsoft.com.", dns.TypeA},           // template: NXDOMAIN
			{"mcr.microsoft.com.", dns.TypeA},                // hosts
			{"mcr.microsoft.com.", dns.TypeAAAA},             // hosts
			{"MCR.Microsoft.COM.", dns.TypeA},                // hosts, any case
			{"packages.aks.azure.com.", dns.TypeA},           // hosts
			{"71.2.0.192.in-addr.arpa.", dns.TypePTR},        // hosts PTR
			{"login.microsoftonline.com.", dns.TypeMX},       // hosts name, other type: falls through
			{nstest.LargeName, dns.TypeA},                    // large answer
		} {
			queries = append(queries, query{server, q.name, q.qtype, false})
		}
		queries = append(queries, query{server, svc, dns.TypeA, true}, query{server, nstest.LargeName, dns.TypeA, true})
	}
	ask := func(q query) (*dns.Msg, error) {
		m := new(dns.Msg)
		m.SetQuestion(q.name, q.qtype)
		m.SetEdns0(1232, false)
		network := "udp"
		if q.tcp {
			network = "tcp"
		}
		return l.node.Exchange(network, "", q.server, m, timeout)
	}

	localdns := nstest.StartCoreDNS(t, l.node, nstest.CoreDNSConfig{Corefile: cf, Probe: pod})
	before := make([]*dns.Msg, len(queries))
	for i, q := range queries {
		r, err := ask(q)
		if err != nil {
			t.Fatalf("LocalDNS, %s %s via %s: %v", q.name, dns.TypeToString[q.qtype], q.server, err)
		}
		before[i] = r
	}

	p := nstest.Start(t, l.node, binary, "run", "--localdns-corefile", corefile,
		"--listen", node, "--listen", pod, "--metrics-addr", "127.0.0.1:9355", "--log-format", "text",
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
	must(t, localdns.Signal(syscall.SIGKILL))
	l.eventuallyMetric(t, s, 5*time.Second, "takeover", func() bool { return l.metric(t, s, "dnsstandby_mode", "mode", "takeover") == 1 })

	agree := 0
	for i, q := range queries {
		r, err := ask(q)
		if err != nil {
			t.Errorf("dnsstandby, %s %s via %s: %v", q.name, dns.TypeToString[q.qtype], q.server, err)
			continue
		}
		if diff := compareAnswers(before[i], r); diff != "" {
			t.Errorf("%s %s via %s (tcp %v): %s", q.name, dns.TypeToString[q.qtype], q.server, q.tcp, diff)
			continue
		}
		t.Logf("%-40s %-5s via %s tcp=%v: %s %v", q.name, dns.TypeToString[q.qtype], q.server, q.tcp, dns.RcodeToString[r.Rcode], r.Answer)
		agree++
	}
	t.Logf("AgentBaker Corefile: %d/%d answered as LocalDNS did", agree, len(queries))
	if out := p.Output(); !strings.Contains(out, "plugin whoami not imitated") {
		t.Errorf("the start log does not list whoami as not imitated:\n%s", out)
	}
}

// compareAnswers says how got differs from want in what a client uses:
// the rcode and the answer RRset, with TTLs not above want's.
func compareAnswers(want, got *dns.Msg) string {
	if want.Rcode != got.Rcode {
		return fmt.Sprintf("rcode %s, LocalDNS %s", dns.RcodeToString[got.Rcode], dns.RcodeToString[want.Rcode])
	}
	key := func(rr dns.RR) string {
		h := *rr.Header()
		c := dns.Copy(rr)
		c.Header().Ttl = 0
		c.Header().Name = strings.ToLower(h.Name)
		return c.String()
	}
	var w, g []string
	ttl := map[string]uint32{}
	for _, rr := range want.Answer {
		w = append(w, key(rr))
		ttl[key(rr)] = rr.Header().Ttl
	}
	for _, rr := range got.Answer {
		g = append(g, key(rr))
		if t, ok := ttl[key(rr)]; ok && rr.Header().Ttl > t {
			return fmt.Sprintf("TTL %d above LocalDNS's %d for %s", rr.Header().Ttl, t, key(rr))
		}
	}
	slices.Sort(w)
	slices.Sort(g)
	if !slices.Equal(w, g) {
		return fmt.Sprintf("answer\n  %s\nLocalDNS\n  %s", strings.Join(g, "\n  "), strings.Join(w, "\n  "))
	}
	return ""
}
