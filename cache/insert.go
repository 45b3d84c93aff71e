package cache

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/wire"
)

// Reason says why a response was not cached.
type Reason uint8

const (
	ReasonMalformed     Reason = iota // not a parsable DNS message
	ReasonNotResponse                 // QR=0
	ReasonTruncated                   // TC=1: partial answers are never cached
	ReasonOpcode                      // opcode other than QUERY
	ReasonQuestionCount               // not exactly one question
	ReasonRcode                       // an rcode that is not cached (or SERVFAIL with servfail TTL 0)
	ReasonNoSOA                       // a negative answer without an SOA (RFC 2308 §5)
	ReasonTooLarge                    // larger than a shard may hold
	ReasonKeptAnswer                  // a failure that would have replaced a servable answer
	ReasonHaveFresh                   // InsertMirror: the same answer is already held fresh
	numReasons
)

var reasonNames = [numReasons]string{
	"malformed", "not_response", "truncated", "opcode", "question_count",
	"rcode", "no_soa", "too_large", "kept_answer", "have_fresh",
}

// Reasons returns every Reason, in order: for counters by reason that
// start at zero, as the cache's own do.
func Reasons() []Reason {
	out := make([]Reason, numReasons)
	for i := range out {
		out[i] = Reason(i)
	}
	return out
}

func (r Reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", r)
}

// errHaveFresh is the (immutable) rejection InsertMirror returns for a
// repeat.
var errHaveFresh = &RejectError{Reason: ReasonHaveFresh}

// ErrRejected matches every RejectError with errors.Is.
var ErrRejected = errors.New("response not cached")

// RejectError tells why Insert did not cache a response.
type RejectError struct {
	Reason Reason
	Err    error // detail, or nil
}

func (e *RejectError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("response not cached (%s): %v", e.Reason, e.Err)
	}
	return fmt.Sprintf("response not cached (%s)", e.Reason)
}

func (e *RejectError) Unwrap() error        { return e.Err }
func (e *RejectError) Is(target error) bool { return target == ErrRejected }

func (c *Cache) reject(r Reason, err error) error {
	c.rejects[r].Add(1)
	return &RejectError{Reason: r, Err: err}
}

// Insert validates a wire-format response and caches it. The key comes
// from the response alone (question, header CD bit, OPT DO bit), so replies
// seen without their query — the mirror feed — can be inserted. The
// returned error is a *RejectError when the response is not cacheable.
func (c *Cache) Insert(resp []byte) error {
	if len(resp) > math.MaxUint16 {
		return c.reject(ReasonTooLarge, nil)
	}
	var m dns.Msg
	if err := m.Unpack(resp); err != nil {
		return c.reject(ReasonMalformed, err)
	}
	return c.InsertMsg(&m)
}

// InsertMirror is Insert for a feed of every reply LocalDNS sends.
//
// Such a reply comes without its query, and its DO bit cannot be trusted
// to be the query's: CoreDNS 1.13.1 with the nsid plugin (LocalDNS has
// it) sets DO in its reply to any EDNS query that asks for NSID, DO or
// not. The DNSSEC records in a reply do tell: one with RRSIG, NSEC or
// NSEC3 records answered a DO query and is filed under DO=1; any other
// reply is what a client without DO got, and is filed under DO=0.
//
// Most replies repeat an answer the cache already holds fresh; checking
// that from the wire costs a fraction of a full validation. A reply whose
// content (records and rcode, TTLs, ID, flags and OPT aside, in any order)
// is the fresh entry's is skipped with ReasonHaveFresh, and takes the
// entry off probation (LocalDNS answered the name twice: clients use it).
// A reply that differs replaces the entry, as does one for an entry in the
// last tenth of its life, stale or missing: the cache follows what
// LocalDNS sends now, and an entry that was not LocalDNS's answer does
// not outlive its next one.
//
// Mirrored entries are fresh for at most Config.MirrorMaxTTL, and a new
// name starts on probation (Config.ProbationPercent).
func (c *Cache) InsertMirror(resp []byte) error {
	var q wire.Query
	if wire.ParseQuery(resp, &q) != nil {
		return c.InsertMirrorParsed(resp, nil, 0)
	}
	return c.InsertMirrorParsed(resp, &q, 0)
}

// InsertMirrorParsed is InsertMirror for a caller that parsed resp
// already: parsed is what wire.ParseQuery returned for it, nil if that
// was an error; hint is what PrefetchMirror returned for parsed, 0 if it
// was not called.
func (c *Cache) InsertMirrorParsed(resp []byte, parsed *wire.Query, hint uint64) error {
	var sum uint32
	if parsed != nil && parsed.Flags&wire.FlagQR != 0 && parsed.Flags&wire.FlagTC == 0 {
		q := *parsed // its DO is set below: the caller's stays as parsed
		q.DO, sum = c.mirrorFacts(resp, q.QEnd)
		if q.DO {
			hint = 0 // the hint hashed the key with DO clear
		}
		if c.repeat(&q, sum, hint) {
			c.rejects[ReasonHaveFresh].Add(1)
			return errHaveFresh // shared: this path runs for almost every mirrored reply
		}
	}
	if len(resp) > math.MaxUint16 {
		return c.reject(ReasonTooLarge, nil)
	}
	var m dns.Msg
	if err := m.Unpack(resp); err != nil {
		return c.reject(ReasonMalformed, err)
	}
	return c.insertMsg(&m, fromMirror, sum)
}

// PrefetchMirror asks the CPU to fetch what InsertMirror reads first of
// the cache for the reply whose question q is (wire.ParseQuery's): the
// memo set of its key, filed as almost every reply is (DO clear; see
// InsertMirror). A caller with several replies calls it for the next one
// before it inserts the current one: with LocalDNS on the same core the
// set is seldom in the CPU's cache, and at 20,000 queries a second waiting
// for it was a fifth of the tap's cost (bench-mirror with -perf). It
// returns the key's hash as a hint for InsertMirrorParsed, which then does
// not hash the key again; 0 for a query without a question.
func (c *Cache) PrefetchMirror(q *wire.Query) (hint uint64) {
	if len(q.QName) == 0 {
		return 0
	}
	var kb [maxKeyLen]byte
	h := c.hash(kb[:putKey(&kb, q.QName, q.QType, q.QClass, false, q.Flags&wire.FlagCD != 0)])
	c.shardFor(h).memo.prefetch(h)
	return h
}

// mirrorFacts reads, in one walk over the records of msg (a reply that
// wire.ParseQuery took, its question ending at qend), whether its answer
// or authority section holds an RRSIG, NSEC or NSEC3 record, and its
// content sum: a hash of the rcode and of each section's records, each
// record without its TTL and with its owner name decompressed and
// lower-cased, summed so that their order does not count (CoreDNS's
// loadbalance shuffles them), and never 0. The OPT record, which differs
// with each client's EDNS, is left out; so is the question, which the key
// holds. RDATA is taken as sent: a name in it compressed otherwise (a
// client asking in another case) reads as a change, which costs one
// insert. It does not allocate.
func (c *Cache) mirrorFacts(msg []byte, qend int) (do bool, sum uint32) {
	counts := [3]int{int(binary.BigEndian.Uint16(msg[6:])), int(binary.BigEndian.Uint16(msg[8:])), int(binary.BigEndian.Uint16(msg[10:]))}
	qname := msg[wire.HeaderLen : qend-4]
	h := uint64(binary.BigEndian.Uint16(msg[2:]) & wire.RcodeMask)
	off := qend
	for sec, n := range counts {
		var records, hashes uint64 // the section's records, and the sum of their hashes
		for range n {
			next, ttlOff, err := wire.SkipRR(msg, off)
			if err != nil {
				return do, 0
			}
			switch binary.BigEndian.Uint16(msg[ttlOff-4:]) {
			case wire.TypeOPT:
				off = next
				continue
			case dns.TypeRRSIG, dns.TypeNSEC, dns.TypeNSEC3:
				do = do || sec < 2
			}
			records++
			hashes += c.rrHash(msg, qname, off, ttlOff, next)
			off = next
		}
		h = mix(mix(h, records), hashes)
	}
	return do, max(uint32(h^h>>32), 1)
}

// mix folds v into h (a multiply-xorshift step; the hashes it folds are
// seeded already, so it need not be).
func mix(h, v uint64) uint64 {
	h = (h ^ v) * 0x9e3779b97f4a7c15
	return h ^ h>>29
}

// ownerIsQName stands for an owner name that is the question's: no name
// in wire format starts with 0xff (a label is at most 63 bytes).
var ownerIsQName = []byte{0xff}

// rrHash hashes the record from off to next in msg, whose TTL is at
// ttlOff: its owner name (decompressed, lower-cased), type, class,
// RDLENGTH and RDATA. The owner is most often a pointer to the question,
// or the question's name itself: one byte stands for both, so that only
// other owners are decompressed.
func (c *Cache) rrHash(msg, qname []byte, off, ttlOff, next int) uint64 {
	owner := msg[off : ttlOff-4]
	if !(len(owner) == 2 && owner[0] == 0xc0 && owner[1] == wire.HeaderLen) && !bytes.Equal(owner, qname) {
		return c.rrHashOwner(msg, qname, off, ttlOff, next)
	}
	return c.hashRR(ownerIsQName, msg[ttlOff-4:ttlOff], msg[ttlOff+4:next])
}

// rrHashOwner is rrHash for an owner name other than the question's
// bytes: its own function, so that the name's buffer costs only here.
func (c *Cache) rrHashOwner(msg, qname []byte, off, ttlOff, next int) uint64 {
	var name [wire.MaxNameLen]byte
	owner := msg[off : ttlOff-4] // a bad pointer: as sent
	if n, ok := canonicalName(&name, msg, off); ok {
		owner = name[:n]
		if equalFold(owner, qname) { // the question's, in another case
			owner = ownerIsQName
		}
	}
	return c.hashRR(owner, msg[ttlOff-4:ttlOff], msg[ttlOff+4:next])
}

// hashRR hashes a record's canonical owner, type and class, and RDLENGTH
// with RDATA: a function of those bytes alone, in one call when they are
// short, as most are.
func (c *Cache) hashRR(owner, typeClass, rdata []byte) uint64 {
	var buf [64]byte
	if len(owner)+len(typeClass)+len(rdata) > len(buf) {
		return mix(mix(maphash.Bytes(c.seed, owner), maphash.Bytes(c.seed, rdata)), uint64(binary.BigEndian.Uint32(typeClass)))
	}
	k := copy(buf[:], owner)
	k += copy(buf[k:], typeClass)
	k += copy(buf[k:], rdata)
	return maphash.Bytes(c.seed, buf[:k])
}

// equalFold reports whether the wire names a and b are equal, ASCII
// letters compared without case.
func equalFold(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// canonicalName writes the name at off in msg into dst with compression
// pointers followed and ASCII letters lower-cased, and returns its length;
// false if it does not read as a name of at most wire.MaxNameLen bytes.
func canonicalName(dst *[wire.MaxNameLen]byte, msg []byte, off int) (int, bool) {
	n := 0
	// Each step adds a label of at least two bytes to dst or follows a
	// pointer: more steps than dst has bytes is a pointer loop.
	for range 2 * wire.MaxNameLen {
		if off >= len(msg) {
			return 0, false
		}
		l := int(msg[off])
		switch {
		case l == 0:
			if n >= len(dst) {
				return 0, false
			}
			dst[n] = 0
			return n + 1, true
		case l&0xc0 == 0xc0:
			if off+2 > len(msg) {
				return 0, false
			}
			off = int(binary.BigEndian.Uint16(msg[off:]) & 0x3fff)
			continue
		case l > 63:
			return 0, false
		}
		if off+1+l > len(msg) || n+1+l >= len(dst) {
			return 0, false
		}
		dst[n] = byte(l)
		wire.LowerName(dst[n+1:], msg[off+1:off+1+l])
		n += 1 + l
		off += 1 + l
	}
	return 0, false
}

// repeat reports whether the cache holds a fresh entry for q, not in its
// refresh window, whose content sum is sum; if so, it takes the entry off
// probation. h is q's key's hash, 0 if not known. It does not allocate,
// takes the write lock only for that, and no lock at all (nor the key) for
// a repeat the shard's memo holds.
func (c *Cache) repeat(q *wire.Query, sum uint32, h uint64) bool {
	if q.Opcode() != 0 || len(q.QName) == 0 || sum == 0 {
		return false
	}
	var kb [maxKeyLen]byte
	var key []byte
	if h == 0 {
		key = kb[:queryKey(&kb, q)]
		h = c.hash(key)
	}
	s := c.shardFor(h)
	now := c.now().UnixNano()
	if s.memo.repeats(h, sum, now) {
		return true
	}
	if key == nil {
		key = kb[:queryKey(&kb, q)]
	}
	s.mu.RLock()
	e, ok := s.lru.Peek(h)
	ok = ok && e.sum == sum && bytes.Equal(e.key(), key) && now < e.fresh && !expiring(e.stored, e.fresh, now)
	if ok && e.flags&entryProbation == 0 {
		s.memo.put(h, sum, repeatUntil(e.stored, e.fresh))
	}
	s.mu.RUnlock()
	if !ok {
		return false
	}
	if e.flags&entryProbation != 0 {
		s.mu.Lock()
		if cur, ok := s.lru.Peek(h); ok && cur.stored == e.stored {
			s.confirm(&cur)
			s.lru.Add(h, cur) // an existing key: updates it in place, evicts nothing
		}
		s.mu.Unlock()
	}
	return true
}

// hasDNSSEC reports whether the answer or authority section of msg, whose
// question ends at qend, holds an RRSIG, NSEC or NSEC3 record.
func hasDNSSEC(msg []byte, qend int) bool {
	rrs := int(binary.BigEndian.Uint16(msg[6:])) + int(binary.BigEndian.Uint16(msg[8:]))
	off := qend
	for range rrs {
		next, ttlOff, err := wire.SkipRR(msg, off)
		if err != nil {
			return false
		}
		switch binary.BigEndian.Uint16(msg[ttlOff-4:]) {
		case dns.TypeRRSIG, dns.TypeNSEC, dns.TypeNSEC3:
			return true
		}
		off = next
	}
	return false
}

// origin says where a response comes from, which decides where its key
// takes its DO bit from and how it is admitted.
type origin uint8

const (
	// fromUpstream is a reply to a query of our own: DO from its OPT.
	fromUpstream origin = iota
	// fromMirror is a reply LocalDNS sent (the mirror feed): DO from its
	// DNSSEC records, freshness capped by MirrorMaxTTL, a new key on
	// probation.
	fromMirror
)

// InsertMsg caches an already parsed response; it does not modify m.
func (c *Cache) InsertMsg(m *dns.Msg) error { return c.insertMsg(m, fromUpstream, 0) }

// insertMsg validates and stores m; sum is its content sum if it came
// from the mirror feed (0 if unknown).
func (c *Cache) insertMsg(m *dns.Msg, from origin, sum uint32) error {
	switch {
	case !m.Response:
		return c.reject(ReasonNotResponse, nil)
	case m.Truncated:
		return c.reject(ReasonTruncated, nil)
	case m.Opcode != dns.OpcodeQuery:
		return c.reject(ReasonOpcode, nil)
	case len(m.Question) != 1:
		return c.reject(ReasonQuestionCount, nil)
	}

	var opt *dns.OPT
	extra := make([]dns.RR, 0, len(m.Extra))
	for _, rr := range m.Extra {
		if o, ok := rr.(*dns.OPT); ok {
			if opt != nil {
				return c.reject(ReasonMalformed, errors.New("more than one OPT"))
			}
			opt = o
			continue
		}
		extra = append(extra, rr)
	}

	ttl, life, isErr, r := c.lifetime(m, from)
	if r != numReasons {
		return c.reject(r, nil)
	}

	stored := *m // shallow: only the header and section slices change
	stored.Id = 0
	stored.Extra = extra
	stored.Compress = true
	msg, err := stored.Pack()
	if err != nil {
		return c.reject(ReasonMalformed, fmt.Errorf("repack: %w", err))
	}

	// miekg/dns packs the question first and uncompressed, so its wire name
	// sits right after the header.
	qend, err := wire.SkipName(msg, wire.HeaderLen)
	if err != nil || qend+4 > len(msg) {
		return c.reject(ReasonMalformed, errors.New("repacked question unreadable"))
	}
	do := opt != nil && opt.Do()
	if from == fromMirror {
		do = hasDNSSEC(msg, qend+4)
	}
	var kb [maxKeyLen]byte
	kn := putKey(&kb, msg[wire.HeaderLen:qend], m.Question[0].Qtype, m.Question[0].Qclass,
		do, m.CheckingDisabled)
	e, err := buildEntry(kb[:kn], msg)
	if err != nil {
		return c.reject(ReasonMalformed, err)
	}
	now := c.now().UnixNano()
	e.ttl = ttl
	e.stored, e.used = now, now
	e.fresh = now + int64(life)
	if isErr {
		e.flags |= entryError
	}
	if from == fromMirror {
		e.flags |= entryProbation // unless the key is cached already (shard.add)
		e.sum = sum
	}

	h := c.hash(e.key())
	s := c.shardFor(h)
	if e.cost() > s.maxBytes {
		return c.reject(ReasonTooLarge, nil)
	}
	if !s.add(h, e, c.staleUntil, now) {
		return c.reject(ReasonKeptAnswer, nil)
	}
	return nil
}

// lifetime classifies m and returns the TTL its records are served with,
// how long the entry stays fresh, whether it is a cached failure, and
// numReasons if cacheable or the reason it is not. A mirrored reply's TTL
// and life are capped by MirrorMaxTTL.
func (c *Cache) lifetime(m *dns.Msg, from origin) (ttl uint32, life time.Duration, isErr bool, r Reason) {
	ttl, life, isErr, r = c.policyLifetime(m)
	if from == fromMirror && r == numReasons {
		ttl = min(ttl, uint32(c.cfg.MirrorMaxTTL/time.Second))
		life = min(life, c.cfg.MirrorMaxTTL)
	}
	return ttl, life, isErr, r
}

// policyLifetime is lifetime by the TTL policy alone.
func (c *Cache) policyLifetime(m *dns.Msg) (ttl uint32, life time.Duration, isErr bool, r Reason) {
	minRR := uint32(maxTTL)
	for _, sec := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, rr := range sec {
			if rr.Header().Rrtype != dns.TypeOPT {
				minRR = min(minRR, rr.Header().Ttl)
			}
		}
	}
	var floor, ceiling time.Duration
	switch {
	case m.Rcode == dns.RcodeSuccess && len(m.Answer) > 0:
		floor, ceiling = c.cfg.MinTTL, c.cfg.MaxTTL
	case m.Rcode == dns.RcodeNameError || m.Rcode == dns.RcodeSuccess:
		// RFC 2308 §5: a negative answer lives for min(SOA TTL, SOA MINIMUM).
		soa := findSOA(m.Ns)
		if soa == nil {
			return 0, 0, false, ReasonNoSOA
		}
		minRR = min(minRR, soa.Minttl)
		floor, ceiling = c.cfg.MinNegTTL, c.cfg.MaxNegTTL
	case m.Rcode == dns.RcodeServerFailure && c.cfg.ServfailTTL > 0:
		minRR = min(minRR, uint32(c.cfg.ServfailTTL/time.Second))
		return minRR, c.cfg.ServfailTTL, true, numReasons
	default:
		return 0, 0, false, ReasonRcode
	}
	ttl = min(minRR, uint32(ceiling/time.Second))
	life = max(time.Duration(ttl)*time.Second, floor)
	return ttl, life, false, numReasons
}

func findSOA(ns []dns.RR) *dns.SOA {
	for _, rr := range ns {
		if soa, ok := rr.(*dns.SOA); ok {
			return soa
		}
	}
	return nil
}

// staleUntil is the last instant e may be served.
func (c *Cache) staleUntil(e entry) int64 {
	if e.isError() {
		return e.fresh
	}
	return e.fresh + int64(c.cfg.MaxStale)
}
