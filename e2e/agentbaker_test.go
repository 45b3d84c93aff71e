package e2e

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/corefile"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// vnetAnswer is what the stand-in VNet DNS answers every A query with.
const vnetAnswer = "192.0.2.168"

// aksHosts is a hosts file shaped like AKS's /etc/localdns/hosts.
const aksHosts = `# critical AKS names
192.0.2.71 mcr.microsoft.com
2001:db8::71 mcr.microsoft.com
192.0.2.72 login.microsoftonline.com
192.0.2.73 packages.aks.azure.com
`

// agentBakerAccepted are the questions on which dnsstandby may answer
// otherwise than LocalDNS, with the reason. Each is asked all the same:
// its answers are logged, and it counts towards N only when they agree.
// None today.
var agentBakerAccepted = map[string]string{}

// TestAgentBakerCorefile runs, for every LocalDNS Corefile rendered from
// Azure/AgentBaker in corefile/testdata (each file's header says from
// what), LocalDNS (CoreDNS) with that Corefile — its hosts file moved into
// the test's directory — on the listeners it binds, asks it a set of
// questions covering every block, then runs one dnsstandby on the same
// listeners with the same Corefile, kills LocalDNS, and asks again:
// dnsstandby must answer as LocalDNS did — same rcode and answer RRset,
// TTLs not above LocalDNS's — each listener from its own blocks, except
// for the questions in agentBakerAccepted.
//
// Every forward target the Corefile names other than kube-dns's ClusterIP
// is a VNet DNS server (168.63.129.16, or the node's own servers once
// localdns.sh rewrote the forward lines); each gets a stand-in at that
// address in the kube-dns namespace. The questions are derived from the
// Corefile's blocks: its override zones, its template zones, hosts,
// whoami, besides the root and cluster.local names every rendering serves.
func TestAgentBakerCorefile(t *testing.T) {
	files, err := filepath.Glob("../corefile/testdata/*.corefile")
	must(t, err)
	if len(files) == 0 {
		t.Fatal("no Corefiles in ../corefile/testdata")
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".corefile"), func(t *testing.T) {
			testAgentBakerCorefile(t, file)
		})
	}
}

// agentBakerQuery is one question of TestAgentBakerCorefile.
type agentBakerQuery struct {
	server, name string
	qtype        uint16
	tcp          bool
	accept       string // reason dnsstandby may answer otherwise; "" if it may not
}

func (q agentBakerQuery) String() string {
	return fmt.Sprintf("%s %s via %s tcp=%v", q.name, dns.TypeToString[q.qtype], q.server, q.tcp)
}

func testAgentBakerCorefile(t *testing.T, file string) {
	l := newLab(t)
	dir := t.TempDir()
	hosts := filepath.Join(dir, "hosts")
	must(t, os.WriteFile(hosts, []byte(aksHosts), 0o644))
	text, err := os.ReadFile(file)
	must(t, err)
	cf := strings.ReplaceAll(string(text), "/etc/localdns/hosts", hosts)
	path := filepath.Join(dir, "Corefile")
	must(t, os.WriteFile(path, []byte(cf), 0o644))

	// The listeners the Corefile binds, and the zones each serves.
	var listeners []string
	zones := map[string][]corefile.Zone{}
	for _, ip := range []string{testkit.NodeListener, testkit.PodListener} {
		addr := ip + ":53"
		s, err := corefile.Load(path, []netip.AddrPort{netip.MustParseAddrPort(addr)})
		if errors.Is(err, corefile.ErrNoServerBlock) {
			t.Logf("no block binds %s", addr)
			continue
		}
		must(t, err)
		listeners = append(listeners, addr)
		zones[addr] = s.Zones
	}
	if len(listeners) == 0 {
		t.Fatal("no block binds a LocalDNS listener")
	}

	// A VNet DNS stand-in at every forward target that is not kube-dns.
	var vnet []string
	for _, zs := range zones {
		for _, z := range zs {
			for _, u := range z.Upstreams {
				if a := u.Addr().String(); a != clusterIP && !slices.Contains(vnet, a) {
					if u.Port() != 53 {
						t.Fatalf("zone %s forwards to %s: the stand-ins listen on port 53 only", z.Name, u)
					}
					vnet = append(vnet, a)
				}
			}
		}
	}
	slices.Sort(vnet)
	if len(vnet) > 0 {
		for _, a := range vnet {
			must(t, l.kube.AddAddr("kubedns", a+"/32"))
			must(t, l.node.AddRoute(nstest.Route{Dst: a + "/32", Via: "10.200.0.2"}))
		}
		nstest.StartCoreDNS(t, l.kube, nstest.CoreDNSConfig{
			Corefile: ".:53 {\n  bind " + strings.Join(vnet, " ") + "\n  template IN A {\n    answer \"{{ .Name }} 60 IN A " + vnetAnswer + "\"\n  }\n  template ANY ANY {\n    rcode NXDOMAIN\n  }\n}\n",
			Probe:    vnet[0] + ":53",
		})
		t.Logf("VNet DNS stand-ins: %s", strings.Join(vnet, " "))
	}

	queries := agentBakerQueries(l, listeners, zones)
	ask := func(q agentBakerQuery) (*dns.Msg, error) {
		m := new(dns.Msg)
		m.SetQuestion(q.name, q.qtype)
		m.SetEdns0(1232, false)
		network := "udp"
		if q.tcp {
			network = "tcp"
		}
		return l.node.Exchange(network, "", q.server, m, timeout)
	}

	localdns := nstest.StartCoreDNS(t, l.node, nstest.CoreDNSConfig{Corefile: cf, Probe: listeners[0]})
	before := make([]*dns.Msg, len(queries))
	for i, q := range queries {
		r, err := ask(q)
		if err != nil {
			t.Fatalf("LocalDNS, %s: %v", q, err)
		}
		before[i] = r
	}

	flags := []string{"--localdns-corefile", path}
	for _, a := range listeners {
		flags = append(flags, "--listen", a)
	}
	s := l.runStandby(t, flags...)
	must(t, localdns.Signal(syscall.SIGKILL))
	l.eventuallyMetric(t, s, 5*time.Second, "takeover", func() bool { return l.metric(t, s, "dnsstandby_mode", "mode", "takeover") == 1 })

	agree, accepted := 0, 0
	for i, q := range queries {
		r, err := ask(q)
		diff := ""
		switch {
		case err != nil:
			diff = err.Error()
		default:
			diff = compareAnswers(before[i], r)
			// whoami's answer is in the additional section: the client's
			// address (its port differs from query to query).
			if w, g := clientAddr(before[i]), clientAddr(r); diff == "" && w != g {
				diff = fmt.Sprintf("client address in the additional section %q, LocalDNS %q", g, w)
			}
		}
		switch {
		case diff == "":
			t.Logf("%-40s %-5s via %s tcp=%v: %s %v", q.name, dns.TypeToString[q.qtype], q.server, q.tcp, dns.RcodeToString[r.Rcode], r.Answer)
			agree++
		case q.accept != "":
			t.Logf("accepted difference, %s: %s\n  reason: %s", q, diff, q.accept)
			accepted++
		default:
			t.Errorf("%s: %s", q, diff)
		}
	}
	t.Logf("%s: %d/%d answered as LocalDNS did (%d accepted differences)", filepath.Base(file), agree, len(queries), accepted)
	if agree+accepted != len(queries) {
		return
	}
	if out := s.Output(); strings.Contains(out, "plugin whoami not imitated") {
		t.Errorf("the start log lists whoami as not imitated:\n%s", out)
	}
}

// agentBakerQueries is the question set for a Corefile: on each listener,
// the names every AgentBaker rendering serves (outside names through the
// root block, the hosts file's names, cluster.local), and, from the
// Corefile's blocks on any listener, a name in each override zone, names
// in each template zone that its match does and does not take, and the
// whoami zone's name.
func agentBakerQueries(l *lab, listeners []string, zones map[string][]corefile.Zone) []agentBakerQuery {
	svc := l.zones.Services[0].FQDN
	type question struct {
		name  string
		qtype uint16
	}
	common := []question{
		{"www.example.com.", dns.TypeA},                  // root block: VNet DNS on .10, kube-dns on .11
		{"nosuch.example.com.", dns.TypeA},               // NXDOMAIN from kube-dns on .11
		{svc, dns.TypeA},                                 // cluster.local: its own block, or the root's upstream
		{svc, dns.TypeSRV},                               //
		{"nosuch.default.svc.cluster.local.", dns.TypeA}, //
		{"mcr.microsoft.com.", dns.TypeA},                // hosts, where the root block has it
		{"mcr.microsoft.com.", dns.TypeAAAA},             //
		{"MCR.Microsoft.COM.", dns.TypeA},                // hosts, any case
		{"packages.aks.azure.com.", dns.TypeA},           //
		{"71.2.0.192.in-addr.arpa.", dns.TypePTR},        // hosts PTR
		{"login.microsoftonline.com.", dns.TypeMX},       // hosts name, other type: falls through
		{nstest.LargeName, dns.TypeA},                    // large answer
	}
	var extra []question
	seen := map[question]bool{}
	for _, q := range common {
		seen[q] = true
	}
	add := func(name string, qtype uint16) {
		q := question{name, qtype}
		if !seen[q] {
			seen[q] = true
			extra = append(extra, q)
		}
	}
	for _, a := range listeners {
		for _, z := range zones[a] {
			switch {
			case z.Whoami:
				add(z.Name, dns.TypeA)
			case z.Name != "." && z.Name != "cluster.local.":
				add("a."+z.Name, dns.TypeA) // an override zone
			}
			for _, tpl := range z.Templates {
				for _, tz := range tpl.Zones {
					add("a.b.c.d."+tz, dns.TypeA) // four labels or more: internal.cloudapp.net's match takes it
					add("node1."+tz, dns.TypeA)   // one label: its match does not, it falls through
				}
			}
		}
	}
	var queries []agentBakerQuery
	for _, server := range listeners {
		for _, q := range append(slices.Clone(common), extra...) {
			key := q.name + " " + dns.TypeToString[q.qtype]
			queries = append(queries, agentBakerQuery{server, q.name, q.qtype, false, agentBakerAccepted[key]})
		}
		queries = append(queries,
			agentBakerQuery{server: server, name: svc, qtype: dns.TypeA, tcp: true},
			agentBakerQuery{server: server, name: nstest.LargeName, qtype: dns.TypeA, tcp: true})
	}
	return queries
}

// clientAddr is the address whoami puts in the additional section, or "".
func clientAddr(m *dns.Msg) string {
	for _, rr := range m.Extra {
		switch rr := rr.(type) {
		case *dns.A:
			return rr.A.String()
		case *dns.AAAA:
			return rr.AAAA.String()
		}
	}
	return ""
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
