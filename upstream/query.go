package upstream

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/wire"
)

// query is a request packed once per Exchange. Its attempts run one after
// another, each writing its own random ID into the same bytes.
type query struct {
	req      *dns.Msg // the caller's; never written
	framed   []byte   // 2-byte length, then the message: what TCP sends
	msg      []byte   // framed[2:]: what UDP sends
	question []byte   // msg[12:qEnd]: the name exactly as sent, type, class
}

// newQuery packs req without modifying it.
func newQuery(req *dns.Msg) (*query, error) {
	if len(req.Question) != 1 {
		return nil, ErrQuestionCount
	}
	// Pack writes the extended rcode into the OPT record it packs, which
	// req shares with its caller: pack a shallow copy holding a copy of
	// the OPT instead, so that req is never written, not even with the
	// value it already has (that would still be a data race).
	m := *req
	for i, rr := range m.Extra {
		if rr != nil && rr.Header().Rrtype == dns.TypeOPT {
			m.Extra = slices.Clone(m.Extra)
			m.Extra[i] = dns.Copy(rr)
		}
	}
	m.Compress = false // the question must be plain bytes to compare
	packed, err := m.Pack()
	if err != nil {
		return nil, fmt.Errorf("pack request: %w", err)
	}
	if len(packed) > 0xffff {
		return nil, fmt.Errorf("request of %d bytes exceeds 65535", len(packed))
	}
	end, err := wire.SkipName(packed, wire.HeaderLen)
	if err != nil || end+4 > len(packed) {
		return nil, fmt.Errorf("packed request has no readable question")
	}
	framed := make([]byte, 2+len(packed))
	binary.BigEndian.PutUint16(framed, uint16(len(packed)))
	copy(framed[2:], packed)
	q := &query{req: req, framed: framed, msg: framed[2:]}
	q.question = q.msg[wire.HeaderLen : end+4]
	return q, nil
}

// setID writes the ID the next attempt sends.
func (q *query) setID(id uint16) { binary.BigEndian.PutUint16(q.msg, id) }

func (q *query) id() uint16 { return binary.BigEndian.Uint16(q.msg) }

// opcodeMask selects the opcode bits of the header flags.
const opcodeMask = 0xf << 11

// match reports whether b is a reply to q as last sent: QR set, the same
// ID and opcode, and exactly one question, byte for byte the one sent —
// so the name is compared case-sensitively and a 0x20-randomised query
// name adds its entropy to the 16-bit ID against blind spoofing.
func (q *query) match(b []byte) bool {
	if len(b) < wire.HeaderLen+len(q.question) {
		return false
	}
	id, flags, _ := wire.ParseHeader(b)
	_, qflags, _ := wire.ParseHeader(q.msg)
	return id == q.id() &&
		flags&wire.FlagQR != 0 &&
		flags&opcodeMask == qflags&opcodeMask &&
		binary.BigEndian.Uint16(b[4:]) == 1 &&
		bytes.Equal(b[wire.HeaderLen:wire.HeaderLen+len(q.question)], q.question)
}

// accept checks b as a reply to q and unpacks it. The reply carries the
// caller's ID and question. A matching reply with TC=1 that does not
// unpack (servers that cut a message anywhere) is kept as its header and
// question: all the caller needs from it is the truncation. ok is false
// when b is to be ignored, and why says why.
func (q *query) accept(b []byte) (m *dns.Msg, why reason, ok bool) {
	if !q.match(b) {
		return nil, reasonMismatch, false
	}
	m = new(dns.Msg)
	if err := m.Unpack(b); err != nil {
		_, flags, _ := wire.ParseHeader(b)
		if flags&wire.FlagTC == 0 {
			return nil, reasonMalformed, false
		}
		head := slices.Clone(b[:wire.HeaderLen+len(q.question)])
		clear(head[6:wire.HeaderLen]) // no answer, authority or additional records
		m = new(dns.Msg)
		if err := m.Unpack(head); err != nil {
			return nil, reasonMalformed, false
		}
	}
	m.Id = q.req.Id
	m.Question = []dns.Question{q.req.Question[0]}
	return m, 0, true
}
