package cache

import (
	"encoding/binary"
	"errors"
	"fmt"
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
	ReasonHaveFresh                   // InsertMirror: a fresh entry for the key is already held
	numReasons
)

var reasonNames = [numReasons]string{
	"malformed", "not_response", "truncated", "opcode", "question_count",
	"rcode", "no_soa", "too_large", "kept_answer", "have_fresh",
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
// that from the wire costs a fraction of a full validation. Those are
// skipped with ReasonHaveFresh; an entry in the last tenth of its life,
// stale or missing is replaced. LocalDNS's cache keeps the same TTLs, so a
// skipped reply carries nothing new.
func (c *Cache) InsertMirror(resp []byte) error {
	var q wire.Query
	if wire.ParseQuery(resp, &q) == nil && q.Flags&wire.FlagQR != 0 && q.Flags&wire.FlagTC == 0 {
		q.DO = hasDNSSEC(resp, q.QEnd)
		if c.Status(&q) == Fresh {
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
	return c.insertMsg(&m, doFromRecords)
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

// doSource says where a response's key takes its DO bit from.
type doSource uint8

const (
	doFromOPT     doSource = iota // the OPT record (a reply to our own query)
	doFromRecords                 // DNSSEC records present (a mirrored reply)
)

// InsertMsg caches an already parsed response; it does not modify m.
func (c *Cache) InsertMsg(m *dns.Msg) error { return c.insertMsg(m, doFromOPT) }

func (c *Cache) insertMsg(m *dns.Msg, doFrom doSource) error {
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

	ttl, life, isErr, r := c.lifetime(m)
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
	if doFrom == doFromRecords {
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
// numReasons if cacheable or the reason it is not.
func (c *Cache) lifetime(m *dns.Msg) (ttl uint32, life time.Duration, isErr bool, r Reason) {
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
