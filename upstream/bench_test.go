package upstream

import (
	"context"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// BenchmarkExchange is one forwarded miss against a loopback server, per
// transport; the server's own cost is included, so compare the lines of
// one run with each other (and with BenchmarkMiekgClient), not with a
// budget.
func BenchmarkExchange(b *testing.B) {
	for _, tt := range []struct {
		name     string
		forceTCP bool
	}{{"udp", false}, {"tcp", true}} {
		b.Run(tt.name, func(b *testing.B) {
			s := newServer(b)
			g, _ := newGroup(b, func(c *Config) { c.ForceTCP = tt.forceTCP; c.Timeout = time.Second }, s.addr)
			req := newReq("bench.example.", dns.TypeA)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := g.Exchange(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkMiekgClient is the same UDP exchange with miekg/dns's client,
// which also dials a fresh socket per query: the baseline.
func BenchmarkMiekgClient(b *testing.B) {
	s := newServer(b)
	c := &dns.Client{Timeout: time.Second}
	req := newReq("bench.example.", dns.TypeA)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := c.Exchange(req, s.addr.String()); err != nil {
			b.Fatal(err)
		}
	}
}
