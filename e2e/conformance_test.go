package e2e

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// confZone is the authoritative zone both servers forward to: RRsets
// larger than 512, 1232 and 4096 bytes, a large TXT, and an MX RRset whose
// targets' addresses come in the additional section.
const confZone = "conf.test."

// confZoneFile writes the zone: many (60 A records, about 1 kB), huge (300
// A records, about 4.8 kB), txt (one TXT of about 2 kB), mx (20 MX with
// their A records as additional), small (one A).
func confZoneFile() string {
	var b strings.Builder
	fmt.Fprintf(&b, "$ORIGIN %s\n$TTL 300\n", confZone)
	b.WriteString("@ IN SOA ns hostmaster 1 7200 1800 86400 300\n@ IN NS ns\nns IN A " + clusterIP + "\n")
	for i := range 60 {
		fmt.Fprintf(&b, "many IN A 10.1.%d.%d\n", i/250, i%250+1)
	}
	for i := range 300 {
		fmt.Fprintf(&b, "huge IN A 10.2.%d.%d\n", i/250, i%250+1)
	}
	b.WriteString("txt IN TXT")
	for i := range 8 {
		fmt.Fprintf(&b, " \"%s\"", strings.Repeat(string(rune('a'+i)), 250))
	}
	b.WriteString("\n")
	for i := range 20 {
		fmt.Fprintf(&b, "mx IN MX %d mail%02d\nmail%02d IN A 10.3.0.%d\n", i, i, i, i+1)
	}
	b.WriteString("small IN A 10.4.0.1\n")
	return b.String()
}

// newConformanceLab is newLab with the authoritative CoreDNS (file plugin,
// confZone) at kube-dns's address in place of the generated cluster zones.
func newConformanceLab(t *testing.T) *lab {
	t.Helper()
	nstest.RequireRoot(t)
	nstest.CoreDNSBinary(t)
	l := &lab{node: nstest.New(t, "node"), kube: nstest.New(t, "auth")}
	must(t, l.kube.AddLink("kubedns", "", clusterIP+"/32"))
	must(t, l.node.AddLink("localdns", "", testkit.NodeListener+"/32", standbyIP+"/32", asideIP+"/32"))
	must(t, nstest.AddVeth(
		nstest.End{NS: l.node, Name: "to-kubedns", Addrs: []string{"10.200.0.1/30"}},
		nstest.End{NS: l.kube, Name: "to-node", Addrs: []string{"10.200.0.2/30"}},
	))
	must(t, l.node.AddRoute(nstest.Route{Dst: clusterIP + "/32", Via: "10.200.0.2"}))
	l.kubeDNS = nstest.StartCoreDNS(t, l.kube, nstest.CoreDNSConfig{
		Corefile: fmt.Sprintf("%s:53 {\n    bind %s\n    file db.conf\n}\n.:53 {\n    bind %s\n    whoami\n}\n", confZone, clusterIP, clusterIP),
		Files:    map[string]string{"db.conf": confZoneFile()},
		Probe:    kubeDNS,
	})
	return l
}

// confQuery is one row of the conformance table: a query, sent as raw
// bytes so that malformed and odd ones can be.
type confQuery struct {
	name    string
	network string
	msg     func() []byte
}

// outcome is what a server's reply is compared on. TTLs are not: both
// servers age them their own way. Nor is the OPT's payload size: CoreDNS
// echoes the client's, dnsstandby advertises its own.
type outcome struct {
	noReply       bool
	closed        bool // a TCP connection closed without a reply
	rcode, opcode int
	tc, ra, aa    bool
	qd            int
	an, ns, ar    []string // records, TTL zeroed, lower case, sorted
	opt, do       bool
}

func (o outcome) String() string {
	if o.noReply {
		return "no reply"
	}
	if o.closed {
		return "closed"
	}
	return fmt.Sprintf("%s opcode=%d TC=%v RA=%v AA=%v qd=%d an=%d ns=%d ar=%d opt=%v do=%v",
		dns.RcodeToString[o.rcode], o.opcode, o.tc, o.ra, o.aa, o.qd, len(o.an), len(o.ns), len(o.ar), o.opt, o.do)
}

func (o outcome) equal(p outcome) bool {
	return o.noReply == p.noReply && o.closed == p.closed && o.rcode == p.rcode && o.opcode == p.opcode && o.tc == p.tc &&
		o.ra == p.ra && o.aa == p.aa && o.qd == p.qd && o.opt == p.opt && o.do == p.do &&
		slices.Equal(o.an, p.an) && slices.Equal(o.ns, p.ns) && slices.Equal(o.ar, p.ar)
}

func toOutcome(m *dns.Msg) outcome {
	o := outcome{rcode: m.Rcode, opcode: m.Opcode, tc: m.Truncated, ra: m.RecursionAvailable, aa: m.Authoritative, qd: len(m.Question)}
	keys := func(rrs []dns.RR) []string {
		var out []string
		for _, rr := range rrs {
			if opt, ok := rr.(*dns.OPT); ok {
				o.opt, o.do = true, opt.Do()
				continue
			}
			c := dns.Copy(rr)
			c.Header().Ttl = 0
			out = append(out, strings.ToLower(c.String()))
		}
		slices.Sort(out)
		return out
	}
	o.an, o.ns, o.ar = keys(m.Answer), keys(m.Ns), keys(m.Extra)
	return o
}

// exchangeRaw sends raw to server from the node namespace and reads one
// reply into a buffer as large as a UDP datagram can be, so that what the
// server chose to send is seen whole. No reply within the timeout is an
// outcome, not an error.
func (l *lab) exchangeRaw(t *testing.T, network, server string, raw []byte, wait time.Duration) outcome {
	t.Helper()
	c, err := l.node.Dial(network, "", server, timeout)
	must(t, err)
	defer c.Close()
	co := &dns.Conn{Conn: c, UDPSize: dns.MaxMsgSize}
	must(t, c.SetDeadline(time.Now().Add(wait)))
	if _, err := co.Write(raw); err != nil {
		t.Fatalf("%s %s: write: %v", network, server, err)
	}
	r, err := co.ReadMsg()
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return outcome{noReply: true}
	case network == "tcp" && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)):
		return outcome{closed: true}
	case err != nil:
		t.Fatalf("%s %s: read: %v", network, server, err)
	case r.Id != uint16(raw[0])<<8|uint16(raw[1]):
		t.Fatalf("%s %s: reply ID %#x for query ID %#x", network, server, r.Id, raw[:2])
	}
	return toOutcome(r)
}

// conformanceQueries is the table: each RRset at each client size over
// UDP and TCP, then malformed and odd queries.
func conformanceQueries(t *testing.T) []confQuery {
	pack := func(m *dns.Msg) []byte {
		b, err := m.Pack()
		must(t, err)
		return b
	}
	var qs []confQuery
	type rrset struct {
		name  string
		qtype uint16
	}
	sets := []rrset{
		{"many." + confZone, dns.TypeA}, {"huge." + confZone, dns.TypeA}, {"txt." + confZone, dns.TypeTXT},
		{"mx." + confZone, dns.TypeMX}, {"small." + confZone, dns.TypeA}, {"small." + confZone, dns.TypeAAAA},
		{"nx." + confZone, dns.TypeA},
	}
	sizes := []struct {
		network string
		edns    int // -1: none
	}{{"udp", -1}, {"udp", 512}, {"udp", 1232}, {"udp", 4096}, {"tcp", -1}, {"tcp", 1232}}
	for _, s := range sets {
		for _, sz := range sizes {
			label := "no EDNS"
			if sz.edns >= 0 {
				label = fmt.Sprintf("EDNS %d", sz.edns)
			}
			qs = append(qs, confQuery{
				name:    fmt.Sprintf("%s %s %s %s", s.name, dns.TypeToString[s.qtype], sz.network, label),
				network: sz.network,
				msg: func() []byte {
					m := new(dns.Msg)
					m.SetQuestion(s.name, s.qtype)
					if sz.edns >= 0 {
						m.SetEdns0(uint16(sz.edns), false)
					}
					return pack(m)
				},
			})
		}
	}
	// A query for a cached name with its opcode and question count set as
	// given; questions: 0, 1 or 2 copies of small's.
	odd := func(opcode, questions int) func() []byte {
		return func() []byte {
			m := new(dns.Msg)
			m.SetQuestion("small."+confZone, dns.TypeA)
			m.Opcode = opcode
			switch questions {
			case 0:
				m.Question = nil
			case 2:
				m.Question = append(m.Question, dns.Question{Name: "many." + confZone, Qtype: dns.TypeA, Qclass: dns.ClassINET})
			}
			return pack(m)
		}
	}
	for _, o := range []struct {
		name              string
		opcode, questions int
	}{
		{"NOTIFY", dns.OpcodeNotify, 1}, {"UPDATE", dns.OpcodeUpdate, 1}, {"IQUERY", dns.OpcodeIQuery, 1},
		{"STATUS", dns.OpcodeStatus, 1}, {"opcode 3 (unassigned)", 3, 1}, {"opcode 15 (unassigned)", 15, 1},
		{"QUERY QDCOUNT 0", dns.OpcodeQuery, 0}, {"QUERY QDCOUNT 2", dns.OpcodeQuery, 2},
		{"UPDATE QDCOUNT 0", dns.OpcodeUpdate, 0}, {"STATUS QDCOUNT 2", dns.OpcodeStatus, 2},
		{"NOTIFY QDCOUNT 0", dns.OpcodeNotify, 0}, {"NOTIFY QDCOUNT 2", dns.OpcodeNotify, 2},
	} {
		for _, network := range []string{"udp", "tcp"} {
			qs = append(qs, confQuery{name: o.name + " " + network, network: network, msg: odd(o.opcode, o.questions)})
		}
	}
	qs = append(qs,
		confQuery{name: "header only, QDCOUNT 1", network: "udp", msg: func() []byte { return odd(dns.OpcodeQuery, 1)()[:12] }},
		confQuery{name: "EDNS version 1", network: "udp", msg: func() []byte {
			m := new(dns.Msg)
			m.SetQuestion("small."+confZone, dns.TypeA)
			m.SetEdns0(1232, false)
			m.IsEdns0().SetVersion(1)
			return pack(m)
		}},
		confQuery{name: "many A udp no EDNS, 0x20 case", network: "udp", msg: func() []byte {
			m := new(dns.Msg)
			m.SetQuestion(mixCase("many."+confZone), dns.TypeA)
			return pack(m)
		}},
	)
	// Queries carrying records, padding or trailing bytes: what a client
	// can make a server parse and hold.
	a, err := dns.NewRR("small." + confZone + " 30 IN A 10.9.9.9")
	must(t, err)
	opt := func(padding int) *dns.OPT {
		o := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
		o.SetUDPSize(1232)
		if padding > 0 {
			o.Option = []dns.EDNS0{&dns.EDNS0_PADDING{Padding: make([]byte, padding)}}
		}
		return o
	}
	tsig := &dns.TSIG{Hdr: dns.RR_Header{Name: "key.", Rrtype: dns.TypeTSIG, Class: dns.ClassANY},
		Algorithm: dns.HmacSHA256, TimeSigned: 1, Fudge: 300, MACSize: 4, MAC: "01020304"}
	small := func(an, ns, ar []dns.RR) func() []byte {
		return func() []byte {
			m := new(dns.Msg)
			m.SetQuestion("small."+confZone, dns.TypeA)
			m.Answer, m.Ns, m.Extra = an, ns, ar
			return pack(m)
		}
	}
	// paddedTo is small's query with an OPT padded to n bytes in all.
	paddedTo := func(n int) func() []byte {
		return func() []byte {
			b := small(nil, nil, []dns.RR{opt(0)})()
			return small(nil, nil, []dns.RR{opt(n - len(b) - 4)})()
		}
	}
	for _, r := range []struct {
		name string
		msg  func() []byte
	}{
		{"an answer record", small([]dns.RR{a}, nil, nil)},
		{"an authority record", small(nil, []dns.RR{a}, nil)},
		{"an additional A", small(nil, nil, []dns.RR{a})},
		{"OPT and an additional A", small(nil, nil, []dns.RR{opt(0), a})},
		{"two OPT", small(nil, nil, []dns.RR{opt(0), opt(0)})},
		{"TSIG", small(nil, nil, []dns.RR{tsig})},
		{"OPT and TSIG", small(nil, nil, []dns.RR{opt(0), tsig})},
		{"4000 bytes: an answer of pointers", func() []byte { return paddedQuery(t, "small."+confZone, 4000) }},
		{"512 bytes: OPT padding", paddedTo(512)},
		{"600 bytes: OPT padding", paddedTo(600)},
		{"600 bytes: a query and trailing zeros", func() []byte {
			b := small(nil, nil, []dns.RR{opt(0)})()
			return append(b, make([]byte, 600-len(b))...)
		}},
	} {
		for _, network := range []string{"udp", "tcp"} {
			qs = append(qs, confQuery{name: r.name + " " + network, network: network, msg: r.msg})
		}
	}
	return qs
}

// acceptedDifferences are rows where dnsstandby knowingly answers unlike
// LocalDNS, by pass and row name, with the reason.
var acceptedDifferences = func() map[string]string {
	const notify = "CoreDNS passes a NOTIFY with one question down its plugins as if it were a query: " +
		"its cache answers it (opcode NOTIFY, AA, the cached records), and on a miss forward relays the NOTIFY upstream. " +
		"A resolver has no zone to be notified of; dnsstandby answers NOTIMP and relays nothing"
	const case0x20 = "CoreDNS compresses names case-sensitively (miekg/dns), so with a mixed-case question the first " +
		"answer's owner is written in full rather than as a pointer to the question, and one record fewer fits " +
		"in 512 bytes; dnsstandby's stored records point at the question, so the same bytes hold one more. TC=1 either way"
	const stray = "CoreDNS takes a query with one answer, one authority and two additional records (miekg/dns's " +
		"default accept function) and unpacks them: RDATA of compression pointers costs it some 40 times its size " +
		"while the query waits. A query has no use for them; dnsstandby answers FORMERR as that function does for " +
		"two, and as Unbound does for any"
	const twoOPT = "RFC 6891 §6.1.1: a message with more than one OPT is FORMERR; CoreDNS reads the first"
	const long = "CoreDNS reads a TCP query of any length (a UDP one only to 512 bytes); dnsstandby closes a " +
		"connection whose query is longer than 512 bytes, more than any query needs, before reading it"
	m := map[string]string{}
	for _, pass := range []string{"cold", "warm"} {
		m[pass+": NOTIFY udp"] = notify
		m[pass+": NOTIFY tcp"] = notify
		m[pass+": many A udp no EDNS, 0x20 case"] = case0x20
		for _, network := range []string{"udp", "tcp"} {
			for _, row := range []string{"an answer record", "an authority record", "an additional A", "OPT and an additional A"} {
				m[pass+": "+row+" "+network] = stray
			}
			m[pass+": two OPT "+network] = twoOPT
		}
		for _, row := range []string{"4000 bytes: an answer of pointers", "600 bytes: OPT padding", "600 bytes: a query and trailing zeros"} {
			m[pass+": "+row+" tcp"] = long
		}
	}
	return m
}()

// TestConformance asks a LocalDNS-shaped CoreDNS (forward and cache, the
// AKS Corefile) and dnsstandby, both forwarding to the same authoritative
// CoreDNS, the same table of queries, cold and then warm, and then two
// uncached names with the upstream hung; it compares rcode, opcode, TC,
// RA, AA, the question count, the records of each section and the OPT.
// The table of outcomes is logged (and written to $E2E_CONFORMANCE_OUT if
// set); a difference not listed in acceptedDifferences fails the test.
func TestConformance(t *testing.T) {
	l := newConformanceLab(t)
	l.startReference(t)
	l.startStandbyOn(t, asideAddr)

	var table strings.Builder
	same, total := 0, 0
	record := func(row string, ref, got outcome) {
		total++
		if ref.equal(got) {
			same++
			fmt.Fprintf(&table, "same  %-50s %s\n", row, got)
			return
		}
		fmt.Fprintf(&table, "DIFF  %-50s\n      CoreDNS    %s\n      dnsstandby %s\n", row, ref, got)
		if why, ok := acceptedDifferences[row]; ok {
			fmt.Fprintf(&table, "      accepted: %s\n", why)
			return
		}
		t.Errorf("%s:\n CoreDNS    %s\n  %q\n  %q\n  %q\n dnsstandby %s\n  %q\n  %q\n  %q",
			row, ref, ref.an, ref.ns, ref.ar, got, got.an, got.ns, got.ar)
	}

	for _, pass := range []string{"cold", "warm"} {
		for _, q := range conformanceQueries(t) {
			raw := q.msg()
			ref := l.exchangeRaw(t, q.network, standbyAddr, raw, timeout)
			got := l.exchangeRaw(t, q.network, asideAddr, raw, timeout)
			record(pass+": "+q.name, ref, got)
		}
	}

	// The upstream hung: an uncached name gets the SERVFAIL each server
	// makes itself (CoreDNS's forward gives up after 5 s).
	must(t, l.kubeDNS.Freeze())
	for _, edns := range []bool{false, true} {
		m := new(dns.Msg)
		m.SetQuestion(fmt.Sprintf("down-%v.%s", edns, confZone), dns.TypeA)
		if edns {
			m.SetEdns0(1232, false)
		}
		raw, err := m.Pack()
		must(t, err)
		ref := l.exchangeRaw(t, "udp", standbyAddr, raw, 8*time.Second)
		got := l.exchangeRaw(t, "udp", asideAddr, raw, 8*time.Second)
		record(fmt.Sprintf("upstream hung: uncached A, EDNS %v", edns), ref, got)
	}

	fmt.Fprintf(&table, "%d/%d identical\n", same, total)
	t.Logf("conformance:\n%s", table.String())
	if out := os.Getenv("E2E_CONFORMANCE_OUT"); out != "" {
		must(t, os.WriteFile(out, []byte(table.String()), 0o644))
	}
}
