package hedge

import (
	"bytes"
	"net/netip"

	"github.com/dnsstandby/dnsstandby/wire"
)

// Entry states.
const (
	stFree     uint8 = iota
	stCache          // waiting for the cache deadline (queue qlCache)
	stFiring         // at the cache deadline, being looked up (no queue)
	stUpstream       // cache had nothing: waiting for the upstream deadline (qlUpstream)
	stLate           // past it, over the upstream budget: waiting Config.NeedAfter more (qlLate)
	stHedged         // hedged or being resolved: waiting for the outcome (qlLinger)
)

// Queues, each in arrival (or hedge) order, so every deadline is the head's.
const (
	qlCache = iota
	qlUpstream
	qlLate
	qlLinger
	numQueues
)

// entry is one tracked query. Links are slot indexes, -1 for none.
type entry struct {
	at       int64 // arrival, unix ns
	hedgedAt int64
	client   netip.AddrPort
	key      uint64 // keyHash
	sent     uint64 // sum of the hedge sent; 0 none (yet)
	next     int32  // queue (or free list)
	prev     int32
	chain    int32 // index bucket
	gen      uint32
	id       uint16
	qlen     uint16
	qend     uint16 // end of the question section
	state    uint8
	queue    int8 // -1 none

	miss      bool // the cache had no answer: LocalDNS's slow path
	hit       bool // hedged from the cache
	resolving bool // Resolve called, send not yet
	answered  bool // LocalDNS replied after the hedge
	ownSeen   bool // the tap saw our hedge leave
}

type queue struct{ head, tail int32 }

// table is the fixed-size store: entries, their query bytes, a chained
// hash index and the queues. Allocated once by init; the caller locks.
type table struct {
	e       []entry
	queries []byte // len(e) × MaxQueryLen
	buckets []int32
	mask    uint64
	free    int32
	q       [numQueues]queue
	n       int // entries in use
}

func (t *table) init(size int) {
	t.e = make([]entry, size)
	t.queries = make([]byte, size*wire.MaxQueryLen)
	nb := 1
	for nb < 2*size {
		nb <<= 1
	}
	t.buckets = make([]int32, nb)
	for i := range t.buckets {
		t.buckets[i] = -1
	}
	t.mask = uint64(nb - 1)
	for i := range t.e {
		t.e[i].next = int32(i + 1)
		t.e[i].queue = -1
	}
	t.e[size-1].next = -1
	t.free = 0
	for i := range t.q {
		t.q[i] = queue{-1, -1}
	}
}

// query returns slot i's query bytes, n long.
func (t *table) query(i int32, n int) []byte {
	off := int(i) * wire.MaxQueryLen
	return t.queries[off : off+n]
}

// question returns the stored question section of entry i.
func (t *table) question(i int32) []byte {
	e := &t.e[i]
	return t.query(i, int(e.qend))[wire.HeaderLen:]
}

// alloc takes a free slot, or returns -1.
func (t *table) alloc() int32 {
	i := t.free
	if i < 0 {
		return -1
	}
	e := &t.e[i]
	t.free = e.next
	gen := e.gen + 1
	*e = entry{gen: gen, next: -1, prev: -1, chain: -1, queue: -1}
	t.n++
	return i
}

// insert adds entry i (its key set) to the index.
func (t *table) insert(i int32) {
	b := t.e[i].key & t.mask
	t.e[i].chain = t.buckets[b]
	t.buckets[b] = i
}

// find returns the entry for the key, or -1.
func (t *table) find(key uint64, client netip.AddrPort, id uint16, question []byte) int32 {
	for i := t.buckets[key&t.mask]; i >= 0; i = t.e[i].chain {
		e := &t.e[i]
		if e.key == key && e.id == id && e.client == client && bytes.Equal(t.question(i), question) {
			return i
		}
	}
	return -1
}

// remove unlinks entry i from its queue and the index and frees it.
func (t *table) remove(i int32) {
	e := &t.e[i]
	t.unlink(i)
	p := &t.buckets[e.key&t.mask]
	for *p != i {
		p = &t.e[*p].chain
	}
	*p = e.chain
	e.state = stFree
	e.gen++ // a Resolve callback or a firing lookup for it is now stale
	e.next = t.free
	t.free = i
	t.n--
}

// push appends entry i to queue q.
func (t *table) push(q int, i int32) {
	e := &t.e[i]
	e.queue, e.next, e.prev = int8(q), -1, t.q[q].tail
	if e.prev >= 0 {
		t.e[e.prev].next = i
	} else {
		t.q[q].head = i
	}
	t.q[q].tail = i
}

// pushByArrival puts entry i into queue q after every entry that
// arrived before it, so that the queue stays in arrival order when a
// query is shown late: the tap shows a query LocalDNS is slow to answer
// when it has waited in the kernel a while, after queries it read from
// the ring that arrived later. It walks from the tail, so an in-order
// arrival costs what push does.
func (t *table) pushByArrival(q int, i int32) {
	at := t.e[i].at
	after := t.q[q].tail
	for after >= 0 && t.e[after].at > at {
		after = t.e[after].prev
	}
	if after == t.q[q].tail {
		t.push(q, i)
		return
	}
	e := &t.e[i]
	e.queue, e.prev = int8(q), after
	if after >= 0 {
		e.next = t.e[after].next
		t.e[after].next = i
	} else {
		e.next = t.q[q].head
		t.q[q].head = i
	}
	t.e[e.next].prev = i
}

// unlink takes entry i out of its queue, if any.
func (t *table) unlink(i int32) {
	e := &t.e[i]
	if e.queue < 0 {
		return
	}
	q := &t.q[e.queue]
	if e.prev >= 0 {
		t.e[e.prev].next = e.next
	} else {
		q.head = e.next
	}
	if e.next >= 0 {
		t.e[e.next].prev = e.prev
	} else {
		q.tail = e.prev
	}
	e.queue, e.next, e.prev = -1, -1, -1
}
