package cache

import (
	"math"
	"sync/atomic"
	"time"
	"unsafe"
)

// memo remembers, per shard, which keys hold a mirrored answer that a
// repeat of it may skip, so that InsertMirror's check of the reply LocalDNS
// sends for almost every query reads one slot instead of taking the
// shard's lock and reading the LRU's map, its list element and the entry's
// key: with LocalDNS on the same core those are cache misses, and they
// were a quarter of the tap's cost (bench-mirror with -perf).
//
// It is 4-way set-associative and lossy: a slot holds one key's hash,
// content sum and the second before which the entry is neither stale nor
// expiring, and a key may be in any of its set's four slots, which share
// one cache line. A slot is written by the slow path of repeat, under the
// shard's read lock, and cleared by every change to that key's entry,
// under its write lock, so a slot never outlives what it describes. A key
// whose set others filled goes the slow way. (Direct-mapped, about one key
// in seven of bench-mirror's 5,000 names found its slot taken by another,
// and took the slow way.) The memo holds only the 64-bit hash, not the key:
// two keys with one hash (about 2^-64) would cost one skipped insert, never
// a wrong answer, since the memo serves nothing.
type memo struct {
	slots []memoSlot
	mask  uint64
}

// memoSlot is read without a lock: h, then v, then h again, and v counts
// only if both reads of h are the key's. A writer claims the slot (h =
// memoClaimed), stores v, then h, so that a reader never takes one key's v
// for another's.
type memoSlot struct {
	h atomic.Uint64 // the key's hash; 0 empty, memoClaimed being written
	v atomic.Uint64 // content sum << 32 | unix second the repeat holds until
}

const memoClaimed = 1

// Slots per shard: a quarter of the shard's entries, as a power of two,
// from 64 to 512 (the default 120,000 entries in 64 shards: 256 each,
// 256 KiB in all). A node's working set of names is far smaller than its
// bound.
const (
	minMemoSlots = 64
	maxMemoSlots = 512
)

func newMemo(entries int) memo {
	n := minMemoSlots
	for n < maxMemoSlots && n*2 <= entries/4 {
		n *= 2
	}
	return memo{slots: make([]memoSlot, n), mask: uint64(n - 1)}
}

// memoWays is the slots of a set: 4 × 16 bytes, one cache line.
const memoWays = 4

// set is h's set of slots, picked from bits the shard choice (the low
// ones) leaves.
func (m *memo) set(h uint64) []memoSlot {
	i := (h >> 32) & m.mask &^ (memoWays - 1)
	return m.slots[i : i+memoWays : i+memoWays]
}

// repeats reports whether a mirrored reply with content sum, under the key
// hashed to h, repeats an entry that is fresh and not expiring at now.
func (m *memo) repeats(h uint64, sum uint32, now int64) bool {
	set := m.set(h)
	for i := range set {
		sl := &set[i]
		if sl.h.Load() != h {
			continue
		}
		v := sl.v.Load()
		if sl.h.Load() != h {
			return false
		}
		return uint32(v>>32) == sum && now/int64(time.Second) < int64(uint32(v))
	}
	return false
}

// prefetch asks the CPU to fetch h's set (one cache line).
func (m *memo) prefetch(h uint64) { prefetch(unsafe.Pointer(&m.set(h)[0])) }

// put remembers that replies with content sum repeat h's entry until
// until (unix nanoseconds); the caller holds the shard's read lock. It
// gives up if another writer has the slot.
func (m *memo) put(h uint64, sum uint32, until int64) {
	secs := until / int64(time.Second) // rounded down: the memo may end early, never late
	if h <= memoClaimed || secs <= 0 || secs > math.MaxUint32 {
		return
	}
	// The slot holding h, else an empty one, else the one h's bits name.
	set := m.set(h)
	var sl *memoSlot
	for i := range set {
		switch old := set[i].h.Load(); {
		case old == h:
			sl = &set[i]
		case old == 0 && sl == nil:
			sl = &set[i]
		}
	}
	if sl == nil {
		// From the top bits: the shard and the set take low ones.
		sl = &set[(h>>56)%memoWays]
	}
	old := sl.h.Load()
	if old == memoClaimed || !sl.h.CompareAndSwap(old, memoClaimed) {
		return
	}
	sl.v.Store(uint64(sum)<<32 | uint64(secs))
	sl.h.Store(h)
}

// forget clears every slot of h's set that holds h (two puts at once may
// both have written it); the caller holds the shard's write lock, so no
// put is under way.
func (m *memo) forget(h uint64) {
	set := m.set(h)
	for i := range set {
		if set[i].h.Load() == h {
			set[i].h.Store(0)
		}
	}
}

// clear empties every slot; the caller holds the shard's write lock.
func (m *memo) clear() {
	for i := range m.slots {
		m.slots[i].h.Store(0)
	}
}

// repeatUntil is when an entry stored at stored and fresh until fresh
// starts expiring (see expiring), rounded so as to end early rather than
// late.
func repeatUntil(stored, fresh int64) int64 {
	life := fresh - stored
	return fresh - max(int64(time.Second), (life+9)/10)
}
