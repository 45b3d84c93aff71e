package cache

import (
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/wire"
)

func TestServeRewritesPerClient(t *testing.T) {
	const name = "web.shop.svc.cluster.local."
	stored := reply(t, name, dns.TypeA, 0, []string{
		name + " 30 IN CNAME backend.shop.svc.cluster.local.",
		"backend.shop.svc.cluster.local. 30 IN A 10.1.2.3",
	}, nil)
	stored.AuthenticatedData = true
	stored.Authoritative = true

	tests := []struct {
		name  string
		query func() *dns.Msg
		check func(t *testing.T, q, a *dns.Msg)
	}{
		{
			name: "ID and 0x20 case come from the client",
			query: func() *dns.Msg {
				q := query(t, "WeB.sHoP.SvC.cLuStEr.LoCaL.", dns.TypeA, -1, false)
				q.Id = 0xbeef
				return q
			},
			check: func(t *testing.T, q, a *dns.Msg) {
				if a.Id != 0xbeef {
					t.Errorf("id %#x, want 0xbeef", a.Id)
				}
				if a.Question[0].Name != q.Question[0].Name {
					t.Errorf("question %q, want the client's %q", a.Question[0].Name, q.Question[0].Name)
				}
				if len(a.Answer) != 2 || a.Answer[1].(*dns.A).A.String() != "10.1.2.3" {
					t.Errorf("answer %v", a.Answer)
				}
			},
		},
		{
			name:  "RD and CD from the query, RA and AA from the answer",
			query: func() *dns.Msg { q := query(t, name, dns.TypeA, -1, false); q.RecursionDesired = false; return q },
			check: func(t *testing.T, q, a *dns.Msg) {
				if a.RecursionDesired || a.CheckingDisabled || !a.RecursionAvailable || !a.Authoritative || !a.Response || a.Truncated {
					t.Errorf("flags rd=%v cd=%v ra=%v aa=%v qr=%v tc=%v", a.RecursionDesired, a.CheckingDisabled, a.RecursionAvailable, a.Authoritative, a.Response, a.Truncated)
				}
			},
		},
		{
			name:  "no OPT in the answer when the client sent none, and no AD",
			query: func() *dns.Msg { return query(t, name, dns.TypeA, -1, false) },
			check: func(t *testing.T, q, a *dns.Msg) {
				if a.IsEdns0() != nil {
					t.Errorf("answer carries OPT %v", a.IsEdns0())
				}
				if a.AuthenticatedData {
					t.Errorf("AD set for a client that asked for neither AD nor DO")
				}
			},
		},
		{
			name:  "AD kept for a client that set AD",
			query: func() *dns.Msg { q := query(t, name, dns.TypeA, -1, false); q.AuthenticatedData = true; return q },
			check: func(t *testing.T, q, a *dns.Msg) {
				if !a.AuthenticatedData {
					t.Errorf("AD cleared")
				}
			},
		},
		{
			name:  "OPT for an EDNS client, without NSID when not asked",
			query: func() *dns.Msg { return query(t, name, dns.TypeA, 4096, false) },
			check: func(t *testing.T, q, a *dns.Msg) {
				opt := a.IsEdns0()
				if opt == nil || opt.UDPSize() != 1232 || opt.Do() || len(opt.Option) != 0 {
					t.Errorf("OPT %v, want udp 1232, no DO, no options", opt)
				}
			},
		},
		{
			name: "NSID when asked",
			query: func() *dns.Msg {
				q := query(t, name, dns.TypeA, 1232, false)
				q.IsEdns0().Option = append(q.IsEdns0().Option, &dns.EDNS0_NSID{Code: dns.EDNS0NSID})
				return q
			},
			check: func(t *testing.T, q, a *dns.Msg) {
				opt := a.IsEdns0()
				if opt == nil || len(opt.Option) != 1 {
					t.Fatalf("OPT %v, want one option", opt)
				}
				nsid, ok := opt.Option[0].(*dns.EDNS0_NSID)
				if !ok || nsid.Nsid != fmt.Sprintf("%x", "dnsstandby") {
					t.Errorf("option %v, want NSID dnsstandby", opt.Option[0])
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := newTestCache(t, func(c *Config) { c.NSID = "dnsstandby" })
			mustInsert(t, c, stored)
			q := tt.query()
			a, st := serve(t, c, q, 0, false)
			if st != Fresh {
				t.Fatalf("status %s, want fresh", st)
			}
			tt.check(t, q, a)
		})
	}
}

func TestKeySeparation(t *testing.T) {
	const name = "signed.example."
	withOPT := func(m *dns.Msg, do bool) *dns.Msg { m.SetEdns0(1232, do); return m }
	plain := reply(t, name, dns.TypeA, 0, []string{name + " 60 IN A 192.0.2.1"}, nil)
	do := withOPT(reply(t, name, dns.TypeA, 0, []string{name + " 60 IN A 192.0.2.2"}, nil), true)
	cd := reply(t, name, dns.TypeA, 0, []string{name + " 60 IN A 192.0.2.3"}, nil)
	cd.CheckingDisabled = true
	aaaa := reply(t, name, dns.TypeAAAA, 0, []string{name + " 60 IN AAAA 2001:db8::4"}, nil)
	txt := reply(t, name, dns.TypeTXT, 0, []string{name + ` 60 IN TXT "internet"`}, nil)
	chaos := reply(t, name, dns.TypeTXT, 0, []string{name + ` 60 CH TXT "chaos"`}, nil)
	chaos.Question[0].Qclass = dns.ClassCHAOS

	c, _ := newTestCache(t, nil)
	for _, m := range []*dns.Msg{plain, do, cd, aaaa, txt, chaos} {
		mustInsert(t, c, m)
	}
	if c.Len() != 6 {
		t.Fatalf("Len = %d, want 6 separate entries", c.Len())
	}

	tests := []struct {
		name  string
		query func() *dns.Msg
		want  string
	}{
		{"plain", func() *dns.Msg { return query(t, name, dns.TypeA, -1, false) }, "192.0.2.1"},
		{"EDNS without DO shares the plain entry", func() *dns.Msg { return query(t, name, dns.TypeA, 1232, false) }, "192.0.2.1"},
		{"upper case shares the plain entry", func() *dns.Msg { return query(t, "SIGNED.EXAMPLE.", dns.TypeA, -1, false) }, "192.0.2.1"},
		{"DO", func() *dns.Msg { return query(t, name, dns.TypeA, 1232, true) }, "192.0.2.2"},
		{"CD", func() *dns.Msg { q := query(t, name, dns.TypeA, -1, false); q.CheckingDisabled = true; return q }, "192.0.2.3"},
		{"AAAA", func() *dns.Msg { return query(t, name, dns.TypeAAAA, -1, false) }, "2001:db8::4"},
		{"TXT class IN", func() *dns.Msg { return query(t, name, dns.TypeTXT, -1, false) }, "internet"},
		{"TXT class CH", func() *dns.Msg {
			q := query(t, name, dns.TypeTXT, -1, false)
			q.Question[0].Qclass = dns.ClassCHAOS
			return q
		}, "chaos"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, st := serve(t, c, tt.query(), 0, false)
			if st != Fresh || len(a.Answer) != 1 {
				t.Fatalf("status %s answer %v", st, a)
			}
			got := ""
			switch r := a.Answer[0].(type) {
			case *dns.A:
				got = r.A.String()
			case *dns.AAAA:
				got = r.AAAA.String()
			case *dns.TXT:
				got = r.Txt[0]
			}
			if got != tt.want {
				t.Fatalf("answer %v, want %q", a.Answer[0], tt.want)
			}
		})
	}
	if _, st := serve(t, c, query(t, name, dns.TypeMX, -1, false), 0, false); st != Miss {
		t.Fatalf("MX: status %s, want miss", st)
	}
}

// truncationCases are stored answers larger than 512 bytes: many A
// records, one large TXT, and answers with authority and additional
// records, so that the cut falls in each section.
func truncationCases(t testing.TB) []*dns.Msg {
	var many []string
	for i := range 40 { // 40 × 16 B of A records: about 700 bytes
		many = append(many, fmt.Sprintf("big.example. 60 IN A 10.0.%d.%d", i/256, i%256))
	}
	txt := "txt.example. 60 IN TXT"
	for i := range 12 { // 12 strings of 200 bytes: one 2.4 kB record
		txt += fmt.Sprintf(" \"%s\"", strings.Repeat(string(rune('a'+i)), 200))
	}
	mx := reply(t, "mx.example.", dns.TypeMX, 0, nil, nil)
	for i := range 12 {
		host := fmt.Sprintf("mail%02d.mx.example.", i)
		mx.Answer = append(mx.Answer, rr(t, fmt.Sprintf("mx.example. 60 IN MX %d %s", i, host)))
		mx.Extra = append(mx.Extra, rr(t, fmt.Sprintf("%s 60 IN A 10.1.0.%d", host, i)),
			rr(t, fmt.Sprintf("%s 60 IN AAAA fd00::%d", host, i)))
	}
	for i := range 4 {
		mx.Ns = append(mx.Ns, rr(t, fmt.Sprintf("mx.example. 60 IN NS ns%d.mx.example.", i)))
	}
	// Small answer, large authority: the cut falls in the authority.
	ns := reply(t, "ns.example.", dns.TypeA, 0, []string{"ns.example. 60 IN A 10.2.0.1"}, nil)
	for i := range 30 {
		ns.Ns = append(ns.Ns, rr(t, fmt.Sprintf("ns.example. 60 IN NS a-rather-long-server-name-%02d.elsewhere.example.net.", i)))
	}
	return []*dns.Msg{
		reply(t, "big.example.", dns.TypeA, 0, many, nil),
		reply(t, "txt.example.", dns.TypeTXT, 0, []string{txt}, nil),
		mx, ns,
	}
}

// TestTruncation checks the cut of every stored answer for each client
// size against miekg/dns's Msg.Truncate, which is what CoreDNS
// (request.Scrub) applies to every reply: the same records, TC, and the
// OPT kept.
func TestTruncation(t *testing.T) {
	const nsid = "dnsstandby"
	type sizeCase struct {
		name  string
		edns  int // -1: none
		nsid  bool
		limit int // 0: the query's payload limit
	}
	sizes := []sizeCase{
		{"no EDNS: 512", -1, false, 0},
		{"EDNS below 512 counts as 512", 256, false, 0},
		{"EDNS 600", 600, false, 0},
		{"EDNS 1232", 1232, false, 0},
		{"EDNS 1232 with NSID", 1232, true, 0},
		{"EDNS 1400", 1400, false, 0},
		{"EDNS 4096", 4096, false, 0},
		{"TCP without EDNS", -1, false, 65535},
	}
	for _, stored := range truncationCases(t) {
		name := stored.Question[0].Name
		for _, sz := range sizes {
			t.Run(name+" "+sz.name, func(t *testing.T) {
				c, _ := newTestCache(t, func(c *Config) { c.NSID = nsid })
				mustInsert(t, c, stored)
				q := query(t, mixCase(name), stored.Question[0].Qtype, sz.edns, false)
				if sz.nsid {
					q.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_NSID{Code: dns.EDNS0NSID}}
				}
				a, st := serve(t, c, q, sz.limit, false)
				if st != Fresh {
					t.Fatalf("status %s", st)
				}

				// What CoreDNS sends: the stored answer, with the OPT we send,
				// through Truncate. The question keeps the stored case: the
				// records' names were compressed against it.
				want := stored.Copy()
				if sz.edns >= 0 {
					opt := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
					opt.SetUDPSize(DefaultConfig().UDPSize)
					if sz.nsid {
						opt.Option = []dns.EDNS0{&dns.EDNS0_NSID{Code: dns.EDNS0NSID, Nsid: hex.EncodeToString([]byte(nsid))}}
					}
					want.Extra = append(want.Extra, opt)
				}
				limit := sz.limit
				if limit == 0 {
					limit = max(sz.edns, 512)
				}
				want.Truncate(limit)

				if a.Truncated != want.Truncated {
					t.Errorf("TC=%v, CoreDNS's TC=%v", a.Truncated, want.Truncated)
				}
				for _, sec := range []struct {
					name      string
					got, want []dns.RR
				}{{"answer", a.Answer, want.Answer}, {"authority", a.Ns, want.Ns}, {"additional", a.Extra, want.Extra}} {
					if g, w := rrStrings(sec.got), rrStrings(sec.want); !slices.Equal(g, w) {
						t.Errorf("%s: %d records, CoreDNS's %d:\n got  %q\n want %q", sec.name, len(g), len(w), g, w)
					}
				}
				if (a.IsEdns0() != nil) != (sz.edns >= 0) {
					t.Errorf("OPT in answer: %v, client sent one: %v", a.IsEdns0() != nil, sz.edns >= 0)
				}
				if a.Question[0].Name != mixCase(name) || a.Id != q.Id || !a.Authoritative {
					t.Errorf("question %v id %#x AA %v", a.Question, a.Id, a.Authoritative)
				}
				for _, ttl := range ttls(a) {
					if ttl != 60 {
						t.Errorf("TTL %d of a kept record, want 60", ttl)
					}
				}
			})
		}
	}
}

// rrStrings is each record in presentation form, TTL zeroed and lower
// case (names compressed against the question take the client's case on
// the hit path).
func rrStrings(rrs []dns.RR) []string {
	out := make([]string, 0, len(rrs))
	for _, r := range rrs {
		r = dns.Copy(r)
		r.Header().Ttl = 0
		out = append(out, strings.ToLower(r.String()))
	}
	return out
}

// mixCase upper-cases every other letter of name, as 0x20 clients do.
func mixCase(name string) string {
	b := []byte(name)
	for i := range b {
		if i%2 == 0 && 'a' <= b[i] && b[i] <= 'z' {
			b[i] -= 'a' - 'A'
		}
	}
	return string(b)
}

// TestServeTruncatedAllocs: cutting an oversize answer walks the stored
// bytes; it allocates nothing, like a hit that fits.
func TestServeTruncatedAllocs(t *testing.T) {
	c, _ := newTestCache(t, nil)
	stored := truncationCases(t)[0]
	mustInsert(t, c, stored)
	var wq wire.Query
	raw := pack(t, query(t, stored.Question[0].Name, dns.TypeA, -1, false))
	if err := wire.ParseQuery(raw, &wq); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	allocs := testing.AllocsPerRun(100, func() {
		if n, _ := c.Serve(buf, &wq, 512, false); n == 0 {
			t.Fatal("miss")
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per truncated hit, want 0", allocs)
	}
}

func TestStaleWindow(t *testing.T) {
	const name = "stale.example."
	tests := []struct {
		name       string
		mod        func(*Config)
		after      time.Duration // past insert; the entry's TTL is 60 s
		allowStale bool
		want       Status
		wantTTL    uint32
	}{
		{"fresh", nil, 53 * time.Second, true, Fresh, 7},
		{"fresh, last tenth: expiring", nil, 54 * time.Second, true, Expiring, 6},
		{"fresh, last second: expiring", nil, 59 * time.Second, true, Expiring, 1},
		{"just expired, stale not allowed", nil, 60 * time.Second, false, Stale, 0},
		{"just expired, stale allowed", nil, 60 * time.Second, true, Stale, 30},
		{"end of default window", nil, 60*time.Second + 72000*time.Second - time.Nanosecond, true, Stale, 30},
		{"past default window", nil, 60*time.Second + 72000*time.Second, true, Miss, 0},
		{"custom stale TTL", func(c *Config) { c.StaleTTL = 7 * time.Second }, time.Hour, true, Stale, 7},
		{"stale disabled", func(c *Config) { c.MaxStale = 0 }, 61 * time.Second, true, Miss, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, clk := newTestCache(t, tt.mod)
			mustInsert(t, c, reply(t, name, dns.TypeA, 0, []string{name + " 60 IN A 192.0.2.1"}, nil))
			clk.Advance(tt.after)
			var wq wire.Query
			if err := wire.ParseQuery(pack(t, query(t, name, dns.TypeA, -1, false)), &wq); err != nil {
				t.Fatal(err)
			}
			if st := c.Status(&wq); st.IsFresh() != tt.want.IsFresh() || (!st.IsFresh() && st != tt.want) {
				t.Fatalf("Status %s, want %s", st, tt.want)
			}
			a, st := serve(t, c, query(t, name, dns.TypeA, -1, false), 0, tt.allowStale)
			if st != tt.want {
				t.Fatalf("status %s, want %s", st, tt.want)
			}
			if (a != nil) != (tt.want != Miss && (tt.want.IsFresh() || tt.allowStale)) {
				t.Fatalf("answer %v for status %s", a, st)
			}
			if a != nil && a.Answer[0].Header().Ttl != tt.wantTTL {
				t.Fatalf("TTL %d, want %d", a.Answer[0].Header().Ttl, tt.wantTTL)
			}
			if tt.want == Miss && c.Len() != 0 {
				t.Fatalf("entry past the stale window still held")
			}
		})
	}
}

func TestAgingNeverExceedsOriginal(t *testing.T) {
	c, clk := newTestCache(t, nil)
	const name = "age.example."
	mustInsert(t, c, reply(t, name, dns.TypeA, 0, []string{name + " 100 IN A 192.0.2.1"}, nil))
	q := query(t, name, dns.TypeA, -1, false)
	for _, step := range []time.Duration{0, time.Millisecond, 999 * time.Millisecond, time.Second, 1500 * time.Millisecond, 50 * time.Second} {
		clk.Advance(step)
		age := clk.Now().Sub(time.Unix(1_800_000_000, 0))
		a, _ := serve(t, c, q, 0, false)
		got := a.Answer[0].Header().Ttl
		if float64(got) > 100-age.Seconds() {
			t.Fatalf("at age %s: TTL %d exceeds 100 - age", age, got)
		}
		if float64(got) < 100-age.Seconds()-1 {
			t.Fatalf("at age %s: TTL %d aged more than a second too fast", age, got)
		}
	}
}

func TestEviction(t *testing.T) {
	names := []string{"a.example.", "b.example.", "c.example.", "d.example."}
	ins := func(t *testing.T, c *Cache, name string) {
		mustInsert(t, c, reply(t, name, dns.TypeA, 0, []string{name + " 60 IN A 192.0.2.1"}, nil))
	}
	present := func(t *testing.T, c *Cache) []string {
		var out []string
		for _, n := range names {
			if _, st := serve(t, c, query(t, n, dns.TypeA, -1, false), 0, false); st == Fresh {
				out = append(out, n)
			}
		}
		return out
	}
	oneEntry := func() int64 {
		c, _ := newTestCache(t, func(c *Config) { c.Shards = 1 })
		ins(t, c, names[0])
		return c.Stats().Bytes
	}()

	tests := []struct {
		name string
		mod  func(*Config)
	}{
		{"by entries", func(c *Config) { c.MaxEntries = 3; c.Shards = 1 }},
		{"by bytes", func(c *Config) { c.MaxBytes = 3*oneEntry + oneEntry/2; c.Shards = 1 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, clk := newTestCache(t, tt.mod)
			ins(t, c, names[0])
			ins(t, c, names[1])
			ins(t, c, names[2])
			// Touch a (LRU order is kept to the second): b is now the
			// least recently used.
			clk.Advance(time.Duration(promoteEvery))
			if _, st := serve(t, c, query(t, names[0], dns.TypeA, -1, false), 0, false); st != Fresh {
				t.Fatal("a missing before eviction")
			}
			ins(t, c, names[3])
			got := present(t, c)
			want := []string{"a.example.", "c.example.", "d.example."}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("present after eviction: %v, want %v", got, want)
			}
			st := c.Stats()
			if st.Evictions != 1 || st.Entries != 3 {
				t.Fatalf("evictions %d entries %d, want 1 and 3", st.Evictions, st.Entries)
			}
			if st.Bytes > c.cfg.MaxBytes {
				t.Fatalf("bytes %d over limit %d", st.Bytes, c.cfg.MaxBytes)
			}
		})
	}
}

func TestStats(t *testing.T) {
	c, clk := newTestCache(t, nil)
	const name = "count.example."
	mustInsert(t, c, reply(t, name, dns.TypeA, 0, []string{name + " 60 IN A 192.0.2.1"}, nil))
	q := query(t, name, dns.TypeA, -1, false)
	serve(t, c, q, 0, false)                                                // hit
	serve(t, c, q, 0, false)                                                // hit
	serve(t, c, query(t, "other.example.", dns.TypeA, -1, false), 0, false) // miss
	buf, wq, none := make([]byte, 512), wireQuery(t, q), wireQuery(t, query(t, "none.example.", dns.TypeA, -1, false))
	if n := c.WriteFresh(buf, wq, len(buf)); n == 0 { // a second look: not counted
		t.Fatal("WriteFresh wrote nothing for a fresh entry")
	}
	clk.Advance(time.Minute)
	serve(t, c, q, 0, false)                                                   // stale, held back: a miss
	if n, st := c.ServeAgain(buf, wq, len(buf), true); n == 0 || st != Stale { // stale hit, not another miss
		t.Fatalf("ServeAgain: %d bytes, %s; want a stale answer", n, st)
	}
	if n := c.WriteFresh(buf, wq, len(buf)); n != 0 {
		t.Fatal("WriteFresh wrote a stale entry")
	}
	c.ServeAgain(buf, none, len(buf), true) // a second look's miss: not counted
	serve(t, c, q, 0, true)                 // stale hit
	_ = c.Insert([]byte{0})                 // reject

	st := c.Stats()
	got := [...]uint64{st.Hits, st.StaleHits, st.Misses, st.Inserts, st.Rejects["malformed"], uint64(st.Entries)}
	want := [...]uint64{2, 2, 2, 1, 1, 1}
	if got != want {
		t.Fatalf("hits, stale hits, misses, inserts, malformed, entries = %v, want %v", got, want)
	}
}

func TestServeNotCacheable(t *testing.T) {
	c, _ := newTestCache(t, nil)
	const name = "op.example."
	mustInsert(t, c, reply(t, name, dns.TypeA, 0, []string{name + " 60 IN A 192.0.2.1"}, nil))
	q := query(t, name, dns.TypeA, -1, false)
	q.Opcode = dns.OpcodeStatus
	var wq wire.Query
	if err := wire.ParseQuery(pack(t, q), &wq); err != nil {
		t.Fatal(err)
	}
	if n, st := c.Serve(make([]byte, 512), &wq, 512, true); n != 0 || st != Miss {
		t.Fatalf("opcode STATUS served from cache: n=%d status %s", n, st)
	}
	q.Opcode = dns.OpcodeQuery
	if err := wire.ParseQuery(pack(t, q), &wq); err != nil {
		t.Fatal(err)
	}
	if n, st := c.Serve(make([]byte, 20), &wq, 512, true); n != 0 || st != Miss {
		t.Fatalf("buffer too small for even a truncated answer: n=%d status %s", n, st)
	}
}

func TestServeHitAllocs(t *testing.T) {
	c, _ := newTestCache(t, func(c *Config) { c.NSID = "dnsstandby" })
	const name = "alloc.default.svc.cluster.local."
	mustInsert(t, c, reply(t, name, dns.TypeA, 0, []string{name + " 30 IN A 10.0.0.1"}, nil))
	for _, edns := range []int{-1, 1232} {
		raw := pack(t, query(t, "AlLoC.default.svc.cluster.local.", dns.TypeA, edns, false))
		buf := make([]byte, 65535)
		var q wire.Query
		allocs := testing.AllocsPerRun(1000, func() {
			if err := wire.ParseQuery(raw, &q); err != nil {
				t.Fatal(err)
			}
			if n, _ := c.Serve(buf, &q, q.PayloadLimit(), false); n == 0 {
				t.Fatal("miss")
			}
		})
		if allocs != 0 {
			t.Fatalf("edns %d: %v allocs per hit, want 0", edns, allocs)
		}
	}
}
