package localanswer

import (
	"bytes"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"text/template"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/corefile"
)

// tmplTestCorefile has templates whose answers show what Templates does
// beyond what TestTemplateConformsToCoreDNS can ask CoreDNS.
const tmplTestCorefile = `.:53 {
    template IN TXT remote.test {
        answer "{{ .Name }} 5 IN TXT \"{{ .Remote }}\" \"[{{ .Meta \"k\" }}]\" \"{{ .Group.zone }}\""
        match "^(?P<zone>.*)$"
    }
    template IN TXT big.test {
        answer "{{ .Name }} 5 IN TXT {{ printf \"%070000d\" 0 }}"
    }
    template IN TXT justfits.test {
        answer "{{ .Name }} 5 IN TXT {{ printf \"%0200d\" 0 }}"
    }
    template IN A echo.test {
        answer "{{ .Name }} 5 IN A 192.0.2.1"
        additional "{{ .Name }} 5 IN TXT \"{{ .Type }} {{ .Class }}\""
    }
    template IN ANY panic.test {
        answer "{{ .Message.Question }} IN A 192.0.2.1"
    }
}
`

func tmplTestTemplates(t testing.TB, text string) *Templates {
	t.Helper()
	s, err := corefile.Parse("test.corefile", strings.NewReader(text), []netip.AddrPort{netip.MustParseAddrPort("169.254.10.11:53")})
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewTemplates(s.ZoneFor(".").Templates)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestTemplatesAnswer checks what the conformance test cannot: clients
// other than the listen address, the output bound, and what is not a
// question.
func TestTemplatesAnswer(t *testing.T) {
	a := tmplTestTemplates(t, tmplTestCorefile)
	v4 := netip.MustParseAddrPort("10.1.2.3:3456")
	tests := []struct {
		name   string
		qname  string
		qtype  uint16
		client netip.AddrPort
		none   bool // no question at all

		pass   bool // passed on
		rcode  int
		aa     bool
		answer []string
		extra  []string
	}{
		{name: "remote IPv4, no port", qname: "x.Remote.test.", qtype: dns.TypeTXT, client: v4, aa: true,
			answer: []string{"x.remote.test.\t5\tIN\tTXT\t\"10.1.2.3\" \"[]\" \"x.remote.test.\""}},
		{name: "remote IPv4-mapped is IPv4", qname: "x.remote.test.", qtype: dns.TypeTXT,
			client: netip.MustParseAddrPort("[::ffff:10.1.2.3]:53"), aa: true,
			answer: []string{"x.remote.test.\t5\tIN\tTXT\t\"10.1.2.3\" \"[]\" \"x.remote.test.\""}},
		{name: "remote IPv6", qname: "remote.test.", qtype: dns.TypeTXT,
			client: netip.MustParseAddrPort("[2001:db8::7]:53"), aa: true,
			answer: []string{"remote.test.\t5\tIN\tTXT\t\"2001:db8::7\" \"[]\" \"remote.test.\""}},
		{name: "no client: empty remote", qname: "remote.test.", qtype: dns.TypeTXT, aa: true,
			answer: []string{"remote.test.\t5\tIN\tTXT\t\"\" \"[]\" \"remote.test.\""}},
		{name: "output over the bound is SERVFAIL", qname: "big.test.", qtype: dns.TypeTXT, client: v4,
			rcode: dns.RcodeServerFailure},
		{name: "output under the bound", qname: "justfits.test.", qtype: dns.TypeTXT, client: v4, aa: true,
			answer: []string{"justfits.test.\t5\tIN\tTXT\t\"" + strings.Repeat("0", 200) + "\""}},
		{name: "type and class data", qname: "E.echo.test.", qtype: dns.TypeA, client: v4, aa: true,
			answer: []string{"e.echo.test.\t5\tIN\tA\t192.0.2.1"},
			extra:  []string{"e.echo.test.\t5\tIN\tTXT\t\"A IN\""}},
		{name: "a template that fails on the query's data is SERVFAIL", qname: "panic.test.", qtype: dns.TypeA, client: v4,
			rcode: dns.RcodeServerFailure},
		{name: "outside every zone", qname: "example.com.", qtype: dns.TypeA, client: v4, pass: true},
		{name: "root", qname: ".", qtype: dns.TypeNS, client: v4, pass: true},
		{name: "no question", none: true, client: v4, pass: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := new(dns.Msg)
			if !tt.none {
				q.SetQuestion(tt.qname, tt.qtype)
			}
			before, err := q.Pack()
			if err != nil {
				t.Fatal(err)
			}
			r, ok := a.Answer(Request{Msg: q, Client: tt.client, Local: netip.MustParseAddrPort("169.254.10.11:53")})
			if after, _ := q.Pack(); !bytes.Equal(before, after) {
				t.Errorf("the query was modified")
			}
			if ok == tt.pass {
				t.Fatalf("answered %v, want %v: %v", ok, !tt.pass, r)
			}
			if tt.pass {
				if r != nil {
					t.Errorf("passed on with a reply: %v", r)
				}
				return
			}
			if r.Id != q.Id || !r.Response || len(r.Question) != 1 || r.Question[0] != q.Question[0] {
				t.Errorf("not a reply to the query: %v", r)
			}
			if r.Rcode != tt.rcode || r.Authoritative != tt.aa {
				t.Errorf("rcode %s AA %v, want %s AA %v", dns.RcodeToString[r.Rcode], r.Authoritative, dns.RcodeToString[tt.rcode], tt.aa)
			}
			if got := tmplRRStrings(r.Answer); strings.Join(got, "\n") != strings.Join(tt.answer, "\n") {
				t.Errorf("answer %q, want %q", got, tt.answer)
			}
			if got := tmplRRStrings(r.Extra); strings.Join(got, "\n") != strings.Join(tt.extra, "\n") {
				t.Errorf("additional %q, want %q", got, tt.extra)
			}
			if _, err := r.Pack(); err != nil {
				t.Errorf("reply does not pack: %v", err)
			}
		})
	}
}

// TestNewTemplates checks that NewTemplates refuses stanzas Parse never
// makes.
func TestNewTemplates(t *testing.T) {
	anyName := regexp.MustCompile(".*")
	tmpl, err := corefile.NewTemplateText("answer", "{{ .Name }} IN A 192.0.2.1")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		ts   []corefile.Template
		want string // error; "" for none
	}{
		{"none", nil, ""},
		{"good", []corefile.Template{{Zones: []string{"."}, Regexes: []*regexp.Regexp{anyName}, Answer: []*template.Template{tmpl}}}, ""},
		{"no regex", []corefile.Template{{Line: 7}}, `localanswer: template 0 (line 7): no regex (a stanza without match has ".*")`},
		{"nil regex", []corefile.Template{{Regexes: []*regexp.Regexp{nil}}}, "localanswer: template 0 (line 0): nil regex"},
		{"nil template", []corefile.Template{{}, {Line: 3, Regexes: []*regexp.Regexp{anyName}, Authority: []*template.Template{nil}}}[1:],
			"localanswer: template 0 (line 3): nil RR template"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := NewTemplates(tt.ts)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("error %v", err)
			case tt.want == "" && a == nil:
				t.Fatal("nil Templates without an error")
			case tt.want != "" && (err == nil || err.Error() != tt.want):
				t.Fatalf("error %v, want %q", err, tt.want)
			}
		})
	}
}

// FuzzTemplates sends whatever a pod may send to AgentBaker's templates
// and to templates that copy the query name into their RRs: Answer must
// not panic, and a reply must answer the question and pack.
func FuzzTemplates(f *testing.F) {
	a := tmplTestTemplates(f, `.:53 {
    template ANY ANY internal.cloudapp.net {
        match "^(?:[^.]+\.){4,}internal\.cloudapp\.net\.$"
        rcode NXDOMAIN
        fallthrough
    }
    template ANY ANY reddog.microsoft.com {
        rcode NXDOMAIN
    }
    template ANY ANY example.org {
        match "^(?P<a>[^.]*)\.(?P<b>.*)$"
        answer "{{ .Name }} 60 {{ .Class }} TXT \"{{ .Group.a }}\" {{ .Group.b }}"
        additional "{{ .Group.a }}.example.org. 60 IN A 192.0.2.1"
        authority "example.org. 60 IN NS {{ .Name }}"
        ederror 15 "{{ .Name }}"
        fallthrough
    }
}
`)
	for _, s := range []struct {
		name  string
		qtype uint16
	}{
		{"a.b.c.d.internal.cloudapp.net.", dns.TypeA},
		{"x.reddog.microsoft.com.", dns.TypeAAAA},
		{"a.b.example.org.", dns.TypeTXT},
		{`a\032b\"\;.x\(.example.org.`, dns.TypeANY},
		{`\000.example.org.`, dns.TypeA},
	} {
		q := new(dns.Msg)
		q.SetQuestion(s.name, s.qtype)
		q.SetEdns0(1232, true)
		b, err := q.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	client := netip.MustParseAddrPort("10.1.2.3:4567")
	f.Fuzz(func(t *testing.T, b []byte) {
		q := new(dns.Msg)
		if err := q.Unpack(b); err != nil {
			return
		}
		r, ok := a.Answer(Request{Msg: q, Client: client})
		if !ok {
			if r != nil {
				t.Fatalf("passed on with a reply")
			}
			return
		}
		if len(q.Question) == 0 || len(r.Question) != 1 || r.Question[0] != q.Question[0] || r.Id != q.Id {
			t.Fatalf("reply %v does not answer %v", r, q)
		}
		if _, err := r.Pack(); err != nil {
			t.Fatalf("reply does not pack: %v\n%v", err, r)
		}
	})
}
