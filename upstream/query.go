package upstream

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/wire"
)

// query is a request packed once per Exchange. Its attempts run one after
// another, each writing its own random ID, and its own random letter case
// of the name (0x20), into the same bytes.
type query struct {
	// req is the caller's, never written; its ID and question are what a
	// reply is given. A race, whose attempts may outlive Exchange,
	// replaces it with a copy of those (detach).
	req      *dns.Msg
	framed   []byte // 2-byte length, then the message: what TCP sends
	msg      []byte // framed[2:]: what UDP sends
	question []byte // msg[12:qEnd]: the name exactly as sent, type, class
	name     []byte // the name in wire format as the caller wrote it (its case)
	// anyCase is set by an attempt that sent the caller's case to a
	// server that does not keep the case of questions: its reply's name
	// is then taken in any case, as CoreDNS forward takes it.
	anyCase bool
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
	q.name = slices.Clone(q.msg[wire.HeaderLen:end])
	return q, nil
}

// detach makes q independent of the caller's request, which the caller
// may change once Exchange returns: q keeps a copy of what accept reads
// of it, its ID and question. No attempt on q may be running.
func (q *query) detach() {
	q.req = &dns.Msg{MsgHdr: dns.MsgHdr{Id: q.req.Id}, Question: []dns.Question{q.req.Question[0]}}
}

// clone returns a copy of q for another attempt running beside q's: each
// writes its own ID and letter case into its own bytes.
func (q *query) clone() *query {
	c := *q
	c.framed = slices.Clone(q.framed)
	c.msg = c.framed[2:]
	c.question = c.msg[wire.HeaderLen : wire.HeaderLen+len(q.question)]
	return &c
}

// prepare writes what the next attempt sends: its ID, and the name either
// in a random letter case (caps) or in the caller's (a server that does
// not keep case, whose replies are then taken in any case).
//
// 0x20 (draft-vixie-dnsext-dns0x20, Unbound's use-caps-for-id): servers
// copy the question into their reply byte for byte, so a spoofer must
// guess one bit per letter of the name on top of the ID and the port.
func (q *query) prepare(id uint16, caps bool) {
	binary.BigEndian.PutUint16(q.msg, id)
	name := q.msg[wire.HeaderLen : wire.HeaderLen+len(q.name)]
	copy(name, q.name)
	q.anyCase = !caps
	if !caps {
		return
	}
	var bits uint64
	n := 0
	for i, c := range name {
		// Label length bytes are at most 63, below 'A': only letters
		// change.
		if lower := c | 0x20; lower < 'a' || lower > 'z' {
			continue
		}
		if n == 0 {
			bits, n = rand.Uint64(), 64
		}
		name[i] = c&^0x20 | byte(bits&1)<<5
		bits >>= 1
		n--
	}
}

func (q *query) id() uint16 { return binary.BigEndian.Uint16(q.msg) }

// opcodeMask selects the opcode bits of the header flags.
const opcodeMask = 0xf << 11

// match says whether b is a reply to q as last sent: QR set, the same ID
// and opcode, and exactly one question, byte for byte the one sent — so
// the name is compared case-sensitively and the 0x20 case adds its entropy
// to the 16-bit ID against blind spoofing. A reply that differs only in
// the letter case of the name is reasonCase: spoofed, or from a server
// that does not keep case. After an attempt in the caller's case to such a
// server (anyCase), any case is taken.
func (q *query) match(b []byte) (ok bool, why reason) {
	if len(b) < wire.HeaderLen+len(q.question) {
		return false, reasonMismatch
	}
	id, flags, _ := wire.ParseHeader(b)
	_, qflags, _ := wire.ParseHeader(q.msg)
	if id != q.id() ||
		flags&wire.FlagQR == 0 ||
		flags&opcodeMask != qflags&opcodeMask ||
		binary.BigEndian.Uint16(b[4:]) != 1 {
		return false, reasonMismatch
	}
	got := b[wire.HeaderLen : wire.HeaderLen+len(q.question)]
	if bytes.Equal(got, q.question) {
		return true, 0
	}
	n := len(q.name)
	if !bytes.Equal(got[n:], q.question[n:]) || !foldEqual(got[:n], q.question[:n]) {
		return false, reasonMismatch
	}
	if q.anyCase {
		return true, 0
	}
	return false, reasonCase
}

// foldEqual reports whether a and b are equal but for the case of ASCII
// letters (as DNS compares names; bytes.EqualFold would fold UTF-8).
func foldEqual[T string | []byte](a, b T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range len(a) {
		x, y := a[i], b[i]
		if x != y && (x|0x20 != y|0x20 || x|0x20 < 'a' || x|0x20 > 'z') {
			return false
		}
	}
	return true
}

// accept checks b as a reply to q and unpacks it. The reply carries the
// caller's ID and question. A matching reply with TC=1 that does not
// unpack (servers that cut a message anywhere) is kept as its header and
// question: all the caller needs from it is the truncation. ok is false
// when b is to be ignored, and why says why.
func (q *query) accept(b []byte) (m *dns.Msg, why reason, ok bool) {
	if ok, why := q.match(b); !ok {
		return nil, why, false
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
	q.restoreCase(m)
	return m, 0, true
}

// restoreCase gives the records owned by the question's name the caller's
// case. Servers copy the question's name into the records they make for
// it, so without this the random case of the attempt would reach the
// cache and every client that ever gets the answer. Other names are left
// as the server wrote them.
func (q *query) restoreCase(m *dns.Msg) {
	name := q.req.Question[0].Name
	for _, sec := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, rr := range sec {
			if h := rr.Header(); h.Name != name && foldEqual(h.Name, name) {
				h.Name = name
			}
		}
	}
}
