package upstream

import (
	"context"
	"errors"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// TestCloseStopsGoroutines brings up every goroutine the group owns — the
// janitor, a prober per down server, wake-ups of exchanges in flight —
// then closes it: none may remain, and the goroutine count must return to
// where it was before the group existed.
func TestCloseStopsGoroutines(t *testing.T) {
	s1, s2, s3 := newServer(t), newServer(t), newServer(t)
	s1.setBoth(silent)
	s2.setBoth(silent)
	before := runtime.NumGoroutine()

	cfg := DefaultConfig()
	cfg.Servers = []netip.AddrPort{s1.addr, s2.addr, s3.addr}
	cfg.Timeout = 50 * time.Millisecond
	cfg.MaxFails = 1
	cfg.HealthCheck = 10 * time.Millisecond
	cfg.Logger = testkit.Logger(t)
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// s1 and s2 go down and get probers; s3 answers.
	mustAnswer(t, g, newReq("a.example.", dns.TypeA), "192.0.2.1")
	// A pooled TCP connection to s3.
	s3.setUDP(replyUDP(truncated))
	mustAnswer(t, g, newReq("b.example.", dns.TypeA), "192.0.2.1")
	if g.servers[2].pool.len() != 1 {
		t.Fatalf("no pooled connection")
	}
	testkit.Eventually(t, 3*time.Second, "probes", func() bool { return s1.probes.Load() > 0 && s2.probes.Load() > 0 })
	if len(groupGoroutines()) < 3 {
		t.Fatalf("expected janitor and two probers, have:\n%s", groupGoroutines())
	}

	// An exchange in flight, stuck on the down servers (every server is
	// down or silent now), is woken by Close.
	s3.setBoth(silent)
	sent := s3.seen()
	done := make(chan error)
	go func() {
		_, err := g.Exchange(context.Background(), newReq("c.example.", dns.TypeA))
		done <- err
	}()
	// In flight: s3, the one server in service, has the query.
	testkit.Eventually(t, 3*time.Second, "the exchange to reach the server", func() bool { return s3.seen() > sent })

	if err := g.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Errorf("exchange in flight returned %v, want ErrClosed", err)
		}
	case <-time.After(time.Second):
		t.Fatal("Close did not wake the exchange in flight")
	}
	if err := g.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := g.Exchange(context.Background(), newReq("d.example.", dns.TypeA)); !errors.Is(err, ErrClosed) {
		t.Errorf("Exchange after Close: %v, want ErrClosed", err)
	}
	if n := g.servers[2].pool.len(); n != 0 {
		t.Errorf("%d pooled connections after Close", n)
	}
	testkit.Eventually(t, 3*time.Second, "the pooled connection to be closed at the server", func() bool {
		s3.mu.Lock()
		defer s3.mu.Unlock()
		return len(s3.conns) == 0
	})

	// Close does not wait for wake-ups (context.AfterFunc) to finish
	// returning, so allow them a moment.
	testkit.Eventually(t, 3*time.Second, "the group's goroutines to end", func() bool { return len(groupGoroutines()) == 0 })
	testkit.Eventually(t, 3*time.Second, "the goroutine count to settle", func() bool { return runtime.NumGoroutine() <= before })
}
