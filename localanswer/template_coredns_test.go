package localanswer

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/corefile"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

// tmplConformanceCorefile holds AgentBaker's two templates, as in
// corefile/testdata/agentbaker.corefile, and more that exercise every
// part of the plugin. Each block ends with whoami, so a query the
// templates pass on is answered in a way we recognise. chaos lets non-IN
// classes reach the plugins, as forward does in LocalDNS.
const tmplConformanceCorefile = `.:53 {
    bind 169.254.10.11
    chaos
    template ANY ANY internal.cloudapp.net {
        match "^(?:[^.]+\.){4,}internal\.cloudapp\.net\.$"
        rcode NXDOMAIN
        fallthrough
    }
    template ANY ANY reddog.microsoft.com {
        rcode NXDOMAIN
    }
    template IN A example.org {
        match "^(?P<host>[a-z0-9-]+)\.a\.example\.org\.$"
        answer "{{ .Name }} 60 IN A 192.0.2.1"
        answer "{{ .Group.host }}.alias.example.org. 61 IN A 192.0.2.2"
        additional "ns.example.org. 120 IN A 192.0.2.53"
        authority "example.org. 300 IN NS ns.example.org."
        fallthrough
    }
    template IN AAAA example.org {
        match \.a\.example\.org\.$
        answer "{{ .Name }} 60 IN AAAA 2001:db8::1"
    }
    template IN TXT example.org {
        answer "{{ .Name }} 30 IN TXT \"{{ .Class }} {{ .Type }} {{ .Zone }} {{ index .Match 0 }} {{ .Remote }} {{ .Question.Qtype }} [{{ .Meta \"x\" }}]\""
    }
    template IN SRV example.org {
        match "^_(?P<svc>[a-z]+)\._tcp\."
        answer "{{ .Name }} 40 IN SRV 10 20 {{ parseInt \"8080\" 10 16 }} {{ .Group.svc }}.{{ index .Group \"1\" }}.example.org."
        fallthrough example.org
    }
    template IN MX example.org {
        rcode SERVFAIL
    }
    template IN NS example.org {
        rcode REFUSED
        answer "example.org. 300 IN NS ns.example.org."
    }
    template ANY ANY fail.example.net {
        match ^ok\.
        answer "{{ .Name }} IN A 192.0.2.9"
    }
    template IN A broken.example.net {
        match ^empty\.
        answer "{{ if false }}x{{ end }}"
        fallthrough
    }
    template IN A broken.example.net {
        match ^badrr\.
        answer "{{ .Name }} IN A not-an-address"
        fallthrough
    }
    template IN A broken.example.net {
        match ^exec\.
        answer "{{ index .Match 7 }} IN A 192.0.2.1"
    }
    template IN TXT ede.example.net {
        rcode NXDOMAIN
        ederror 15 "blocked by policy"
    }
    template IN TXT ede.example.net ede2.example.net {
        ederror 18
        answer "{{ .Name }} 10 IN TXT ok"
    }
    template CH ANY class.example.net {
        answer "{{ .Name }} 10 CH TXT {{ .Class }}"
    }
    whoami
}
tpl.test:53 {
    bind 169.254.10.11
    template IN TXT {
        answer "{{ .Name }} 5 IN TXT {{ .Zone }}"
    }
    whoami
}
`

// tmplQuery is one query of the conformance table.
type tmplQuery struct {
	name   string
	qtype  uint16
	qclass uint16 // 0: IN
	tcp    bool
	edns   uint16 // UDP size of an OPT to add; 0: none
	do     bool
}

func (q tmplQuery) String() string {
	s := fmt.Sprintf("%s %s %s", q.name, dns.ClassToString[q.class()], dns.TypeToString[q.qtype])
	if q.tcp {
		s += " tcp"
	}
	if q.edns > 0 {
		s += fmt.Sprintf(" edns%d", q.edns)
	}
	if q.do {
		s += " do"
	}
	return s
}

func (q tmplQuery) class() uint16 {
	if q.qclass == 0 {
		return dns.ClassINET
	}
	return q.qclass
}

func (q tmplQuery) msg(id uint16) *dns.Msg {
	m := new(dns.Msg)
	m.Id = id
	m.RecursionDesired = true
	m.Question = []dns.Question{{Name: q.name, Qtype: q.qtype, Qclass: q.class()}}
	if q.edns > 0 {
		m.SetEdns0(q.edns, q.do)
	}
	return m
}

// TestTemplateConformsToCoreDNS asks a real CoreDNS 1.13.1 and
// Templates the same queries, with the same Corefile, and requires the
// same replies: where Templates passes the query on, CoreDNS's reply
// must be whoami's, the next plugin of the block.
func TestTemplateConformsToCoreDNS(t *testing.T) {
	nstest.RequireRoot(t)
	bin := nstest.CoreDNSBinary(t)
	listen := netip.MustParseAddrPort("169.254.10.11:53")

	ns := nstest.New(t, "tmpl")
	if err := ns.AddLink("localdns", "", listen.Addr().String()+"/32"); err != nil {
		t.Fatal(err)
	}
	nstest.StartCoreDNS(t, ns, nstest.CoreDNSConfig{Binary: bin, Corefile: tmplConformanceCorefile, Probe: listen.String()})

	s, err := corefile.Parse("Corefile", strings.NewReader(tmplConformanceCorefile), []netip.AddrPort{listen})
	if err != nil {
		t.Fatal(err)
	}
	answerers := map[string]*Templates{}
	for _, z := range s.Zones {
		a, err := NewTemplates(z.Templates)
		if err != nil {
			t.Fatalf("zone %s: %v", z.Name, err)
		}
		answerers[z.Name] = a
	}

	var ch, anyc, none uint16 = dns.ClassCHAOS, dns.ClassANY, dns.ClassNONE
	queries := []tmplQuery{
		// AgentBaker: internal.cloudapp.net, four labels or more.
		{name: "a.b.c.d.internal.cloudapp.net.", qtype: dns.TypeA},
		{name: "a.b.c.d.e.internal.cloudapp.net.", qtype: dns.TypeAAAA},
		{name: "A.B.c.D.Internal.CloudApp.NET.", qtype: dns.TypeA},
		{name: "a.b.c.d.internal.cloudapp.net.", qtype: dns.TypeMX, tcp: true},
		{name: "a.b.c.d.internal.cloudapp.net.", qtype: dns.TypeANY},
		{name: "a.b.c.d.internal.cloudapp.net.", qtype: dns.TypeTXT, qclass: ch},
		{name: "a.b.c.d.internal.cloudapp.net.", qtype: dns.TypeA, edns: 1232, do: true},
		// ... fewer labels fall through to whoami.
		{name: "vm1.internal.cloudapp.net.", qtype: dns.TypeA},
		{name: "a.b.c.internal.cloudapp.net.", qtype: dns.TypeA},
		{name: "internal.cloudapp.net.", qtype: dns.TypeSOA},
		{name: "cloudapp.net.", qtype: dns.TypeA},
		{name: "a.b.c.d.internal.cloudapp.net.example.", qtype: dns.TypeA},
		// AgentBaker: reddog.microsoft.com, every name below.
		{name: "reddog.microsoft.com.", qtype: dns.TypeA},
		{name: "x.y.reddog.microsoft.com.", qtype: dns.TypeTXT},
		{name: "REDDOG.Microsoft.COM.", qtype: dns.TypeMX},
		{name: "reddog.microsoft.com.", qtype: dns.TypeSOA, tcp: true},
		{name: "host.reddog.microsoft.com.", qtype: dns.TypeA, qclass: anyc},
		{name: "host.reddog.microsoft.com.", qtype: dns.TypeA, qclass: none},
		{name: "host.reddog.microsoft.com.", qtype: dns.TypeAAAA, edns: 4096},
		{name: "microsoft.com.", qtype: dns.TypeA},
		{name: "notreddog.microsoft.com.", qtype: dns.TypeA},
		// Answers, a regex group, additional and authority.
		{name: "web.a.example.org.", qtype: dns.TypeA},
		{name: "Web.A.Example.ORG.", qtype: dns.TypeA},
		{name: "web.a.example.org.", qtype: dns.TypeA, tcp: true},
		{name: "web.a.example.org.", qtype: dns.TypeA, edns: 1232, do: true},
		{name: "web.a.example.org.", qtype: dns.TypeANY},
		{name: "web.a.example.org.", qtype: dns.TypeA, qclass: ch},
		{name: "web.a.example.org.", qtype: dns.TypeA, qclass: anyc},
		{name: "x.web.a.example.org.", qtype: dns.TypeA}, // regex fails, fallthrough, AAAA stanza: wrong type
		{name: "web.b.example.org.", qtype: dns.TypeA},
		{name: "web.a.example.org.", qtype: dns.TypeAAAA},
		{name: "x.y.a.example.org.", qtype: dns.TypeAAAA},
		{name: "web.b.example.org.", qtype: dns.TypeAAAA}, // no match, no fallthrough: SERVFAIL
		{name: "Some.Name.example.org.", qtype: dns.TypeTXT},
		{name: "example.org.", qtype: dns.TypeTXT},
		{name: "name.example.org.", qtype: dns.TypeTXT, qclass: anyc},
		{name: "name.example.org.", qtype: dns.TypeTXT, tcp: true},
		{name: "_http._tcp.example.org.", qtype: dns.TypeSRV},
		{name: "_http._udp.example.org.", qtype: dns.TypeSRV},
		{name: "mx.example.org.", qtype: dns.TypeMX},
		{name: "mx.example.org.", qtype: dns.TypeMX, edns: 1232},
		{name: "example.org.", qtype: dns.TypeNS},
		{name: "example.org.", qtype: dns.TypeNS, tcp: true},
		{name: "example.org.", qtype: dns.TypeSOA},
		{name: "example.com.", qtype: dns.TypeA},
		// A stanza without fallthrough, default TTL.
		{name: "ok.fail.example.net.", qtype: dns.TypeA},
		{name: "ok.fail.example.net.", qtype: dns.TypeMX},
		{name: "no.fail.example.net.", qtype: dns.TypeA},
		{name: "fail.example.net.", qtype: dns.TypeA},
		// Templates that fail.
		{name: "empty.broken.example.net.", qtype: dns.TypeA},
		{name: "badrr.broken.example.net.", qtype: dns.TypeA},
		{name: "exec.broken.example.net.", qtype: dns.TypeA},
		{name: "other.broken.example.net.", qtype: dns.TypeA},
		// ederror.
		{name: "x.ede.example.net.", qtype: dns.TypeTXT},
		{name: "x.ede.example.net.", qtype: dns.TypeTXT, edns: 1232},
		{name: "x.ede.example.net.", qtype: dns.TypeTXT, edns: 1232, do: true},
		{name: "x.ede2.example.net.", qtype: dns.TypeTXT},
		{name: "x.ede2.example.net.", qtype: dns.TypeTXT, edns: 2048, tcp: true},
		// Class.
		{name: "x.class.example.net.", qtype: dns.TypeTXT, qclass: ch},
		{name: "x.class.example.net.", qtype: dns.TypeA, qclass: anyc},
		{name: "x.class.example.net.", qtype: dns.TypeTXT},
		// The default zones: the block's keys.
		{name: "a.tpl.test.", qtype: dns.TypeTXT},
		{name: "TPL.test.", qtype: dns.TypeTXT},
		{name: "a.tpl.test.", qtype: dns.TypeA},
	}

	agree := 0
	for i, q := range queries {
		t.Run(q.String(), func(t *testing.T) {
			id := uint16(1000 + i)
			network := "udp"
			if q.tcp {
				network = "tcp"
			}
			theirs, err := ns.Exchange(network, "", listen.String(), q.msg(id), 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}

			z := s.ZoneForAddr(listen, q.name)
			if z == nil {
				t.Fatalf("no zone for %s", q.name)
			}
			req := Request{Msg: q.msg(id), Client: netip.AddrPortFrom(listen.Addr(), 40000), Local: listen, TCP: q.tcp}
			ours, ok := answerers[z.Name].Answer(req)
			if !ok {
				if err := tmplIsWhoami(theirs, q, network); err != nil {
					t.Fatalf("Templates passed on; CoreDNS's reply is not whoami's: %v\n%v", err, theirs)
				}
				t.Logf("passed on; CoreDNS: whoami")
				agree++
				return
			}
			tmplServerFinish(q.msg(id), ours, q.tcp)
			if diff := tmplDiff(theirs, ours); diff != "" {
				t.Fatalf("%s\nCoreDNS:\n%v\nours:\n%v", diff, theirs, ours)
			}
			t.Logf("answered: %s AA=%v an=%d ns=%d ex=%d",
				dns.RcodeToString[ours.Rcode], ours.Authoritative, len(ours.Answer), len(ours.Ns), len(ours.Extra))
			agree++
		})
	}
	t.Logf("%d/%d queries agree with CoreDNS", agree, len(queries))
}

// tmplServerFinish does to reply what CoreDNS's server does to every
// reply a plugin writes (request.ScrubWriter: SizeAndDo, then Truncate).
func tmplServerFinish(req, reply *dns.Msg, tcp bool) {
	o := req.IsEdns0()
	if o == nil {
		return
	}
	if mo := reply.IsEdns0(); mo != nil {
		mo.Hdr.Name = "."
		mo.SetVersion(0)
		mo.SetUDPSize(o.UDPSize())
		mo.Hdr.Ttl &= 0xff00
		if o.Do() {
			mo.SetDo()
		}
	} else {
		o.SetVersion(0)
		o.Hdr.Ttl &= 0xff00
		o.Option = nil // the queries here carry no options
		reply.Extra = append(reply.Extra, o)
	}
	size := 65535
	if !tcp {
		size = max(512, int(o.UDPSize()))
	}
	reply.Truncate(size)
}

// tmplDiff compares two replies in everything but the ID.
func tmplDiff(want, got *dns.Msg) string {
	var d []string
	wh, gh := want.MsgHdr, got.MsgHdr
	wh.Id, gh.Id = 0, 0
	if wh != gh {
		d = append(d, fmt.Sprintf("header: CoreDNS %+v, ours %+v", want.MsgHdr, got.MsgHdr))
	}
	if !slices.Equal(want.Question, got.Question) {
		d = append(d, fmt.Sprintf("question: CoreDNS %v, ours %v", want.Question, got.Question))
	}
	for _, sec := range []struct {
		name      string
		want, got []dns.RR
	}{{"answer", want.Answer, got.Answer}, {"authority", want.Ns, got.Ns}, {"additional", want.Extra, got.Extra}} {
		if w, g := tmplRRStrings(sec.want), tmplRRStrings(sec.got); !slices.Equal(w, g) {
			d = append(d, fmt.Sprintf("%s: CoreDNS %q, ours %q", sec.name, w, g))
		}
	}
	return strings.Join(d, "\n")
}

func tmplRRStrings(rrs []dns.RR) []string {
	out := make([]string, len(rrs))
	for i, rr := range rrs {
		out[i] = rr.String()
	}
	return out
}

// tmplIsWhoami checks that reply is whoami's answer to q, sent from the
// listen address over network.
func tmplIsWhoami(reply *dns.Msg, q tmplQuery, network string) error {
	if reply.Rcode != dns.RcodeSuccess || !reply.Authoritative || len(reply.Answer) != 0 || len(reply.Ns) != 0 {
		return fmt.Errorf("rcode %s AA %v, %d answers, %d authority",
			dns.RcodeToString[reply.Rcode], reply.Authoritative, len(reply.Answer), len(reply.Ns))
	}
	var extra []dns.RR
	for _, rr := range reply.Extra {
		if rr.Header().Rrtype != dns.TypeOPT {
			extra = append(extra, rr)
		}
	}
	if len(extra) != 2 {
		return fmt.Errorf("%d additional records, whoami gives 2", len(extra))
	}
	a, ok := extra[0].(*dns.A)
	if !ok || a.Hdr.Name != q.name || a.A.String() != "169.254.10.11" {
		return fmt.Errorf("first additional %v is not whoami's A for %s", extra[0], q.name)
	}
	srv, ok := extra[1].(*dns.SRV)
	if !ok || srv.Hdr.Name != "_"+network+"."+q.name {
		return fmt.Errorf("second additional %v is not whoami's SRV", extra[1])
	}
	return nil
}
