package upstream

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// fakeServers returns n addresses for groups that are never asked.
func fakeServers(n int) []netip.AddrPort {
	out := make([]netip.AddrPort, n)
	for i := range out {
		out[i] = netip.AddrPortFrom(netip.MustParseAddr("192.0.2.53"), uint16(1000+i))
	}
	return out
}

// markDown marks server i of g down as MaxFails failed attempts would.
func markDown(t *testing.T, g *Group, i int) {
	t.Helper()
	s := g.servers[i]
	for range g.cfg.MaxFails {
		g.failed(s, time.Now(), &failure{server: s.name, proto: protoUDP, why: reasonTimeout, err: errors.New("marked down by the test")})
	}
	if !s.down.Load() {
		t.Fatalf("server %d not down after %d failures", i, g.cfg.MaxFails)
	}
}

// TestPolicyOrder holds each policy to the order CoreDNS forward's List
// gives, one exchange after another.
func TestPolicyOrder(t *testing.T) {
	tests := []struct {
		policy Policy
		n      int
		want   [][]int // the orders of consecutive exchanges
	}{
		{PolicySequential, 1, [][]int{{0}, {0}}},
		{PolicySequential, 3, [][]int{{0, 1, 2}, {0, 1, 2}, {0, 1, 2}}},
		{PolicyRoundRobin, 1, [][]int{{0}, {0}}},
		{PolicyRoundRobin, 2, [][]int{{1, 0}, {0, 1}, {1, 0}}},
		// The next server first, the others in Config order (not rotated).
		{PolicyRoundRobin, 3, [][]int{{1, 0, 2}, {2, 0, 1}, {0, 1, 2}, {1, 0, 2}}},
		{PolicyRoundRobin, 4, [][]int{{1, 0, 2, 3}, {2, 0, 1, 3}, {3, 0, 1, 2}, {0, 1, 2, 3}}},
		{PolicyRandom, 1, [][]int{{0}, {0}}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/%d", tt.policy, tt.n), func(t *testing.T) {
			g, _ := newGroup(t, func(c *Config) { c.Policy = tt.policy }, fakeServers(tt.n)...)
			for i, want := range tt.want {
				got := make([]int, tt.n)
				g.order(got)
				if !slices.Equal(got, want) {
					t.Errorf("exchange %d: order %v, want %v", i, got, want)
				}
			}
		})
	}
}

// TestPolicyRandom: every order comes up, and each is a permutation.
// 3000 draws miss one of 3! orders with probability about 6·(5/6)^3000.
func TestPolicyRandom(t *testing.T) {
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			g, _ := newGroup(t, func(c *Config) { c.Policy = PolicyRandom }, fakeServers(n)...)
			seen := map[string]int{}
			for range 3000 {
				got := make([]int, n)
				g.order(got)
				sorted := slices.Sorted(slices.Values(got))
				for i := range sorted {
					if sorted[i] != i {
						t.Fatalf("order %v is not a permutation", got)
					}
				}
				seen[fmt.Sprint(got)]++
			}
			want := 1
			for i := 2; i <= n; i++ {
				want *= i
			}
			if len(seen) != want {
				t.Errorf("%d distinct orders, want %d: %v", len(seen), want, seen)
			}
		})
	}
}

// TestPolicyOrderAllocs: ordering the servers of an exchange does not
// allocate, whatever the policy.
func TestPolicyOrderAllocs(t *testing.T) {
	for _, p := range []Policy{PolicySequential, PolicyRoundRobin, PolicyRandom} {
		t.Run(string(p), func(t *testing.T) {
			g, _ := newGroup(t, func(c *Config) { c.Policy = p }, fakeServers(3)...)
			var buf [smallGroup]int
			if n := testing.AllocsPerRun(100, func() { g.order(buf[:3]) }); n != 0 {
				t.Errorf("%v allocations", n)
			}
		})
	}
}

// policyServers starts n servers, server i answering 192.0.2.(i+1).
func policyServers(t *testing.T, n int) ([]*testServer, []netip.AddrPort) {
	var ss []*testServer
	var addrs []netip.AddrPort
	for i := range n {
		s := newServer(t)
		s.setBoth(answer(fmt.Sprintf("192.0.2.%d", i+1)))
		ss = append(ss, s)
		addrs = append(addrs, s.addr)
	}
	return ss, addrs
}

// patient gives attempts a timeout no loaded test machine reaches, so
// that every exchange is answered by the first server it asks.
func patient(c *Config) { c.Timeout = 2 * time.Second; c.MaxFails = 100 }

// TestPolicyExchange: the servers that answer a run of exchanges, per
// policy.
func TestPolicyExchange(t *testing.T) {
	tests := []struct {
		policy  Policy
		queries int
		want    []string // the answer of each exchange, in order; nil: see minEach
		minEach int64    // with want nil: queries each server must get at least
	}{
		{policy: PolicySequential, queries: 4, want: []string{"192.0.2.1", "192.0.2.1", "192.0.2.1", "192.0.2.1"}},
		{policy: PolicyRoundRobin, queries: 6, want: []string{"192.0.2.2", "192.0.2.3", "192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.1"}},
		// 300 exchanges miss a server with probability about 3·(2/3)^300.
		{policy: PolicyRandom, queries: 300, minEach: 1},
	}
	for _, tt := range tests {
		t.Run(string(tt.policy), func(t *testing.T) {
			ss, addrs := policyServers(t, 3)
			g, _ := newGroup(t, func(c *Config) { patient(c); c.Policy = tt.policy }, addrs...)
			for i := range tt.queries {
				want := ""
				if tt.want != nil {
					want = tt.want[i]
				}
				mustAnswer(t, g, newReq(fmt.Sprintf("q%d.example.", i), dns.TypeA), want)
			}
			var total int64
			for i, s := range ss {
				n := s.seen()
				total += n
				if tt.want == nil && n < tt.minEach {
					t.Errorf("server %d got %d queries, want at least %d", i, n, tt.minEach)
				}
			}
			if total != int64(tt.queries) {
				t.Errorf("servers got %d queries in all, want %d: one each", total, tt.queries)
			}
		})
	}
}

// TestRoundRobinConcurrent: exchanges running at once share the counter,
// so that the servers get exactly equal shares.
func TestRoundRobinConcurrent(t *testing.T) {
	const workers, each = 8, 30
	ss, addrs := policyServers(t, 3)
	g, _ := newGroup(t, func(c *Config) { patient(c); c.Policy = PolicyRoundRobin }, addrs...)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				if _, err := exchange(t, g, newReq(fmt.Sprintf("w%d-%d.example.", w, i), dns.TypeA)); err != nil {
					t.Errorf("Exchange: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	for i, s := range ss {
		if n := s.seen(); n != workers*each/3 {
			t.Errorf("server %d got %d queries, want %d", i, n, workers*each/3)
		}
	}
}

// TestPolicySkipsDown: whatever the policy, a server marked down is not
// asked while another answers.
func TestPolicySkipsDown(t *testing.T) {
	for _, p := range []Policy{PolicySequential, PolicyRoundRobin, PolicyRandom} {
		t.Run(string(p), func(t *testing.T) {
			ss, addrs := policyServers(t, 3)
			g, _ := newGroup(t, func(c *Config) {
				patient(c)
				c.Policy, c.MaxFails, c.HealthCheck = p, 1, time.Hour
			}, addrs...)
			markDown(t, g, 0)
			for i := range 30 {
				mustAnswer(t, g, newReq(fmt.Sprintf("q%d.example.", i), dns.TypeA), "")
			}
			if n0, n := ss[0].seen(), ss[1].seen()+ss[2].seen(); n0 != 0 || n != 30 {
				t.Errorf("down server got %d queries, the others %d; want 0 and 30", n0, n)
			}
		})
	}
}

// TestFailFast: with FailFast a server marked down is never asked, so an
// exchange that finds them all down fails at once with ErrNoHealthy
// (LocalDNS answers SERVFAIL); without it they are asked last.
func TestFailFast(t *testing.T) {
	tests := []struct {
		name         string
		failFast     bool
		down         []int  // servers marked down before the exchange
		secondSilent bool   // server 1 never answers; server 0 always does
		want         string // the answer; "" for an error
		wantCause    error  // the error's Cause
		wantFailures int
		wantSeen     [2]int64
	}{
		{name: "all down, fail fast", failFast: true, down: []int{0, 1},
			wantCause: ErrNoHealthy, wantSeen: [2]int64{0, 0}},
		{name: "all down, no fail fast", failFast: false, down: []int{0, 1},
			want: "192.0.2.1", wantSeen: [2]int64{1, 0}},
		{name: "one down, fail fast, the other fails", failFast: true, down: []int{0}, secondSilent: true,
			wantFailures: 1, wantSeen: [2]int64{0, 1}},
		{name: "one down, no fail fast, the other fails", failFast: false, down: []int{0}, secondSilent: true,
			want: "192.0.2.1", wantSeen: [2]int64{1, 1}},
		{name: "none down, fail fast", failFast: true,
			want: "192.0.2.1", wantSeen: [2]int64{1, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ss, addrs := policyServers(t, 2)
			if tt.secondSilent {
				ss[1].setBoth(silent)
			}
			g, _ := newGroup(t, func(c *Config) {
				c.FailFast, c.MaxFails, c.HealthCheck, c.Timeout = tt.failFast, 1, time.Hour, 100*time.Millisecond
			}, addrs...)
			for _, i := range tt.down {
				markDown(t, g, i)
			}
			resp, err := exchange(t, g, newReq("a.example.", dns.TypeA))
			if tt.want != "" {
				if err != nil || len(resp.Answer) != 1 || resp.Answer[0].(*dns.A).A.String() != tt.want {
					t.Fatalf("Exchange: %v %v, want %s", resp, err, tt.want)
				}
			} else {
				var e *Error
				if !errors.As(err, &e) || e.Cause != tt.wantCause || len(e.Failures) != tt.wantFailures {
					t.Fatalf("err %v, want *Error with Cause %v and %d failures", err, tt.wantCause, tt.wantFailures)
				}
			}
			for i, s := range ss {
				if n := s.seen(); n != tt.wantSeen[i] {
					t.Errorf("server %d got %d queries, want %d", i, n, tt.wantSeen[i])
				}
			}
		})
	}
}

// TestHealthCheckProbe: the probe asks HealthCheckDomain with RD unless
// HealthCheckNoRec, over the transport of the queries, and an answer to
// it brings the server back.
func TestHealthCheckProbe(t *testing.T) {
	tests := []struct {
		name     string
		domain   string
		noRec    bool
		forceTCP bool
	}{
		{name: "default", domain: "."},
		{name: "no_rec", domain: ".", noRec: true},
		{name: "domain", domain: testProbeDomain},
		{name: "no_rec domain", domain: testProbeDomain, noRec: true},
		{name: "no_rec domain over tcp", domain: testProbeDomain, noRec: true, forceTCP: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newServer(t)
			s.setBoth(silent)
			g, _ := newGroup(t, func(c *Config) {
				c.MaxFails, c.ForceTCP = 1, tt.forceTCP
				c.HealthCheckDomain, c.HealthCheckNoRec = tt.domain, tt.noRec
			}, s.addr)
			markDown(t, g, 0)
			testkit.Eventually(t, 3*time.Second, "a health probe", func() bool { return s.lastProbe.Load() != nil })
			p := s.lastProbe.Load()
			if q := p.Question[0]; !strings.EqualFold(q.Name, tt.domain) || q.Qtype != dns.TypeNS || q.Qclass != dns.ClassINET {
				t.Errorf("probe question %v, want %s IN NS", q, tt.domain)
			}
			if p.RecursionDesired == tt.noRec {
				t.Errorf("probe RD=%v, want %v", p.RecursionDesired, !tt.noRec)
			}
			s.setBoth(answer("192.0.2.1"))
			testkit.Eventually(t, 3*time.Second, "the server back up", func() bool { return stats(g, 0).Healthy })
			if n := s.seen(); n != 0 {
				t.Errorf("probes counted as queries: %d", n)
			}
		})
	}
}
