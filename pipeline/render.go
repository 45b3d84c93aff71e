package pipeline

import (
	"encoding/binary"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/cache"
	"github.com/dnsstandby/dnsstandby/wire"
)

// maxErrorLen bounds what writeReplyHeader writes: header, the longest
// question, and an OPT without options.
const maxErrorLen = wire.HeaderLen + wire.MaxNameLen + 4 + 11

// opcodeBits is the opcode field of the header flags.
const opcodeBits uint16 = 0xf << 11

// replyFlags are the header flags of an answer dnsstandby makes itself
// (an error, not a relayed or cached answer): QR and the opcode, and for
// QUERY the client's RD and CD — what miekg/dns's SetReply copies, which
// is how CoreDNS builds its errors. AA, RA and AD stay clear: CoreDNS
// sends its own SERVFAIL and REFUSED without RA.
func replyFlags(q *wire.Query) uint16 {
	f := wire.FlagQR | q.Flags&opcodeBits
	if q.Opcode() == dns.OpcodeQuery {
		f |= q.Flags & (wire.FlagRD | wire.FlagCD)
	}
	return f
}

// writeHeaderOnly writes a bare header answering q with rcode, as CoreDNS
// answers a message without a question (SERVFAIL).
func writeHeaderOnly(dst []byte, q *wire.Query, rcode int) int {
	clear(dst[:wire.HeaderLen])
	binary.BigEndian.PutUint16(dst, q.ID)
	binary.BigEndian.PutUint16(dst[2:], replyFlags(q)|uint16(rcode&0xf))
	return wire.HeaderLen
}

// rejectKeep are the query's header bits miekg/dns's server leaves as they
// were when it rejects a query: it answers with the query's own header,
// QR set, AA and Z cleared.
const rejectKeep = wire.FlagTC | wire.FlagRD | wire.FlagRA | wire.FlagAD | wire.FlagCD

// writeReject writes what miekg/dns's server (under CoreDNS) sends for a
// query it rejects by its header (wire.CheckHeader): the query's header
// with QR set and rcode, and nothing else. NOTIMP keeps the opcode;
// FORMERR is sent as opcode QUERY.
func writeReject(dst []byte, q *wire.Query, rcode int) int {
	clear(dst[:wire.HeaderLen])
	binary.BigEndian.PutUint16(dst, q.ID)
	flags := wire.FlagQR | q.Flags&rejectKeep | uint16(rcode&0xf)
	if rcode == dns.RcodeNotImplemented {
		flags |= q.Flags & opcodeBits
	}
	binary.BigEndian.PutUint16(dst[2:], flags)
	return wire.HeaderLen
}

// writeFormErr writes FORMERR for a query whose header passed but whose
// rest did not parse: a rejection as writeReject's, with the question
// echoed when it was read (miekg/dns keeps the question it had unpacked
// when a later section fails).
func writeFormErr(dst []byte, q *wire.Query) int {
	n := writeReject(dst, q, dns.RcodeFormatError)
	if len(q.QName) == 0 {
		return n
	}
	binary.BigEndian.PutUint16(dst[4:], 1)
	n += copy(dst[n:], q.QName)
	binary.BigEndian.PutUint16(dst[n:], q.QType)
	binary.BigEndian.PutUint16(dst[n+2:], q.QClass)
	return n + 4
}

// writeStray writes FORMERR for a query carrying records a query has no
// use for (wire.Query.Stray): a rejection as miekg/dns's accept function
// makes for more than one answer or authority record, here for any.
func writeStray(dst []byte, q *wire.Query) int {
	return writeReject(dst, q, dns.RcodeFormatError)
}

// writeError writes an answer to q with rcode, the question echoed and no
// records, as CoreDNS's errorFunc writes one: SERVFAIL, NOTIMP, REFUSED,
// BADVERS, without RA.
func writeError(dst []byte, q *wire.Query, rcode int) int {
	return writeReplyHeader(dst, q, uint16(rcode&0xf), rcode>>4)
}

// writeReplyHeader writes header and question of an answer to q with the
// given flags added to replyFlags, and an OPT if q had one.
func writeReplyHeader(dst []byte, q *wire.Query, flags uint16, extRcode int) int {
	n := writeHeaderOnly(dst, q, 0)
	binary.BigEndian.PutUint16(dst[2:], replyFlags(q)|flags)
	binary.BigEndian.PutUint16(dst[4:], 1)
	n += copy(dst[n:], q.QName)
	binary.BigEndian.PutUint16(dst[n:], q.QType)
	binary.BigEndian.PutUint16(dst[n+2:], q.QClass)
	n += 4
	if q.EDNS {
		m := wire.PutOPT(dst[n:], 1232, q.DO, nil)
		dst[n+5] = byte(extRcode) // the OPT TTL's high byte: extended rcode (RFC 6891 §6.1.3)
		n += m
		binary.BigEndian.PutUint16(dst[10:], 1)
	}
	return n
}

// replyRcode answers w with rcode and no records.
func (p *Pipeline) replyRcode(w *waiter, rcode int) {
	var buf [maxErrorLen]byte
	p.finish(w, srcError, rcode, buf[:writeError(buf[:], &w.q, rcode)])
}

// replyBuilt answers w with what write makes of its query (at most
// maxErrorLen bytes), counted under src and rcode.
func (p *Pipeline) replyBuilt(w *waiter, src, rcode int, write func([]byte, *wire.Query) int) {
	var buf [maxErrorLen]byte
	p.finish(w, src, rcode, buf[:write(buf[:], &w.q)])
}

// finish sends b, the answer to w with rcode, from the source src, and
// counts it: by source and rcode, and the time since Resolve took it.
func (p *Pipeline) finish(w *waiter, src, rcode int, b []byte) {
	p.stats.answers[src].Add(1)
	p.stats.rcodes[rcodeIndex(rcode)].Add(1)
	p.stats.duration[src].Observe(time.Since(w.start).Seconds())
	w.reply(b)
}

// bufs holds answer buffers of the largest size (TCP's), shared by every
// pipeline: an answer is written into one, handed to the reply function,
// which copies what it keeps, and the buffer goes back. So answering a
// flight's waiters costs no buffer per waiter.
var bufs = sync.Pool{New: func() any { b := make([]byte, wire.MaxMsgLen); return &b }}

func getBuf() *[]byte  { return bufs.Get().(*[]byte) }
func putBuf(b *[]byte) { bufs.Put(b) }

// headerRcode is the rcode in the header of the message b (the four bits
// there: an extended rcode needs the OPT).
func headerRcode(b []byte) int {
	if len(b) < wire.HeaderLen {
		return dns.RcodeServerFailure
	}
	return int(b[3] & 0x0f)
}

// replyStaleOr answers w from its route's cache, stale allowed, or with
// rcode (SERVFAIL or REFUSED) when there is nothing to serve.
func (p *Pipeline) replyStaleOr(w *waiter, rcode int) { p.replyStale(w, rcode, false) }

// replyStaleOrTC answers w, a UDP query, from its route's cache, stale
// allowed, or with an empty answer with TC set when there is nothing to
// serve: the client's stub asks again over TCP.
func (p *Pipeline) replyStaleOrTC(w *waiter) { p.replyStale(w, dns.RcodeSuccess, true) }

// replyStale is replyStaleOr, or replyStaleOrTC if tc.
func (p *Pipeline) replyStale(w *waiter, rcode int, tc bool) {
	q := &w.q
	b := getBuf()
	defer putBuf(b)
	buf := (*b)[:limitFor(q, w.udp)]
	n, st := 0, cache.Miss
	if w.cache != nil {
		n, st = w.cache.ServeAgain(buf, q, len(buf), true)
	}
	var src int
	switch st {
	case cache.Fresh, cache.Expiring:
		src, rcode = srcCache, headerRcode(buf[:n])
	case cache.Stale:
		src, rcode = srcStale, headerRcode(buf[:n])
	case cache.Miss:
		if tc {
			src, n = srcTruncated, writeReplyHeader(buf, q, wire.FlagTC, 0)
			break
		}
		fallthrough
	default:
		src = srcError
		if rcode == dns.RcodeServerFailure {
			src = srcServfail
		}
		n = writeError(buf, q, rcode)
	}
	p.finish(w, src, rcode, buf[:n])
}

// replyUpstream answers w with an upstream reply, through the cache when
// the reply was cached (so it is rewritten exactly as a hit would be), else
// rendered from the message.
func (p *Pipeline) replyUpstream(w *waiter, resp *dns.Msg) {
	q := &w.q
	limit := limitFor(q, w.udp)
	b := getBuf()
	defer putBuf(b)
	buf := (*b)[:limit]
	// WriteFresh, not Serve: the query was counted as a miss already.
	if n := w.cache.WriteFresh(buf, q, limit); n > 0 {
		// A hit has AA set, as CoreDNS's cache sets it; the answer that
		// fills the cache goes out with the upstream's AA, as CoreDNS
		// relays it.
		if !resp.Authoritative {
			buf[2] &^= byte(wire.FlagAA >> 8)
		}
		p.finish(w, srcUpstream, headerRcode(buf[:n]), buf[:n])
		return
	}
	out, ok := p.render(q, resp, buf)
	p.finishRendered(w, out, ok)
}

// finishRendered sends what render made: an upstream answer, or SERVFAIL
// when it could not be packed.
func (p *Pipeline) finishRendered(w *waiter, out []byte, ok bool) {
	if !ok {
		p.finish(w, srcServfail, dns.RcodeServerFailure, out)
		return
	}
	// An upstream's extended rcode (BADCOOKIE...) counts as "other".
	p.finish(w, srcUpstream, headerRcode(out), out)
}

// render turns an uncached upstream reply into the answer to the client's
// query q: the client's ID, question (its 0x20 case), RD, CD and OPT;
// or SERVFAIL, and ok false, when it cannot be packed.
func (p *Pipeline) render(q *wire.Query, resp *dns.Msg, buf []byte) (out []byte, ok bool) {
	qn, err := question(q)
	if err != nil {
		return buf[:writeError(buf, q, dns.RcodeServerFailure)], false
	}
	m := *resp
	m.Id = q.ID
	m.Question = []dns.Question{qn}
	m.Answer = capTTL(resp.Answer)
	m.Ns = capTTL(resp.Ns)
	m.Extra = capTTL(withoutOPT(resp.Extra))
	m.Compress = true
	m.Truncated = resp.Truncated
	m.RecursionDesired = q.Flags&wire.FlagRD != 0
	m.CheckingDisabled = q.Flags&wire.FlagCD != 0
	if q.EDNS {
		opt := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
		opt.SetUDPSize(p.cfg.UDPSize)
		if q.DO {
			opt.SetDo()
		}
		if q.NSID && p.nsid != nil {
			opt.Option = []dns.EDNS0{&dns.EDNS0_NSID{Code: dns.EDNS0NSID, Nsid: hexNSID(p.nsid)}}
		}
		m.Extra = append(m.Extra, opt)
	}
	// Too large for the client: cut as CoreDNS's ScrubWriter cuts every
	// reply (miekg/dns's Truncate): whole records in section order up to
	// the first that does not fit, TC set, the OPT kept.
	m.Truncate(len(buf))
	m.Compress = true
	out, err = m.PackBuffer(buf)
	if err != nil || len(out) > len(buf) {
		return buf[:writeError(buf, q, dns.RcodeServerFailure)], false
	}
	return out, true
}

// uncachedTTL caps the TTLs of a reply the cache would not store (an
// NXDOMAIN without SOA, a referral, an error): CoreDNS's cache plugin, in
// front of every LocalDNS answer, sends such replies with its 5 s minimal
// TTL, and a client should not hold an odd answer longer than LocalDNS
// would have let it.
const uncachedTTL = 5

// capTTL returns copies of rrs with TTLs of at most uncachedTTL; rrs is
// not modified (it belongs to a reply other waiters may render too).
func capTTL(rrs []dns.RR) []dns.RR {
	out := make([]dns.RR, len(rrs))
	for i, rr := range rrs {
		if rr.Header().Ttl > uncachedTTL {
			rr = dns.Copy(rr)
			rr.Header().Ttl = uncachedTTL
		}
		out[i] = rr
	}
	return out
}

// hexNSID is NSID as miekg/dns carries it: hex-encoded.
func hexNSID(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&0xf])
	}
	return string(out)
}

// limitFor is the largest answer q's transport takes.
func limitFor(q *wire.Query, udp bool) int {
	if udp {
		return min(q.PayloadLimit(), MaxUDPAnswer)
	}
	return wire.MaxMsgLen
}
