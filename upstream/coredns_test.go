package upstream

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/dnsstandby/dnsstandby/cache"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/wire"
)

// The kube-dns stand-in: CoreDNS (bin/coredns, the version LocalDNS and
// kube-dns run) with its cache, a zone file for cluster.local and a
// template whose answers are owned by the question's name.
const caseCorefile = `cluster.local:53 {
    bind 127.0.0.1
    cache 30
    file db.cluster.local
}
example.test:53 {
    bind 127.0.0.1
    cache 30
    template IN A example.test {
        answer "{{ .Name }} 60 IN A 192.0.2.7"
    }
}
`

const caseZone = `$ORIGIN cluster.local.
@   3600 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 30
@   3600 IN NS  ns.dns.cluster.local.
ns.dns          30 IN A 10.0.0.10
web.default.svc 30 IN A 10.0.0.7
`

// TestCoreDNSKeepsCase: CoreDNS copies the question, in the random case
// sent, into its replies, from its cache too, so 0x20 stays on and no
// reply is ignored. Each answer comes back in the asking client's case,
// and a cache filled with it serves a client asking in yet another case.
func TestCoreDNSKeepsCase(t *testing.T) {
	nstest.RequireRoot(t)
	ns := nstest.New(t, "kubedns")
	nstest.StartCoreDNS(t, ns, nstest.CoreDNSConfig{
		Corefile: caseCorefile,
		Files:    map[string]string{"db.cluster.local": caseZone},
		Probe:    "127.0.0.1:53",
	})
	server := "127.0.0.1:53"
	g, logs := newGroup(t, func(c *Config) { c.Timeout = time.Second }, netip.MustParseAddrPort(server))
	c, err := cache.New(cache.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, other string // the client's case, and another client's
		rcode       int
		answer      string // "" for none
	}{
		{"Web.Default.Svc.Cluster.Local.", "wEB.dEFAULT.sVC.cLUSTER.lOCAL.", dns.RcodeSuccess, "10.0.0.7"},
		{"API.Example.Test.", "api.example.test.", dns.RcodeSuccess, "192.0.2.7"},
		{"Nope.Default.Svc.Cluster.Local.", "nope.default.svc.cluster.local.", dns.RcodeNameError, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Twice: the second reply comes from CoreDNS's cache.
			for i := range 2 {
				var r *dns.Msg
				err := ns.Do(func() error {
					ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
					defer cancel()
					var err error
					r, err = g.Exchange(ctx, newReq(tt.name, dns.TypeA))
					return err
				})
				if err != nil {
					t.Fatalf("exchange %d: %v", i, err)
				}
				if r.Rcode != tt.rcode || r.Question[0].Name != tt.name {
					t.Fatalf("exchange %d: rcode %s question %v", i, dns.RcodeToString[r.Rcode], r.Question)
				}
				if tt.answer != "" {
					if len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != tt.answer || r.Answer[0].Header().Name != tt.name {
						t.Fatalf("exchange %d: answer %v, want %s owned by %s", i, r.Answer, tt.answer, tt.name)
					}
				}
				if i == 0 {
					if err := c.InsertMsg(r); err != nil {
						t.Fatalf("cache insert: %v", err)
					}
				}
			}
			// The cache key is the lower-cased name: another client's case
			// hits the same entry, and gets its own case back.
			hit := serveCached(t, c, tt.other)
			if hit == nil || hit.Rcode != tt.rcode || hit.Question[0].Name != tt.other {
				t.Fatalf("cache hit for %s: %v", tt.other, hit)
			}
			if tt.answer != "" && (len(hit.Answer) != 1 || !strings.EqualFold(hit.Answer[0].Header().Name, tt.other)) {
				t.Fatalf("cache hit answer %v", hit.Answer)
			}
		})
	}
	if st := stats(g, 0); st.Errors["case_mismatch"] != 0 || st.Errors["mismatch"] != 0 || len(logs.with("does not keep the letter case")) != 0 {
		t.Errorf("CoreDNS's replies ignored: %v; fallback logged %d times", st.Errors, len(logs.with("does not keep the letter case")))
	}
	want := fmt.Sprintf("# HELP dnsstandby_upstream_case_randomized %s\n# TYPE dnsstandby_upstream_case_randomized gauge\ndnsstandby_upstream_case_randomized{server=%q} 1\n", helpCase, server)
	if err := testutil.CollectAndCompare(g, strings.NewReader(want), "dnsstandby_upstream_case_randomized"); err != nil {
		t.Error(err)
	}
}

// serveCached asks c for name (A) as a client would, or returns nil on a
// miss.
func serveCached(t *testing.T, c *cache.Cache, name string) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	var q wire.Query
	if err := wire.ParseQuery(b, &q); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 65535)
	n, _ := c.Serve(buf, &q, q.PayloadLimit(), false)
	if n == 0 {
		return nil
	}
	r := new(dns.Msg)
	if err := r.Unpack(buf[:n]); err != nil {
		t.Fatal(err)
	}
	return r
}
