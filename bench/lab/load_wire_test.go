package lab

import (
	"encoding/hex"
	"fmt"
	"testing"

	"github.com/miekg/dns"
)

func TestLoadTemplate(t *testing.T) {
	tmpl, err := newLoadTemplate(LoadName{FQDN: "svc-1.default.svc.cluster.local.", Type: dns.TypeA, Rcode: dns.RcodeSuccess})
	if err != nil {
		t.Fatal(err)
	}
	m := new(dns.Msg)
	if err := m.Unpack(tmpl.wire); err != nil {
		t.Fatal(err)
	}
	if !m.RecursionDesired || m.Id != 0 || len(m.Question) != 1 || m.Question[0].Name != "svc-1.default.svc.cluster.local." {
		t.Errorf("query: %v", m)
	}
	opt := m.IsEdns0()
	if opt == nil || opt.UDPSize() != loadEDNSSize {
		t.Fatalf("no EDNS(%d): %v", loadEDNSSize, m)
	}
	if len(opt.Option) != 1 || opt.Option[0].Option() != dns.EDNS0NSID {
		t.Errorf("options %v, want one empty NSID", opt.Option)
	}
	if want := len("svc-1.default.svc.cluster.local.") + 1 + 4; len(tmpl.question) != want {
		t.Errorf("question section %d bytes, want %d", len(tmpl.question), want)
	}

	for _, bad := range []LoadName{
		{FQDN: "no-dot.example", Type: dns.TypeA},
		{FQDN: "ok.example.", Type: dns.TypeA, Rcode: dns.RcodeServerFailure},
	} {
		if _, err := newLoadTemplate(bad); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}

// loadTestReply packs a reply to q as a server would, with the given rcode,
// NSID ("" for no OPT at all) and an answer record or not.
func loadTestReply(t *testing.T, q *dns.Msg, rcode int, nsid string, answer bool) []byte {
	t.Helper()
	r := new(dns.Msg)
	r.SetRcode(q, rcode)
	r.Compress = true
	if answer {
		rr, err := dns.NewRR(q.Question[0].Name + " 30 IN A 192.0.2.1")
		if err != nil {
			t.Fatal(err)
		}
		r.Answer = append(r.Answer, rr)
		ns, _ := dns.NewRR(q.Question[0].Name + " 30 IN NS ns." + q.Question[0].Name)
		r.Ns = append(r.Ns, ns)
	}
	if nsid != "" {
		opt := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
		opt.SetUDPSize(1232)
		opt.SetExtendedRcode(uint16(rcode))
		opt.Option = append(opt.Option,
			&dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708"},
			&dns.EDNS0_NSID{Code: dns.EDNS0NSID, Nsid: hex.EncodeToString([]byte(nsid))})
		r.Extra = append(r.Extra, opt)
	}
	b, err := r.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestLoadParseReply(t *testing.T) {
	q := new(dns.Msg)
	q.SetQuestion("Svc-1.Default.svc.cluster.local.", dns.TypeA)
	q.Id = 0xbeef
	tmpl, err := newLoadTemplate(LoadName{FQDN: "svc-1.default.svc.cluster.local.", Type: dns.TypeA})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		wire      []byte
		wantErr   bool
		wantRcode int
		wantNSID  string
		wantTC    bool
	}{
		{name: "answer with NSID", wire: loadTestReply(t, q, dns.RcodeSuccess, LoadNSIDLocalDNS, true), wantNSID: LoadNSIDLocalDNS},
		{name: "nxdomain from standby", wire: loadTestReply(t, q, dns.RcodeNameError, LoadNSIDStandby, false), wantRcode: dns.RcodeNameError, wantNSID: LoadNSIDStandby},
		{name: "servfail without EDNS", wire: loadTestReply(t, q, dns.RcodeServerFailure, "", false), wantRcode: dns.RcodeServerFailure},
		{name: "extended rcode BADCOOKIE", wire: loadTestReply(t, q, dns.RcodeBadCookie, "x", false), wantRcode: dns.RcodeBadCookie, wantNSID: "x"},
		{name: "truncated", wire: func() []byte {
			b := loadTestReply(t, q, dns.RcodeSuccess, "", true)
			b[2] |= 0x02
			return b[:len(q.Question[0].Name)+1+4+12+3] // cut inside the answer
		}(), wantTC: true},
		{name: "a query, not a reply", wire: func() []byte { b, _ := q.Pack(); return b }(), wantErr: true},
		{name: "short", wire: []byte{0xbe, 0xef, 0x80}, wantErr: true},
		{name: "no question", wire: []byte{0xbe, 0xef, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0}, wantErr: true},
		{name: "bad label", wire: []byte{0xbe, 0xef, 0x80, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0x80, 0, 0, 1, 0, 1}, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := loadParseReply(tc.wire)
			if (err != nil) != tc.wantErr {
				t.Fatalf("error %v, want error %v", err, tc.wantErr)
			}
			if tc.wantErr {
				return
			}
			if r.id != 0xbeef || r.rcode != tc.wantRcode || string(r.nsid) != tc.wantNSID || r.truncated != tc.wantTC {
				t.Errorf("got id %#x rcode %d nsid %q tc %v; want rcode %d nsid %q tc %v",
					r.id, r.rcode, r.nsid, r.truncated, tc.wantRcode, tc.wantNSID, tc.wantTC)
			}
			if !loadSameQuestion(r.question, tmpl.question) {
				t.Errorf("question %x does not match %x (case must not matter)", r.question, tmpl.question)
			}
		})
	}
}

func TestLoadSameQuestion(t *testing.T) {
	a, _ := newLoadTemplate(LoadName{FQDN: "a.example.", Type: dns.TypeA})
	aaaa, _ := newLoadTemplate(LoadName{FQDN: "a.example.", Type: dns.TypeAAAA})
	b, _ := newLoadTemplate(LoadName{FQDN: "b.example.", Type: dns.TypeA})
	https, _ := newLoadTemplate(LoadName{FQDN: "a.example.", Type: dns.TypeHTTPS}) // 65 = 'A'
	type97, _ := newLoadTemplate(LoadName{FQDN: "a.example.", Type: 97})           // 'a'
	upper, _ := newLoadTemplate(LoadName{FQDN: "A.EXAMPLE.", Type: dns.TypeA})
	tests := []struct {
		name string
		x, y []byte
		want bool
	}{
		{"same", a.question, a.question, true},
		{"case", a.question, upper.question, true},
		{"type", a.question, aaaa.question, false},
		{"name", a.question, b.question, false},
		{"type is not folded", https.question, type97.question, false},
		{"length", a.question, a.question[1:], false},
	}
	for _, tc := range tests {
		if got := loadSameQuestion(tc.x, tc.y); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestLoadIntern: the responders' NSIDs, on either listener, come back as
// the package's constants; others are kept up to loadMaxNSIDs, then
// lumped together.
func TestLoadIntern(t *testing.T) {
	l := &Load{nsids: map[string]string{}}
	for _, tc := range []struct{ nsid, want string }{
		{"", ""},
		{"localdns-pod", LoadNSIDLocalDNS},
		{"localdns", LoadNSIDLocalDNSNode},
		{"dnsstandby", LoadNSIDStandby},
		{"other-server", "other-server"},
	} {
		if got := l.intern([]byte(tc.nsid)); got != tc.want {
			t.Errorf("intern(%q) = %q, want %q", tc.nsid, got, tc.want)
		}
	}
	for i := range loadMaxNSIDs {
		l.intern(fmt.Appendf(nil, "server-%d", i))
	}
	if got := l.intern([]byte("one-too-many")); got != LoadNSIDOther {
		t.Errorf("NSID past the cap: %q, want %q", got, LoadNSIDOther)
	}
}
