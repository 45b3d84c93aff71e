package cache

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/wire"
)

func TestMemo(t *testing.T) {
	const (
		h     = uint64(0xabcd) << 32 // set 0xabcd & mask; its top bits name way 0
		other = h | 0x55             // the same set, another key
		// After h and three more keys fill h's set, fifth, whose top bits
		// name the way h took (the first empty one, 0), takes it.
		fifth = h | 0x99
		sum   = 7
		sec   = int64(time.Second)
		until = 1_800_000_100*sec + sec/2
	)
	tests := []struct {
		name string
		do   func(m *memo)
		h    uint64
		sum  uint32
		now  int64
		want bool
	}{
		{"empty", func(m *memo) {}, h, sum, until - 10*sec, false},
		{"held", func(m *memo) { m.put(h, sum, until) }, h, sum, until - 10*sec, true},
		{"other sum", func(m *memo) { m.put(h, sum, until) }, h, sum + 1, until - 10*sec, false},
		{"other key, same set", func(m *memo) { m.put(h, sum, until) }, other, sum, until - 10*sec, false},
		{"last whole second before until", func(m *memo) { m.put(h, sum, until) }, h, sum, until - sec/2 - 1, true},
		{"within until's second: ends early", func(m *memo) { m.put(h, sum, until) }, h, sum, until - sec/4, false},
		{"after until", func(m *memo) { m.put(h, sum, until) }, h, sum, until + sec, false},
		{"forgotten", func(m *memo) { m.put(h, sum, until); m.forget(h) }, h, sum, until - 10*sec, false},
		{"another key's forget leaves it", func(m *memo) { m.put(h, sum, until); m.forget(other) }, h, sum, until - 10*sec, true},
		{"another key beside it in the set", func(m *memo) { m.put(h, sum, until); m.put(other, sum, until) }, h, sum, until - 10*sec, true},
		{"a full set: the fifth key takes the way its bits name", func(m *memo) {
			for _, k := range []uint64{h, h | 1, h | 2, h | 3, fifth} {
				m.put(k, sum, until)
			}
		}, h, sum, until - 10*sec, false},
		{"a full set: the fifth key held", func(m *memo) {
			for _, k := range []uint64{h, h | 1, h | 2, h | 3, fifth} {
				m.put(k, sum, until)
			}
		}, fifth, sum, until - 10*sec, true},
		{"a full set: the others kept", func(m *memo) {
			for _, k := range []uint64{h, h | 1, h | 2, h | 3, fifth} {
				m.put(k, sum, until)
			}
		}, h | 2, sum, until - 10*sec, true},
		{"forget clears every copy", func(m *memo) {
			set := m.set(h)
			for _, i := range []int{0, 2} {
				set[i].v.Store(uint64(sum)<<32 | uint64(until/sec))
				set[i].h.Store(h)
			}
			m.forget(h)
		}, h, sum, until - 10*sec, false},
		{"cleared", func(m *memo) { m.put(h, sum, until); m.clear() }, h, sum, until - 10*sec, false},
		{"claimed slots: put gives up", func(m *memo) {
			set := m.set(h)
			for i := range set {
				set[i].h.Store(memoClaimed)
			}
			m.put(h, sum, until)
		}, h, sum, until - 10*sec, false},
		{"hash 0 is never held", func(m *memo) { m.put(0, sum, until) }, 0, sum, until - 10*sec, false},
		{"until before 1970", func(m *memo) { m.put(h, sum, -until) }, h, sum, -until - 10*sec, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newMemo(1000)
			tt.do(&m)
			if got := m.repeats(tt.h, tt.sum, tt.now); got != tt.want {
				t.Errorf("repeats = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestMemoSize(t *testing.T) {
	for _, tt := range []struct{ entries, want int }{
		{1, minMemoSlots}, {256, minMemoSlots}, {1024, 256}, {1875, 256}, {2048, 512}, {1 << 20, maxMemoSlots},
	} {
		if got := len(newMemo(tt.entries).slots); got != tt.want {
			t.Errorf("newMemo(%d): %d slots, want %d", tt.entries, got, tt.want)
		}
	}
}

// TestRepeatUntil: the memo holds a repeat until the last nanosecond
// before the entry starts expiring, or one earlier, never later.
func TestRepeatUntil(t *testing.T) {
	stored := int64(1_800_000_000) * int64(time.Second)
	for _, life := range []time.Duration{2 * time.Second, 5 * time.Second, 10*time.Second + 3, 300 * time.Second, 3600*time.Second + 7} {
		fresh := stored + int64(life)
		until := repeatUntil(stored, fresh)
		if expiring(stored, fresh, until-1) {
			t.Errorf("life %v: expiring already at until-1ns", life)
		}
		if !expiring(stored, fresh, until+1) {
			t.Errorf("life %v: not expiring yet at until+1ns", life)
		}
	}
}

// memoHeld counts the memo slots that hold a key, in every shard.
func memoHeld(c *Cache) int {
	n := 0
	for i := range c.shards {
		for j := range c.shards[i].memo.slots {
			if c.shards[i].memo.slots[j].h.Load() > memoClaimed {
				n++
			}
		}
	}
	return n
}

// TestMemoHoldsAWorkingSet: at the default size (16,384 slots), bench-
// mirror's 5,000 names, each mirrored and repeated, are nearly all held in
// the memo at once: 4,953 of them when this was written. Direct-mapped,
// about 14% of them would have shared a slot with another and pushed each
// other out.
func TestMemoHoldsAWorkingSet(t *testing.T) {
	c, _ := newTestCache(t, nil)
	const names = 5000
	for pass := range 3 {
		for i := range names {
			// Stored, confirmed, then held in the memo.
			if err := c.InsertMirror(mirrorA(t, fmt.Sprintf("svc-%d.default.svc.cluster.local.", i), 1)); err != nil && !errors.Is(err, errHaveFresh) {
				t.Fatalf("pass %d, name %d: %v", pass, i, err)
			}
		}
	}
	if held := memoHeld(c); held < names*98/100 {
		t.Errorf("%d of %d names held in the memo, want at least 98%%", held, names)
	}
}

// TestMirrorRepeatMemo: once a mirrored answer is confirmed, its repeats
// are skipped through the memo, and whatever changes the entry makes the
// next repeat go the slow way, so that LocalDNS's answer is stored again.
func TestMirrorRepeatMemo(t *testing.T) {
	const name = "memo.example."
	tests := []struct {
		name   string
		change func(t *testing.T, c *Cache, clk *testClock)
	}{
		{"upstream answer replaces it", func(t *testing.T, c *Cache, clk *testClock) {
			if err := c.InsertMsg(reply(t, name, dns.TypeA, 0, []string{name + " 30 IN A 192.0.2.99"}, nil)); err != nil {
				t.Fatal(err)
			}
		}},
		{"purged", func(t *testing.T, c *Cache, clk *testClock) { c.Purge() }},
		{"evicted", func(t *testing.T, c *Cache, clk *testClock) {
			for _, n := range names("evict", 0, 20) {
				if err := c.InsertMsg(reply(t, n, dns.TypeA, 0, []string{n + " 30 IN A 192.0.2.1"}, nil)); err != nil {
					t.Fatal(err)
				}
			}
		}},
		{"expiring", func(t *testing.T, c *Cache, clk *testClock) { clk.Advance(28 * time.Second) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, clk := newTestCache(t, func(c *Config) { c.Shards, c.MaxEntries = 1, 10 })
			raw := mirrorA(t, name, 1)
			for i, want := range []error{nil, errHaveFresh, errHaveFresh} {
				if err := c.InsertMirror(raw); !errors.Is(err, want) {
					t.Fatalf("mirrored copy %d: %v, want %v", i+1, err, want)
				}
			}
			if got := memoHeld(c); got != 1 {
				t.Fatalf("%d memo slots hold a key after a confirmed repeat, want 1", got)
			}
			before := c.Stats().Inserts
			tt.change(t, c, clk)
			if got := memoHeld(c); got != 0 && tt.name != "expiring" {
				t.Errorf("%d memo slots still hold a key after the entry changed", got)
			}
			if err := c.InsertMirror(raw); err != nil {
				t.Fatalf("the mirrored answer after the change: %v, want it stored", err)
			}
			if c.Stats().Inserts == before {
				t.Error("the mirrored answer was not stored again")
			}
			q := wireQuery(t, query(t, name, dns.TypeA, -1, false))
			if st := c.Status(q); !st.IsFresh() {
				t.Errorf("after storing LocalDNS's answer again: %s, want fresh", st)
			}
		})
	}
}

// BenchmarkInsertMirrorRepeatNames: the cost of the check LocalDNS's reply to
// almost every query goes through, memo on (the path taken) and off (the
// shard's lock and LRU, as before the memo), over a working set of names
// large enough not to stay in the CPU's caches.
func BenchmarkInsertMirrorRepeatNames(b *testing.B) {
	for _, tc := range []struct {
		name           string
		memo, prefetch bool
		parsed, hint   bool
	}{{"memo=true", true, false, false, false}, {"memo=false", false, false, false, false},
		{"memo=true,prefetch", true, true, false, false},
		{"memo=true,prefetch,parsed", true, true, true, false}, // the tap's path before the hint
		{"memo=true,prefetch,parsed,hint", true, true, true, true}} {
		b.Run(tc.name, func(b *testing.B) {
			c, _ := newTestCache(b, nil)
			raws := make([][]byte, 5000)
			qs := make([]wire.Query, len(raws))
			for i := range raws {
				raws[i] = mirrorA(b, fmt.Sprintf("svc-%d.default.svc.cluster.local.", i), 1)
				if err := wire.ParseQuery(raws[i], &qs[i]); err != nil {
					b.Fatal(err)
				}
				for range 2 {
					if err := c.InsertMirror(raws[i]); err != nil && !errors.Is(err, errHaveFresh) {
						b.Fatal(err)
					}
				}
			}
			if !tc.memo {
				for i := range c.shards { // every slot claimed: repeats and put give up
					for j := range c.shards[i].memo.slots {
						c.shards[i].memo.slots[j].h.Store(memoClaimed)
					}
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			var hint, next uint64
			for i := range b.N {
				if tc.prefetch {
					// As the tap does: the next reply's set asked for
					// before this one is checked.
					next = c.PrefetchMirror(&qs[((i+1)*7919)%len(raws)])
				}
				if !tc.hint {
					hint = 0
				}
				j := (i * 7919) % len(raws)
				var err error
				if tc.parsed {
					err = c.InsertMirrorParsed(raws[j], &qs[j], hint)
				} else {
					err = c.InsertMirror(raws[j])
				}
				if err != errHaveFresh {
					b.Fatalf("repeat: %v", err)
				}
				hint = next
			}
		})
	}
}

// TestPrefetchMirror: the hint allocates nothing, takes a question of any
// shape, and changes nothing InsertMirror then does.
func TestPrefetchMirror(t *testing.T) {
	c, _ := newTestCache(t, nil)
	raw := mirrorA(t, "a.example.", 1)
	var q wire.Query
	if err := wire.ParseQuery(raw, &q); err != nil {
		t.Fatal(err)
	}
	if allocs := testing.AllocsPerRun(100, func() { c.PrefetchMirror(&q) }); allocs != 0 {
		t.Errorf("PrefetchMirror: %v allocations, want 0", allocs)
	}
	if h := c.PrefetchMirror(&wire.Query{}); h != 0 { // no question: nothing to fetch
		t.Errorf("PrefetchMirror without a question: hint %#x, want 0", h)
	}
	for i, want := range []error{nil, errHaveFresh} {
		c.PrefetchMirror(&q)
		if err := c.InsertMirror(raw); !errors.Is(err, want) {
			t.Errorf("insert %d after the hint: %v, want %v", i+1, err, want)
		}
	}
	// The hint is the key's hash: a repeat it finds is the one found
	// without it, for a name filed with and without one.
	other := mirrorA(t, "b.example.", 1)
	var oq wire.Query
	if err := wire.ParseQuery(other, &oq); err != nil {
		t.Fatal(err)
	}
	for i, want := range []error{nil, errHaveFresh, errHaveFresh} {
		hint := c.PrefetchMirror(&oq)
		if i == 2 {
			hint = 0
		}
		if err := c.InsertMirrorParsed(other, &oq, hint); !errors.Is(err, want) {
			t.Errorf("b.example. insert %d (hint %#x): %v, want %v", i+1, hint, err, want)
		}
	}
	if err := c.InsertMirrorParsed(raw, &q, c.PrefetchMirror(&q)); !errors.Is(err, errHaveFresh) {
		t.Errorf("a.example. with the hint: %v, want a repeat", err)
	}
	hint := c.PrefetchMirror(&q)
	if allocs := testing.AllocsPerRun(100, func() { _ = c.InsertMirrorParsed(raw, &q, hint) }); allocs != 0 {
		t.Errorf("InsertMirrorParsed with a hint: %v allocations, want 0", allocs)
	}
}
