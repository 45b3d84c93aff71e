package cache

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/miekg/dns"
)

func TestInsertRejects(t *testing.T) {
	const name = "svc.default.svc.cluster.local."
	ok := func() *dns.Msg { return reply(t, name, dns.TypeA, 0, []string{name + " 30 IN A 10.0.0.1"}, nil) }
	soa := "cluster.local. 30 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 30"

	tests := []struct {
		name   string
		raw    func() []byte
		reason Reason
	}{
		{"garbage", func() []byte { return []byte{1, 2, 3} }, ReasonMalformed},
		{"truncated message", func() []byte { b := pack(t, ok()); return b[:len(b)-3] }, ReasonMalformed},
		{"query not response", func() []byte { m := ok(); m.Response = false; return pack(t, m) }, ReasonNotResponse},
		{"TC set", func() []byte { m := ok(); m.Truncated = true; return pack(t, m) }, ReasonTruncated},
		{"opcode notify", func() []byte { m := ok(); m.Opcode = dns.OpcodeNotify; return pack(t, m) }, ReasonOpcode},
		{"no question", func() []byte { m := ok(); m.Question = nil; return pack(t, m) }, ReasonQuestionCount},
		{"two questions", func() []byte {
			m := ok()
			m.Question = append(m.Question, dns.Question{Name: "x.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
			return pack(t, m)
		}, ReasonQuestionCount},
		{"servfail", func() []byte { return pack(t, reply(t, name, dns.TypeA, dns.RcodeServerFailure, nil, nil)) }, ReasonRcode},
		{"refused", func() []byte { return pack(t, reply(t, name, dns.TypeA, dns.RcodeRefused, nil, nil)) }, ReasonRcode},
		{"formerr", func() []byte { return pack(t, reply(t, name, dns.TypeA, dns.RcodeFormatError, nil, nil)) }, ReasonRcode},
		{"notimp", func() []byte { return pack(t, reply(t, name, dns.TypeA, dns.RcodeNotImplemented, nil, nil)) }, ReasonRcode},
		{"extended rcode BADVERS", func() []byte {
			m := reply(t, name, dns.TypeA, dns.RcodeBadVers, nil, []string{soa})
			m.SetEdns0(1232, false)
			return pack(t, m)
		}, ReasonRcode},
		{"NXDOMAIN without SOA", func() []byte { return pack(t, reply(t, name, dns.TypeA, dns.RcodeNameError, nil, nil)) }, ReasonNoSOA},
		{"NODATA without SOA", func() []byte { return pack(t, reply(t, name, dns.TypeA, 0, nil, nil)) }, ReasonNoSOA},
		{"referral without SOA", func() []byte {
			return pack(t, reply(t, name, dns.TypeA, 0, nil, []string{"cluster.local. 30 IN NS ns.cluster.local."}))
		}, ReasonNoSOA},
		{"two OPT records", func() []byte {
			m := ok()
			m.SetEdns0(1232, false)
			m.Extra = append(m.Extra, m.Extra[0])
			return pack(t, m)
		}, ReasonMalformed},
		{"over 64 KiB", func() []byte { return make([]byte, 70000) }, ReasonTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := newTestCache(t, nil)
			err := c.Insert(tt.raw())
			var rej *RejectError
			if !errors.As(err, &rej) || !errors.Is(err, ErrRejected) {
				t.Fatalf("Insert error = %v, want a RejectError", err)
			}
			if rej.Reason != tt.reason {
				t.Fatalf("reason = %s, want %s", rej.Reason, tt.reason)
			}
			if c.Len() != 0 {
				t.Fatalf("rejected response left %d entries", c.Len())
			}
			if got := c.Stats().Rejects[tt.reason.String()]; got != 1 {
				t.Fatalf("rejects[%s] = %d, want 1", tt.reason, got)
			}
		})
	}
}

func TestTTLRules(t *testing.T) {
	const name = "example.com."
	soa := func(ttl, minttl int) string {
		return "example.com. " + strconv.Itoa(ttl) + " IN SOA ns.example.com. h.example.com. 1 7200 1800 86400 " + strconv.Itoa(minttl)
	}
	tests := []struct {
		name      string
		mod       func(*Config)
		msg       func() *dns.Msg
		wantTTL   uint32        // served TTL right after insert
		freshFor  time.Duration // the entry is fresh until exactly this age
		afterTTLs []uint32      // served TTLs one second before freshFor
	}{
		{
			name: "positive: minimum over records",
			msg: func() *dns.Msg {
				return reply(t, name, dns.TypeA, 0, []string{"example.com. 300 IN CNAME b.example.com.", "b.example.com. 60 IN A 1.2.3.4"}, nil)
			},
			wantTTL:  60,
			freshFor: 60 * time.Second,
		},
		{
			name: "positive: authority and additional count too",
			msg: func() *dns.Msg {
				m := reply(t, name, dns.TypeA, 0, []string{"example.com. 300 IN A 1.2.3.4"}, []string{"example.com. 40 IN NS ns.example.com."})
				m.Extra = []dns.RR{rr(t, "ns.example.com. 100 IN A 1.1.1.1")}
				return m
			},
			wantTTL:  40,
			freshFor: 40 * time.Second,
		},
		{
			name:     "positive: capped at 3600",
			msg:      func() *dns.Msg { return reply(t, name, dns.TypeA, 0, []string{"example.com. 86400 IN A 1.2.3.4"}, nil) },
			wantTTL:  3600,
			freshFor: 3600 * time.Second,
		},
		{
			name:     "positive: custom cap",
			mod:      func(c *Config) { c.MaxTTL = 100 * time.Second },
			msg:      func() *dns.Msg { return reply(t, name, dns.TypeA, 0, []string{"example.com. 300 IN A 1.2.3.4"}, nil) },
			wantTTL:  100,
			freshFor: 100 * time.Second,
		},
		{
			name:      "positive: floor extends freshness, not the TTL",
			msg:       func() *dns.Msg { return reply(t, name, dns.TypeA, 0, []string{"example.com. 2 IN A 1.2.3.4"}, nil) },
			wantTTL:   2,
			freshFor:  5 * time.Second,
			afterTTLs: []uint32{0},
		},
		{
			name:     "positive: zero TTL kept for the floor",
			msg:      func() *dns.Msg { return reply(t, name, dns.TypeA, 0, []string{"example.com. 0 IN A 1.2.3.4"}, nil) },
			wantTTL:  0,
			freshFor: 5 * time.Second,
		},
		{
			name: "NXDOMAIN: SOA MINIMUM below SOA TTL",
			msg: func() *dns.Msg {
				return reply(t, "nx."+name, dns.TypeA, dns.RcodeNameError, nil, []string{soa(900, 60)})
			},
			wantTTL:  60,
			freshFor: 60 * time.Second,
		},
		{
			name:     "NODATA: SOA TTL below SOA MINIMUM",
			msg:      func() *dns.Msg { return reply(t, name, dns.TypeAAAA, 0, nil, []string{soa(30, 300)}) },
			wantTTL:  30,
			freshFor: 30 * time.Second,
		},
		{
			name: "NXDOMAIN after CNAME: the CNAME's TTL bounds it",
			msg: func() *dns.Msg {
				return reply(t, name, dns.TypeA, dns.RcodeNameError, []string{"example.com. 20 IN CNAME gone.example.com."}, []string{soa(900, 600)})
			},
			wantTTL:  20,
			freshFor: 20 * time.Second,
		},
		{
			name: "negative: custom cap",
			mod:  func(c *Config) { c.MaxNegTTL = 10 * time.Second },
			msg: func() *dns.Msg {
				return reply(t, "nx."+name, dns.TypeA, dns.RcodeNameError, nil, []string{soa(900, 600)})
			},
			wantTTL:  10,
			freshFor: 10 * time.Second,
		},
		{
			name:     "negative: floor",
			msg:      func() *dns.Msg { return reply(t, "nx."+name, dns.TypeA, dns.RcodeNameError, nil, []string{soa(1, 1)}) },
			wantTTL:  1,
			freshFor: 5 * time.Second,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, clk := newTestCache(t, tt.mod)
			m := tt.msg()
			mustInsert(t, c, m)
			q := query(t, m.Question[0].Name, m.Question[0].Qtype, -1, false)

			a, st := serve(t, c, q, 0, false)
			if st != Fresh || a == nil {
				t.Fatalf("right after insert: status %s", st)
			}
			if a.Rcode != m.Rcode {
				t.Fatalf("rcode %d, want %d", a.Rcode, m.Rcode)
			}
			for _, ttl := range ttls(a) {
				if ttl != tt.wantTTL {
					t.Fatalf("TTLs %v, want all %d", ttls(a), tt.wantTTL)
				}
			}

			clk.Advance(tt.freshFor - time.Second)
			a, st = serve(t, c, q, 0, false)
			if st != Expiring { // fresh, and in its last second: refresh it
				t.Fatalf("1s before expiry: status %s, want expiring", st)
			}
			want := uint32(0)
			if tt.wantTTL > uint32((tt.freshFor-time.Second)/time.Second) {
				want = tt.wantTTL - uint32((tt.freshFor-time.Second)/time.Second)
			}
			for _, ttl := range ttls(a) {
				if ttl != want {
					t.Fatalf("1s before expiry: TTLs %v, want all %d", ttls(a), want)
				}
			}
			if tt.afterTTLs != nil && !slices.Equal(ttls(a), tt.afterTTLs) {
				t.Fatalf("TTLs %v, want %v", ttls(a), tt.afterTTLs)
			}

			clk.Advance(time.Second)
			if _, st := serve(t, c, q, 0, false); st != Stale {
				t.Fatalf("at expiry: status %s, want stale", st)
			}
		})
	}
}

func TestServfailTTL(t *testing.T) {
	const name = "svc.cluster.local."
	fail := reply(t, name, dns.TypeA, dns.RcodeServerFailure, nil, nil)

	t.Run("cached for servfail ttl, never stale", func(t *testing.T) {
		c, clk := newTestCache(t, func(c *Config) { c.ServfailTTL = 10 * time.Second })
		mustInsert(t, c, fail)
		q := query(t, name, dns.TypeA, -1, false)
		a, st := serve(t, c, q, 0, true)
		if st != Fresh || a.Rcode != dns.RcodeServerFailure {
			t.Fatalf("status %s answer %v, want fresh SERVFAIL", st, a)
		}
		clk.Advance(10 * time.Second)
		if _, st := serve(t, c, q, 0, true); st != Miss {
			t.Fatalf("after servfail ttl: status %s, want miss", st)
		}
	})
	t.Run("does not replace a servable answer", func(t *testing.T) {
		c, clk := newTestCache(t, func(c *Config) { c.ServfailTTL = 10 * time.Second })
		mustInsert(t, c, reply(t, name, dns.TypeA, 0, []string{name + " 30 IN A 10.0.0.1"}, nil))
		clk.Advance(time.Hour) // stale now
		err := c.Insert(pack(t, fail))
		var rej *RejectError
		if !errors.As(err, &rej) || rej.Reason != ReasonKeptAnswer {
			t.Fatalf("Insert SERVFAIL over stale answer: %v, want kept_answer", err)
		}
		a, st := serve(t, c, query(t, name, dns.TypeA, -1, false), 0, true)
		if st != Stale || len(a.Answer) != 1 {
			t.Fatalf("status %s answer %v, want the stale A record", st, a)
		}
	})
}

func TestInsertMirror(t *testing.T) {
	c, clk := newTestCache(t, nil)
	const name = "mirror.example."
	resp := func(ip string) []byte {
		m := reply(t, name, dns.TypeA, 0, []string{name + " 60 IN A " + ip}, nil)
		m.SetEdns0(1232, false)
		return pack(t, m)
	}
	if err := c.InsertMirror(resp("192.0.2.1")); err != nil {
		t.Fatalf("first mirror insert: %v", err)
	}
	// A repeat while fresh is skipped, cheaply.
	err := c.InsertMirror(resp("192.0.2.1"))
	var rej *RejectError
	if !errors.As(err, &rej) || rej.Reason != ReasonHaveFresh {
		t.Fatalf("repeat: %v, want have_fresh", err)
	}
	// A different answer while fresh replaces it: the cache follows what
	// LocalDNS sends, and one that was not LocalDNS's does not stay.
	if err := c.InsertMirror(resp("192.0.2.2")); err != nil {
		t.Fatalf("changed answer: %v", err)
	}
	if a, _ := serve(t, c, query(t, name, dns.TypeA, -1, false), 0, false); a.Answer[0].(*dns.A).A.String() != "192.0.2.2" {
		t.Fatalf("answer %v after a changed reply", a.Answer)
	}
	// In the last tenth of its life it is replaced.
	clk.Advance(55 * time.Second)
	if err := c.InsertMirror(resp("192.0.2.3")); err != nil {
		t.Fatalf("expiring: %v", err)
	}
	a, _ := serve(t, c, query(t, name, dns.TypeA, -1, false), 0, false)
	if a.Answer[0].(*dns.A).A.String() != "192.0.2.3" {
		t.Fatalf("answer %v after replacement", a.Answer)
	}
	// CoreDNS sets DO in every reply; without DNSSEC records the reply is
	// what a DO=0 client got, so it is that key, fresh already.
	m := reply(t, name, dns.TypeA, 0, []string{name + " 60 IN A 192.0.2.3"}, nil)
	m.SetEdns0(1232, true)
	if err := c.InsertMirror(pack(t, m)); !errors.As(err, &rej) || rej.Reason != ReasonHaveFresh {
		t.Fatalf("DO reply without DNSSEC records: %v, want have_fresh", err)
	}
	// A miss for a DO=1 reply without RRSIG is served to a DO=0 query.
	const other = "other.example."
	m = reply(t, other, dns.TypeA, 0, []string{other + " 60 IN A 192.0.2.5"}, nil)
	m.SetEdns0(1232, true)
	if err := c.InsertMirror(pack(t, m)); err != nil {
		t.Fatalf("DO reply, new name: %v", err)
	}
	if _, st := serve(t, c, query(t, other, dns.TypeA, -1, false), 0, false); st != Fresh {
		t.Fatalf("DO=0 query after a DO=1 reply without RRSIG: %s, want fresh", st)
	}
	// A reply carrying an RRSIG answered a DO query: DO=1 key only.
	m = reply(t, name, dns.TypeA, 0, []string{
		name + " 60 IN A 192.0.2.6",
		name + " 60 IN RRSIG A 13 2 60 20261231000000 20261201000000 12345 example. AAAA",
	}, nil)
	m.SetEdns0(1232, true)
	if err := c.InsertMirror(pack(t, m)); err != nil {
		t.Fatalf("signed reply: %v", err)
	}
	a, _ = serve(t, c, query(t, name, dns.TypeA, -1, false), 0, false)
	if a.Answer[0].(*dns.A).A.String() != "192.0.2.3" {
		t.Fatalf("DO=0 answer %v: the signed reply replaced it", a.Answer)
	}
	if _, st := serve(t, c, query(t, name, dns.TypeA, 1232, true), 0, false); st != Fresh {
		t.Fatalf("DO=1 query after a signed reply: %s, want fresh", st)
	}
	// Garbage still goes through full validation and is rejected there.
	if err := c.InsertMirror([]byte{1, 2, 3}); !errors.As(err, &rej) || rej.Reason != ReasonMalformed {
		t.Fatalf("garbage: %v", err)
	}
}

// BenchmarkInsertMirrorRepeat is the mirror feed's common case: a reply
// whose answer is held fresh already, compressed as CoreDNS sends it (the
// owner a pointer to the question) or not.
func BenchmarkInsertMirrorRepeat(b *testing.B) {
	for _, compress := range []bool{true, false} {
		b.Run(fmt.Sprintf("compress=%v", compress), func(b *testing.B) {
			c, _ := newTestCache(b, nil)
			const name = "svc-1.default.svc.cluster.local."
			m := reply(b, name, dns.TypeA, 0, []string{name + " 30 IN A 10.0.0.1"}, nil)
			m.SetEdns0(1232, false)
			m.Compress = compress
			raw := pack(b, m)
			if err := c.InsertMirror(raw); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				_ = c.InsertMirror(raw)
			}
		})
	}
}

func BenchmarkInsert(b *testing.B) {
	c, _ := newTestCache(b, nil)
	const name = "svc-1.default.svc.cluster.local."
	m := reply(b, name, dns.TypeA, 0, []string{name + " 30 IN A 10.0.0.1"}, nil)
	m.SetEdns0(1232, false)
	raw := pack(b, m)
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Insert(raw); err != nil {
			b.Fatal(err)
		}
	}
}
