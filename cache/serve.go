package cache

import (
	"bytes"
	"encoding/binary"
	"sync/atomic"
	"time"

	"github.com/dnsstandby/dnsstandby/wire"
)

// Serve looks up the query q (parsed by wire.ParseQuery) and, on a hit,
// writes the answer into dst and returns its length. limit is the largest
// answer the client accepts (q.PayloadLimit() over UDP, 65535 over TCP);
// a larger answer is cut as CoreDNS (LocalDNS) cuts it: as many whole
// records as fit, in section order, with TC=1, so that the client retries
// over TCP and a client that ignores TC (musl before 1.2.4) has what fit.
//
// A stale entry is written only if allowStale; otherwise Serve returns
// (0, Stale), counted as a miss, so the caller can try upstreams first and
// come back. Serve returns (0, Miss) when nothing is servable, including
// when dst cannot hold even a truncated answer. It does not allocate.
//
// Every call counts once, as a hit, a stale hit or a miss: call it once
// per client query, and ServeAgain or WriteFresh for a second look.
func (c *Cache) Serve(dst []byte, q *wire.Query, limit int, allowStale bool) (int, Status) {
	return c.serve(dst, q, limit, allowStale, countAll)
}

// ServeAgain is Serve for a second look at a query that Serve counted as
// a miss (a stale entry held back, upstreams failed): it counts the answer
// it serves, fresh or stale, and not the miss again.
func (c *Cache) ServeAgain(dst []byte, q *wire.Query, limit int, allowStale bool) (int, Status) {
	return c.serve(dst, q, limit, allowStale, countServed)
}

// WriteFresh writes q's answer as Serve does if the entry is fresh, and
// returns 0 if not; it counts nothing. It is for answering from the entry
// an upstream reply has just filled: an upstream answer, not a hit.
func (c *Cache) WriteFresh(dst []byte, q *wire.Query, limit int) int {
	n, st := c.serve(dst, q, limit, false, countNone)
	if !st.IsFresh() {
		return 0
	}
	return n
}

// countMode says which outcomes of a lookup are counted.
type countMode uint8

const (
	countAll    countMode = iota // hits, stale hits and misses
	countServed                  // hits and stale hits
	countNone
)

func (c *Cache) serve(dst []byte, q *wire.Query, limit int, allowStale bool, count countMode) (int, Status) {
	if q.Opcode() != 0 || len(q.QName) == 0 {
		return 0, Miss
	}
	var kb [maxKeyLen]byte
	key := kb[:queryKey(&kb, q)]
	h := c.hash(key)
	s := c.shardFor(h)
	now := c.now().UnixNano()
	e, ok := s.get(h, now)
	if !ok || !bytes.Equal(e.key(), key) {
		s.count(&s.misses, count == countAll)
		return 0, Miss
	}

	var ttl uint32
	st := Fresh
	switch {
	case now < e.fresh:
		ttl = agedTTL(e.ttl, now-e.stored)
		if expiring(e.stored, e.fresh, now) {
			st = Expiring
		}
	case now < c.staleUntil(e):
		if !allowStale {
			s.count(&s.misses, count == countAll)
			return 0, Stale
		}
		st, ttl = Stale, uint32(c.cfg.StaleTTL/time.Second)
	default:
		s.removeIf(h, e.stored)
		s.count(&s.misses, count == countAll)
		return 0, Miss
	}

	n := c.write(dst, q, &e, ttl, limit)
	switch {
	case n == 0:
		s.count(&s.misses, count == countAll)
		return 0, Miss
	case st == Stale:
		s.count(&s.staleHits, count != countNone)
	default:
		s.count(&s.hits, count != countNone)
	}
	return n, st
}

// count adds one to n if count is set.
func (s *shard) count(n *atomic.Uint64, count bool) {
	if count {
		n.Add(1)
	}
}

// Status reports what Serve would find for q (Fresh, Expiring, Stale or
// Miss), without writing, counting or touching the LRU order.
func (c *Cache) Status(q *wire.Query) Status {
	if q.Opcode() != 0 || len(q.QName) == 0 {
		return Miss
	}
	var kb [maxKeyLen]byte
	key := kb[:queryKey(&kb, q)]
	h := c.hash(key)
	s := c.shardFor(h)
	s.mu.RLock()
	e, ok := s.lru.Peek(h)
	s.mu.RUnlock()
	now := c.now().UnixNano()
	switch {
	case !ok || !bytes.Equal(e.key(), key):
		return Miss
	case now < e.fresh && expiring(e.stored, e.fresh, now):
		return Expiring
	case now < e.fresh:
		return Fresh
	case now < c.staleUntil(e):
		return Stale
	}
	return Miss
}

// expiring reports whether now is in the refresh window of an entry fresh
// from stored until fresh: its last tenth, and at least its last second.
func expiring(stored, fresh, now int64) bool {
	left := fresh - now
	return left <= int64(time.Second) || left*10 <= fresh-stored
}

// agedTTL is ttl minus age, age rounded up to whole seconds so that a
// served TTL never exceeds the original minus the time it was held.
func agedTTL(ttl uint32, age int64) uint32 {
	if age <= 0 {
		return ttl
	}
	secs := (age + int64(time.Second) - 1) / int64(time.Second)
	if secs >= int64(ttl) {
		return 0
	}
	return ttl - uint32(secs)
}

// Answer flags taken from the stored response; RD and CD come from the
// query (RFC 1035 §4.1.1, RFC 4035 §3.1.6). Opcode is QUERY. AA is set on
// every answer, as CoreDNS's cache sets it on every hit (some clients drop
// non-authoritative answers); TC is set only when records had to be left
// out.
const storedFlags = wire.FlagQR | wire.FlagRA | wire.FlagAD | wire.RcodeMask

// write renders e as the answer to q into dst. See Serve.
func (c *Cache) write(dst []byte, q *wire.Query, e *entry, ttl uint32, limit int) int {
	var nsid []byte
	optLen := 0
	if q.EDNS {
		if q.NSID {
			nsid = c.nsid
		}
		optLen = wire.OPTLen(nsid)
	}
	limit = min(limit, len(dst))
	m := e.msg()
	flags := binary.BigEndian.Uint16(m[2:])&storedFlags | wire.FlagAA | q.Flags&(wire.FlagRD|wire.FlagCD)
	if !q.DO && q.Flags&wire.FlagAD == 0 {
		flags &^= wire.FlagAD // RFC 6840 §5.8: AD only for clients that asked for it
	}

	// What fits: the whole message, or, as miekg/dns's Msg.Truncate
	// (CoreDNS's request.Scrub) cuts it, the whole records that fit in
	// order — answer, authority, additional — up to the first one that
	// does not, with TC set; the OPT is kept and counted.
	end, counts := len(m), [3]uint16{
		binary.BigEndian.Uint16(m[6:]), binary.BigEndian.Uint16(m[8:]), binary.BigEndian.Uint16(m[10:]),
	}
	if end+optLen > limit {
		qEnd := wire.HeaderLen + e.questionLen()
		if qEnd+optLen > limit {
			return 0
		}
		end, counts = fitRecords(m, qEnd, limit-optLen, counts)
		flags |= wire.FlagTC
	}

	n := copy(dst, m[:end])
	// The client's name has the stored name's length (the key matched),
	// so compression pointers into the question stay valid.
	copy(dst[wire.HeaderLen:], q.QName)
	offs := e.ttlOffsets()
	for i := 0; i+1 < len(offs); i += 2 {
		off := int(binary.BigEndian.Uint16(offs[i:]))
		if off >= end {
			break // offsets ascend: the rest were cut
		}
		binary.BigEndian.PutUint32(dst[off:], ttl)
	}
	binary.BigEndian.PutUint16(dst, q.ID)
	binary.BigEndian.PutUint16(dst[2:], flags)
	binary.BigEndian.PutUint16(dst[6:], counts[0])
	binary.BigEndian.PutUint16(dst[8:], counts[1])
	arcount := counts[2]
	if optLen > 0 {
		n += wire.PutOPT(dst[n:], c.cfg.UDPSize, q.DO, nsid)
		arcount++
	}
	binary.BigEndian.PutUint16(dst[10:], arcount)
	return n
}

// fitRecords walks the records of msg (a stored, well-formed message whose
// question ends at qEnd, with counts its section counts) and returns the
// end of the longest run of whole records from the first that ends within
// size bytes, and how many of each section's records that run holds. The
// run stops at the first record that does not fit, even if a smaller one
// after it would: later sections get nothing once one record is cut.
// Stored messages are compressed with pointers only backwards, so any
// such prefix is a well-formed message on its own.
func fitRecords(msg []byte, qEnd, size int, counts [3]uint16) (int, [3]uint16) {
	var kept [3]uint16
	off := qEnd
	for sec := range counts {
		for range counts[sec] {
			next, _, err := wire.SkipRR(msg, off)
			if err != nil || next > size {
				return off, kept
			}
			off = next
			kept[sec]++
		}
	}
	return off, kept
}
