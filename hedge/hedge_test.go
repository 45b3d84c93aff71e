package hedge

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		field string
		set   func(*Config)
	}{
		{"Table", func(c *Config) { c.Table = 8 }},
		{"CacheMult", func(c *Config) { c.CacheMult = 0.5 }},
		{"UpstreamMult", func(c *Config) { c.UpstreamMult = 0 }},
		{"CacheMin", func(c *Config) { c.CacheMin = 0 }},
		{"CacheMax", func(c *Config) { c.CacheMax = c.CacheMin - 1 }},
		{"UpstreamMax", func(c *Config) { c.UpstreamMax = time.Millisecond }},
		{"Window", func(c *Config) { c.Window = 0 }},
		{"Linger", func(c *Config) { c.Linger = 0 }},
		{"Rate", func(c *Config) { c.Rate = 0 }},
		{"Burst", func(c *Config) { c.Burst = 0 }},
		{"MinQueries", func(c *Config) { c.MinQueries = 0 }},
		{"SilentWindow", func(c *Config) { c.SilentWindow = -1 }},
		{"Tick", func(c *Config) { c.Tick = 0 }},
	}
	def := DefaultConfig()
	if err := def.Validate(); err != nil {
		t.Fatalf("DefaultConfig: %v", err)
	}
	for _, tt := range tests {
		t.Run(tt.field, func(t *testing.T) {
			c := DefaultConfig()
			tt.set(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), "hedge: "+tt.field+" must") {
				t.Fatalf("Validate = %v, want an error naming %s", err, tt.field)
			}
			if _, err := New(c, newFakeAnswerer()); err == nil {
				t.Fatal("New accepted an invalid Config")
			}
		})
	}
	if _, err := New(def, nil); err == nil {
		t.Fatal("New accepted a nil Answerer")
	}
}

// step is one packet the tap hands over.
type step struct {
	reply  bool
	at     int64 // ms after t0
	client netip.AddrPort
	id     uint16
	name   string
	own    bool // want Reply's result
}

func TestMatching(t *testing.T) {
	q := func(at int64, c netip.AddrPort, id uint16, name string) step {
		return step{false, at, c, id, name, false}
	}
	r := func(at int64, c netip.AddrPort, id uint16, name string) step {
		return step{true, at, c, id, name, false}
	}
	tests := []struct {
		name    string
		steps   []step
		matched uint64
		unknown uint64
		tracked uint64
		left    int // entries still waiting
	}{
		{"answered", []step{q(0, podA, 1, "a.example."), r(1, podA, 1, "a.example.")}, 1, 0, 1, 0},
		{"ID reuse, same port, new ID", []step{
			q(0, podA, 1, "a.example."), q(0, podA, 2, "a.example."),
			r(1, podA, 2, "a.example."), r(2, podA, 1, "a.example."),
		}, 2, 0, 2, 0},
		{"same ID, new port", []step{
			q(0, podA, 7, "a.example."), q(0, podB, 7, "a.example."),
			r(1, podB, 7, "a.example."),
		}, 1, 0, 2, 1},
		{"same ID, other address family", []step{
			q(0, podA, 7, "a.example."), q(0, podC, 7, "a.example."),
			r(1, podC, 7, "a.example."), r(1, podA, 7, "a.example."),
		}, 2, 0, 2, 0},
		{"port and ID reused after the answer", []step{
			q(0, podA, 9, "a.example."), r(1, podA, 9, "a.example."),
			q(2, podA, 9, "a.example."), r(3, podA, 9, "a.example."),
		}, 2, 0, 2, 0},
		{"same ID and port, other question", []step{
			q(0, podA, 9, "a.example."), q(0, podA, 9, "b.example."),
			r(1, podA, 9, "b.example."),
		}, 1, 0, 2, 1},
		{"question case must match (0x20)", []step{
			q(0, podA, 9, "A.Example."), r(1, podA, 9, "a.example."),
		}, 0, 1, 1, 1},
		{"out of order", []step{
			q(0, podA, 1, "a.example."), q(1, podA, 2, "b.example."), q(2, podB, 3, "c.example."),
			r(3, podB, 3, "c.example."), r(4, podA, 1, "a.example."), r(5, podA, 2, "b.example."),
		}, 3, 0, 3, 0},
		{"unknown reply", []step{r(1, podA, 1, "a.example.")}, 0, 1, 0, 0},
		{"reply twice", []step{
			q(0, podA, 1, "a.example."), r(1, podA, 1, "a.example."), r(2, podA, 1, "a.example."),
		}, 1, 1, 1, 0},
		{"retransmission while waiting", []step{
			q(0, podA, 1, "a.example."), q(3, podA, 1, "a.example."), r(4, podA, 1, "a.example."),
		}, 1, 0, 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := newHarness(t, DefaultConfig(), newFakeAnswerer())
			for _, s := range tt.steps {
				msg := query(s.id, s.name)
				if s.reply {
					if own := x.h.Reply(t0+s.at*ms, s.client, answer(msg, "10.0.0.1")); own != s.own {
						t.Fatalf("Reply own = %v", own)
					}
				} else {
					x.h.Query(t0+s.at*ms, s.client, msg)
				}
				x.check()
			}
			st := x.h.Stats()
			if st.Replies["matched"] != tt.matched || st.Replies["unknown"] != tt.unknown ||
				st.Queries["tracked"] != tt.tracked || st.Entries != tt.left {
				t.Fatalf("matched %d unknown %d tracked %d entries %d, want %d %d %d %d",
					st.Replies["matched"], st.Replies["unknown"], st.Queries["tracked"], st.Entries,
					tt.matched, tt.unknown, tt.tracked, tt.left)
			}
			if st.HedgesTotal() != 0 {
				t.Fatalf("hedged %d before any deadline", st.HedgesTotal())
			}
		})
	}
}

func TestHostileInputs(t *testing.T) {
	good := query(1, "a.example.")
	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	long := make([]byte, 0, 300)
	long = append(long, good[:12]...)
	for range 5 { // 5 × 60 = 300 > 255
		long = append(long, 59)
		long = append(long, strings.Repeat("x", 59)...)
	}
	long = append(long, 0, 0, 1, 0, 1)
	tests := []struct {
		name   string
		msg    []byte
		result string
	}{
		{"empty", nil, "malformed"},
		{"short header", good[:11], "malformed"},
		{"header only", good[:12], "malformed"},
		{"truncated name", good[:15], "malformed"},
		{"no type and class", good[:len(good)-3], "malformed"},
		{"QDCOUNT 0", mut(func(b []byte) []byte { b[5] = 0; return b }), "malformed"},
		{"QDCOUNT 2", mut(func(b []byte) []byte { b[5] = 2; return b }), "malformed"},
		{"QR set", mut(func(b []byte) []byte { b[2] |= 0x80; return b }), "malformed"},
		{"opcode UPDATE", mut(func(b []byte) []byte { b[2] |= 5 << 3; return b }), "malformed"},
		{"compression pointer", mut(func(b []byte) []byte { return append(b[:12], 0xc0, 12, 0, 1, 0, 1) }), "malformed"},
		{"label 64", mut(func(b []byte) []byte {
			return append(append(append(b[:12], 64), strings.Repeat("y", 64)...), 0, 0, 1, 0, 1)
		}), "malformed"},
		{"name over 255", long, "malformed"},
		{"longer than 512", append(append([]byte(nil), good...), make([]byte, 600)...), "too_long"},
		{"good", good, "tracked"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := newHarness(t, DefaultConfig(), newFakeAnswerer())
			x.h.Query(t0, podA, tt.msg)
			if got := x.stat(queries, tt.result); got != 1 {
				t.Fatalf("queries[%s] = %d, want 1 (%v)", tt.result, got, x.h.Stats().Queries)
			}
			// As a reply (QR flipped), each bad one is malformed too.
			r := append([]byte(nil), tt.msg...)
			if len(r) > 2 {
				r[2] |= 0x80
			}
			x.h.Reply(t0+ms, podA, r)
			x.check()
		})
	}
	t.Run("reply with QR clear", func(t *testing.T) {
		x := newHarness(t, DefaultConfig(), newFakeAnswerer())
		x.h.Query(t0, podA, good)
		x.h.Reply(t0+ms, podA, good) // the query itself, QR=0
		if x.stat(replies, "malformed") != 1 || x.h.Stats().Entries != 1 {
			t.Fatalf("replies %v", x.h.Stats().Replies)
		}
	})
}

func TestTableFull(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Table = 16
	x := newHarness(t, cfg, newFakeAnswerer("hit.example."))
	// 16 waiting queries fill it; the 17th is not tracked.
	for i := range 16 {
		x.h.Query(t0, podA, query(uint16(i), "miss.example."))
	}
	x.h.Query(t0, podA, query(100, "miss.example."))
	if x.stat(queries, "table_full") != 1 {
		t.Fatalf("queries %v", x.h.Stats().Queries)
	}
	x.check()
	// Answer 8, leave 8 waiting; hedge 8 hits.
	for i := range 8 {
		x.h.Reply(t0+ms, podA, answer(query(uint16(i), "miss.example."), "10.0.0.1"))
	}
	for i := range 8 {
		x.h.Query(t0+ms, podB, query(uint16(i), "hit.example."))
	}
	x.advance(pastCache)
	if got := x.ans.sentCount(); got != 8 {
		t.Fatalf("sent %d hedges, want 8", got)
	}
	// Full again: a new query retires the oldest hedged entry.
	x.h.Query(x.now, podA, query(200, "hit.example."))
	st := x.h.Stats()
	if st.Queries["tracked"] != 25 || st.Outcomes["unknown"] != 1 || st.Entries != 16 {
		t.Fatalf("queries %v outcomes %v entries %d", st.Queries, st.Outcomes, st.Entries)
	}
	x.check()
}

func TestStages(t *testing.T) {
	tests := []struct {
		name       string
		qname      string
		stale      bool
		upstream   bool // the upstream answers
		source     string
		wantLookup bool
	}{
		{"cache", "hit.example.", false, false, "cache", true},
		{"stale", "hit.example.", true, false, "stale", true},
		{"miss, then upstream", "miss.example.", false, true, "upstream", true},
		{"miss, upstream silent", "miss.example.", false, false, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ans := newFakeAnswerer("hit.example.")
			ans.stale = tt.stale
			x := newHarness(t, DefaultConfig(), ans)
			q := query(42, tt.qname)
			x.h.Query(t0, podA, q)
			x.advance(DefaultConfig().CacheMin - 5*time.Millisecond)
			if ans.lookups != 0 || ans.sentCount() != 0 {
				t.Fatal("acted before the cache deadline")
			}
			x.advance(10 * time.Millisecond) // past it
			if ans.lookups != 1 {
				t.Fatalf("lookups %d at the cache deadline", ans.lookups)
			}
			if strings.HasPrefix(tt.qname, "hit") {
				if ans.sentCount() != 1 || x.stat(hedges, tt.source) != 1 {
					t.Fatalf("sent %d, hedges %v", ans.sentCount(), x.h.Stats().Hedges)
				}
				if ans.sent[0].client != podA || ans.sent[0].msg[0] != 0 || ans.sent[0].msg[1] != 42 {
					t.Fatalf("hedge to %v id %x", ans.sent[0].client, ans.sent[0].msg[:2])
				}
				return
			}
			// A miss waits for the upstream deadline (300 ms).
			x.advance(DefaultConfig().UpstreamMin - DefaultConfig().CacheMin - 10*time.Millisecond)
			if len(ans.resolves) != 0 {
				t.Fatal("resolved before the upstream deadline")
			}
			x.advance(20 * time.Millisecond)
			if len(ans.resolves) != 1 || string(ans.resolves[0].query) != string(q) {
				t.Fatalf("resolves %d", len(ans.resolves))
			}
			if tt.upstream {
				rep := answer(q, "10.0.0.7")
				ans.resolves[0].send(rep)
				if ans.sentCount() != 1 || x.stat(hedges, "upstream") != 1 {
					t.Fatalf("sent %d hedges %v", ans.sentCount(), x.h.Stats().Hedges)
				}
				// The echo is ours.
				if !x.h.Reply(x.now+ms, podA, rep) {
					t.Fatal("upstream hedge's echo not recognised")
				}
			}
			x.advance(2100 * time.Millisecond)
			st := x.h.Stats()
			if tt.upstream && st.Outcomes["never"] != 1 {
				t.Fatalf("outcomes %v", st.Outcomes)
			}
			if !tt.upstream && st.Skipped["no_answer"] != 1 {
				t.Fatalf("skipped %v", st.Skipped)
			}
			if st.Entries != 0 {
				t.Fatalf("%d entries after Linger", st.Entries)
			}
			x.check()
		})
	}
}

func TestUpstreamAfterLocalDNS(t *testing.T) {
	ans := newFakeAnswerer()
	x := newHarness(t, DefaultConfig(), ans)
	q := query(5, "miss.example.")
	x.h.Query(t0, podA, q)
	x.advance(310 * time.Millisecond)
	if len(ans.resolves) != 1 {
		t.Fatalf("resolves %d", len(ans.resolves))
	}
	x.h.Reply(x.now, podA, answer(q, "10.0.0.1")) // LocalDNS first
	ans.resolves[0].send(answer(q, "10.0.0.2"))
	st := x.h.Stats()
	if ans.sentCount() != 0 || st.Skipped["answered"] != 1 || st.Entries != 0 {
		t.Fatalf("sent %d skipped %v entries %d", ans.sentCount(), st.Skipped, st.Entries)
	}
	ans.resolves[0].send(answer(q, "10.0.0.2")) // a second call is ignored
	if x.stat(skippedM, "late") != 1 {
		t.Fatalf("skipped %v", x.h.Stats().Skipped)
	}
	x.check()
}

func TestOwnEchoAndOutcomes(t *testing.T) {
	tests := []struct {
		name      string
		localdns  bool // LocalDNS answers after the hedge
		echoFirst bool
		echoTwice bool // the same bytes again: only the first copy is ours
		outcome   string
	}{
		{"later, echo first", true, true, false, "later"},
		{"later, echo after", true, false, false, "later"},
		{"never", false, true, false, "never"},
		{"echo twice", false, true, true, "later"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ans := newFakeAnswerer("hit.example.")
			x := newHarness(t, DefaultConfig(), ans)
			q := query(77, "hit.example.")
			x.h.Query(t0, podA, q)
			x.advance(pastCache)
			if ans.sentCount() != 1 {
				t.Fatalf("sent %d", ans.sentCount())
			}
			echo := ans.sent[0].msg
			late := answer(q, "10.0.0.1")
			if tt.echoFirst {
				if !x.h.Reply(x.now+ms, podA, echo) {
					t.Fatal("own hedge not recognised")
				}
			}
			if tt.localdns {
				if x.h.Reply(x.now+2*ms, podA, late) {
					t.Fatal("LocalDNS's late reply taken as ours")
				}
			}
			if !tt.echoFirst {
				if !x.h.Reply(x.now+3*ms, podA, echo) {
					t.Fatal("own hedge not recognised after LocalDNS's reply")
				}
			}
			// The same bytes a second time are not ours: recognised once.
			if tt.echoTwice && x.h.Reply(x.now+4*ms, podA, echo) {
				t.Fatal("own hedge recognised twice")
			}
			x.advance(2100 * time.Millisecond)
			st := x.h.Stats()
			if st.Outcomes[tt.outcome] != 1 || st.Replies["own"] != 1 || st.Entries != 0 {
				t.Fatalf("outcomes %v replies %v entries %d", st.Outcomes, st.Replies, st.Entries)
			}
			x.check()
		})
	}
}

func TestRateCap(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Rate, cfg.Burst = 100, 10
	ans := newFakeAnswerer("hit.example.")
	x := newHarness(t, cfg, ans)
	// The misses first: a lookup that finds nothing spends no token.
	for i := range 5 {
		x.h.Query(t0, podA, query(uint16(1000+i), "miss.example."))
	}
	for i := range 50 {
		x.h.Query(t0, podA, query(uint16(i), "hit.example."))
	}
	x.advance(pastCache)
	if got := ans.sentCount(); got != 10 {
		t.Fatalf("sent %d, want the burst, 10", got)
	}
	x.advance(300 * time.Millisecond) // 30 more tokens: the misses get theirs
	st := x.h.Stats()
	if st.Hedges["cache"] != 10 || st.Skipped["rate"] != 40 || len(ans.resolves) != 5 {
		t.Fatalf("hedges %v skipped %v resolves %d", st.Hedges, st.Skipped, len(ans.resolves))
	}
	x.check()
}

func TestSetTracking(t *testing.T) {
	x := newHarness(t, DefaultConfig(), newFakeAnswerer())
	x.now = t0 + 10*ms
	x.h.SetTracking(false)
	x.h.Query(t0+7*ms, podA, query(1, "a.example."))  // arrived before the switch: tracked
	x.h.Query(t0+10*ms, podA, query(2, "a.example.")) // after: not
	x.h.Query(t0+12*ms, podA, query(3, "a.example."))
	st := x.h.Stats()
	if st.Queries["tracked"] != 1 || st.Queries["untracked"] != 2 || st.Tracking {
		t.Fatalf("queries %v tracking %v", st.Queries, st.Tracking)
	}
	// Tracked entries are still matched.
	x.h.Reply(t0+13*ms, podA, answer(query(1, "a.example."), "10.0.0.1"))
	x.now = t0 + 20*ms
	x.h.SetTracking(true)
	x.h.Query(t0+18*ms, podA, query(4, "a.example.")) // before switching back: not
	x.h.Query(t0+20*ms, podA, query(5, "a.example."))
	st = x.h.Stats()
	if st.Queries["tracked"] != 2 || st.Queries["untracked"] != 3 || st.Replies["matched"] != 1 || !st.Tracking {
		t.Fatalf("queries %v replies %v", st.Queries, st.Replies)
	}
	x.check()
}

func TestSetTrackingStillHedges(t *testing.T) {
	ans := newFakeAnswerer("hit.example.")
	x := newHarness(t, DefaultConfig(), ans)
	x.h.Query(t0, podA, query(1, "hit.example."))
	x.h.SetTracking(false)
	x.advance(pastCache)
	if ans.sentCount() != 1 {
		t.Fatalf("sent %d: a tracked entry must be hedged after tracking stops", ans.sentCount())
	}
}

// hang sends n queries spaced by gap, none answered by LocalDNS, and runs
// the clock past their cache deadline.
func (x *harness) hang(n int, gap time.Duration, name string, id0 uint16) {
	for i := range n {
		x.h.Query(x.now, podA, query(id0+uint16(i), name))
		x.advance(gap)
	}
	x.advance(200 * time.Millisecond)
}

func TestFastHold(t *testing.T) {
	type call struct {
		n     int
		since time.Time
	}
	setup := func(t *testing.T) (*harness, *[]call) {
		var calls []call
		cfg := DefaultConfig()
		x := newHarness(t, cfg, newFakeAnswerer("hit.example."))
		x.onSilent = func(n int, since time.Time) { calls = append(calls, call{n, since}) }
		// LocalDNS healthy first: one reply.
		x.h.Query(x.now, podB, query(999, "hit.example."))
		x.h.Reply(x.now+ms, podB, answer(query(999, "hit.example."), "10.0.0.1"))
		x.advance(10 * time.Millisecond)
		return x, &calls
	}
	t.Run("hang of hits trips once", func(t *testing.T) {
		x, calls := setup(t)
		start := x.now
		x.hang(20, 5*time.Millisecond, "hit.example.", 0)
		if len(*calls) != 1 || (*calls)[0].n < 8 || (*calls)[0].since.UnixNano() != start {
			t.Fatalf("calls %+v, want one since %d", *calls, start)
		}
		if x.h.Stats().Silent != 1 {
			t.Fatal("silent not counted")
		}
		// Re-armed by a LocalDNS reply after it, then trips again.
		x.h.Reply(x.now, podB, answer(query(999, "other.example."), "10.0.0.1"))
		x.advance(5 * time.Millisecond)
		x.hang(20, 5*time.Millisecond, "hit.example.", 100)
		if len(*calls) != 2 {
			t.Fatalf("calls %d after re-arm, want 2", len(*calls))
		}
	})
	t.Run("trips a few ticks after SilentMin", func(t *testing.T) {
		x, calls := setup(t)
		start := x.now
		for i := 0; len(*calls) == 0 && i < 1000; i++ {
			x.h.Query(x.now, podA, query(uint16(i), "hit.example."))
			x.advance(2 * time.Millisecond) // 500 queries/s
		}
		if len(*calls) != 1 || x.now-start < int64(DefaultConfig().SilentMin) || x.now-start > int64(DefaultConfig().SilentMin)+50*ms {
			t.Fatalf("tripped after %v (calls %d)", time.Duration(x.now-start), len(*calls))
		}
	})
	t.Run("slow misses do not trip", func(t *testing.T) {
		x, calls := setup(t)
		x.hang(50, 2*time.Millisecond, "miss.example.", 0)
		if len(*calls) != 0 {
			t.Fatalf("tripped on misses: %+v", *calls)
		}
	})
	t.Run("low rate does not trip", func(t *testing.T) {
		x, calls := setup(t)
		x.hang(20, 200*time.Millisecond, "hit.example.", 0) // 5 hits/s
		if len(*calls) != 0 {
			t.Fatalf("tripped at a low rate: %+v", *calls)
		}
	})
	t.Run("one answered hit keeps it armed but quiet", func(t *testing.T) {
		x, calls := setup(t)
		for i := range 20 {
			q := query(uint16(i), "hit.example.")
			x.h.Query(x.now, podA, q)
			if i%4 == 0 { // LocalDNS answers one in four, late
				x.h.Reply(x.now+ms, podA, answer(q, "10.0.0.1"))
			}
			x.advance(5 * time.Millisecond)
		}
		x.advance(200 * time.Millisecond)
		if len(*calls) != 0 {
			t.Fatalf("tripped while LocalDNS answered: %+v", *calls)
		}
	})
	t.Run("tracking on re-arms", func(t *testing.T) {
		x, calls := setup(t)
		x.hang(20, 5*time.Millisecond, "hit.example.", 0)
		x.h.SetTracking(false)
		x.h.SetTracking(true)
		x.hang(20, 5*time.Millisecond, "hit.example.", 100)
		if len(*calls) != 2 {
			t.Fatalf("calls %d, want 2", len(*calls))
		}
	})
}

// pastCache is a moment past the default cache deadline with no samples.
var pastCache = DefaultConfig().CacheMin + 5*time.Millisecond

func TestAdaptiveDeadline(t *testing.T) {
	d := DefaultConfig()
	x := newHarness(t, d, newFakeAnswerer("a.example."))
	c, u := x.h.Deadlines()
	if c != d.CacheMin || u != d.UpstreamMin {
		t.Fatalf("with no samples: %v %v", c, u)
	}
	feedName := func(name string, lat time.Duration, n int) {
		for i := range n {
			q := query(uint16(i), name)
			x.h.Query(x.now, podA, q)
			x.h.Reply(x.now+int64(lat), podA, answer(q, "10.0.0.1"))
			if i%10 == 0 {
				x.advance(10 * time.Millisecond)
			}
		}
	}
	feed := func(lat time.Duration, n int) { feedName("a.example.", lat, n) }
	feed(time.Millisecond, 1000)
	if c, _ := x.h.Deadlines(); c != d.CacheMin {
		t.Fatalf("1 ms latency: cache deadline %v, want the minimum", c)
	}
	// 5% slow misses (the cache has no answer: LocalDNS forwarded them)
	// lift the upstream deadline only.
	for range 20 {
		feed(time.Millisecond, 95)
		feedName("miss.example.", 60*time.Millisecond, 5)
	}
	if c, u := x.h.Deadlines(); c != d.CacheMin || u < min(480*time.Millisecond, d.UpstreamMax) {
		t.Fatalf("5%% slow misses: deadlines %v %v, want %v and about 8×60 ms", c, u, d.CacheMin)
	}
	x.advance(11 * time.Second)
	// LocalDNS slows to 20 ms: the deadline follows within a window.
	feed(20*time.Millisecond, 1000)
	x.advance(6 * time.Second)
	feed(20*time.Millisecond, 1000)
	c, u = x.h.Deadlines()
	if c < 80*time.Millisecond || c > 150*time.Millisecond || u < min(160*time.Millisecond, d.UpstreamMax) {
		t.Fatalf("20 ms latency: deadlines %v %v, want about 4×20 ms and 8×20 ms", c, u)
	}
	// Very slow: clamped.
	feed(time.Second, 1000)
	x.advance(6 * time.Second)
	feed(time.Second, 1000)
	if c, u = x.h.Deadlines(); c != d.CacheMax || u != d.UpstreamMax {
		t.Fatalf("1 s latency: %v %v, want the maximums", c, u)
	}
	// Back to fast: once the window has passed, back to the minimum.
	feed(time.Millisecond, 1000)
	x.advance(11 * time.Second)
	feed(time.Millisecond, 1000)
	if c, _ = x.h.Deadlines(); c != d.CacheMin {
		t.Fatalf("fast again: %v", c)
	}
	// A few samples: the largest counts.
	y := newHarness(t, DefaultConfig(), newFakeAnswerer("a.example."))
	q := query(1, "a.example.")
	y.h.Query(y.now, podA, q)
	y.h.Reply(y.now+int64(50*time.Millisecond), podA, answer(q, "10.0.0.1"))
	y.advance(5 * time.Millisecond)
	if c, _ := y.h.Deadlines(); c != 150*time.Millisecond {
		t.Fatalf("one 50 ms sample: %v", c)
	}
}

func TestSendError(t *testing.T) {
	ans := newFakeAnswerer("hit.example.")
	ans.sendErr = errors.New("boom")
	x := newHarness(t, DefaultConfig(), ans)
	x.h.Query(t0, podA, query(1, "hit.example."))
	x.advance(2500 * time.Millisecond)
	st := x.h.Stats()
	if st.Skipped["send_error"] != 1 || st.Outcomes["never"] != 0 {
		t.Fatalf("skipped %v outcomes %v", st.Skipped, st.Outcomes)
	}
}

func TestMetrics(t *testing.T) {
	x := newHarness(t, DefaultConfig(), newFakeAnswerer("hit.example."))
	x.h.Query(t0, podA, query(1, "hit.example."))
	x.h.Query(t0, podA, query(2, "hit.example."))
	x.h.Reply(t0+ms, podA, answer(query(2, "hit.example."), "10.0.0.1"))
	x.advance(DefaultConfig().CacheMin + 5*time.Millisecond)
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(x.h); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			k := mf.GetName()
			for _, l := range m.GetLabel() {
				k += "/" + l.GetValue()
			}
			switch {
			case m.Counter != nil:
				got[k] = m.Counter.GetValue()
			case m.Gauge != nil:
				got[k] = m.Gauge.GetValue()
			case m.Histogram != nil:
				got[k] = float64(m.Histogram.GetSampleCount())
			}
		}
	}
	want := map[string]float64{
		"dnsstandby_hedge_queries_total/tracked":     2,
		"dnsstandby_hedge_sent_total/cache":          1,
		"dnsstandby_hedge_replies_total/matched":     1,
		"dnsstandby_localdns_reply_duration_seconds": 1,
		"dnsstandby_hedge_deadline_seconds/cache":    DefaultConfig().CacheMin.Seconds(),
		"dnsstandby_hedge_deadline_seconds/upstream": DefaultConfig().UpstreamMin.Seconds(),
		"dnsstandby_localdns_silent_total":           0,
		"dnsstandby_hedge_entries":                   1,
		"dnsstandby_hedge_tracking":                  1,
		"dnsstandby_hedge_outcomes_total/never":      0,
		"dnsstandby_hedge_skipped_total/rate":        0,
		// The old names, one release more.
		"dnsstandby_hedges_total/cache":        1,
		"dnsstandby_hedges_skipped_total/rate": 0,
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
}

func TestRun(t *testing.T) {
	ans := newFakeAnswerer("hit.example.")
	cfg := DefaultConfig()
	cfg.CacheMin = time.Millisecond
	h, err := New(cfg, ans)
	if err != nil {
		t.Fatal(err)
	}
	stop := runHedger(t, h)
	h.Query(time.Now().UnixNano(), podA, query(1, "hit.example."))
	testkit.Eventually(t, 5*time.Second, "Run sending the hedge", func() bool { return ans.sentCount() > 0 })
	stop()
	if ans.sentCount() != 1 {
		t.Fatalf("Run sent %d hedges", ans.sentCount())
	}
}

// runHedger starts h's Run and returns what stops it and waits for it
// to return; it is stopped when the test ends too.
func runHedger(t *testing.T, h *Hedger) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.Run(ctx, nil); close(done) }()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}

// TestTicksFollowTheTap: while the tap reads (Drained every 2 ms, as its
// batch pause has it), deadlines fire in its ticks and the hedger's own
// timer does not wake; once the tap goes quiet with a query still waiting,
// the timer fires it; with nothing waiting, nothing wakes at all.
func TestTicksFollowTheTap(t *testing.T) {
	ans := newFakeAnswerer("hit.example.", "late.example.")
	cfg := DefaultConfig()
	// 100 ms: a reply "1 ms later" stays in time under the same load.
	cfg.CacheMin, cfg.CacheMax = 100*time.Millisecond, 100*time.Millisecond
	// A Tick of 25 ms gives the tap 50 ms (drainedGrace) to come back
	// before the timer may: the loop's 2 ms sleeps stretched to 25 ms on
	// a loaded machine running other -race tests, which a 5 ms Tick (10 ms
	// of grace) took for a quiet tap.
	cfg.Tick = 25 * time.Millisecond
	h, err := New(cfg, ans)
	if err != nil {
		t.Fatal(err)
	}
	runHedger(t, h)
	ticks := func(by int) uint64 { return h.st.ticks[by].Load() }

	// A busy, healthy LocalDNS: every query answered 1 ms later.
	end := time.Now().Add(600 * time.Millisecond)
	for id := uint16(1); time.Now().Before(end); id++ {
		q := query(id, "hit.example.")
		now := time.Now().UnixNano()
		h.Query(now, podA, q)
		time.Sleep(time.Millisecond)
		h.Reply(time.Now().UnixNano(), podA, answer(q, "10.0.0.1"))
		time.Sleep(time.Millisecond)
		h.Drained(time.Now().UnixNano(), 0)
	}
	// (A sleep stretched past 2 Ticks by a loaded machine lets the timer
	// in now and then; on its own it would have woken about 60 times.)
	if got, tap := ticks(tickTimer), ticks(tickTap); got > tap/10 {
		t.Errorf("the hedger's timer woke %d times while the tap read every 2 ms (%d ticks)", got, tap)
	}
	if got := ticks(tickTap); got < 10 {
		t.Errorf("%d ticks on the tap's reads in 600 ms, want about 24", got)
	}
	if n := ans.sentCount(); n != 0 {
		t.Errorf("%d hedges for queries all answered in 1 ms", n)
	}

	// One left unanswered while the tap keeps reading: its tick fires it.
	h.Query(time.Now().UnixNano(), podA, query(60001, "late.example."))
	for end := time.Now().Add(2 * time.Second); ans.sentCount() == 0; {
		if time.Now().After(end) {
			t.Fatal("no hedge within 2 s of ticks on the tap's reads")
		}
		time.Sleep(2 * time.Millisecond)
		h.Drained(time.Now().UnixNano(), 0)
	}
	if got, tap := ticks(tickTimer), ticks(tickTap); got > tap/10 {
		t.Errorf("the timer woke %d times while the tap read (%d ticks)", got, tap)
	}

	// The tap goes quiet with a query waiting: the timer fires it.
	h.Query(time.Now().UnixNano(), podB, query(60002, "late.example."))
	testkit.Eventually(t, 2*time.Second, "the timer firing the hedge", func() bool { return ans.sentCount() == 2 })
	if ticks(tickTimer) == 0 {
		t.Error("hedge sent with no timer tick and no tap read")
	}

	// Nothing waits once the hedged entries linger out: nothing wakes.
	testkit.Eventually(t, 5*time.Second, "the table to empty", func() bool { return h.Stats().Entries == 0 })
	idle := ticks(tickTimer)
	time.Sleep(100 * time.Millisecond)
	if got := ticks(tickTimer) - idle; got > 1 {
		t.Errorf("the timer woke %d times in 100 ms with nothing waiting", got)
	}
}

// TestDrainedNext: Drained tells the tap to come back when the first
// deadline can fall due: the oldest waiting query's cache deadline, that
// of a query the tap holds unseen if it came first, or, with none, a
// whole cache deadline after now (a query not yet read has that much
// ahead of it).
func TestDrainedNext(t *testing.T) {
	ans := newFakeAnswerer("hit.example.")
	cfg := DefaultConfig()
	const d1 = 100 * time.Millisecond
	cfg.CacheMin, cfg.CacheMax = d1, d1
	h, err := New(cfg, ans)
	if err != nil {
		t.Fatal(err)
	}
	runHedger(t, h)
	t0 := time.Now().UnixNano()
	h.Drained(t0, 0) // the first tick sets the deadlines
	q1, q2 := query(1, "hit.example."), query(2, "hit.example.")
	ms := int64(time.Millisecond)
	steps := []struct {
		name   string
		do     func()
		at     int64 // Drained's now, after t0
		unseen int64 // a query the tap holds unseen since, after t0; 0 none
		want   int64 // its answer, after t0
	}{
		{"nothing waits", func() {}, 1 * ms, 0, 1*ms + int64(d1)},
		{"q1 waits from 2 ms", func() { h.Query(t0+2*ms, podA, q1) }, 3 * ms, 0, 2*ms + int64(d1)},
		{"q2 waits from 4 ms: q1 still first", func() { h.Query(t0+4*ms, podB, q2) }, 5 * ms, 0, 2*ms + int64(d1)},
		{"q1 answered: q2 first", func() { h.Reply(t0+6*ms, podA, answer(q1, "10.0.0.1")) }, 7 * ms, 0, 4*ms + int64(d1)},
		{"one unseen since 3 ms: first", func() {}, 7 * ms, 3 * ms, 3*ms + int64(d1)},
		{"one unseen since 5 ms: q2 first", func() {}, 7 * ms, 5 * ms, 4*ms + int64(d1)},
		{"q2 answered: nothing waits", func() { h.Reply(t0+8*ms, podB, answer(q2, "10.0.0.1")) }, 9 * ms, 0, 9*ms + int64(d1)},
		{"nothing seen waits, one unseen since 8 ms", func() {}, 9 * ms, 8 * ms, 8*ms + int64(d1)},
	}
	for _, st := range steps {
		st.do()
		unseen := int64(0)
		if st.unseen != 0 {
			unseen = t0 + st.unseen
		}
		if got := h.Drained(t0+st.at, unseen) - t0; got != st.want {
			t.Errorf("%s: Drained at +%v says come back at +%v, want +%v", st.name,
				time.Duration(st.at), time.Duration(got), time.Duration(st.want))
		}
	}
}

// TestDrainedBeforeRun: the tap's reads fire nothing before Run starts
// (the daemon starts Run once the fast hold has somewhere to go) or after
// it returns (at shutdown the sockets drain).
func TestDrainedBeforeRun(t *testing.T) {
	ans := newFakeAnswerer("hit.example.")
	cfg := DefaultConfig()
	cfg.CacheMin = time.Millisecond
	h, err := New(cfg, ans)
	if err != nil {
		t.Fatal(err)
	}
	h.Query(time.Now().UnixNano(), podA, query(1, "hit.example."))
	time.Sleep(20 * time.Millisecond)
	h.Drained(time.Now().UnixNano(), 0)
	if n := ans.sentCount(); n != 0 {
		t.Fatalf("%d hedges before Run", n)
	}
	stop := runHedger(t, h)
	testkit.Eventually(t, 2*time.Second, "Run's timer firing the waiting query", func() bool { return ans.sentCount() == 1 })
	stop()
	h.Query(time.Now().UnixNano(), podB, query(2, "hit.example."))
	time.Sleep(20 * time.Millisecond)
	h.Drained(time.Now().UnixNano(), 0)
	if n := ans.sentCount(); n != 1 {
		t.Fatalf("%d hedges after Run returned, want the 1 from before", n)
	}
}

func TestNoAllocs(t *testing.T) {
	x := newHarness(t, DefaultConfig(), newFakeAnswerer())
	q := query(1, "a.example.")
	r := answer(q, "10.0.0.1")
	bad := q[:13]
	var at int64 = t0
	allocs := testing.AllocsPerRun(1000, func() {
		at += 1000
		x.h.Query(at, podA, q)
		x.h.Reply(at+500, podA, r)
		x.h.Query(at, podA, bad)
		x.h.Reply(at, podB, r) // unknown
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per Query+Reply", allocs)
	}
	if x.stat(replies, "matched") < 1000 {
		t.Fatal("replies did not match")
	}
}

func BenchmarkQueryReply(b *testing.B) {
	x := newHarness(b, DefaultConfig(), newFakeAnswerer())
	const n = 256
	var qs, rs [n][]byte
	for i := range n {
		qs[i] = query(uint16(i), "service-"+string(rune('a'+i%26))+".default.svc.cluster.local.")
		rs[i] = answer(qs[i], "10.0.0.1")
	}
	at := t0
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k := i % n
		at += 1000
		x.h.Query(at, podA, qs[k])
		x.h.Reply(at+500, podA, rs[k])
	}
}

func FuzzQueryReply(f *testing.F) {
	q := query(1, "a.example.")
	f.Add(q, answer(q, "10.0.0.1"), uint8(0))
	f.Add(q[:12], q, uint8(3))
	f.Add([]byte{0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1}, []byte{}, uint8(9))
	f.Fuzz(func(t *testing.T, qb, rb []byte, step uint8) {
		cfg := DefaultConfig()
		cfg.Table = 16
		x := newHarness(t, cfg, newFakeAnswerer("a.example."))
		clients := []netip.AddrPort{podA, podB, podC}
		for i := range 40 {
			c := clients[(int(step)+i)%3]
			x.h.Query(x.now, c, qb)
			if i%3 == 0 {
				x.h.Reply(x.now+ms, c, rb)
			}
			// Replies built from the fuzzed query, and our hedges' echoes.
			if len(qb) > 3 {
				r := append([]byte(nil), qb...)
				r[2] |= 0x80
				x.h.Reply(x.now+ms, c, r)
			}
			for _, s := range x.ans.sent {
				x.h.Reply(x.now, s.client, s.msg)
			}
			x.ans.sent = x.ans.sent[:0]
			for _, r := range x.ans.resolves {
				r.send(rb)
			}
			x.ans.resolves = x.ans.resolves[:0]
			x.advance(time.Duration(step%50+1) * time.Millisecond)
			x.check()
		}
		x.advance(4 * time.Second)
		x.check()
		if n := x.h.Stats().Entries; n != 0 {
			t.Fatalf("%d entries left after Linger", n)
		}
	})
}

// TestUpstreamNeed: upstream hedges for misses LocalDNS answers soon
// after the upstream deadline (only slow) are limited to the budget, and
// those over it wait NeedAfter more, which LocalDNS's answer ends; misses
// it still holds then prove needed, earn two more each, and are hedged,
// so a silent upstream's misses keep being hedged on time after the
// first, even from an empty budget.
func TestUpstreamNeed(t *testing.T) {
	tests := []struct {
		name string
		// budget is the upstream hedges left at the start (the burst is
		// the default).
		budget int
		// localdns is how long after its arrival LocalDNS answers each
		// miss; negative: never.
		localdns    time.Duration
		wantHedges  uint64 // of 100 misses, 10 a round
		wantDelayed uint64
		wantNeeded  uint64
		wantSlowest time.Duration // of the hedges' firing, after arrival
	}{
		{"slow LocalDNS: the budget, then none", 40, 260 * time.Millisecond, 40, 60, 0, 200 * time.Millisecond},
		{"held by a silent server: every one, on time", 40, 2 * time.Second, 100, 0, 100, 200 * time.Millisecond},
		{"never answered: every one, on time", 40, -1, 100, 0, 100, 200 * time.Millisecond},
		{"held, budget spent (by a slow spell): the first ones delayed, then on time", 0, 2 * time.Second, 100, 10, 100, 450 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.UpstreamRefill = 1e-6 // none over the test's few seconds
			ans := newFakeAnswerer()
			x := newHarness(t, cfg, ans)
			x.h.need.tokens = float64(tt.budget)
			type pending struct {
				q  []byte
				at int64
			}
			var held []pending
			arrived := map[uint16]int64{}
			var slowest time.Duration
			fired := 0
			id := uint16(0)
			for range 10 {
				for range 10 {
					id++
					q := query(id, fmt.Sprintf("miss%d.example.", id))
					x.h.Query(x.now, podA, q)
					arrived[id] = x.now
					if tt.localdns >= 0 {
						held = append(held, pending{q, x.now + int64(tt.localdns)})
					}
				}
				for end := x.now + int64(700*time.Millisecond); x.now < end; x.advance(5 * time.Millisecond) {
					for len(held) > 0 && held[0].at <= x.now {
						x.h.Reply(x.now, podA, answer(held[0].q, "10.0.0.1"))
						held = held[1:]
					}
					for ; fired < len(ans.resolves); fired++ {
						r := ans.resolves[fired]
						qid := uint16(r.query[0])<<8 | uint16(r.query[1])
						slowest = max(slowest, time.Duration(x.now-arrived[qid]))
						r.send(answer(r.query, "10.0.0.2"))
					}
				}
			}
			x.advance(3 * time.Second)
			st := x.h.Stats()
			if st.Hedges["upstream"] != tt.wantHedges || st.Delayed != tt.wantDelayed || st.Needed != tt.wantNeeded {
				t.Errorf("upstream hedges %d, delayed %d, needed %d; want %d, %d, %d",
					st.Hedges["upstream"], st.Delayed, st.Needed, tt.wantHedges, tt.wantDelayed, tt.wantNeeded)
			}
			if slowest > tt.wantSlowest {
				t.Errorf("slowest hedge fired %v after its query, want at most %v", slowest, tt.wantSlowest)
			}
			x.check()
		})
	}
}

// TestAnswered: a reply the tap matched to its query in the kernel
// (Answered) counts as a tracked query and a matched reply and gives
// LocalDNS's latency, with nothing tracked; a slow one asks the cache,
// with the reply's question as a query, whether it was a hit; a query
// that arrived while tracking was off counts as untracked; and a tracked
// query the same reply answers (a retransmission the tap showed) is
// settled as Reply settles it.
func TestAnswered(t *testing.T) {
	tests := []struct {
		name     string
		shown    bool  // a retransmission of the query was shown first (Query)
		tracking bool  // at the query's arrival
		lat      int64 // ms
		tracked  uint64
		lookups  int // Fresh's (the fake's lookups)
	}{
		{"fast", false, true, 1, 1, 0},
		{"slow: asks the cache", false, true, 40, 1, 1},
		{"untracked", false, false, 1, 0, 0},
		{"a shown retransmission settled", true, true, 1, 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := newHarness(t, DefaultConfig(), newFakeAnswerer("a.example."))
			if !tt.tracking {
				x.h.SetTracking(false)
			}
			msg := query(7, "a.example.")
			if tt.shown {
				x.h.Query(t0+ms, podA, msg)
			}
			x.now = t0 + tt.lat*ms
			if own := x.h.Answered(t0, t0+tt.lat*ms, podA, answer(msg, "10.0.0.1")); own {
				t.Fatal("Answered: own")
			}
			x.check()
			x.advance(time.Second)
			st := x.h.Stats()
			if st.Queries["tracked"] != tt.tracked || st.Entries != 0 || st.HedgesTotal() != 0 {
				t.Errorf("tracked %d, entries %d, hedges %d; want %d, 0, 0", st.Queries["tracked"], st.Entries, st.HedgesTotal(), tt.tracked)
			}
			wantMatched := uint64(1)
			if !tt.tracking {
				wantMatched = 0
			}
			if st.Replies["matched"] != wantMatched || st.Replies["unknown"] != 0 {
				t.Errorf("replies %v, want %d matched and none unknown", st.Replies, wantMatched)
			}
			if x.ans.lookups != tt.lookups {
				t.Errorf("cache asked %d times, want %d", x.ans.lookups, tt.lookups)
			}
		})
	}
}

// TestQueriesShownLate: a query shown after one that arrived later (the
// tap shows a query LocalDNS is slow with once it has waited in the
// kernel) is hedged at its own deadline, not behind the later one's.
func TestQueriesShownLate(t *testing.T) {
	x := newHarness(t, DefaultConfig(), newFakeAnswerer("a.example.", "b.example."))
	x.h.Query(t0+40*ms, podB, query(2, "b.example."))
	x.h.Query(t0, podA, query(1, "a.example."))
	x.check()
	cache, _ := x.h.Deadlines()
	x.advanceTo(t0 + int64(cache) + 5*ms)
	if n := x.ans.sentCount(); n != 1 {
		t.Fatalf("%d hedges sent by the earlier query's deadline, want 1 (its own)", n)
	}
	x.advance(50 * time.Millisecond)
	if n := x.ans.sentCount(); n != 2 {
		t.Fatalf("%d hedges sent, want 2", n)
	}
	x.check()
}
