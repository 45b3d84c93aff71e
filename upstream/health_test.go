package upstream

import (
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// probeRunning reports whether any probe goroutine is running.
func probeRunning() bool {
	for _, g := range groupGoroutines() {
		if strings.Contains(g, "upstream.(*Group).probe(") {
			return true
		}
	}
	return false
}

// seen returns the queries s received, health probes not counted.
func (s *testServer) seen() int64 { return s.udpQueries.Load() + s.tcpQueries.Load() }

func (s *server) isProbing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.probing
}

// TestMarkedDownAndBack: MaxFails failures mark a server down; it is then
// skipped, probed, and put back in service once a probe is answered.
func TestMarkedDownAndBack(t *testing.T) {
	for _, tt := range []struct {
		name     string
		forceTCP bool
	}{{"udp", false}, {"tcp", true}} {
		t.Run(tt.name, func(t *testing.T) {
			s1, s2 := newServer(t), newServer(t)
			s1.setBoth(silent)
			s2.setBoth(answer("192.0.2.2"))
			g, logs := newGroup(t, func(c *Config) { c.ForceTCP = tt.forceTCP; c.Timeout = 100 * time.Millisecond }, s1.addr, s2.addr)

			mustAnswer(t, g, newReq("a.example.", dns.TypeA), "192.0.2.2")
			if st := stats(g, 0); !st.Healthy || st.Fails != 1 {
				t.Fatalf("after one failure: %+v", st)
			}
			mustAnswer(t, g, newReq("b.example.", dns.TypeA), "192.0.2.2")
			if st := stats(g, 0); st.Healthy {
				t.Fatalf("not marked down after MaxFails failures: %+v", st)
			}
			if l := logs.with("marked down"); len(l) != 1 || l[0].level != slog.LevelWarn ||
				l[0].attrs["server"] != s1.addr.String() || l[0].attrs["component"] != "upstream" || l[0].attrs["err"] == "" {
				t.Errorf("down log lines: %+v", l)
			}

			// Skipped: the next query goes straight to the second server.
			mustAnswer(t, g, newReq("c.example.", dns.TypeA), "192.0.2.2")
			if n := s1.seen(); n != 2 {
				t.Errorf("down server got %d queries, want 2", n)
			}
			testkit.Eventually(t, 3*time.Second, "health probes", func() bool { return s1.probes.Load() >= 2 })
			if !g.servers[0].isProbing() || !probeRunning() {
				t.Errorf("no probe goroutine")
			}

			s1.setBoth(answer("192.0.2.1"))
			testkit.Eventually(t, 3*time.Second, "the server back up", func() bool { return stats(g, 0).Healthy })
			if l := logs.with("back up"); len(l) != 1 || l[0].level != slog.LevelInfo || l[0].attrs["by"] != "health check" {
				t.Errorf("up log lines: %+v", l)
			}
			// No probe after recovery: the probe goroutine, the only
			// sender of probes, ends. Its end is the signal, not a pause.
			testkit.Eventually(t, 3*time.Second, "the probe goroutine to end", func() bool {
				return !g.servers[0].isProbing() && !probeRunning()
			})
			probes := s1.probes.Load()
			mustAnswer(t, g, newReq("d.example.", dns.TypeA), "192.0.2.1")
			if st := stats(g, 0); st.Fails != 0 || st.Requests[tt.name] != 3 {
				t.Errorf("probes counted in stats, or fails kept: %+v", st)
			}
			if n := s1.probes.Load(); n != probes {
				t.Errorf("%d probes after recovery", n-probes)
			}
		})
	}
}

// TestAllDownStillTried: with every server marked down, each is still
// tried, in order, and the one that answers is back in service.
func TestAllDownStillTried(t *testing.T) {
	s1, s2 := newServer(t), newServer(t)
	s1.setBoth(silent)
	s2.setBoth(silent)
	g, logs := newGroup(t, func(c *Config) { c.MaxFails = 1; c.HealthCheck = time.Hour; c.Timeout = 80 * time.Millisecond }, s1.addr, s2.addr)

	_, err := exchange(t, g, newReq("a.example.", dns.TypeA))
	if !isFailure(err, reasonTimeout) {
		t.Fatalf("err %v, want timeouts", err)
	}
	if stats(g, 0).Healthy || stats(g, 1).Healthy {
		t.Fatalf("not both down: %+v", g.Stats())
	}

	s2.setBoth(answer("192.0.2.2"))
	mustAnswer(t, g, newReq("b.example.", dns.TypeA), "192.0.2.2")
	if n1, n2 := s1.seen(), s2.seen(); n1 != 2 || n2 != 2 {
		t.Errorf("queries seen %d, %d; want 2, 2", n1, n2)
	}
	if !stats(g, 1).Healthy || stats(g, 0).Healthy {
		t.Errorf("want only the answering server back: %+v", g.Stats())
	}
	if l := logs.with("back up"); len(l) != 1 || l[0].attrs["by"] != "query" {
		t.Errorf("up log lines: %+v", l)
	}

	// Now the healthy one goes first and the down one is skipped.
	mustAnswer(t, g, newReq("c.example.", dns.TypeA), "192.0.2.2")
	if n := s1.seen(); n != 2 {
		t.Errorf("down server got %d queries, want 2", n)
	}
}

// TestDownTriedLast: a server marked down is tried after the servers in
// service have failed, not never.
func TestDownTriedLast(t *testing.T) {
	s1, s2 := newServer(t), newServer(t)
	s1.setBoth(silent)
	g, _ := newGroup(t, func(c *Config) { c.MaxFails = 1; c.HealthCheck = time.Hour; c.Timeout = 80 * time.Millisecond }, s1.addr, s2.addr)
	mustAnswer(t, g, newReq("a.example.", dns.TypeA), "192.0.2.1") // s1 fails and goes down
	if stats(g, 0).Healthy {
		t.Fatal("first server not down")
	}
	s1.setBoth(answer("192.0.2.11"))
	s2.setBoth(silent)
	mustAnswer(t, g, newReq("b.example.", dns.TypeA), "192.0.2.11")
	if n1, n2 := s1.seen(), s2.seen(); n1 != 2 || n2 != 2 {
		t.Errorf("queries seen %d, %d; want 2, 2", n1, n2)
	}
}

// TestMaxFailsDisabled: MaxFails 0 never marks a server down.
func TestMaxFailsDisabled(t *testing.T) {
	s1, s2 := newServer(t), newServer(t)
	s1.setBoth(silent)
	g, logs := newGroup(t, func(c *Config) { c.MaxFails = 0; c.Timeout = 50 * time.Millisecond }, s1.addr, s2.addr)
	for range 4 {
		mustAnswer(t, g, newReq("a.example.", dns.TypeA), "192.0.2.1")
	}
	if n := s1.seen(); n != 4 {
		t.Errorf("first server got %d queries, want 4", n)
	}
	if !stats(g, 0).Healthy || len(logs.with("marked down")) != 0 || g.servers[0].isProbing() {
		t.Errorf("server marked down with MaxFails 0")
	}
}

// TestCallerDeadline: an attempt that the caller's deadline ends is a
// timeout of the server when the server had at least half its Timeout to
// answer — above all the daemon's case of one upstream whose Timeout is
// the whole of the pipeline's deadline, where the caller always wins the
// race by microseconds — and is not held against it when the deadline
// left it less, or when the caller cancelled.
func TestCallerDeadline(t *testing.T) {
	const timeout = 300 * time.Millisecond
	tests := []struct {
		name     string
		servers  int
		forceTCP bool
		// deadline is the caller's, from just before each Exchange; cancel,
		// if set, cancels the exchange that long after it starts instead.
		deadline, cancel time.Duration
		rounds           int   // exchanges, one after the other
		blamed           []int // timeouts counted per server
	}{
		{name: "one server, deadline equal to Timeout", servers: 1, deadline: timeout, rounds: 2, blamed: []int{2}},
		{name: "one server over tcp, deadline equal to Timeout", servers: 1, forceTCP: true, deadline: timeout, rounds: 2, blamed: []int{2}},
		{name: "second server gets its share", servers: 2, deadline: 2 * timeout, rounds: 1, blamed: []int{1, 1}},
		{name: "second server gets a sliver", servers: 2, deadline: timeout + timeout/10, rounds: 1, blamed: []int{1, 0}},
		{name: "deadline well short of Timeout", servers: 1, deadline: timeout / 5, rounds: 2, blamed: []int{0}},
		// More than half of Timeout, which a deadline would be blamed for,
		// with room before Timeout for a slow timer on a loaded machine.
		{name: "cancelled after most of Timeout", servers: 1, cancel: timeout * 6 / 10, rounds: 2, blamed: []int{0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var addrs []netip.AddrPort
			for range tt.servers {
				addrs = append(addrs, silentServer(t))
			}
			g, logs := newGroup(t, func(c *Config) { c.Timeout, c.ForceTCP, c.HealthCheck = timeout, tt.forceTCP, time.Hour }, addrs...)
			for range tt.rounds {
				ctx, cancel := context.WithTimeout(context.Background(), tt.deadline)
				if tt.cancel > 0 {
					ctx, cancel = context.WithCancel(context.Background())
					time.AfterFunc(tt.cancel, cancel)
				}
				_, err := g.Exchange(ctx, newReq("blackholed.example.", dns.TypeA))
				cancel()
				if err == nil {
					t.Fatal("a silent server answered")
				}
			}
			for i, want := range tt.blamed {
				st := stats(g, i)
				down := want >= g.cfg.MaxFails
				if st.Errors["timeout"] != uint64(want) || st.Healthy == down {
					t.Errorf("server %d: %d timeouts, healthy %v; want %d, healthy %v (%+v)", i, st.Errors["timeout"], st.Healthy, want, !down, st)
				}
			}
			downs := 0
			for _, want := range tt.blamed {
				if want >= g.cfg.MaxFails {
					downs++
				}
			}
			if n := len(logs.with("marked down")); n != downs {
				t.Errorf("%d marked-down lines, want %d", n, downs)
			}
		})
	}
}
