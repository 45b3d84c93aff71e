// Package wire reads and writes the few parts of a DNS message that the hot
// path needs — the header, the single question and the OPT record — straight
// from the wire bytes and without allocating. Whole messages (misses,
// validation, upstream replies) are miekg/dns's job; this package exists so
// that a cache hit never has to build one.
package wire

import (
	"encoding/binary"
	"errors"
)

// HeaderLen is the size of the fixed DNS header.
const HeaderLen = 12

// Header flag bits (RFC 1035 §4.1.1, RFC 4035 §3.2).
const (
	FlagQR     uint16 = 1 << 15
	FlagAA     uint16 = 1 << 10
	FlagTC     uint16 = 1 << 9
	FlagRD     uint16 = 1 << 8
	FlagRA     uint16 = 1 << 7
	FlagAD     uint16 = 1 << 5
	FlagCD     uint16 = 1 << 4
	opcodeMask uint16 = 0xf << 11
	RcodeMask  uint16 = 0xf
)

// Resource record types and option codes the hot path looks at.
const (
	TypeOPT    uint16 = 41
	TypeTSIG   uint16 = 250
	OptionNSID uint16 = 3
)

// Limits from RFC 1035 §2.3.4 and RFC 6891 §6.2.5.
const (
	MaxNameLen = 255
	// MaxMsgLen is the largest DNS message (TCP framing, RFC 1035 §4.2.2).
	MaxMsgLen = 65535
	// MinUDPSize is the payload every client can take, with or without EDNS.
	MinUDPSize = 512
	// MaxQueryLen is the longest query read, over either transport.
	// LocalDNS reads no more of a UDP query (miekg/dns's server reads a
	// datagram into a buffer of its default UDPSize, 512, and parses
	// what fits), so no pod's resolver can depend on sending more, and a
	// client that falls back to TCP repeats the query it sent over UDP.
	// The largest query a stub builds fits: a header, a 255-byte name
	// and its type and class (271 bytes), an OPT with a cookie (44), a
	// client subnet (24), NSID and padding to a multiple of 128 bytes
	// (RFC 8467) comes to 384; a TSIG with common names adds about 130.
	// Anything longer is padding, and padding is what a hostile query
	// uses to cost a server memory.
	MaxQueryLen = 512
)

var (
	// ErrShort means the message is too short to hold a header: there is
	// nothing to answer, so callers drop it.
	ErrShort = errors.New("dns message shorter than its header")
	// ErrFormat means the header was readable but the rest was not; callers
	// answer FORMERR.
	ErrFormat = errors.New("malformed dns message")
	// ErrQuestionCount means the message does not carry exactly one
	// question, which is all a resolver query may carry in practice.
	ErrQuestionCount = errors.New("dns message does not have exactly one question")
)

// Query is what the hot path needs from a query. Its slices alias the
// message it was parsed from.
type Query struct {
	ID    uint16
	Flags uint16
	// QName is the question's wire-format name exactly as the client sent
	// it, 0x20 mixed case included; it has no compression pointers.
	QName  []byte
	QType  uint16
	QClass uint16
	// QEnd is the offset just past the question section.
	QEnd int

	EDNS        bool   // the query carried an OPT record
	EDNSVersion uint8  // OPT version; only 0 exists
	UDPSize     uint16 // payload size the OPT advertised, as sent
	DO          bool   // DNSSEC OK
	NSID        bool   // the OPT asked for the server's NSID

	// Stray counts the records a query has no use for: every answer and
	// authority record, and every additional record but the OPT and a
	// TSIG that comes last (RFC 8945 §5.1). A server never needs them to
	// answer, and a resolver that parses them hands a client a lever on
	// its memory: miekg/dns unpacks each 2-byte compression pointer in
	// them into a string of the whole name it points to. (For a
	// response, Stray counts its records; only queries are judged by it.)
	Stray int
}

// Opcode returns the query's opcode (0 is QUERY).
func (q *Query) Opcode() int { return int(q.Flags&opcodeMask) >> 11 }

// PayloadLimit is the largest UDP answer the client accepts: 512 bytes
// without EDNS, else its advertised size but never below 512 (RFC 6891
// §6.2.5 treats smaller values as 512).
func (q *Query) PayloadLimit() int {
	if !q.EDNS || q.UDPSize < MinUDPSize {
		return MinUDPSize
	}
	return int(q.UDPSize)
}

// Opcodes (RFC 1035 §4.1.1, RFC 1996, RFC 2136).
const (
	OpcodeQuery  = 0
	OpcodeNotify = 4
)

// Verdict is what a server built on miekg/dns, CoreDNS among them, does
// with a query from its header alone, before reading any of the rest.
type Verdict uint8

const (
	// Accept: read the rest of the message.
	Accept Verdict = iota
	// Ignore: a response (QR=1); send nothing.
	Ignore
	// RejectNotImp: an opcode other than QUERY and NOTIFY; answer NOTIMP.
	RejectNotImp
	// RejectFormat: not exactly one question, more than one answer or
	// authority record, or more than two additional records; answer
	// FORMERR.
	RejectFormat
)

// CheckHeader judges msg by its header as miekg/dns's default
// MsgAcceptFunc does, in the same order: QR, then the opcode, then the
// section counts. So an UPDATE without a question is NOTIMP, not FORMERR.
// msg must hold a header (see ParseHeader).
func CheckHeader(msg []byte) Verdict {
	flags := binary.BigEndian.Uint16(msg[2:])
	if flags&FlagQR != 0 {
		return Ignore
	}
	if op := int(flags&opcodeMask) >> 11; op != OpcodeQuery && op != OpcodeNotify {
		return RejectNotImp
	}
	if binary.BigEndian.Uint16(msg[4:]) != 1 || binary.BigEndian.Uint16(msg[6:]) > 1 ||
		binary.BigEndian.Uint16(msg[8:]) > 1 || binary.BigEndian.Uint16(msg[10:]) > 2 {
		return RejectFormat
	}
	return Accept
}

// ParseHeader reads the ID and flags; it fails only on ErrShort.
func ParseHeader(msg []byte) (id, flags uint16, err error) {
	if len(msg) < HeaderLen {
		return 0, 0, ErrShort
	}
	return binary.BigEndian.Uint16(msg), binary.BigEndian.Uint16(msg[2:]), nil
}

// ParseQuery fills q from msg. It reads the header and the question, skips
// any answer and authority records, and reads the OPT record if present;
// q.Stray counts the other records. It does not allocate. On ErrFormat and ErrQuestionCount, q.ID and q.Flags
// are still set so that the caller can answer.
func ParseQuery(msg []byte, q *Query) error {
	id, flags, err := ParseHeader(msg)
	if err != nil {
		return err
	}
	*q = Query{ID: id, Flags: flags}
	if binary.BigEndian.Uint16(msg[4:]) != 1 {
		return ErrQuestionCount
	}
	an := int(binary.BigEndian.Uint16(msg[6:]))
	ns := int(binary.BigEndian.Uint16(msg[8:]))
	ar := int(binary.BigEndian.Uint16(msg[10:]))

	end, err := questionNameEnd(msg, HeaderLen)
	if err != nil {
		return err
	}
	if end+4 > len(msg) {
		return ErrFormat
	}
	q.QName = msg[HeaderLen:end]
	q.QType = binary.BigEndian.Uint16(msg[end:])
	q.QClass = binary.BigEndian.Uint16(msg[end+2:])
	q.QEnd = end + 4

	off := q.QEnd
	for i := 0; i < an+ns; i++ {
		if off, err = skipRR(msg, off); err != nil {
			return err
		}
	}
	q.Stray = an + ns
	for i := 0; i < ar; i++ {
		start := off
		if off, err = skipRR(msg, off); err != nil {
			return err
		}
		switch rrType(msg, start) {
		case TypeOPT:
		case TypeTSIG:
			if i != ar-1 {
				q.Stray++
			}
			continue
		default:
			q.Stray++
			continue
		}
		if q.EDNS {
			return ErrFormat // RFC 6891 §6.1.1: more than one OPT is FORMERR
		}
		if err := parseOPT(msg[start:off], q); err != nil {
			return err
		}
	}
	return nil
}

// questionNameEnd validates an uncompressed name starting at off and returns
// the offset just past it. A question name never needs a pointer: nothing
// precedes it but the header.
func questionNameEnd(msg []byte, off int) (int, error) {
	start := off
	for {
		if off >= len(msg) {
			return 0, ErrFormat
		}
		l := int(msg[off])
		if l == 0 {
			off++
			break
		}
		if l > 63 { // pointers and the obsolete extended label types
			return 0, ErrFormat
		}
		off += 1 + l
		if off-start > MaxNameLen {
			return 0, ErrFormat
		}
	}
	if off-start > MaxNameLen {
		return 0, ErrFormat
	}
	return off, nil
}

// SkipName returns the offset just past the possibly compressed name at off.
// It does not follow pointers: a pointer ends the name's bytes here.
func SkipName(msg []byte, off int) (int, error) {
	start := off
	for {
		if off >= len(msg) {
			return 0, ErrFormat
		}
		l := int(msg[off])
		switch {
		case l == 0:
			return off + 1, nil
		case l&0xc0 == 0xc0:
			if off+2 > len(msg) {
				return 0, ErrFormat
			}
			return off + 2, nil
		case l > 63:
			return 0, ErrFormat
		}
		off += 1 + l
		if off-start > MaxNameLen {
			return 0, ErrFormat
		}
	}
}

// RRFixedLen is the size of an RR's type, class, TTL and RDLENGTH fields.
const RRFixedLen = 10

// SkipRR returns the offset just past the resource record at off, and the
// offset of its TTL field.
func SkipRR(msg []byte, off int) (next, ttlOff int, err error) {
	off, err = SkipName(msg, off)
	if err != nil {
		return 0, 0, err
	}
	if off+RRFixedLen > len(msg) {
		return 0, 0, ErrFormat
	}
	rdlen := int(binary.BigEndian.Uint16(msg[off+8:]))
	next = off + RRFixedLen + rdlen
	if next > len(msg) {
		return 0, 0, ErrFormat
	}
	return next, off + 4, nil
}

func skipRR(msg []byte, off int) (int, error) {
	next, _, err := SkipRR(msg, off)
	return next, err
}

// rrType returns the type of the (already bounds-checked) RR at off.
func rrType(msg []byte, off int) uint16 {
	end, _ := SkipName(msg, off)
	return binary.BigEndian.Uint16(msg[end:])
}

// parseOPT reads the OPT record rr (whole, from its owner name on).
func parseOPT(rr []byte, q *Query) error {
	if rr[0] != 0 { // the owner must be the root
		return ErrFormat
	}
	q.EDNS = true
	q.UDPSize = binary.BigEndian.Uint16(rr[3:])
	ttl := binary.BigEndian.Uint32(rr[5:])
	q.EDNSVersion = uint8(ttl >> 16)
	q.DO = ttl&(1<<15) != 0
	opts := rr[1+RRFixedLen:]
	for len(opts) > 0 {
		if len(opts) < 4 {
			return ErrFormat
		}
		code := binary.BigEndian.Uint16(opts)
		n := int(binary.BigEndian.Uint16(opts[2:]))
		if 4+n > len(opts) {
			return ErrFormat
		}
		if code == OptionNSID {
			q.NSID = true
		}
		opts = opts[4+n:]
	}
	return nil
}

// OPTLen is the size of the OPT record PutOPT writes.
func OPTLen(nsid []byte) int {
	if nsid == nil {
		return 1 + RRFixedLen
	}
	return 1 + RRFixedLen + 4 + len(nsid)
}

// PutOPT writes an OPT record (version 0, extended rcode 0) into b, which
// must hold OPTLen(nsid) bytes, and returns the bytes written. A non-nil
// nsid adds the NSID option.
func PutOPT(b []byte, udpSize uint16, do bool, nsid []byte) int {
	n := OPTLen(nsid)
	_ = b[n-1]
	b[0] = 0
	binary.BigEndian.PutUint16(b[1:], TypeOPT)
	binary.BigEndian.PutUint16(b[3:], udpSize)
	var ttl uint32
	if do {
		ttl = 1 << 15
	}
	binary.BigEndian.PutUint32(b[5:], ttl)
	binary.BigEndian.PutUint16(b[9:], uint16(n-1-RRFixedLen))
	if nsid != nil {
		binary.BigEndian.PutUint16(b[11:], OptionNSID)
		binary.BigEndian.PutUint16(b[13:], uint16(len(nsid)))
		copy(b[15:], nsid)
	}
	return n
}

// LowerName writes the ASCII-lower-cased copy of name into dst, which must
// be at least as long, and returns the bytes written. DNS compares names
// case-insensitively in ASCII only (RFC 4343).
func LowerName(dst, name []byte) int {
	dst = dst[:len(name)]
	for i, c := range name {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		dst[i] = c
	}
	return len(name)
}
