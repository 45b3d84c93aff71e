package corefile

import (
	"regexp"
	"slices"
	"strconv"
	"text/template"

	"github.com/coredns/caddy/caddyfile"
	"github.com/miekg/dns"
)

// Template is one template stanza of a block, as CoreDNS 1.13.1's
// template plugin reads it (plugin/template/setup.go):
//
//	template CLASS TYPE [ZONE...] {
//	    match REGEX...
//	    answer RR...
//	    additional RR...
//	    authority RR...
//	    rcode CODE
//	    ederror CODE [EXTRA]
//	    fallthrough [ZONE...]
//	}
//
// The answer, additional and authority templates are Go text/templates,
// parsed here as CoreDNS parses them at load, with its functions
// (parseInt). A Template is read-only once Parse returns and may be used
// by several goroutines; Zones copied for several keys share it.
type Template struct {
	Class uint16 // query class it answers: dns.ClassINET, ..., dns.ClassANY for any
	Type  uint16 // query type it answers: dns.TypeA, ..., dns.TypeANY for any

	// Zones are the names it answers for: its ZONE arguments, or else the
	// zones of every key of its server block, fully qualified and lower
	// case, as CoreDNS's plugin.OriginsFromArgsOrServerBlock gives them.
	Zones []string

	// Regexes are the match patterns, tried in order against the lower
	// case query name; the first that matches answers. regexp.String
	// gives a pattern's text as written. CoreDNS puts ".*" here when the
	// stanza has no match line, and so does Parse.
	Regexes []*regexp.Regexp

	// Answer, Additional and Authority are the templates of each
	// section, in order. Each executes to one RR in presentation format.
	Answer, Additional, Authority []*template.Template

	Rcode int // reply rcode, dns.RcodeSuccess when not given

	// EDE is the extended DNS error added to the reply (RFC 8914); nil
	// without an ederror line.
	EDE *EDE

	// Fallthrough holds the zones for which a name the regexes do not
	// match is passed to the next plugin: ["."] for a bare fallthrough,
	// nil when the stanza has none.
	Fallthrough []string

	Line int // line of the template directive
}

// EDE is an ederror line of a template stanza.
type EDE struct {
	Code   uint16
	Reason string // EXTRA-TEXT; may be empty
}

// NewTemplateText parses one answer, additional or authority template as
// CoreDNS's template plugin does (its newTemplate): a text/template named
// after the section, with the function parseInt (strconv.ParseUint).
func NewTemplateText(section, text string) (*template.Template, error) {
	return template.New(section).Funcs(template.FuncMap{
		"parseInt": strconv.ParseUint,
	}).Parse(text)
}

// templates reads a block's template directives as CoreDNS's
// templateParse does. keys are the block's keys: their zones are a
// stanza's zones when it names none.
func (p *parser) templates(toks []caddyfile.Token, keys []key) ([]Template, error) {
	if len(toks) == 0 {
		return nil, nil
	}
	var blockZones []string
	for _, k := range keys {
		blockZones = append(blockZones, k.zones...)
	}
	d := p.directive("template", toks)
	var out []Template
	for {
		ok, err := d.next()
		if err != nil {
			return nil, err
		}
		if !ok {
			return out, nil
		}
		t, err := d.template(blockZones)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
}

// template reads one template stanza; the dispenser is on its first
// token.
func (d *directive) template(blockZones []string) (Template, error) {
	t := Template{Line: d.Line()}
	if !d.NextArg() {
		return t, d.argErr()
	}
	class, ok := dns.StringToClass[d.Val()]
	if !ok {
		return t, d.errf("invalid query class %s", d.Val())
	}
	if !d.NextArg() {
		return t, d.argErr()
	}
	qtype, ok := dns.StringToType[d.Val()]
	if !ok {
		return t, d.errf("invalid RR type %s", d.Val())
	}
	t.Class, t.Type = class, qtype
	if args := d.RemainingArgs(); len(args) > 0 {
		// CoreDNS silently drops zones it cannot normalize; they are
		// noted here. With all dropped the stanza answers for nothing.
		t.Zones = d.zones(args)
	} else {
		t.Zones = slices.Clone(blockZones)
	}

	for d.NextBlock() {
		opt := d.Val()
		switch opt {
		case "match":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return t, d.argErr()
			}
			for _, a := range args {
				re, err := regexp.Compile(a)
				if err != nil {
					return t, d.errf("match: could not parse regex %q: %v", a, err)
				}
				t.Regexes = append(t.Regexes, re)
			}
		case "answer", "additional", "authority":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return t, d.argErr()
			}
			for _, a := range args {
				tmpl, err := NewTemplateText(opt, a)
				if err != nil {
					return t, d.errf("%s: could not compile template %q: %v", opt, a, err)
				}
				switch opt {
				case "answer":
					t.Answer = append(t.Answer, tmpl)
				case "additional":
					t.Additional = append(t.Additional, tmpl)
				default:
					t.Authority = append(t.Authority, tmpl)
				}
			}
		case "rcode":
			// CoreDNS reads the next argument and leaves any further
			// ones to be taken as the next option line's name.
			if !d.NextArg() {
				return t, d.argErr()
			}
			rcode, ok := dns.StringToRcode[d.Val()]
			if !ok {
				return t, d.errf("rcode: unknown rcode %s", d.Val())
			}
			t.Rcode = rcode
		case "ederror":
			args := d.RemainingArgs()
			if len(args) != 1 && len(args) != 2 {
				return t, d.argErr()
			}
			code, err := strconv.ParseUint(args[0], 10, 16)
			if err != nil {
				return t, d.errf("ederror: invalid extended DNS error code %q", args[0])
			}
			t.EDE = &EDE{Code: uint16(code)}
			if len(args) == 2 {
				t.EDE.Reason = args[1]
			}
		case "fallthrough":
			t.Fallthrough = fallthroughZones(d.RemainingArgs())
		case "upstream":
			// Accepted and ignored by CoreDNS ("remove soon").
			d.RemainingArgs()
		default:
			return t, d.unknownOption()
		}
	}
	if len(t.Regexes) == 0 {
		t.Regexes = []*regexp.Regexp{regexp.MustCompile(".*")}
	}
	return t, nil
}

// fallthroughZones is CoreDNS's fall.F.SetZonesFromArgs: no arguments is
// the root; arguments that do not normalize are dropped silently.
func fallthroughZones(args []string) []string {
	if len(args) == 0 {
		return []string{"."}
	}
	out := []string{}
	for _, a := range args {
		zs, err := zoneArg(a)
		if err != nil {
			continue
		}
		out = append(out, zs...)
	}
	return out
}
