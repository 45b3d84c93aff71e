package upstream

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// caseServer answers every query with an A record, its question and the
// record's owner being the name it got passed through rewrite (a server
// that lower-cases, say), and records the names it got. With spoof, a
// reply in another case than the query's (a spoofer's, ID and port right)
// goes out first.
type caseServer struct {
	*testServer
	mu    sync.Mutex
	names []string
}

func newCaseServer(t *testing.T, rewrite func(string) string, spoof bool) *caseServer {
	cs := &caseServer{testServer: newServer(t)}
	reply := func(q *dns.Msg) *dns.Msg {
		if !isProbe(q) {
			cs.mu.Lock()
			cs.names = append(cs.names, q.Question[0].Name)
			cs.mu.Unlock()
		}
		r := answer("192.0.2.1")(q)
		r.Question[0].Name = rewrite(q.Question[0].Name)
		for _, rr := range r.Answer {
			rr.Header().Name = r.Question[0].Name
		}
		return r
	}
	cs.setTCP(reply)
	cs.setUDP(func(s *testServer, from netip.AddrPort, q *dns.Msg) {
		if spoof {
			bogus := answer("192.0.2.66")(q)
			bogus.Question[0].Name = swapCase(q.Question[0].Name)
			s.sendUDP(from, bogus)
		}
		s.sendUDP(from, reply(q))
	})
	return cs
}

// received returns the names the server got, and forgets them.
func (cs *caseServer) received() []string {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	out := cs.names
	cs.names = nil
	return out
}

func keep(name string) string { return name }

// TestCaseRandomization: questions go upstream with their letters in a
// random case (0x20, as Unbound's use-caps-for-id), and a reply must keep
// that case: one in another case is ignored and counted (a spoofer does
// not know the case). A server that does not keep case (it lower- or
// upper-cases) is found out by its first query, which it then answers
// in the caller's case within the same exchange; from then on it is
// asked in the caller's case, its replies taken in any case, logged once
// and shown by dnsstandby_upstream_case_randomized. The reply handed
// back, and the records owned by the question's name, carry the caller's
// case whatever the server sent.
func TestCaseRandomization(t *testing.T) {
	const name = "WwW.ExAmPlE.CoM."
	tests := []struct {
		name     string
		rewrite  func(string) string
		spoof    bool
		forceTCP bool
		keeps    bool // the server keeps case: 0x20 stays on
		// The first query's deadline is its one attempt's (the daemon's
		// with one upstream): no time is left to ask again, and that
		// query fails, but the next ones do not.
		deadline bool
	}{
		{"server keeps case", keep, false, false, true, false},
		{"spoofed reply in another case first", keep, true, false, true, false},
		{"server lower-cases", strings.ToLower, false, false, false, false},
		{"server upper-cases", strings.ToUpper, false, false, false, false},
		{"server lower-cases, over TCP", strings.ToLower, false, true, false, false},
		{"server lower-cases, no time to ask again", strings.ToLower, false, false, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newCaseServer(t, tt.rewrite, tt.spoof)
			g, logs := newGroup(t, func(c *Config) { c.ForceTCP = tt.forceTCP }, s.addr)
			n := 20
			if tt.deadline {
				ctx, cancel := context.WithTimeout(context.Background(), g.cfg.Timeout)
				_, err := g.Exchange(ctx, newReq(name, dns.TypeA))
				cancel()
				if err == nil {
					t.Fatal("the first query answered within its one attempt")
				}
				n--
			}
			for i := range n {
				r := mustAnswer(t, g, newReq(name, dns.TypeA), "192.0.2.1")
				if owner := r.Answer[0].Header().Name; owner != name {
					t.Fatalf("query %d: answer owned by %q, want the caller's case %q", i, owner, name)
				}
			}
			got := s.received()
			distinct := map[string]bool{}
			for _, q := range got {
				if !foldEqual(q, name) {
					t.Fatalf("server got %q for %q", q, name)
				}
				distinct[q] = true
			}
			st := stats(g, 0)
			mismatches := st.Errors["case_mismatch"]
			fallbacks := len(logs.with("does not keep the letter case"))
			gauge := 1
			if tt.keeps {
				// Every question in a case of its own (13 letters: two
				// draws alike once in 8192).
				if len(got) != n || len(distinct) < n-2 {
					t.Errorf("%d queries in %d distinct cases, want %d in about as many: %q", len(got), len(distinct), n, got)
				}
				want := uint64(0)
				if tt.spoof {
					want = uint64(n)
				}
				if mismatches != want || fallbacks != 0 {
					t.Errorf("%d replies in another case counted, %d fallbacks logged; want %d, 0", mismatches, fallbacks, want)
				}
			} else {
				// The first query once in random case, then again in the
				// caller's, as every later one.
				if len(got) != 1+n || slices.ContainsFunc(got[1:], func(q string) bool { return q != name }) {
					t.Errorf("server got %q; want one random case, then %d times %q", got, n, name)
				}
				if mismatches != 1 || fallbacks != 1 {
					t.Errorf("%d replies in another case counted, %d fallbacks logged; want 1 and 1", mismatches, fallbacks)
				}
				gauge = 0
			}
			if !st.Healthy || st.Fails != 0 {
				t.Errorf("server healthy %v, %d fails: not keeping case is no failure", st.Healthy, st.Fails)
			}
			want := fmt.Sprintf(`# HELP dnsstandby_upstream_case_randomized %s
# TYPE dnsstandby_upstream_case_randomized gauge
dnsstandby_upstream_case_randomized{server=%q} %d
`, helpCase, s.addr, gauge)
			if err := testutil.CollectAndCompare(g, strings.NewReader(want), "dnsstandby_upstream_case_randomized"); err != nil {
				t.Error(err)
			}
		})
	}
}
