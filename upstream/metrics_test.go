package upstream

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// serverSeries is the expected text of one server's counters and gauge.
type serverSeries struct {
	udp, tcp uint64            // requests by proto
	errors   map[string]uint64 // by reason; the rest are 0
	healthy  bool
}

// expectedText renders the metrics of servers (name to series) in the
// exposition format, with the group's reject count.
func expectedText(servers map[string]serverSeries, rejects uint64) string {
	var req, errs, healthy strings.Builder
	for name, s := range servers {
		fmt.Fprintf(&req, "dnsstandby_upstream_requests_total{proto=\"udp\",server=%q} %d\n", name, s.udp)
		fmt.Fprintf(&req, "dnsstandby_upstream_requests_total{proto=\"tcp\",server=%q} %d\n", name, s.tcp)
		for r := range numReasons {
			fmt.Fprintf(&errs, "dnsstandby_upstream_errors_total{reason=%q,server=%q} %d\n", r.String(), name, s.errors[r.String()])
		}
		h := 0
		if s.healthy {
			h = 1
		}
		fmt.Fprintf(&healthy, "dnsstandby_upstream_healthy{server=%q} %d\n", name, h)
	}
	return fmt.Sprintf(`# HELP dnsstandby_upstream_requests_total %s
# TYPE dnsstandby_upstream_requests_total counter
%s# HELP dnsstandby_upstream_errors_total %s
# TYPE dnsstandby_upstream_errors_total counter
%s# HELP dnsstandby_upstream_healthy %s
# TYPE dnsstandby_upstream_healthy gauge
%s# HELP dnsstandby_upstream_max_concurrent_rejects_total %s
# TYPE dnsstandby_upstream_max_concurrent_rejects_total counter
dnsstandby_upstream_max_concurrent_rejects_total %d
`, helpRequests, req.String(), helpErrors, errs.String(), helpHealthy, healthy.String(), helpRejects, rejects)
}

// TestMetrics registers the group with a pedantic registry (which checks
// Collect against Describe) and compares its series after one failed and
// one answered attempt.
func TestMetrics(t *testing.T) {
	bad := closedAddr(t)
	good := newServer(t)
	g, _ := newGroup(t, func(c *Config) { c.MaxFails = 1; c.HealthCheck = time.Hour }, bad, good.addr)
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(g); err != nil {
		t.Fatalf("Register: %v", err)
	}
	mustAnswer(t, g, newReq("m.example.", dns.TypeA), "192.0.2.1")

	want := expectedText(map[string]serverSeries{
		bad.String():       {udp: 1, errors: map[string]uint64{"refused": 1}, healthy: false},
		good.addr.String(): {udp: 1, healthy: true},
	}, 0)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"dnsstandby_upstream_requests_total", "dnsstandby_upstream_errors_total",
		"dnsstandby_upstream_healthy", "dnsstandby_upstream_max_concurrent_rejects_total"); err != nil {
		t.Error(err)
	}
	// The histogram: one series per server; the answered attempt timed.
	if n := testutil.CollectAndCount(g, "dnsstandby_upstream_duration_seconds"); n != 2 {
		t.Errorf("%d duration series, want 2", n)
	}
	if r0, r1 := stats(g, 0).Replies, stats(g, 1).Replies; r0 != 0 || r1 != 1 {
		t.Errorf("replies timed %d, %d; want 0, 1", r0, r1)
	}
}

// TestDurationHistogram compares the whole histogram of a server that
// never answered: CoreDNS's buckets, all empty.
func TestDurationHistogram(t *testing.T) {
	bad := closedAddr(t)
	g, _ := newGroup(t, nil, bad)
	if _, err := exchange(t, g, newReq("h.example.", dns.TypeA)); err == nil {
		t.Fatal("a closed port answered")
	}
	var want strings.Builder
	fmt.Fprintf(&want, "# HELP dnsstandby_upstream_duration_seconds %s\n# TYPE dnsstandby_upstream_duration_seconds histogram\n", helpDuration)
	for _, ub := range durationBuckets {
		fmt.Fprintf(&want, "dnsstandby_upstream_duration_seconds_bucket{server=%q,le=\"%g\"} 0\n", bad.String(), ub)
	}
	fmt.Fprintf(&want, "dnsstandby_upstream_duration_seconds_bucket{server=%q,le=\"+Inf\"} 0\n", bad.String())
	fmt.Fprintf(&want, "dnsstandby_upstream_duration_seconds_sum{server=%q} 0\n", bad.String())
	fmt.Fprintf(&want, "dnsstandby_upstream_duration_seconds_count{server=%q} 0\n", bad.String())
	if err := testutil.CollectAndCompare(g, strings.NewReader(want.String()), "dnsstandby_upstream_duration_seconds"); err != nil {
		t.Error(err)
	}
}

// TestMaxConcurrent: with MaxConcurrent exchanges in flight, one more fails
// at once with ErrLimitExceeded, reaches no server and is counted; 0 means
// no cap. Once the exchanges in flight end, their slots are free again.
func TestMaxConcurrent(t *testing.T) {
	tests := []struct {
		name        string
		max         int
		inFlight    int // exchanges held at the server
		wantRejects uint64
	}{
		{"no cap", 0, 3, 0},
		{"under the cap", 3, 2, 0},
		{"at the cap", 2, 2, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newServer(t)
			held := make(chan func(), 16)
			s.setUDP(func(s *testServer, from netip.AddrPort, q *dns.Msg) {
				held <- func() { s.sendUDP(from, answer("192.0.2.1")(q)) }
			})
			g, _ := newGroup(t, func(c *Config) { c.MaxConcurrent = tt.max; c.Timeout = 5 * time.Second }, s.addr)

			results := make(chan error, tt.inFlight+1)
			for i := range tt.inFlight {
				go func() {
					_, err := exchange(t, g, newReq(fmt.Sprintf("held%d.example.", i), dns.TypeA))
					results <- err
				}()
			}
			testkit.Eventually(t, 3*time.Second, "the exchanges to reach the server", func() bool {
				return s.seen() == int64(tt.inFlight)
			})

			extra := make(chan error, 1)
			go func() {
				_, err := exchange(t, g, newReq("extra.example.", dns.TypeA))
				extra <- err
			}()
			if tt.wantRejects > 0 {
				// Refused without a reply from anyone: no release needed.
				if err := <-extra; !errors.Is(err, ErrLimitExceeded) {
					t.Fatalf("exchange over the cap: %v, want ErrLimitExceeded", err)
				}
				if n := s.seen(); n != int64(tt.inFlight) {
					t.Errorf("server saw %d queries, want %d: the refused one was sent", n, tt.inFlight)
				}
			} else {
				testkit.Eventually(t, 3*time.Second, "the extra exchange to reach the server", func() bool {
					return s.seen() == int64(tt.inFlight)+1
				})
			}

			s.setBoth(answer("192.0.2.1"))
			for range s.seen() {
				(<-held)()
			}
			for range tt.inFlight {
				if err := <-results; err != nil {
					t.Errorf("held exchange: %v", err)
				}
			}
			if tt.wantRejects == 0 {
				if err := <-extra; err != nil {
					t.Errorf("extra exchange: %v", err)
				}
			}
			// The slots are free again.
			mustAnswer(t, g, newReq("after.example.", dns.TypeA), "192.0.2.1")
			if err := testutil.CollectAndCompare(g, strings.NewReader(fmt.Sprintf(`# HELP dnsstandby_upstream_max_concurrent_rejects_total %s
# TYPE dnsstandby_upstream_max_concurrent_rejects_total counter
dnsstandby_upstream_max_concurrent_rejects_total %d
`, helpRejects, tt.wantRejects)), "dnsstandby_upstream_max_concurrent_rejects_total"); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestObserveBuckets(t *testing.T) {
	tests := []struct {
		d      time.Duration
		bucket int
	}{
		{0, 0},
		{250 * time.Microsecond, 0}, // upper bounds are inclusive
		{251 * time.Microsecond, 1},
		{3 * time.Millisecond, 4}, // 0.25, 0.5, 1, 2, 4 ms
		{8192 * time.Millisecond, numBuckets - 1},
		{10 * time.Second, numBuckets}, // +Inf
	}
	for _, tt := range tests {
		var m serverMetrics
		m.observe(tt.d)
		if m.buckets[tt.bucket].Load() != 1 {
			t.Errorf("%s not in bucket %d", tt.d, tt.bucket)
		}
		if m.sumNanos.Load() != int64(tt.d) {
			t.Errorf("sum %d, want %d", m.sumNanos.Load(), tt.d)
		}
	}
}

// TestObserveAllocs: recording a reply's latency must not allocate.
func TestObserveAllocs(t *testing.T) {
	var m serverMetrics
	if n := testing.AllocsPerRun(100, func() {
		m.sent(protoUDP)
		m.observe(time.Millisecond)
		m.count(reasonMismatch)
	}); n != 0 {
		t.Errorf("%v allocations", n)
	}
}
