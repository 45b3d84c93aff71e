package corefile

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"text/template"

	"github.com/miekg/dns"
)

// tmplView is a Template with its regexes and templates as their text,
// for comparison.
type tmplView struct {
	Class, Type                   uint16
	Zones                         []string
	Regexes                       []string
	Answer, Additional, Authority []string
	Rcode                         int
	EDE                           *EDE
	Fallthrough                   []string
	Line                          int
}

func viewTemplates(ts []Template) []tmplView {
	texts := func(tt []*template.Template) []string {
		var out []string
		for _, t := range tt {
			out = append(out, t.Tree.Root.String())
		}
		return out
	}
	var out []tmplView
	for _, t := range ts {
		v := tmplView{
			Class: t.Class, Type: t.Type, Zones: t.Zones,
			Answer: texts(t.Answer), Additional: texts(t.Additional), Authority: texts(t.Authority),
			Rcode: t.Rcode, EDE: t.EDE, Fallthrough: t.Fallthrough, Line: t.Line,
		}
		for _, re := range t.Regexes {
			v.Regexes = append(v.Regexes, re.String())
		}
		out = append(out, v)
	}
	return out
}

// TestTemplateAgentBaker reads AgentBaker's two templates, which both
// root blocks carry and no other block does.
func TestTemplateAgentBaker(t *testing.T) {
	s, err := Load("testdata/agentbaker.corefile", []netip.AddrPort{podListener, nodeListener})
	if err != nil {
		t.Fatal(err)
	}
	roots := 0
	for _, z := range s.Zones {
		if z.Name != "." {
			if len(z.Templates) != 0 {
				t.Errorf("zone %s: %d templates, want none", z.Name, len(z.Templates))
			}
			continue
		}
		roots++
		want := []tmplView{{
			Class: dns.ClassANY, Type: dns.TypeANY,
			Zones:       []string{"internal.cloudapp.net."},
			Regexes:     []string{`^(?:[^.]+\.){4,}internal\.cloudapp\.net\.$`},
			Rcode:       dns.RcodeNameError,
			Fallthrough: []string{"."},
			Line:        z.Line + 24,
		}, {
			Class: dns.ClassANY, Type: dns.TypeANY,
			Zones:   []string{"reddog.microsoft.com."},
			Regexes: []string{".*"},
			Rcode:   dns.RcodeNameError,
			Line:    z.Line + 29,
		}}
		if got := viewTemplates(z.Templates); !reflect.DeepEqual(got, want) {
			t.Errorf("zone %s at line %d:\n got %+v\nwant %+v", z.Name, z.Line, got, want)
		}
		re := z.Templates[0].Regexes[0]
		for name, match := range map[string]bool{
			"a.b.c.d.internal.cloudapp.net.": true,
			"a.b.c.internal.cloudapp.net.":   false,
			"vm.internal.cloudapp.net.":      false,
		} {
			if re.MatchString(name) != match {
				t.Errorf("regex matches %s: %v, want %v", name, !match, match)
			}
		}
	}
	if roots != 2 {
		t.Fatalf("%d root zones, want 2 (one per listener)", roots)
	}
}

// TestTemplate checks template parsing against CoreDNS 1.13.1's
// templateParse.
func TestTemplate(t *testing.T) {
	tests := []struct {
		name  string
		block string // the block, its template directive on line 2
		zone  string // the zone to look at
		want  []tmplView
		notes []string
	}{
		{
			name:  "no zone: every key of the block",
			block: "Example.ORG:53 dns://example.net 10.0.0.0/23 {\n  template IN A\n}\n",
			zone:  "example.org.",
			want: []tmplView{{Class: dns.ClassINET, Type: dns.TypeA,
				Zones:   []string{"example.org.", "example.net.", "0.0.10.in-addr.arpa.", "1.0.10.in-addr.arpa."},
				Regexes: []string{".*"}, Line: 2}},
		},
		{
			name:  "zones normalized, bad ones dropped",
			block: ".:53 {\n  template CH TXT Example.COM. dns://foo.org:53 a..b\n}\n",
			zone:  ".",
			want: []tmplView{{Class: dns.ClassCHAOS, Type: dns.TypeTXT,
				Zones: []string{"example.com.", "foo.org."}, Regexes: []string{".*"}, Line: 2}},
			notes: []string{`test.corefile:2: template: zone "a..b" ignored: zone is not a valid domain name: "a..b"`},
		},
		{
			name: "every option",
			block: ".:53 {\n  template IN ANY example.org {\n" +
				"    match ^a\\. \"^b\\.\"\n    match ^c\\.\n" +
				"    answer \"{{ .Name }} 60 IN A 192.0.2.1\" \"{{ .Name }} IN A 192.0.2.2\"\n" +
				"    additional \"ns.example.org. IN A 192.0.2.53\"\n" +
				"    authority \"example.org. IN NS ns.example.org.\"\n" +
				"    rcode NXDOMAIN\n    ederror 18 \"not here\"\n" +
				"    fallthrough Example.ORG other.org.\n    upstream 10.0.0.1\n  }\n}\n",
			zone: ".",
			want: []tmplView{{Class: dns.ClassINET, Type: dns.TypeANY,
				Zones:       []string{"example.org."},
				Regexes:     []string{`^a\.`, `^b\.`, `^c\.`},
				Answer:      []string{"{{.Name}} 60 IN A 192.0.2.1", "{{.Name}} IN A 192.0.2.2"},
				Additional:  []string{"ns.example.org. IN A 192.0.2.53"},
				Authority:   []string{"example.org. IN NS ns.example.org."},
				Rcode:       dns.RcodeNameError,
				EDE:         &EDE{Code: 18, Reason: "not here"},
				Fallthrough: []string{"example.org.", "other.org."},
				Line:        2}},
		},
		{
			name:  "bare fallthrough is the root; ederror without text; later rcode wins",
			block: ".:53 {\n  template ANY ANY {\n    fallthrough\n    ederror 0\n    rcode REFUSED\n    rcode SERVFAIL\n  }\n}\n",
			zone:  ".",
			want: []tmplView{{Class: dns.ClassANY, Type: dns.TypeANY, Zones: []string{"."}, Regexes: []string{".*"},
				Rcode: dns.RcodeServerFailure, EDE: &EDE{}, Fallthrough: []string{"."}, Line: 2}},
		},
		{
			name:  "fallthrough with only bad zones falls through nowhere",
			block: ".:53 {\n  template IN A {\n    fallthrough a..b\n  }\n}\n",
			zone:  ".",
			want: []tmplView{{Class: dns.ClassINET, Type: dns.TypeA, Zones: []string{"."}, Regexes: []string{".*"},
				Fallthrough: []string{}, Line: 2}},
		},
		{
			name:  "stanzas in file order, other plugins between",
			block: ".:53 {\n  template IN A a.org\n  whoami\n  template IN AAAA b.org {\n    rcode NOTIMP\n  }\n}\n",
			zone:  ".",
			want: []tmplView{
				{Class: dns.ClassINET, Type: dns.TypeA, Zones: []string{"a.org."}, Regexes: []string{".*"}, Line: 2},
				{Class: dns.ClassINET, Type: dns.TypeAAAA, Zones: []string{"b.org."}, Regexes: []string{".*"}, Rcode: dns.RcodeNotImplemented, Line: 4},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := parseText(t, tt.block)
			z := zone(t, s, tt.zone)
			if got := viewTemplates(z.Templates); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("templates:\n got %+v\nwant %+v", got, tt.want)
			}
			var notes []string
			for _, n := range s.Notes {
				notes = append(notes, n.String())
			}
			if !reflect.DeepEqual(notes, tt.notes) {
				t.Errorf("notes %q, want %q", notes, tt.notes)
			}
		})
	}
}

// TestTemplateZonesCopied checks that the zones of a multi-key block
// each get the block's templates.
func TestTemplateZonesCopied(t *testing.T) {
	s := parseText(t, "a.org b.org {\n  template IN A\n}\n")
	for _, name := range []string{"a.org.", "b.org."} {
		z := zone(t, s, name)
		if len(z.Templates) != 1 || !reflect.DeepEqual(z.Templates[0].Zones, []string{"a.org.", "b.org."}) {
			t.Errorf("zone %s: templates %+v", name, viewTemplates(z.Templates))
		}
	}
}

// TestTemplateErrors checks that what CoreDNS refuses is refused, with
// the place.
func TestTemplateErrors(t *testing.T) {
	const head = ".:53 {\n" // the template directive is on line 2
	tests := []struct {
		name string
		body string
		want string
	}{
		{"no class", "  template", `test.corefile:2: template: wrong argument count or unexpected line ending after "template"`},
		{"no type", "  template IN", `test.corefile:2: template: wrong argument count or unexpected line ending after "IN"`},
		{"class is case-sensitive", "  template in A", "test.corefile:2: template: invalid query class in"},
		{"bad class", "  template XX A", "test.corefile:2: template: invalid query class XX"},
		{"bad type", "  template IN AX", "test.corefile:2: template: invalid RR type AX"},
		{"type is case-sensitive", "  template IN a", "test.corefile:2: template: invalid RR type a"},
		{"brace for class", "  template {\n  }", "test.corefile:2: template: invalid query class {"},
		{"match without regex", "  template IN A {\n    match\n  }", `test.corefile:3: template: wrong argument count or unexpected line ending after "match"`},
		{"bad regex", "  template IN A {\n    match ^(a\n  }", "test.corefile:3: template: match: could not parse regex \"^(a\": error parsing regexp: missing closing ): `^(a`"},
		{"answer without template", "  template IN A {\n    answer\n  }", `test.corefile:3: template: wrong argument count or unexpected line ending after "answer"`},
		{"bad answer template", "  template IN A {\n    answer \"{{ .Name \"\n  }", `test.corefile:3: template: answer: could not compile template "{{ .Name ": template: answer:1: unclosed action`},
		{"numeric field", "  template IN A {\n    authority \"{{ .Group.1 }}\"\n  }", `test.corefile:3: template: authority: could not compile template "{{ .Group.1 }}": template: authority:1: unexpected ".1" in operand`},
		{"unknown function", "  template IN A {\n    additional \"{{ lower .Name }}\"\n  }", `test.corefile:3: template: additional: could not compile template "{{ lower .Name }}": template: additional:1: function "lower" not defined`},
		{"rcode missing", "  template IN A {\n    rcode\n  }", `test.corefile:3: template: wrong argument count or unexpected line ending after "rcode"`},
		{"rcode unknown", "  template IN A {\n    rcode nxdomain\n  }", "test.corefile:3: template: rcode: unknown rcode nxdomain"},
		{"ederror no code", "  template IN A {\n    ederror\n  }", `test.corefile:3: template: wrong argument count or unexpected line ending after "ederror"`},
		{"ederror too many", "  template IN A {\n    ederror 1 a b\n  }", `test.corefile:3: template: wrong argument count or unexpected line ending after "b"`},
		{"ederror not a number", "  template IN A {\n    ederror x\n  }", `test.corefile:3: template: ederror: invalid extended DNS error code "x"`},
		{"ederror over 16 bits", "  template IN A {\n    ederror 65536\n  }", `test.corefile:3: template: ederror: invalid extended DNS error code "65536"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("test.corefile", strings.NewReader(head+tt.body+"\n}\n"), []netip.AddrPort{podListener})
			if err == nil {
				t.Fatalf("no error, want %q", tt.want)
			}
			if err.Error() != tt.want {
				t.Errorf("error\n %q\nwant\n %q", err.Error(), tt.want)
			}
		})
	}
}

// TestNewTemplateText checks the function CoreDNS gives its templates.
func TestNewTemplateText(t *testing.T) {
	tt, err := NewTemplateText("answer", `{{ parseInt "0x10" 0 16 }} {{ .Name }}`)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := tt.Execute(&b, struct{ Name string }{"a."}); err != nil {
		t.Fatal(err)
	}
	if b.String() != "16 a." {
		t.Errorf("got %q, want %q", b.String(), "16 a.")
	}
	if tt.Name() != "answer" {
		t.Errorf("name %q, want answer", tt.Name())
	}
}
