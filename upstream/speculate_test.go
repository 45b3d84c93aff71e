package upstream

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// speculating is newGroup's modifier for the tests of speculative
// attempts: the defaults, with a 1 s Timeout so that waiting one out is
// plain to see and cheap to wait for.
func speculating(more func(*Config)) func(*Config) {
	return func(c *Config) {
		d := DefaultConfig()
		c.Timeout = time.Second
		c.SpeculativeMult, c.SpeculativeMin, c.SpeculativeMax = d.SpeculativeMult, d.SpeculativeMin, d.SpeculativeMax
		c.SpeculativeWindow, c.SpeculativeShare = d.SpeculativeWindow, d.SpeculativeShare
		c.SpeculativeRate, c.SpeculativeBurst = d.SpeculativeRate, d.SpeculativeBurst
		if more != nil {
			more(c)
		}
	}
}

// dropFirst answers every UDP query but the first it gets, which it
// drops: a ClusterIP whose first flow went to a dead backend.
func dropFirst() udpHandler {
	var n atomic.Int64
	ok := replyUDP(answer("192.0.2.2"))
	return func(s *testServer, from netip.AddrPort, q *dns.Msg) {
		if n.Add(1) > 1 {
			ok(s, from, q)
		}
	}
}

// slowly answers after d.
func slowly(d time.Duration, ip string) udpHandler {
	h := replyUDP(answer(ip))
	return func(s *testServer, from netip.AddrPort, q *dns.Msg) {
		time.AfterFunc(d, func() { h(s, from, q) })
	}
}

func specCount(g *Group, r specReason, res specResult) uint64 { return g.spec.started[r][res].Load() }

// TestSpeculativeWins: an attempt left unanswered past its speculative
// deadline has the next one started beside it, and the first reply
// wins, well before the 1 s Timeout the exchange waited before.
func TestSpeculativeWins(t *testing.T) {
	for _, tt := range []struct {
		name    string
		servers []udpHandler
		want    string        // the answer
		within  time.Duration // the exchange's time at the most
		reason  specReason
		won     uint64 // speculative attempts won (of reason)
		lost    uint64
	}{
		{"the next server beats a silent one", []udpHandler{replyUDP(silent), replyUDP(answer("192.0.2.2"))}, "192.0.2.2", 300 * time.Millisecond, specNextServer, 1, 0},
		{"the only server from a fresh socket beats a dropped query", []udpHandler{dropFirst()}, "192.0.2.2", 300 * time.Millisecond, specFreshSocket, 1, 0},
		{"two silent servers: the third answers", []udpHandler{replyUDP(silent), replyUDP(silent), replyUDP(answer("192.0.2.2"))}, "192.0.2.2", 400 * time.Millisecond, specNextServer, 1, 1},
		{"a server answering within the deadline: no speculation", []udpHandler{slowly(10*time.Millisecond, "192.0.2.1"), replyUDP(answer("192.0.2.2"))}, "192.0.2.1", 300 * time.Millisecond, specNextServer, 0, 0},
		{"a slow server's reply still wins if first", []udpHandler{slowly(70*time.Millisecond, "192.0.2.1"), slowly(200*time.Millisecond, "192.0.2.2")}, "192.0.2.1", 300 * time.Millisecond, specNextServer, 0, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var addrs []netip.AddrPort
			var srvs []*testServer
			for _, h := range tt.servers {
				s := newServer(t)
				s.setUDP(h)
				addrs = append(addrs, s.addr)
				srvs = append(srvs, s)
			}
			g, _ := newGroup(t, speculating(nil), addrs...)
			start := time.Now()
			mustAnswer(t, g, newReq("spec.example.", dns.TypeA), tt.want)
			if took := time.Since(start); took > tt.within {
				t.Errorf("answered in %v, want within %v", took, tt.within)
			}
			if w, l := specCount(g, tt.reason, specWon), specCount(g, tt.reason, specLost); w != tt.won || l != tt.lost {
				t.Errorf("speculative %s: %d won, %d lost; want %d, %d", tt.reason, w, l, tt.won, tt.lost)
			}
		})
	}
}

// TestSpeculativeKeepsHealth: the attempt a speculative one overtook
// waits out its own Timeout and counts, so a silent first server is still
// marked down after MaxFails exchanges, as without speculation, and is
// then skipped: no more speculation.
func TestSpeculativeKeepsHealth(t *testing.T) {
	s1, s2 := newServer(t), newServer(t)
	s1.setBoth(silent)
	g, _ := newGroup(t, speculating(func(c *Config) { c.Timeout = 300 * time.Millisecond }), s1.addr, s2.addr)
	for range 2 {
		mustAnswer(t, g, newReq("a.example.", dns.TypeA), "192.0.2.1")
	}
	testkit.Eventually(t, 3*time.Second, "the silent server marked down", func() bool { return !stats(g, 0).Healthy })
	if st := stats(g, 0); st.Errors["timeout"] != 2 {
		t.Errorf("silent server: %d timeouts, want 2 (%+v)", st.Errors["timeout"], st)
	}
	before := specCount(g, specNextServer, specWon)
	start := time.Now()
	mustAnswer(t, g, newReq("b.example.", dns.TypeA), "192.0.2.1")
	if took := time.Since(start); took > 40*time.Millisecond || specCount(g, specNextServer, specWon) != before {
		t.Errorf("after marked down: %v and a speculative attempt; want the second server at once", took)
	}
}

// TestSpeculativeCaps floods a group with exchanges that all want a
// speculative attempt and checks the caps hold: the rate's bucket, and
// the share of extra attempts, so that a slow server that still answers
// never has a healthy one sent more than its share of the queries.
func TestSpeculativeCaps(t *testing.T) {
	for _, tt := range []struct {
		name  string
		first udpHandler // the first server; the second answers at once
		mod   func(*Config)
		n     int // exchanges, 8 at a time
		check func(t *testing.T, g *Group, second *testServer, n int)
	}{
		{
			name:  "rate: a silent first server",
			first: replyUDP(silent),
			mod: func(c *Config) {
				c.SpeculativeRate, c.SpeculativeBurst = 1, 5
				c.Timeout, c.MaxFails = 300*time.Millisecond, 0 // never skipped as down
			},
			n: 40,
			check: func(t *testing.T, g *Group, _ *testServer, n int) {
				started := specCount(g, specNextServer, specWon) + specCount(g, specNextServer, specLost)
				skipped := g.spec.skipped[skipRate].Load()
				// The burst, and at most a token or two more refilled
				// while the flood lasts.
				if started < 5 || started > 7 || started+skipped != uint64(n) {
					t.Errorf("%d started, %d skipped for rate; want 5 to 7 of %d, the rest skipped", started, skipped, n)
				}
			},
		},
		{
			name:  "share: a slow first server that answers",
			first: slowly(120*time.Millisecond, "192.0.2.1"),
			mod: func(c *Config) {
				c.SpeculativeRate, c.SpeculativeBurst = 1e6, 1e6
				// A deadline that does not adapt: every exchange wants a
				// speculative attempt, and only the share stops them.
				c.SpeculativeMax = c.SpeculativeMin
			},
			n: 200,
			check: func(t *testing.T, g *Group, second *testServer, n int) {
				// Wait for the overtaken attempts to end and count.
				testkit.Eventually(t, 3*time.Second, "every attempt to end", func() bool { return len(groupGoroutines()) == 1 })
				sent := g.sent()
				got := uint64(second.udpQueries.Load())
				// Its share of what was sent, and the cap's lag: the
				// attempts the 8 workers start before the first
				// server's reply (120 ms, 3 deadlines) shows them extra.
				if limit := uint64(0.1*float64(sent)) + 8*3; got > limit {
					t.Errorf("healthy server sent %d of %d queries, want at most %d", got, sent, limit)
				}
				if g.spec.skipped[skipShare].Load() == 0 {
					t.Errorf("no attempt skipped for the share")
				}
			},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s1, s2 := newServer(t), newServer(t)
			s1.setUDP(tt.first)
			g, _ := newGroup(t, speculating(tt.mod), s1.addr, s2.addr)
			var wg sync.WaitGroup
			work := make(chan int)
			for range 8 {
				wg.Go(func() {
					for range work {
						if _, err := exchange(t, g, newReq("flood.example.", dns.TypeA)); err != nil {
							t.Errorf("Exchange: %v", err)
						}
					}
				})
			}
			for i := range tt.n {
				work <- i
			}
			close(work)
			wg.Wait()
			tt.check(t, g, s2, tt.n)
		})
	}
}

// TestSpeculativeCancel: a caller that gives up, or Close, ends every
// attempt of the race at once, none held against its server, and no
// goroutine of the race is left.
func TestSpeculativeCancel(t *testing.T) {
	for _, tt := range []struct {
		name string
		stop func(g *Group, cancel context.CancelFunc)
		want error
	}{
		{"the caller cancels", func(_ *Group, cancel context.CancelFunc) { cancel() }, context.Canceled},
		{"the group closes", func(g *Group, _ context.CancelFunc) { g.Close() }, ErrClosed},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s1, s2 := newServer(t), newServer(t)
			s1.setBoth(silent)
			s2.setBoth(silent)
			g, _ := newGroup(t, speculating(nil), s1.addr, s2.addr)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() {
				_, err := g.Exchange(ctx, newReq("c.example.", dns.TypeA))
				done <- err
			}()
			testkit.Eventually(t, 3*time.Second, "both servers asked", func() bool { return s1.seen() > 0 && s2.seen() > 0 })
			tt.stop(g, cancel)
			select {
			case err := <-done:
				if !errors.Is(err, tt.want) {
					t.Errorf("Exchange: %v, want %v", err, tt.want)
				}
			case <-time.After(time.Second):
				t.Fatal("Exchange still waiting")
			}
			want := 1 // the janitor
			if tt.want == ErrClosed {
				want = 0
			}
			testkit.Eventually(t, 3*time.Second, "the race's goroutines to end", func() bool { return len(groupGoroutines()) == want })
			for i := range 2 {
				if st := stats(g, i); st.Fails != 0 || st.Errors["timeout"] != 0 {
					t.Errorf("server %d blamed: %+v", i, st)
				}
			}
		})
	}
}

// TestSpeculativeNoAllocs: an exchange answered in time allocates as
// much with speculative attempts on as with them off.
func TestSpeculativeNoAllocs(t *testing.T) {
	s := newServer(t)
	off, _ := newGroup(t, nil, s.addr)
	on, _ := newGroup(t, speculating(nil), s.addr)
	req := newReq("allocs.example.", dns.TypeA)
	ctx := context.Background()
	allocs := func(g *Group) float64 {
		return testing.AllocsPerRun(200, func() {
			if _, err := g.Exchange(ctx, req); err != nil {
				t.Fatal(err)
			}
		})
	}
	a, b := allocs(off), allocs(on)
	if b > a {
		t.Errorf("%v allocations per exchange with speculative attempts, %v without", b, a)
	}
}

// TestFreshSocketWhenDown: a single server marked down still gets
// speculative attempts from fresh sockets. The lab's dnsstandby, asking
// kube-dns little, saw two lost flows in a row mark the ClusterIP down
// while two of its three backends answered; a flow then drawn to the dead
// one waited out the whole Timeout.
func TestFreshSocketWhenDown(t *testing.T) {
	s := newServer(t)
	s.setBoth(silent)
	g, _ := newGroup(t, speculating(func(c *Config) { c.Timeout, c.MaxFails = 300*time.Millisecond, 1 }), s.addr)
	if _, err := exchange(t, g, newReq("a.example.", dns.TypeA)); err == nil {
		t.Fatal("a silent server answered")
	}
	testkit.Eventually(t, 3*time.Second, "marked down", func() bool { return !stats(g, 0).Healthy })
	started := specCount(g, specFreshSocket, specWon)
	s.setUDP(dropFirst()) // the next flow draws the dead backend; the others a live one
	start := time.Now()
	mustAnswer(t, g, newReq("b.example.", dns.TypeA), "192.0.2.2")
	if took := time.Since(start); took > 200*time.Millisecond {
		t.Errorf("answered after %v, want a fresh socket's answer well before the 300 ms Timeout", took)
	}
	if got := specCount(g, specFreshSocket, specWon); got != started+1 {
		t.Errorf("%d fresh sockets won while down, want 1", got-started)
	}
	if !stats(g, 0).Healthy {
		t.Error("still marked down after answering a query")
	}
}

// dropN drops the first n UDP queries it gets and answers the others:
// flows that drew a dead backend behind a ClusterIP.
func dropN(n int64) udpHandler {
	var seen atomic.Int64
	ok := replyUDP(answer("192.0.2.2"))
	return func(s *testServer, from netip.AddrPort, q *dns.Msg) {
		if seen.Add(1) > n {
			ok(s, from, q)
		}
	}
}

// TestDeadBackendKeepsServerUp: two exchanges at once on the only server
// both lose their first attempt (a dead backend) and are answered from
// fresh sockets; the two lost attempts then time out back to back. The
// server replied meanwhile, so they do not count against it: it stays in
// service, and keeps its speculative attempts (a server marked down gets
// none).
func TestDeadBackendKeepsServerUp(t *testing.T) {
	s := newServer(t)
	s.setUDP(dropN(2))
	g, _ := newGroup(t, speculating(func(c *Config) { c.Timeout = 500 * time.Millisecond }), s.addr)
	var wg sync.WaitGroup
	for _, name := range []string{"a.example.", "b.example."} {
		wg.Go(func() { mustAnswer(t, g, newReq(name, dns.TypeA), "192.0.2.2") })
	}
	wg.Wait()
	testkit.Eventually(t, 3*time.Second, "both lost attempts timed out", func() bool { return stats(g, 0).Errors["timeout"] == 2 })
	if !stats(g, 0).Healthy {
		t.Errorf("marked down by the timeouts of attempts lost while it answered others: %+v", stats(g, 0))
	}
}

// TestFreshSocketsPerExchange: the only server's first flows all draw a
// dead backend; the exchange keeps starting fresh sockets, one at each
// speculative deadline, up to maxSpeculative, and is answered by the first
// that draws a live one. Past that it waits out the Timeout.
func TestFreshSocketsPerExchange(t *testing.T) {
	for _, tt := range []struct {
		dead     int64 // flows lost before one is answered
		answered bool  // before the 1 s Timeout
	}{
		{dead: 1, answered: true},
		{dead: maxSpeculative, answered: true},
		{dead: maxSpeculative + 1, answered: false},
	} {
		t.Run(fmt.Sprintf("%d dead", tt.dead), func(t *testing.T) {
			s := newServer(t)
			s.setUDP(dropN(tt.dead))
			g, _ := newGroup(t, speculating(func(c *Config) { c.Timeout, c.MaxFails = time.Second, 0 }), s.addr)
			start := time.Now()
			_, err := exchange(t, g, newReq("a.example.", dns.TypeA))
			took := time.Since(start)
			fast := err == nil && took < 800*time.Millisecond
			if fast != tt.answered {
				t.Errorf("answered %v in %v (err %v), want answered before the Timeout: %v", err == nil, took, err, tt.answered)
			}
			want := min(tt.dead, maxSpeculative)
			if got := int64(specCount(g, specFreshSocket, specWon) + specCount(g, specFreshSocket, specLost)); got != want {
				t.Errorf("%d fresh sockets started, want %d", got, want)
			}
		})
	}
}

// TestSilentServerFloor: a server that answered in about 45 ms (under
// the floor: no speculation) has a speculative deadline of about 4 × 45
// ms; once it goes silent, the
// first exchange waits that deadline, and the next ones (before it is
// marked down) only the floor, SpeculativeMin, since it has not replied
// since an attempt went overdue.
func TestSilentServerFloor(t *testing.T) {
	first, second := newServer(t), newServer(t)
	var silentNow atomic.Bool
	slow := slowly(45*time.Millisecond, "192.0.2.1")
	first.setUDP(func(s *testServer, from netip.AddrPort, q *dns.Msg) {
		if !silentNow.Load() {
			slow(s, from, q)
		}
	})
	second.setUDP(replyUDP(answer("192.0.2.2")))
	g, _ := newGroup(t, speculating(func(c *Config) { c.Timeout = 2 * time.Second }), first.addr, second.addr)
	for range 20 {
		mustAnswer(t, g, newReq("warm.example.", dns.TypeA), "192.0.2.1")
	}
	if after := g.servers[0].speculativeAfter(); after < 160*time.Millisecond {
		t.Fatalf("deadline %v after 45 ms replies, want about 4 × 45 ms", after)
	}
	silentNow.Store(true)
	took := func(name string) time.Duration {
		start := time.Now()
		mustAnswer(t, g, newReq(name, dns.TypeA), "192.0.2.2")
		return time.Since(start)
	}
	if d := took("a.example."); d < 150*time.Millisecond {
		t.Errorf("first exchange after the silence answered in %v, want after the p99 deadline", d)
	}
	for _, name := range []string{"b.example.", "c.example.", "d.example."} {
		if d := took(name); d > 120*time.Millisecond {
			t.Errorf("%s answered in %v, want about the 50 ms floor", name, d)
		}
	}
}

// TestSparseGroupKeepsSpeculating: a group that has asked little (a
// healthy node's dnsstandby sends only its hedges) and has one attempt
// proved extra already — over 1% of what it sent — still starts a
// speculative attempt for a flow lost to a dead backend: the share cap
// allows speculativeExtraFloor extra attempts whatever the share.
func TestSparseGroupKeepsSpeculating(t *testing.T) {
	s := newServer(t)
	var n atomic.Int64
	// 70 ms: past the 50 ms deadline of a server that has not replied
	// yet, and answered before a second speculative attempt is due.
	slow, ok := slowly(70*time.Millisecond, "192.0.2.2"), replyUDP(answer("192.0.2.2"))
	s.setUDP(func(ts *testServer, from netip.AddrPort, q *dns.Msg) {
		switch n.Add(1) {
		case 1, 2: // the first exchange and its speculative attempt: both answer, late
			slow(ts, from, q)
		case 3: // the second exchange's first flow: a dead backend
		default:
			ok(ts, from, q)
		}
	})
	g, _ := newGroup(t, speculating(nil), s.addr)
	mustAnswer(t, g, newReq("a.example.", dns.TypeA), "192.0.2.2")
	testkit.Eventually(t, 3*time.Second, "the overtaken attempt to end", func() bool { return len(groupGoroutines()) == 1 })
	if got := g.spec.extra.Load(); got != 1 || n.Load() != 2 {
		t.Fatalf("%d attempts proved extra of %d sent, want 1 of 2", got, n.Load())
	}
	start := time.Now()
	mustAnswer(t, g, newReq("b.example.", dns.TypeA), "192.0.2.2")
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("a lost flow answered after %v (skipped for the share: %d); want a speculative attempt well before the 1 s Timeout",
			took, g.spec.skipped[skipShare].Load())
	}
}
