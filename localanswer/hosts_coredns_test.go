package localanswer

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/corefile"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// The conformance tests run CoreDNS in a namespace on conformAddr and
// send it queries from conformClient.
const (
	conformAddr   = "169.254.10.10"
	conformClient = "169.254.10.20"
)

// hostsConformCorefile has one block per hosts stanza under test, each on
// its own port, each ending in whoami so that a query the hosts plugin
// passes on gets an answer that says so. FILE is the test hosts file.
const hostsConformCorefile = `# AKS: /etc/localdns/hosts as AgentBaker renders it.
.:5301 {
    bind 169.254.10.10
    hosts FILE {
        ttl 5
        reload 5s
        fallthrough
    }
    whoami
}
# No fallthrough; a short reload for the reload test.
.:5302 {
    bind 169.254.10.10
    hosts FILE {
        ttl 5
        reload 1s
    }
    whoami
}
# Zones, inline lines, no_reverse, fallthrough for one zone, default TTL.
.:5303 {
    bind 169.254.10.10
    hosts FILE example.org microsoft.com {
        10.9.9.9 inline.example.org mcr.microsoft.com
        10.9.9.8 notinzone.test
        fd00::99 inline6.example.org
        no_reverse
        fallthrough microsoft.com
    }
    whoami
}
# Inline lines only (the file does not exist), with reverse.
.:5304 {
    bind 169.254.10.10
    hosts MISSING {
        10.9.9.9 inline.example.org
        fd00::99 inline6.example.org # comment
        ttl 60
    }
    whoami
}
`

// hostsConformFile is the test hosts file, in the shape of AKS's.
const hostsConformFile = `# critical AKS FQDNs
10.1.0.1 mcr.microsoft.com
10.1.0.2 login.microsoftonline.com Login.Example.org
10.1.0.3 packages.aks.azure.com
10.1.0.4 packages.aks.azure.com
fd00::3 packages.aks.azure.com
fd00::1 mcr.microsoft.com
::ffff:10.1.0.9 mapped.example.org
10.1.0.1 mcr-alias.example.org
bad-address dropped.example.org
10.1.0.6 outside.test
`

// conformQuery is one question of a conformance table.
type conformQuery struct {
	name  string
	qtype uint16
}

func (q conformQuery) String() string { return q.name + "/" + dns.TypeToString[q.qtype] }

var hostsConformQueries = []conformQuery{
	{"mcr.microsoft.com.", dns.TypeA},
	{"mcr.microsoft.com.", dns.TypeAAAA},
	{"mcr.microsoft.com.", dns.TypeMX},
	{"mcr.microsoft.com.", dns.TypePTR},
	{"MCR.Microsoft.COM.", dns.TypeA},
	{"login.microsoftonline.com.", dns.TypeA},
	{"login.example.org.", dns.TypeA},
	{"packages.aks.azure.com.", dns.TypeA},
	{"packages.aks.azure.com.", dns.TypeAAAA},
	{"packages.aks.azure.com.", dns.TypeTXT},
	{"mapped.example.org.", dns.TypeA},
	{"dropped.example.org.", dns.TypeA},
	{"outside.test.", dns.TypeA},
	{"unknown.example.org.", dns.TypeA},
	{"unknown.example.org.", dns.TypeMX},
	{"other.microsoft.com.", dns.TypeA},
	{"inline.example.org.", dns.TypeA},
	{"inline6.example.org.", dns.TypeAAAA},
	{"notinzone.test.", dns.TypeA},
	{"1.0.1.10.in-addr.arpa.", dns.TypePTR},
	{"2.0.1.10.IN-ADDR.ARPA.", dns.TypePTR},
	{"99.0.1.10.in-addr.arpa.", dns.TypePTR},
	{"9.9.9.10.in-addr.arpa.", dns.TypePTR},
	{"1.0.1.10.in-addr.arpa.", dns.TypeA},
	{mustReverse("fd00::3"), dns.TypePTR},
	{mustReverse("fd00::99"), dns.TypePTR},
	{mustReverse("::ffff:10.1.0.9"), dns.TypePTR},
}

func mustReverse(ip string) string {
	r, err := dns.ReverseAddr(ip)
	if err != nil {
		panic(err)
	}
	return r
}

// conformLab is CoreDNS in a namespace and the answerers dnsstandby makes
// from the same Corefile, one chain per listen address.
type conformLab struct {
	ns     *nstest.Namespace
	chains map[netip.AddrPort][]Answerer
}

// newConformLab starts CoreDNS with corefile and builds the chains from
// corefile.Parse of the same text, for the given ports.
func newConformLab(t *testing.T, corefileText string, ports ...uint16) *conformLab {
	t.Helper()
	nstest.RequireRoot(t)
	bin := nstest.CoreDNSBinary(t)
	ns := nstest.New(t, "localanswer")
	if err := ns.AddLink("anchor", "", conformAddr+"/32", conformClient+"/32"); err != nil {
		t.Fatal(err)
	}
	var listen []netip.AddrPort
	for _, p := range ports {
		listen = append(listen, netip.AddrPortFrom(netip.MustParseAddr(conformAddr), p))
	}
	// One CoreDNS serves every block; the probe needs one of them.
	nstest.StartCoreDNS(t, ns, nstest.CoreDNSConfig{Binary: bin, Corefile: corefileText, Probe: listen[0].String()})
	s, err := corefile.Parse("conformance.corefile", strings.NewReader(corefileText), listen)
	if err != nil {
		t.Fatal(err)
	}
	l := &conformLab{ns: ns, chains: map[netip.AddrPort][]Answerer{}}
	for _, ap := range listen {
		// Each port has one block with one zone.
		i := slices.IndexFunc(s.Zones, func(z corefile.Zone) bool { return z.Serves(ap) })
		if i < 0 {
			t.Fatalf("no zone for %s", ap)
		}
		z := s.Zones[i]
		var chain []Answerer
		if z.Hosts != nil {
			cfg := DefaultHostsConfig()
			cfg.Hosts = *z.Hosts
			cfg.Logger = testkit.Logger(t)
			h, err := NewHosts(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := h.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { h.Close() })
			chain = append(chain, h)
		}
		if z.Whoami {
			chain = append(chain, Whoami{})
		}
		l.chains[ap] = chain
	}
	return l
}

// exchange asks CoreDNS at server over network from conformClient, and
// asks the chain for server the same question from the same client
// address; it returns both replies, ours packed and unpacked as a client
// would see it.
func (l *conformLab) exchange(t *testing.T, network string, server netip.AddrPort, q *dns.Msg) (theirs, ours *dns.Msg) {
	t.Helper()
	conn, err := l.ns.Dial(network, net.JoinHostPort(conformClient, "0"), server.String(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := dns.Client{Net: network, Timeout: 2 * time.Second}
	theirs, _, err = c.ExchangeWithConn(q, &dns.Conn{Conn: conn})
	if err != nil {
		t.Fatalf("CoreDNS: %v", err)
	}
	client, err := netip.ParseAddrPort(conn.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	if q.Question[0].Qclass != dns.ClassINET {
		// CoreDNS's server refuses other classes before any plugin sees
		// them (unless a block has the chaos plugin); the caller of an
		// Answerer does the same.
		ours = new(dns.Msg)
		ours.SetRcode(q, dns.RcodeRefused)
		return theirs, ours
	}
	req := Request{Msg: q, Client: client, Local: server, TCP: network == "tcp"}
	for _, a := range l.chains[server] {
		if m, ok := a.Answer(req); ok {
			wire, err := m.Pack()
			if err != nil {
				t.Fatalf("pack our reply: %v", err)
			}
			ours = new(dns.Msg)
			if err := ours.Unpack(wire); err != nil {
				t.Fatalf("unpack our reply: %v", err)
			}
			return theirs, ours
		}
	}
	// No plugin left: CoreDNS's NextOrFailure gives SERVFAIL.
	ours = new(dns.Msg)
	ours.SetRcode(q, dns.RcodeServerFailure)
	return theirs, ours
}

// conformDiff describes how two replies differ in what a client sees:
// header flags, rcode, question and every section (the OPT record aside).
func conformDiff(theirs, ours *dns.Msg) string {
	var diffs []string
	th, oh := theirs.MsgHdr, ours.MsgHdr
	if th != oh {
		diffs = append(diffs, fmt.Sprintf("header: CoreDNS %+v, ours %+v", th, oh))
	}
	if !slices.Equal(theirs.Question, ours.Question) {
		diffs = append(diffs, fmt.Sprintf("question: CoreDNS %v, ours %v", theirs.Question, ours.Question))
	}
	for _, s := range []struct {
		name        string
		theirs, our []dns.RR
	}{
		{"answer", theirs.Answer, ours.Answer},
		{"authority", theirs.Ns, ours.Ns},
		{"additional", theirs.Extra, ours.Extra},
	} {
		a, b := conformRRs(s.theirs), conformRRs(s.our)
		if !slices.Equal(a, b) {
			diffs = append(diffs, fmt.Sprintf("%s: CoreDNS %q, ours %q", s.name, a, b))
		}
	}
	return strings.Join(diffs, "; ")
}

func conformRRs(rrs []dns.RR) []string {
	var out []string
	for _, rr := range rrs {
		if rr.Header().Rrtype == dns.TypeOPT {
			continue
		}
		out = append(out, strings.ReplaceAll(rr.String(), "\t", " "))
	}
	return out
}

// TestHostsConformsToCoreDNS asks CoreDNS 1.13.1 and the hosts answerer
// the same questions, over UDP and TCP, for each hosts stanza, and wants
// the same replies.
func TestHostsConformsToCoreDNS(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "hosts")
	if err := os.WriteFile(file, []byte(hostsConformFile), 0o644); err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(hostsConformCorefile, "FILE", file)
	text = strings.ReplaceAll(text, "MISSING", filepath.Join(dir, "missing"))
	ports := []uint16{5301, 5302, 5303, 5304}
	l := newConformLab(t, text, ports...)

	agree, total := 0, 0
	for _, port := range ports {
		server := netip.AddrPortFrom(netip.MustParseAddr(conformAddr), port)
		for _, network := range []string{"udp", "tcp"} {
			for i, cq := range hostsConformQueries {
				q := new(dns.Msg)
				q.SetQuestion(cq.name, cq.qtype)
				q.Id = uint16(i + 1)
				theirs, ours := l.exchange(t, network, server, q)
				total++
				if d := conformDiff(theirs, ours); d != "" {
					t.Errorf("port %d %s %s: %s", port, network, cq, d)
					continue
				}
				agree++
			}
		}
	}
	t.Logf("hosts: %d/%d replies agree with CoreDNS", agree, total)
}

// TestHostsReloadLikeCoreDNS rewrites the hosts file and wants CoreDNS and
// the hosts answerer both to give the new answer within two reload
// intervals.
func TestHostsReloadLikeCoreDNS(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "hosts")
	if err := os.WriteFile(file, []byte(hostsConformFile), 0o644); err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(hostsConformCorefile, "FILE", file)
	text = strings.ReplaceAll(text, "MISSING", filepath.Join(dir, "missing"))
	l := newConformLab(t, text, 5302)
	server := netip.AddrPortFrom(netip.MustParseAddr(conformAddr), 5302)

	q := new(dns.Msg)
	q.SetQuestion("mcr.microsoft.com.", dns.TypeA)
	first := func(m *dns.Msg) string {
		if len(m.Answer) == 0 {
			return dns.RcodeToString[m.Rcode]
		}
		return m.Answer[0].(*dns.A).A.String()
	}
	theirs, ours := l.exchange(t, "udp", server, q)
	if first(theirs) != "10.1.0.1" || first(ours) != "10.1.0.1" {
		t.Fatalf("before: CoreDNS %s, ours %s", first(theirs), first(ours))
	}
	rewritten := strings.Replace(hostsConformFile, "10.1.0.1 mcr.microsoft.com", "10.1.0.111 mcr.microsoft.com", 1)
	if err := os.WriteFile(file, []byte(rewritten), 0o644); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 2*time.Second, "CoreDNS and localanswer both answer the new address", func() bool {
		theirs, ours := l.exchange(t, "udp", server, q)
		return first(theirs) == "10.1.0.111" && first(ours) == "10.1.0.111" && conformDiff(theirs, ours) == ""
	})
}
