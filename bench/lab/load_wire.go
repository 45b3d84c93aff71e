package lab

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/miekg/dns"
)

// loadEDNSSize is the UDP payload size the load advertises: the DNS Flag
// Day 2020 value, what current stub resolvers send.
const loadEDNSSize = 1232

// loadTemplate is one name of the mix as it goes on the wire: the packed
// query with ID 0, and where its question section lies, for matching
// replies without unpacking them.
type loadTemplate struct {
	wire     []byte // header, question, OPT with an empty NSID option
	question []byte // wire[12:qend]: name, type, class
	rcode    int    // expected rcode
	// fresh: the first label (wire[13:13+LoadFreshLabelLen], question[1:])
	// is a placeholder, written per query.
	fresh bool
}

// Query is the query the load sends for n (with ID 0; the load sets a
// fresh one per try): RD set, EDNS with a 1232-byte payload and the NSID
// option (RFC 5001), so the reply says who answered. For a fresh entry the
// first label is a placeholder the load replaces per query.
func (n LoadName) Query() *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(n.wireName(), n.Type)
	m.Id = 0
	m.RecursionDesired = true
	opt := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
	opt.SetUDPSize(loadEDNSSize)
	opt.Option = append(opt.Option, &dns.EDNS0_NSID{Code: dns.EDNS0NSID})
	m.Extra = append(m.Extra, opt)
	return m
}

// newLoadTemplate packs the query for n once, off the hot path.
func newLoadTemplate(n LoadName) (loadTemplate, error) {
	if _, ok := dns.IsDomainName(n.FQDN); !ok || !dns.IsFqdn(n.FQDN) {
		return loadTemplate{}, fmt.Errorf("name %q: want an absolute domain name (with the trailing dot)", n.FQDN)
	}
	if n.Rcode != dns.RcodeSuccess && n.Rcode != dns.RcodeNameError {
		return loadTemplate{}, fmt.Errorf("name %s: expected rcode %s: want NOERROR or NXDOMAIN", n.FQDN, dns.RcodeToString[n.Rcode])
	}
	wire, err := n.Query().Pack()
	if err != nil {
		return loadTemplate{}, fmt.Errorf("name %s: pack query: %w", n.FQDN, err)
	}
	qend, err := loadSkipName(wire, 12)
	if err != nil || qend+4 > len(wire) {
		return loadTemplate{}, fmt.Errorf("name %s: packed query has no question", n.FQDN)
	}
	if n.Fresh && wire[12] != LoadFreshLabelLen {
		return loadTemplate{}, fmt.Errorf("name %s: fresh name's first label not where expected", n.FQDN)
	}
	return loadTemplate{wire: wire, question: wire[12 : qend+4], rcode: n.Rcode, fresh: n.Fresh}, nil
}

// loadReply is what the load needs from a reply, read in place.
type loadReply struct {
	id        uint16
	rcode     int    // with the OPT record's extended bits
	truncated bool   // TC set
	answers   int    // records in the answer section (ANCOUNT)
	question  []byte // the question section (one question), aliasing the packet
	nsid      []byte // NSID option data, aliasing the packet; nil if none
}

var errLoadShortReply = errors.New("malformed reply")

// loadParseReply reads a reply without allocating: header, the one question,
// then it skips answer and authority and looks for OPT in additional.
func loadParseReply(b []byte) (loadReply, error) {
	var r loadReply
	if len(b) < 12 {
		return r, errLoadShortReply
	}
	r.id = binary.BigEndian.Uint16(b[0:])
	if b[2]&0x80 == 0 { // QR: not a response
		return r, errLoadShortReply
	}
	r.truncated = b[2]&0x02 != 0
	r.rcode = int(b[3] & 0x0f)
	qd := binary.BigEndian.Uint16(b[4:])
	an := int(binary.BigEndian.Uint16(b[6:]))
	r.answers = an
	ns := int(binary.BigEndian.Uint16(b[8:]))
	ar := int(binary.BigEndian.Uint16(b[10:]))
	if qd != 1 {
		return r, errLoadShortReply
	}
	off, err := loadSkipName(b, 12)
	if err != nil || off+4 > len(b) {
		return r, errLoadShortReply
	}
	r.question = b[12 : off+4]
	off += 4
	for range an + ns {
		if off, err = loadSkipRR(b, off); err != nil {
			// A truncated reply may end anywhere; what was read stands.
			return r, nil
		}
	}
	for range ar {
		start := off
		if off, err = loadSkipName(b, off); err != nil || off+10 > len(b) {
			return r, nil
		}
		typ := binary.BigEndian.Uint16(b[off:])
		extRcode := int(b[off+4])
		rdlen := int(binary.BigEndian.Uint16(b[off+8:]))
		rdata := off + 10
		if rdata+rdlen > len(b) {
			return r, nil
		}
		if typ == dns.TypeOPT && off == start+1 {
			r.rcode |= extRcode << 4
			r.nsid = loadFindOption(b[rdata:rdata+rdlen], dns.EDNS0NSID)
		}
		off = rdata + rdlen
	}
	return r, nil
}

// loadFindOption returns the data of the first EDNS option with code, or
// nil.
func loadFindOption(opts []byte, code uint16) []byte {
	for len(opts) >= 4 {
		c := binary.BigEndian.Uint16(opts)
		n := int(binary.BigEndian.Uint16(opts[2:]))
		if 4+n > len(opts) {
			return nil
		}
		if c == code {
			return opts[4 : 4+n : 4+n]
		}
		opts = opts[4+n:]
	}
	return nil
}

// loadSkipName returns the offset just past the (possibly compressed) name
// at off.
func loadSkipName(b []byte, off int) (int, error) {
	for {
		if off >= len(b) {
			return 0, errLoadShortReply
		}
		l := int(b[off])
		switch {
		case l == 0:
			return off + 1, nil
		case l&0xc0 == 0xc0:
			if off+2 > len(b) {
				return 0, errLoadShortReply
			}
			return off + 2, nil
		case l&0xc0 != 0:
			return 0, errLoadShortReply
		}
		off += 1 + l
	}
}

// loadSkipRR returns the offset just past the resource record at off.
func loadSkipRR(b []byte, off int) (int, error) {
	off, err := loadSkipName(b, off)
	if err != nil || off+10 > len(b) {
		return 0, errLoadShortReply
	}
	end := off + 10 + int(binary.BigEndian.Uint16(b[off+8:]))
	if end > len(b) {
		return 0, errLoadShortReply
	}
	return end, nil
}

// loadSameQuestion compares two question sections: the name ignoring ASCII
// case (a server may echo the name in another case; label lengths are
// below 64, so folding never touches them), type and class exactly.
func loadSameQuestion(a, b []byte) bool {
	if len(a) != len(b) || len(a) < 5 {
		return false
	}
	n := len(a) - 4
	if string(a[n:]) != string(b[n:]) {
		return false
	}
	for i := range n {
		x, y := a[i], b[i]
		if x == y {
			continue
		}
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
