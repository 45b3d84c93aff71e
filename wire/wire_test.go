package wire

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

func packMsg(t testing.TB, m *dns.Msg) []byte {
	t.Helper()
	b, err := m.Pack()
	if err != nil {
		t.Fatalf("Pack: %v", err)
	}
	return b
}

func newQuery(name string, qtype uint16) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	m.Id = 0x4242
	return m
}

func TestParseQuery(t *testing.T) {
	nsid := func() []byte {
		m := newQuery("a.example.", dns.TypeA)
		m.SetEdns0(1232, true)
		m.IsEdns0().Option = append(m.IsEdns0().Option, &dns.EDNS0_NSID{Code: dns.EDNS0NSID}, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708"})
		return packMsg(t, m)
	}
	tests := []struct {
		name    string
		raw     func() []byte
		wantErr error
		check   func(t *testing.T, q *Query)
	}{
		{
			name: "plain query, 0x20 case kept",
			raw:  func() []byte { return packMsg(t, newQuery("WwW.ExAmPlE.", dns.TypeAAAA)) },
			check: func(t *testing.T, q *Query) {
				if q.ID != 0x4242 || q.QType != dns.TypeAAAA || q.QClass != dns.ClassINET || q.EDNS {
					t.Errorf("got %+v", q)
				}
				if string(q.QName) != "\x03WwW\x07ExAmPlE\x00" {
					t.Errorf("qname %q", q.QName)
				}
				if q.PayloadLimit() != 512 || q.Opcode() != 0 || q.Flags&FlagRD == 0 {
					t.Errorf("limit %d opcode %d flags %#x", q.PayloadLimit(), q.Opcode(), q.Flags)
				}
			},
		},
		{
			name: "root name",
			raw:  func() []byte { return packMsg(t, newQuery(".", dns.TypeNS)) },
			check: func(t *testing.T, q *Query) {
				if !bytes.Equal(q.QName, []byte{0}) || q.QEnd != HeaderLen+5 {
					t.Errorf("qname %q qend %d", q.QName, q.QEnd)
				}
			},
		},
		{
			name: "EDNS with DO, NSID and a cookie",
			raw:  nsid,
			check: func(t *testing.T, q *Query) {
				if !q.EDNS || !q.DO || !q.NSID || q.UDPSize != 1232 || q.EDNSVersion != 0 || q.PayloadLimit() != 1232 {
					t.Errorf("got %+v", q)
				}
			},
		},
		{
			name: "EDNS size below 512 counts as 512",
			raw: func() []byte {
				m := newQuery("a.example.", dns.TypeA)
				m.SetEdns0(100, false)
				return packMsg(t, m)
			},
			check: func(t *testing.T, q *Query) {
				if q.UDPSize != 100 || q.PayloadLimit() != 512 || q.DO {
					t.Errorf("got %+v limit %d", q, q.PayloadLimit())
				}
			},
		},
		{
			name: "EDNS version 1 is reported",
			raw: func() []byte {
				m := newQuery("a.example.", dns.TypeA)
				m.SetEdns0(1232, false)
				m.IsEdns0().SetVersion(1)
				return packMsg(t, m)
			},
			check: func(t *testing.T, q *Query) {
				if q.EDNSVersion != 1 {
					t.Errorf("version %d", q.EDNSVersion)
				}
			},
		},
		{
			name: "OPT after an answer record",
			raw: func() []byte {
				m := newQuery("a.example.", dns.TypeA)
				rr, _ := dns.NewRR("a.example. 60 IN A 192.0.2.1")
				m.Answer = []dns.RR{rr}
				m.SetEdns0(4096, true)
				return packMsg(t, m)
			},
			check: func(t *testing.T, q *Query) {
				if !q.EDNS || !q.DO || q.UDPSize != 4096 || q.Stray != 1 {
					t.Errorf("got %+v", q)
				}
			},
		},
		{
			name:    "shorter than a header",
			raw:     func() []byte { return []byte{1, 2, 3} },
			wantErr: ErrShort,
		},
		{
			name:    "no question",
			raw:     func() []byte { m := newQuery("a.", dns.TypeA); m.Question = nil; return packMsg(t, m) },
			wantErr: ErrQuestionCount,
		},
		{
			name: "two questions",
			raw: func() []byte {
				m := newQuery("a.", dns.TypeA)
				m.Question = append(m.Question, m.Question[0])
				return packMsg(t, m)
			},
			wantErr: ErrQuestionCount,
		},
		{
			name:    "question cut short",
			raw:     func() []byte { b := packMsg(t, newQuery("a.example.", dns.TypeA)); return b[:len(b)-2] },
			wantErr: ErrFormat,
		},
		{
			name:    "pointer in question",
			raw:     func() []byte { return append(header(1, 0, 0), 0xc0, 12, 0, 1, 0, 1) },
			wantErr: ErrFormat,
		},
		{
			name: "name longer than 255",
			raw: func() []byte {
				b := header(1, 0, 0)
				for range 5 {
					b = append(b, 63)
					b = append(b, strings.Repeat("x", 63)...)
				}
				return append(b, 0, 0, 1, 0, 1)
			},
			wantErr: ErrFormat,
		},
		{
			name: "two OPT records",
			raw: func() []byte {
				m := newQuery("a.example.", dns.TypeA)
				m.SetEdns0(1232, false)
				m.Extra = append(m.Extra, m.Extra[0])
				return packMsg(t, m)
			},
			wantErr: ErrFormat,
		},
		{
			name:    "additional count past the end",
			raw:     func() []byte { b := packMsg(t, newQuery("a.", dns.TypeA)); b[11] = 1; return b },
			wantErr: ErrFormat,
		},
		{
			name: "OPT option length past RDATA",
			raw: func() []byte {
				b := packMsg(t, newQuery("a.", dns.TypeA))
				b[11] = 1
				return append(b, 0, 0, 41, 4, 0xd0, 0, 0, 0, 0, 0, 4, 0, 3, 0, 9)
			},
			wantErr: ErrFormat,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var q Query
			err := ParseQuery(tt.raw(), &q)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if tt.wantErr != nil && tt.wantErr != ErrShort && q.ID == 0 {
				t.Fatalf("ID not set on %v", err)
			}
			if tt.check != nil {
				tt.check(t, &q)
			}
		})
	}
}

// TestParseQueryStray: Stray counts the records a query has no use for —
// answer and authority records, additional records other than the OPT and
// a final TSIG — and nothing else.
func TestParseQueryStray(t *testing.T) {
	rr := func(s string) dns.RR {
		r, err := dns.NewRR(s)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	a := rr("a.example. 60 IN A 192.0.2.1")
	opt := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
	tsig := &dns.TSIG{Hdr: dns.RR_Header{Name: "key.", Rrtype: dns.TypeTSIG, Class: dns.ClassANY},
		Algorithm: dns.HmacSHA256, Fudge: 300, MACSize: 4, MAC: "01020304"}
	tests := []struct {
		name       string
		an, ns, ar []dns.RR
		want       int
	}{
		{"question only", nil, nil, nil, 0},
		{"OPT", nil, nil, []dns.RR{opt}, 0},
		{"TSIG", nil, nil, []dns.RR{tsig}, 0},
		{"OPT then TSIG", nil, nil, []dns.RR{opt, tsig}, 0},
		{"TSIG not last", nil, nil, []dns.RR{tsig, opt}, 1},
		{"an answer", []dns.RR{a}, nil, nil, 1},
		{"an authority record", nil, []dns.RR{a}, []dns.RR{opt}, 1},
		{"an additional A", nil, nil, []dns.RR{a}, 1},
		{"OPT and an additional A", nil, nil, []dns.RR{opt, a}, 1},
		{"one of each", []dns.RR{a}, []dns.RR{a}, []dns.RR{a, opt}, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newQuery("a.example.", dns.TypeA)
			m.Answer, m.Ns, m.Extra = tt.an, tt.ns, tt.ar
			var q Query
			if err := ParseQuery(packMsg(t, m), &q); err != nil {
				t.Fatal(err)
			}
			if q.Stray != tt.want {
				t.Errorf("Stray = %d, want %d", q.Stray, tt.want)
			}
		})
	}
}

// header returns a query header with the given counts and ID 0x0101.
func header(qd, an, ar byte) []byte {
	return []byte{1, 1, 1, 0, 0, qd, 0, an, 0, 0, 0, ar}
}

func TestPutOPT(t *testing.T) {
	for _, nsid := range [][]byte{nil, []byte("dnsstandby")} {
		m := newQuery("a.", dns.TypeA)
		b := packMsg(t, m)
		b[11] = 1
		opt := make([]byte, OPTLen(nsid))
		if n := PutOPT(opt, 1232, true, nsid); n != len(opt) {
			t.Fatalf("PutOPT wrote %d, want %d", n, len(opt))
		}
		var got dns.Msg
		if err := got.Unpack(append(b, opt...)); err != nil {
			t.Fatalf("unpack with OPT: %v", err)
		}
		o := got.IsEdns0()
		if o == nil || o.UDPSize() != 1232 || !o.Do() || o.Version() != 0 {
			t.Fatalf("OPT %v", o)
		}
		if nsid != nil {
			if len(o.Option) != 1 || o.Option[0].(*dns.EDNS0_NSID).Nsid != "646e737374616e646279" {
				t.Fatalf("options %v", o.Option)
			}
		} else if len(o.Option) != 0 {
			t.Fatalf("options %v", o.Option)
		}
	}
}

func TestLowerName(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string
	}{
		{"mixed case", "\x03WwW\x07Ex-AmPlE\x00", "\x03www\x07ex-ample\x00"},
		{"root", "\x00", "\x00"},
		{"already lower", "\x01a\x00", "\x01a\x00"},
		// Only A-Z change: their neighbours '@' and '[', and bytes past
		// ASCII (label lengths, or octets in a label), stay.
		{"A-Z edges", "\x04@AZ[\x00", "\x04@az[\x00"},
		{"octets past ASCII", "\x02\xc1\xda\x00", "\x02\xc1\xda\x00"},
		// A label is at most 63 octets: no length byte is in A-Z.
		{"longest label", "\x3f" + strings.Repeat("X", 63) + "\x00", "\x3f" + strings.Repeat("x", 63) + "\x00"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := make([]byte, len(tt.in)+3)
			if n := LowerName(out, []byte(tt.in)); n != len(tt.in) || string(out[:n]) != tt.want {
				t.Fatalf("LowerName(%q) = %d, %q; want %q", tt.in, n, out[:n], tt.want)
			}
		})
	}
}

func TestParseQueryAllocs(t *testing.T) {
	m := newQuery("a.example.", dns.TypeA)
	m.SetEdns0(1232, true)
	raw := packMsg(t, m)
	var q Query
	if n := testing.AllocsPerRun(100, func() { _ = ParseQuery(raw, &q) }); n != 0 {
		t.Fatalf("%v allocs", n)
	}
}

// FuzzParseQuery checks ParseQuery never panics and agrees with miekg/dns
// on every message both accept: question, OPT and stray records.
func FuzzParseQuery(f *testing.F) {
	m := newQuery("WwW.example.", dns.TypeA)
	f.Add(packMsg(f, m))
	m.SetEdns0(1232, true)
	m.IsEdns0().Option = append(m.IsEdns0().Option, &dns.EDNS0_NSID{Code: dns.EDNS0NSID})
	f.Add(packMsg(f, m))
	f.Add(append(header(1, 0, 0), 0xc0, 12, 0, 1, 0, 1))
	rr, _ := dns.NewRR("www.example. 60 IN A 192.0.2.1")
	m.Answer = []dns.RR{rr}
	m.Extra = append(m.Extra, rr)
	f.Add(packMsg(f, m))
	f.Fuzz(func(t *testing.T, raw []byte) {
		var q Query
		if err := ParseQuery(raw, &q); err != nil {
			return
		}
		if q.QEnd > len(raw) || len(q.QName) == 0 || q.QName[len(q.QName)-1] != 0 {
			t.Fatalf("inconsistent parse: %+v", q)
		}
		var m dns.Msg
		if m.Unpack(raw) != nil {
			return // miekg/dns also checks RDATA, which the hot path skips
		}
		wantName := make([]byte, 256)
		n, err := dns.PackDomainName(m.Question[0].Name, wantName, 0, nil, false)
		if err != nil {
			return
		}
		if !bytes.Equal(wantName[:n], q.QName) || m.Question[0].Qtype != q.QType || m.Question[0].Qclass != q.QClass || m.Id != q.ID {
			t.Fatalf("question differs from miekg/dns: %q %d %d vs %v", q.QName, q.QType, q.QClass, m.Question[0])
		}
		opt := m.IsEdns0()
		if (opt != nil) != q.EDNS {
			t.Fatalf("EDNS %v, miekg/dns %v", q.EDNS, opt != nil)
		}
		if opt != nil && (opt.UDPSize() != q.UDPSize || opt.Do() != q.DO || opt.Version() != q.EDNSVersion) {
			t.Fatalf("OPT differs: %+v vs %v", q, opt)
		}
		stray := len(m.Answer) + len(m.Ns)
		for i, rr := range m.Extra {
			switch rr.Header().Rrtype {
			case dns.TypeOPT:
			case dns.TypeTSIG:
				if i != len(m.Extra)-1 {
					stray++
				}
			default:
				stray++
			}
		}
		if stray != q.Stray {
			t.Fatalf("Stray %d, miekg/dns's sections make it %d", q.Stray, stray)
		}
	})
}

func TestCheckHeader(t *testing.T) {
	// hdr builds a header: flags, then QD, AN, NS, AR counts.
	hdr := func(flags uint16, qd, an, ns, ar byte) []byte {
		return []byte{0, 1, byte(flags >> 8), byte(flags), 0, qd, 0, an, 0, ns, 0, ar}
	}
	op := func(o int) uint16 { return uint16(o) << 11 }
	tests := []struct {
		name string
		msg  []byte
		want Verdict
	}{
		{"query", hdr(FlagRD, 1, 0, 0, 1), Accept},
		{"query with an answer, an authority and OPT plus TSIG", hdr(0, 1, 1, 1, 2), Accept},
		{"notify", hdr(op(OpcodeNotify), 1, 1, 0, 0), Accept},
		{"response", hdr(FlagQR, 1, 0, 0, 0), Ignore},
		{"response with a bad opcode", hdr(FlagQR|op(5), 0, 0, 0, 0), Ignore},
		{"iquery", hdr(op(1), 1, 0, 0, 0), RejectNotImp},
		{"status", hdr(op(2), 1, 0, 0, 0), RejectNotImp},
		{"update", hdr(op(5), 1, 0, 0, 0), RejectNotImp},
		{"unassigned opcode 15", hdr(op(15), 1, 0, 0, 0), RejectNotImp},
		{"update without a question: the opcode first", hdr(op(5), 0, 0, 0, 0), RejectNotImp},
		{"iquery with two questions", hdr(op(1), 2, 0, 0, 0), RejectNotImp},
		{"no question", hdr(0, 0, 0, 0, 0), RejectFormat},
		{"two questions", hdr(0, 2, 0, 0, 0), RejectFormat},
		{"notify without a question", hdr(op(OpcodeNotify), 0, 0, 0, 0), RejectFormat},
		{"two answers", hdr(0, 1, 2, 0, 0), RejectFormat},
		{"two authority records", hdr(0, 1, 0, 2, 0), RejectFormat},
		{"three additional records", hdr(0, 1, 0, 0, 3), RejectFormat},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := CheckHeader(tt.msg); got != tt.want {
				t.Errorf("CheckHeader = %d, want %d", got, tt.want)
			}
		})
	}
}
