package cache

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/wire"
)

const mirrorName = "svc.example."

// mirrorBase is a reply LocalDNS could send: two addresses and an NS in
// the authority section, no EDNS, names compressed as CoreDNS does.
func mirrorBase(t testing.TB) *dns.Msg {
	m := reply(t, mirrorName, dns.TypeA, 0, []string{
		mirrorName + " 30 IN A 192.0.2.1",
		mirrorName + " 30 IN A 192.0.2.2",
	}, []string{"example. 30 IN NS ns.example."})
	m.Compress = true
	return m
}

// TestMirrorSum: what InsertMirror counts as the same answer (skipped as
// have_fresh) and what as a changed one (replacing the entry at once).
func TestMirrorSum(t *testing.T) {
	tests := []struct {
		name string
		mod  func(m *dns.Msg)
		same bool
	}{
		{"another ID", func(m *dns.Msg) { m.Id++ }, true},
		{"TTLs counted down", func(m *dns.Msg) {
			for _, r := range append(m.Answer, m.Ns...) {
				r.Header().Ttl = 7
			}
		}, true},
		{"other flags", func(m *dns.Msg) { m.RecursionDesired, m.Authoritative, m.AuthenticatedData = true, true, true }, true},
		{"EDNS with NSID, DO set without DNSSEC records", func(m *dns.Msg) {
			m.SetEdns0(1232, true)
			m.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_NSID{Code: dns.EDNS0NSID, Nsid: "6c6f63616c646e73"}}
		}, true},
		{"records shuffled (loadbalance)", func(m *dns.Msg) { m.Answer[0], m.Answer[1] = m.Answer[1], m.Answer[0] }, true},
		{"owner names in another case", func(m *dns.Msg) { m.Answer[0].Header().Name = "SVC.EXAMPLE." }, true},

		{"an address changed", func(m *dns.Msg) {
			m.Answer[1].(*dns.A).A = m.Answer[1].(*dns.A).A.To16()
			m.Answer[1].(*dns.A).A[15] = 66
		}, false},
		{"a record more", func(m *dns.Msg) { m.Answer = append(m.Answer, rr(t, mirrorName+" 30 IN A 192.0.2.3")) }, false},
		{"a record less", func(m *dns.Msg) { m.Answer = m.Answer[:1] }, false},
		{"a record moved to another section", func(m *dns.Msg) { m.Extra = m.Ns; m.Ns = nil }, false},
		// miekg/dns (CoreDNS) compresses case-sensitively: the NS's name
		// in RDATA no longer points at the question's suffix. Owner names
		// count decompressed and lower-cased (TestMirrorSumQuestionCase),
		// RDATA as sent: a change, which costs one insert more.
		{"question in another case (0x20), a name in RDATA", func(m *dns.Msg) { m.Question[0].Name = "SVC.Example." }, false},
		{"an owner name changed", func(m *dns.Msg) { m.Answer[0].Header().Name = "svd.example." }, false},
		{"another rcode", func(m *dns.Msg) {
			m.Rcode = dns.RcodeNameError
			m.Answer = nil
			m.Ns = []dns.RR{rr(t, "example. 30 IN SOA ns.example. h.example. 1 2 3 4 30")}
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := newTestCache(t, nil)
			base := pack(t, mirrorBase(t))
			m := mirrorBase(t)
			tt.mod(m)
			other := pack(t, m)
			var qb, qo wire.Query
			if wire.ParseQuery(base, &qb) != nil || wire.ParseQuery(other, &qo) != nil {
				t.Fatal("ParseQuery")
			}
			_, sb := c.mirrorFacts(base, qb.QEnd)
			_, so := c.mirrorFacts(other, qo.QEnd)
			if (sb == so) != tt.same || sb == 0 || so == 0 {
				t.Errorf("sums %08x and %08x; same answer %v", sb, so, tt.same)
			}
			if err := c.InsertMirror(base); err != nil {
				t.Fatal(err)
			}
			err := c.InsertMirror(other)
			var rej *RejectError
			if skipped := errors.As(err, &rej) && rej.Reason == ReasonHaveFresh; skipped != tt.same {
				t.Errorf("InsertMirror of the second reply: %v; want skipped %v", err, tt.same)
			}
		})
	}
}

// TestMirrorSumQuestionCase: with no name in RDATA, a reply to a query in
// another letter case (0x20) is the same answer, though its owner names
// are no longer compressed.
func TestMirrorSumQuestionCase(t *testing.T) {
	c, _ := newTestCache(t, nil)
	b, m := mirrorBase(t), mirrorBase(t)
	b.Ns, m.Ns = nil, nil
	m.Question[0].Name = "SVC.Example."
	base, other := pack(t, b), pack(t, m)
	if len(other) == len(base) {
		t.Fatal("owner names still compressed: the test shows nothing")
	}
	if err := c.InsertMirror(base); err != nil {
		t.Fatal(err)
	}
	if err := c.InsertMirror(other); err != errHaveFresh {
		t.Errorf("reply to a 0x20 query: %v, want have_fresh", err)
	}
}

// TestMirrorMaxTTL: a mirrored entry is never fresh for longer than
// MirrorMaxTTL, nor served with a larger TTL; an upstream answer is not
// capped by it.
func TestMirrorMaxTTL(t *testing.T) {
	const name = "ttl.example."
	positive := func(ttl int) *dns.Msg {
		return reply(t, name, dns.TypeA, 0, []string{fmt.Sprintf("%s %d IN A 192.0.2.1", name, ttl)}, nil)
	}
	negative := reply(t, name, dns.TypeA, dns.RcodeNameError, nil,
		[]string{"example. 3600 IN SOA ns.example. h.example. 1 2 3 4 3600"})
	tests := []struct {
		name     string
		mod      func(*Config)
		m        *dns.Msg
		mirror   bool
		wantTTL  uint32        // served right after the insert
		freshFor time.Duration // fresh until, stale from
	}{
		{"mirrored, long TTL", nil, positive(86400), true, 300, 300 * time.Second},
		{"mirrored, TTL under the cap", nil, positive(60), true, 60, 60 * time.Second},
		{"mirrored negative answer", nil, negative, true, 300, 300 * time.Second},
		{"mirrored, floor above the cap", func(c *Config) { c.MinTTL = 600 * time.Second; c.MaxTTL = 3600 * time.Second }, positive(5), true, 5, 300 * time.Second},
		{"mirrored, smaller cap", func(c *Config) { c.MirrorMaxTTL = 10 * time.Second }, positive(60), true, 10, 10 * time.Second},
		{"upstream answer, long TTL", nil, positive(86400), false, 3600, 3600 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, clk := newTestCache(t, tt.mod)
			var err error
			if tt.mirror {
				err = c.InsertMirror(pack(t, tt.m))
			} else {
				err = c.InsertMsg(tt.m)
			}
			if err != nil {
				t.Fatal(err)
			}
			q := query(t, name, dns.TypeA, -1, false)
			a, _ := serve(t, c, q, 0, false)
			if a == nil {
				t.Fatal("miss right after the insert")
			}
			if got := ttls(a)[0]; got != tt.wantTTL {
				t.Errorf("served TTL %d, want %d", got, tt.wantTTL)
			}
			clk.Advance(tt.freshFor - time.Millisecond)
			if st := c.Status(wireQuery(t, q)); !st.IsFresh() {
				t.Errorf("%s after the insert: %s, want fresh", tt.freshFor-time.Millisecond, st)
			}
			clk.Advance(time.Millisecond)
			if st := c.Status(wireQuery(t, q)); st != Stale {
				t.Errorf("%s after the insert: %s, want stale", tt.freshFor, st)
			}
		})
	}
}

// mirrorA is a mirrored reply for name with one address, or with n
// addresses (a large entry).
func mirrorA(t testing.TB, name string, n int) []byte {
	var answer []string
	for i := range n {
		answer = append(answer, fmt.Sprintf("%s 30 IN A 192.0.2.%d", name, i+1))
	}
	return pack(t, reply(t, name, dns.TypeA, 0, answer, nil))
}

// fresh lists which of names the cache answers fresh.
func freshNames(t testing.TB, c *Cache, names []string) (held []string) {
	for _, name := range names {
		if c.Status(wireQuery(t, query(t, name, dns.TypeA, -1, false))).IsFresh() {
			held = append(held, name)
		}
	}
	return held
}

func names(prefix string, from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("%s-%d.example.", prefix, i))
	}
	return out
}

// TestProbation: mirrored names seen once stay within their share of the
// cache, and a flood of them does not evict what clients use.
func TestProbation(t *testing.T) {
	oneShard := func(c *Config) { c.Shards, c.MaxEntries, c.ProbationPercent = 1, 20, 25 } // 5 on probation
	type use func(t *testing.T, c *Cache, name string)
	mirroredTwice := func(t *testing.T, c *Cache, name string) {
		for range 2 {
			if err := c.InsertMirror(mirrorA(t, name, 1)); err != nil && !errors.Is(err, errHaveFresh) {
				t.Fatal(err)
			}
		}
	}
	served := func(t *testing.T, c *Cache, name string) {
		if err := c.InsertMirror(mirrorA(t, name, 1)); err != nil {
			t.Fatal(err)
		}
		if a, _ := serve(t, c, query(t, name, dns.TypeA, -1, false), 0, false); a == nil {
			t.Fatalf("%s not served", name)
		}
	}
	upstream := func(t *testing.T, c *Cache, name string) {
		if err := c.Insert(mirrorA(t, name, 1)); err != nil {
			t.Fatal(err)
		}
	}
	replaced := func(t *testing.T, c *Cache, name string) {
		if err := c.InsertMirror(mirrorA(t, name, 1)); err != nil {
			t.Fatal(err)
		}
		if err := c.InsertMirror(mirrorA(t, name, 2)); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name string
		mod  func(*Config)
		use  use
		used int // names used before the flood
		want int // of them held after it
		big  int // addresses per flooded reply
	}{
		{"mirrored twice", oneShard, mirroredTwice, 10, 10, 1},
		{"served once", oneShard, served, 10, 10, 1},
		{"upstream answers", oneShard, upstream, 10, 10, 1},
		{"replaced by a changed reply", oneShard, replaced, 10, 10, 1},
		{"used entries over their share keep it", oneShard, upstream, 20, 15, 1},
		{"probation bounded by bytes", func(c *Config) {
			c.Shards, c.MaxEntries, c.MaxBytes, c.ProbationPercent = 1, 1000, 20_000, 25 // 5,000 bytes on probation
		}, mirroredTwice, 10, 10, 40},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := newTestCache(t, tt.mod)
			used := names("used", 0, tt.used)
			for _, name := range used {
				tt.use(t, c, name)
			}
			if st := c.Stats(); st.Probation != 0 {
				t.Fatalf("%d entries on probation after use", st.Probation)
			}
			flood := names("flood", 0, 200)
			for _, name := range flood {
				if err := c.InsertMirror(mirrorA(t, name, tt.big)); err != nil {
					t.Fatal(err)
				}
			}
			held := freshNames(t, c, used)
			if len(held) != tt.want || (tt.want > 0 && held[len(held)-1] != used[len(used)-1]) {
				t.Errorf("after the flood, %d of the %d used names held (%v), want the last %d", len(held), len(used), held, tt.want)
			}
			st := c.Stats()
			s := &c.shards[0]
			// Probation holds more than its share only of room the used
			// entries leave: it never pushes them below theirs.
			usedEntries, usedBytes := s.lru.Len()-st.Probation, s.bytes-s.probBytes
			if st.Probation == 0 ||
				st.Probation > s.maxProb && usedEntries >= s.maxEntries-s.maxProb ||
				s.probBytes > s.maxProbB && usedBytes >= s.maxBytes-s.maxProbB {
				t.Errorf("%d entries (%d bytes) on probation beside %d used (%d bytes), bounds %d and %d bytes", st.Probation, s.probBytes, usedEntries, usedBytes, s.maxProb, s.maxProbB)
			}
			// The newest flooded names are the ones kept.
			if got := freshNames(t, c, flood[len(flood)-st.Probation:]); len(got) != st.Probation {
				t.Errorf("newest flooded names held: %v", got)
			}
			if s.probQ.len() > s.maxEntries {
				t.Errorf("probation queue holds %d references, more than the shard's %d entries", s.probQ.len(), s.maxEntries)
			}
		})
	}
}

// TestProbationAccounting follows the probation counters through every
// way an entry leaves probation or the cache.
func TestProbationAccounting(t *testing.T) {
	c, clk := newTestCache(t, func(c *Config) { c.Shards = 1 })
	s := &c.shards[0]
	check := func(step string, entries int) {
		t.Helper()
		var bytes int64
		n := 0
		for _, e := range s.lru.Values() {
			if e.flags&entryProbation != 0 {
				n++
				bytes += e.cost()
			}
		}
		if n != entries || s.probEntries != n || s.probBytes != bytes {
			t.Fatalf("%s: %d entries (%d bytes) on probation, counted %d (%d bytes); want %d", step, n, bytes, s.probEntries, s.probBytes, entries)
		}
	}
	for _, name := range names("a", 0, 5) {
		if err := c.InsertMirror(mirrorA(t, name, 1)); err != nil {
			t.Fatal(err)
		}
	}
	check("five mirrored", 5)
	serve(t, c, query(t, "a-0.example.", dns.TypeA, -1, false), 0, false)
	check("one served", 4)
	_ = c.InsertMirror(mirrorA(t, "a-1.example.", 1))
	check("one seen again", 3)
	_ = c.InsertMirror(mirrorA(t, "a-2.example.", 3))
	check("one changed", 2)
	_ = c.Insert(mirrorA(t, "a-3.example.", 1))
	check("one answered by an upstream", 1)
	clk.Advance(c.cfg.MaxStale + time.Hour)
	serve(t, c, query(t, "a-4.example.", dns.TypeA, -1, true), 0, true) // past the stale window: removed
	check("one expired", 0)
	_ = c.InsertMirror(mirrorA(t, "b.example.", 1))
	check("a new one", 1)
	c.Purge()
	check("purged", 0)
}

// TestProbationSnapshot: an entry on probation is still on probation
// after a restart, and a used one still used.
func TestProbationSnapshot(t *testing.T) {
	c, _ := newTestCache(t, nil)
	for _, name := range names("p", 0, 3) {
		if err := c.InsertMirror(mirrorA(t, name, 1)); err != nil {
			t.Fatal(err)
		}
	}
	_ = c.InsertMirror(mirrorA(t, "p-0.example.", 1)) // used
	var buf bytes.Buffer
	if _, err := c.Save(&buf); err != nil {
		t.Fatal(err)
	}
	d, _ := newTestCache(t, nil)
	if n, err := d.Load(&buf); err != nil || n != 3 {
		t.Fatalf("Load: %d, %v", n, err)
	}
	if st := d.Stats(); st.Probation != 2 {
		t.Errorf("%d entries on probation after a restart, want 2", st.Probation)
	}
	// The loaded entries have no content sum (it is per process): the
	// next mirrored reply replaces each once, as used or not as it was.
	if err := d.InsertMirror(mirrorA(t, "p-1.example.", 1)); err != nil {
		t.Errorf("first mirrored reply after a restart: %v, want it stored", err)
	}
	if st := d.Stats(); st.Probation != 1 {
		t.Errorf("%d entries on probation, want 1", st.Probation)
	}
}

// TestInsertMirrorRepeatNoAllocs: skipping a repeat, taking its entry off
// probation on the way, allocates nothing.
func TestInsertMirrorRepeatNoAllocs(t *testing.T) {
	c, _ := newTestCache(t, nil)
	const runs = 100
	raws := make([][]byte, runs+1) // AllocsPerRun calls once more to warm up
	for i := range raws {
		raws[i] = mirrorA(t, fmt.Sprintf("svc-%d.default.svc.cluster.local.", i), 2)
		if err := c.InsertMirror(raws[i]); err != nil {
			t.Fatal(err)
		}
	}
	i := 0
	allocs := testing.AllocsPerRun(runs, func() {
		if err := c.InsertMirror(raws[i]); err != errHaveFresh {
			t.Fatalf("repeat: %v", err)
		}
		i++
	})
	if allocs != 0 {
		t.Errorf("a repeat allocates %v times", allocs)
	}
	if st := c.Stats(); st.Probation != 0 {
		t.Errorf("%d entries still on probation after their repeat", st.Probation)
	}
}

// TestCanonicalName: owner names are read through compression pointers
// and lower-cased; what does not read as a name is refused, pointer loops
// included.
func TestCanonicalName(t *testing.T) {
	// A header's worth of zeros, then "Www.Example." at 12 and names after.
	msg := append(make([]byte, 12), []byte("\x03Www\x07Example\x00")...)
	msg = append(msg, 0xc0, 16)         // 25: pointer to "Example."
	msg = append(msg, 1, 'A', 0xc0, 12) // 27: "A" + pointer to "Www.Example."
	msg = append(msg, 0xc0, 31)         // 31: pointer to itself
	msg = append(msg, 0xc0, 0xff)       // 33: pointer past the end
	msg = append(msg, 64)               // 35: a label length over 63
	long := append([]byte(nil), msg...) // a chain of labels past 255 bytes
	for range 5 {
		long = append(long, 63)
		long = append(long, bytes.Repeat([]byte{'x'}, 63)...)
	}
	long = append(long, 0)
	tests := []struct {
		name string
		msg  []byte
		off  int
		want string // "" : refused
	}{
		{"plain, upper case", msg, 12, "\x03www\x07example\x00"},
		{"pointer", msg, 25, "\x07example\x00"},
		{"label then pointer", msg, 27, "\x01a\x03www\x07example\x00"},
		{"pointer loop", msg, 31, ""},
		{"pointer past the end", msg, 33, ""},
		{"label too long", msg, 35, ""},
		{"name too long", long, len(msg), ""},
		{"past the end", msg, len(msg), ""},
	}
	for _, tt := range tests {
		var dst [wire.MaxNameLen]byte
		n, ok := canonicalName(&dst, tt.msg, tt.off)
		if got := string(dst[:n]); ok != (tt.want != "") || got != tt.want {
			t.Errorf("%s: %q, %v; want %q", tt.name, got, ok, tt.want)
		}
	}
}

// TestProbationUsesFreeRoom: while a shard has room, mirrored names seen
// once are all kept, however many more than probation's share: a name
// asked once before LocalDNS failed is still answered in a takeover.
// (Evicting them at their share regardless lost 2% of a lab's warm names.)
func TestProbationUsesFreeRoom(t *testing.T) {
	c, _ := newTestCache(t, func(c *Config) { c.Shards, c.MaxEntries, c.ProbationPercent = 1, 100, 25 })
	once := names("once", 0, 60)
	for _, name := range once {
		if err := c.InsertMirror(mirrorA(t, name, 1)); err != nil {
			t.Fatal(err)
		}
	}
	if held := freshNames(t, c, once); len(held) != len(once) {
		t.Fatalf("%d of %d names seen once held in a cache with room for 100", len(held), len(once))
	}
}
