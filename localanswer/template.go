package localanswer

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/template"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/corefile"
)

// TemplateMaxOutput bounds what one answer, additional or authority
// template may write for one query, in bytes. Above it the template
// fails and the query gets SERVFAIL, as for any failed template. CoreDNS
// has no such bound; 64 KiB is more than any RR a DNS message can carry.
const TemplateMaxOutput = 64 << 10

// Templates answers as the template plugin of one server block does
// (CoreDNS 1.13.1 plugin/template, ServeDNS): all of the block's
// template stanzas, tried in file order. It is safe for concurrent use.
//
// The replies are what the plugin hands to CoreDNS's server; the server
// then fits them to the client as it does every reply (the query's OPT
// echoed, truncation to the client's buffer), which is the caller's job
// here.
//
// Not imitated: when an answer template yields a CNAME for an A or AAAA
// query, CoreDNS also looks the target up through its own server and
// appends that answer; here the reply holds the CNAME alone.
//
// The reply depends on the client only through the template data's
// .Remote, its address; a Request without a valid Client gets "" there.
type Templates struct {
	zones     []string // every stanza's zones: the plugin's own zone check
	templates []corefile.Template
}

// NewTemplates returns the Answerer for a block's template stanzas, in
// the order given (corefile.Zone.Templates). It refuses a stanza Parse
// would not have made: no regex, or a nil regex or template.
func NewTemplates(ts []corefile.Template) (*Templates, error) {
	t := &Templates{templates: make([]corefile.Template, len(ts))}
	for i, tp := range ts {
		if len(tp.Regexes) == 0 {
			return nil, fmt.Errorf("localanswer: template %d (line %d): no regex (a stanza without match has \".*\")", i, tp.Line)
		}
		for _, re := range tp.Regexes {
			if re == nil {
				return nil, fmt.Errorf("localanswer: template %d (line %d): nil regex", i, tp.Line)
			}
		}
		for _, sec := range [][]*template.Template{tp.Answer, tp.Additional, tp.Authority} {
			for _, tt := range sec {
				if tt == nil {
					return nil, fmt.Errorf("localanswer: template %d (line %d): nil RR template", i, tp.Line)
				}
			}
		}
		t.templates[i] = tp
		t.zones = append(t.zones, tp.Zones...)
	}
	return t, nil
}

// tmplData is what a template sees, with the fields and method of
// CoreDNS's templateData.
type tmplData struct {
	Zone     string
	Name     string
	Regex    string
	Match    []string
	Group    map[string]string
	Class    string
	Type     string
	Message  *dns.Msg
	Question *dns.Question
	Remote   string
}

// Meta is the metadata plugin's value of name. CoreDNS gives "" without
// the metadata plugin, which LocalDNS does not load.
func (*tmplData) Meta(string) string { return "" }

// Answer implements Answerer.
func (t *Templates) Answer(r Request) (reply *dns.Msg, answered bool) {
	if r.Msg == nil || len(r.Msg.Question) == 0 {
		return nil, false
	}
	q := r.Msg.Question[0]
	// request.Request.Name: the question name in presentation format,
	// lower case.
	name := strings.ToLower(dns.Name(q.Name).String())
	if tmplZoneMatch(t.zones, name) == "" {
		return nil, false
	}
	// CoreDNS's server turns a panic in a plugin into SERVFAIL; a
	// template calling a method of the query could panic.
	defer func() {
		if recover() != nil {
			reply, answered = tmplServfail(r.Msg), true
		}
	}()

	for i := range t.templates {
		tp := &t.templates[i]
		zone := tmplZoneMatch(tp.Zones, name)
		if zone == "" {
			continue
		}
		if tp.Class != dns.ClassANY && q.Qclass != dns.ClassANY && q.Qclass != tp.Class {
			continue
		}
		if tp.Type != dns.TypeANY && q.Qtype != dns.TypeANY && q.Qtype != tp.Type {
			continue
		}
		re := -1
		for j, rx := range tp.Regexes {
			if rx.MatchString(name) {
				re = j
				break
			}
		}
		if re < 0 {
			if tmplZoneMatch(tp.Fallthrough, name) != "" {
				continue
			}
			// The plugin returns SERVFAIL unwritten; the server writes it.
			return tmplServfail(r.Msg), true
		}
		if tp.Rcode == dns.RcodeServerFailure {
			return tmplServfail(r.Msg), true
		}
		m, err := tmplReply(r, tp, zone, name, re)
		if err != nil {
			return tmplServfail(r.Msg), true
		}
		return m, true
	}
	return nil, false
}

// tmplReply is the reply of stanza tp, whose regex re matched name in
// zone.
func tmplReply(r Request, tp *corefile.Template, zone, name string, re int) (*dns.Msg, error) {
	q := r.Msg.Question[0]
	rx := tp.Regexes[re]
	data := &tmplData{
		Zone:     zone,
		Name:     name,
		Regex:    rx.String(),
		Question: &q,
		Message:  r.Msg,
	}
	if r.Client.Addr().IsValid() {
		// request.Request.IP: the address without the port.
		data.Remote = r.Client.Addr().Unmap().String()
	}
	if q.Qclass != dns.ClassANY {
		data.Class = dns.ClassToString[q.Qclass]
	} else {
		data.Class = dns.ClassToString[tp.Class]
	}
	if q.Qtype != dns.TypeANY {
		data.Type = dns.TypeToString[q.Qtype]
	} else {
		data.Type = dns.TypeToString[tp.Type]
	}
	data.Match = rx.FindStringSubmatch(name)
	data.Group = make(map[string]string, 2*len(data.Match))
	groups := rx.SubexpNames()
	for i, m := range data.Match {
		data.Group[strconv.Itoa(i)] = m
	}
	for i, m := range data.Match {
		if groups[i] != "" {
			data.Group[groups[i]] = m
		}
	}

	m := new(dns.Msg)
	m.SetReply(r.Msg)
	m.Authoritative = true
	m.Rcode = tp.Rcode
	var buf tmplBuffer
	for _, tt := range tp.Answer {
		rr, err := buf.execute(tt, data)
		if err != nil {
			return nil, err
		}
		m.Answer = append(m.Answer, rr)
	}
	for _, tt := range tp.Additional {
		rr, err := buf.execute(tt, data)
		if err != nil {
			return nil, err
		}
		m.Extra = append(m.Extra, rr)
	}
	for _, tt := range tp.Authority {
		rr, err := buf.execute(tt, data)
		if err != nil {
			return nil, err
		}
		m.Ns = append(m.Ns, rr)
	}
	if tp.EDE != nil {
		m.SetEdns0(4096, true)
		opt := m.IsEdns0()
		opt.Option = append(opt.Option, &dns.EDNS0_EDE{InfoCode: tp.EDE.Code, ExtraText: tp.EDE.Reason})
	}
	return m, nil
}

var (
	errTmplTooLong = fmt.Errorf("template output longer than %d bytes", TemplateMaxOutput)
	errTmplNoRR    = errors.New("template output holds no RR")
)

// tmplBuffer collects one template's output, up to TemplateMaxOutput.
type tmplBuffer struct{ b []byte }

func (w *tmplBuffer) Write(p []byte) (int, error) {
	if len(w.b)+len(p) > TemplateMaxOutput {
		return 0, errTmplTooLong
	}
	w.b = append(w.b, p...)
	return len(p), nil
}

// execute runs tt on data and parses its output as one RR, as CoreDNS's
// executeRRTemplate does (dns.NewRR: no origin, default TTL 3600).
func (w *tmplBuffer) execute(tt *template.Template, data *tmplData) (dns.RR, error) {
	w.b = w.b[:0]
	if err := tt.Execute(w, data); err != nil {
		return nil, err
	}
	rr, err := dns.NewRR(string(w.b))
	if err != nil {
		return nil, err
	}
	if rr == nil {
		// Empty output: CoreDNS puts a nil RR in the reply and its
		// server recovers from the panic that follows with SERVFAIL.
		return nil, errTmplNoRR
	}
	return rr, nil
}

// tmplServfail is the SERVFAIL CoreDNS's server writes when a plugin
// returns that rcode without writing (errorFunc): the question, no AA.
func tmplServfail(req *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetRcode(req, dns.RcodeServerFailure)
	return m
}

// tmplZoneMatch is CoreDNS's plugin.Zones.Matches: the longest of zones
// that holds name, or "".
func tmplZoneMatch(zones []string, name string) string {
	zone := ""
	for _, z := range zones {
		if len(z) > len(zone) && dns.IsSubDomain(z, name) {
			zone = z
		}
	}
	return zone
}
