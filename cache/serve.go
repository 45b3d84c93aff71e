package cache

import (
	"bytes"
	"encoding/binary"
	"time"

	"github.com/dnsstandby/dnsstandby/wire"
)

// Serve looks up the query q (parsed by wire.ParseQuery) and, on a hit,
// writes the answer into dst and returns its length. limit is the largest
// answer the client accepts (q.PayloadLimit() over UDP, 65535 over TCP);
// a larger answer is written truncated (TC=1, empty sections) so the client
// retries over TCP.
//
// A stale entry is written only if allowStale; otherwise Serve returns
// (0, Stale) so the caller can try upstreams first and come back. Serve
// returns (0, Miss) when nothing is servable, including when dst cannot
// hold even a truncated answer. It does not allocate.
func (c *Cache) Serve(dst []byte, q *wire.Query, limit int, allowStale bool) (int, Status) {
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
		s.misses.Add(1)
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
			return 0, Stale
		}
		st, ttl = Stale, uint32(c.cfg.StaleTTL/time.Second)
	default:
		s.removeIf(h, e.stored)
		s.misses.Add(1)
		return 0, Miss
	}

	n := c.write(dst, q, &e, ttl, limit)
	switch {
	case n == 0:
		s.misses.Add(1)
		return 0, Miss
	case st == Stale:
		s.staleHits.Add(1)
	default:
		s.hits.Add(1)
	}
	return n, st
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
// query (RFC 1035 §4.1.1, RFC 4035 §3.1.6). Opcode is QUERY, TC is unset.
const storedFlags = wire.FlagQR | wire.FlagAA | wire.FlagRA | wire.FlagAD | wire.RcodeMask

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
	flags := binary.BigEndian.Uint16(m[2:])&storedFlags | q.Flags&(wire.FlagRD|wire.FlagCD)
	if !q.DO && q.Flags&wire.FlagAD == 0 {
		flags &^= wire.FlagAD // RFC 6840 §5.8: AD only for clients that asked for it
	}
	arcount := binary.BigEndian.Uint16(m[10:])

	var n int
	if len(m)+optLen <= limit {
		n = copy(dst, m)
		// The client's name has the stored name's length (the key matched),
		// so compression pointers into the question stay valid.
		copy(dst[wire.HeaderLen:], q.QName)
		offs := e.ttlOffsets()
		for i := 0; i+1 < len(offs); i += 2 {
			binary.BigEndian.PutUint32(dst[binary.BigEndian.Uint16(offs[i:]):], ttl)
		}
	} else {
		n = wire.HeaderLen + e.questionLen()
		if n+optLen > limit {
			return 0
		}
		copy(dst[wire.HeaderLen:n], m[wire.HeaderLen:])
		copy(dst[wire.HeaderLen:], q.QName)
		clear(dst[4:wire.HeaderLen])
		binary.BigEndian.PutUint16(dst[4:], 1)
		flags |= wire.FlagTC
		arcount = 0
	}
	binary.BigEndian.PutUint16(dst, q.ID)
	binary.BigEndian.PutUint16(dst[2:], flags)
	if optLen > 0 {
		n += wire.PutOPT(dst[n:], c.cfg.UDPSize, q.DO, nsid)
		arcount++
	}
	binary.BigEndian.PutUint16(dst[10:], arcount)
	return n
}
