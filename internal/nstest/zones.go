package nstest

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/miekg/dns"
)

// ZoneOptions shapes the zones KubeDNSZones generates.
type ZoneOptions struct {
	Services   int      // svc-N services in cluster.local; 0 means 100
	Namespaces []string // Kubernetes namespaces the services are spread over, round robin; nil means {"default"}
	TTL        uint32   // TTL of cluster.local records and its SOA MINIMUM; 0 means 30
}

// Service is one generated cluster service.
type Service struct {
	Name      string     // svc-N
	Namespace string     // Kubernetes namespace
	FQDN      string     // svc-N.NAMESPACE.svc.cluster.local.
	IP        netip.Addr // its ClusterIP (A record)
	SRV       string     // _http._tcp.FQDN, an SRV record pointing at FQDN port 80
}

// Case is one query the zones answer, with the answer CoreDNS gives.
type Case struct {
	Name   string   // FQDN asked, lower case
	Type   uint16   // qtype
	Rcode  int      // expected rcode
	Answer []dns.RR // expected answer section in any order; none for NXDOMAIN and NODATA
	Zone   string   // apex whose SOA a negative answer carries in authority; "" if none is checked
	Large  bool     // the reply exceeds 512 bytes: over UDP without EDNS it comes truncated
	Why    string   // what the case covers
}

func (c Case) String() string {
	return fmt.Sprintf("%s %s", c.Name, dns.TypeToString[c.Type])
}

// Question is a query for the case as a stub resolver sends it: RD set,
// EDNS with a 1232-byte payload (enough for every case).
func (c Case) Question() *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(c.Name, c.Type)
	m.SetEdns0(1232, false)
	return m
}

// Check reports how m differs from the expected reply: rcode, the answer
// RRs (as a set, owner names compared case-insensitively, each TTL at most
// the zone's, so a cache's aged answer passes), and for a negative answer
// the zone's SOA in authority. A truncated reply is an error.
func (c Case) Check(m *dns.Msg) error {
	if m == nil {
		return fmt.Errorf("%s: no reply", c)
	}
	var errs []string
	if m.Rcode != c.Rcode {
		errs = append(errs, fmt.Sprintf("rcode %s, want %s", dns.RcodeToString[m.Rcode], dns.RcodeToString[c.Rcode]))
	}
	if m.Truncated {
		errs = append(errs, "truncated")
	}
	if d := diffRRs(m.Answer, c.Answer); d != "" {
		errs = append(errs, "answer: "+d)
	}
	negative := c.Rcode == dns.RcodeNameError || (c.Rcode == dns.RcodeSuccess && len(c.Answer) == 0)
	if negative && c.Zone != "" && !hasSOA(m.Ns, c.Zone) {
		errs = append(errs, fmt.Sprintf("authority has no SOA of %s: %v", c.Zone, m.Ns))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s: %s", c, strings.Join(errs, "; "))
	}
	return nil
}

// CheckRRs is Check for a client that shows only rcode and answer (dig).
func (c Case) CheckRRs(rcode int, answer []dns.RR) error {
	m := &dns.Msg{Answer: answer}
	m.Rcode = rcode
	c.Zone = ""
	return c.Check(m)
}

func hasSOA(rrs []dns.RR, zone string) bool {
	for _, rr := range rrs {
		if rr.Header().Rrtype == dns.TypeSOA && strings.EqualFold(rr.Header().Name, zone) {
			return true
		}
	}
	return false
}

// diffRRs compares got with want as multisets, ignoring TTLs except that a
// got TTL may not exceed the wanted one.
func diffRRs(got, want []dns.RR) string {
	key := func(rr dns.RR) string {
		rr = dns.Copy(rr)
		rr.Header().Ttl = 0
		rr.Header().Name = strings.ToLower(rr.Header().Name)
		return rr.String()
	}
	wantTTL := map[string][]uint32{}
	for _, rr := range want {
		k := key(rr)
		wantTTL[k] = append(wantTTL[k], rr.Header().Ttl)
	}
	var problems []string
	for _, rr := range got {
		k := key(rr)
		ttls := wantTTL[k]
		if len(ttls) == 0 {
			problems = append(problems, "unexpected "+rr.String())
			continue
		}
		if rr.Header().Ttl > ttls[0] {
			problems = append(problems, fmt.Sprintf("TTL %d > %d in %s", rr.Header().Ttl, ttls[0], rr))
		}
		wantTTL[k] = ttls[1:]
	}
	for _, rr := range want {
		k := key(rr)
		if len(wantTTL[k]) > 0 {
			problems = append(problems, "missing "+rr.String())
			wantTTL[k] = wantTTL[k][1:]
		}
	}
	return strings.Join(problems, ", ")
}

// Zones is a set of generated zones: a "cluster.local" as kube-dns serves
// it, and two external-looking zones (documentation address ranges only).
type Zones struct {
	Files    map[string]string // zone file name → contents; pass as CoreDNSConfig.Files
	Origins  []string          // the zones, as FQDNs, in Corefile order
	Services []Service         // the cluster services
	Cases    []Case            // queries with the replies CoreDNS gives for them

	files   map[string]string // origin → file name
	records []dns.RR          // every record of every zone
}

// Names of the external zones' interesting records, for tests that need one
// particular behaviour.
const (
	LargeName    = "large.example.com." // LargeCount A records: over 512 bytes
	LargeCount   = 40
	ChainName    = "alias.example.com." // CNAME → CNAME → www.example.com
	CrossName    = "cdn.example.net."   // CNAME into example.com
	DanglingName = "dangling.example.net."
	TXTName      = "txt.example.com."
)

// KubeDNSZones generates the zones and the cases that check them.
func KubeDNSZones(opts ZoneOptions) *Zones {
	if opts.Services == 0 {
		opts.Services = 100
	}
	if len(opts.Namespaces) == 0 {
		opts.Namespaces = []string{"default"}
	}
	if opts.TTL == 0 {
		// The kubernetes plugin's records live 5 s by default; AKS's
		// kube-dns answers with 30, which is also a sane negative TTL.
		opts.TTL = 30
	}
	z := &Zones{Files: map[string]string{}, files: map[string]string{}}

	ttl := opts.TTL
	cluster := z.zone("cluster.local.",
		fmt.Sprintf("cluster.local. %d IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 %d", ttl, ttl),
		fmt.Sprintf("cluster.local. %d IN NS ns.dns.cluster.local.", ttl),
		fmt.Sprintf("ns.dns.cluster.local. %d IN A 10.0.0.10", ttl),
		fmt.Sprintf("kube-dns.kube-system.svc.cluster.local. %d IN A 10.0.0.10", ttl),
		fmt.Sprintf("kubernetes.default.svc.cluster.local. %d IN A 10.0.0.1", ttl),
	)
	// ClusterIPs from 10.0.1.0 on, clear of the 10.0.0.x of the system
	// services, inside AKS's default 10.0.0.0/16 service range.
	ip := netip.MustParseAddr("10.0.1.0")
	for i := range opts.Services {
		ns := opts.Namespaces[i%len(opts.Namespaces)]
		s := Service{Name: fmt.Sprintf("svc-%d", i), Namespace: ns, IP: ip}
		s.FQDN = fmt.Sprintf("%s.%s.svc.cluster.local.", s.Name, ns)
		s.SRV = "_http._tcp." + s.FQDN
		z.Services = append(z.Services, s)
		cluster.add(fmt.Sprintf("%s %d IN A %s", s.FQDN, ttl, s.IP))
		cluster.add(fmt.Sprintf("%s %d IN SRV 0 100 80 %s", s.SRV, ttl, s.FQDN))
		ip = ip.Next()
	}

	exCom := z.zone("example.com.",
		"example.com. 3600 IN SOA ns1.example.com. hostmaster.example.com. 2024010101 7200 3600 1209600 300",
		"example.com. 3600 IN NS ns1.example.com.",
		"example.com. 300 IN MX 10 mail.example.com.",
		"ns1.example.com. 3600 IN A 192.0.2.1",
		"mail.example.com. 300 IN A 192.0.2.25",
		"www.example.com. 300 IN A 192.0.2.10",
		"www.example.com. 300 IN AAAA 2001:db8::10",
		"alias.example.com. 300 IN CNAME alias2.example.com.",
		"alias2.example.com. 60 IN CNAME www.example.com.",
		`txt.example.com. 300 IN TXT "v=spf1 -all"`,
		`txt.example.com. 300 IN TXT "dnsstandby nstest zone" "second string"`,
	)
	large := netip.MustParseAddr("192.0.2.100")
	for range LargeCount {
		exCom.add(fmt.Sprintf("%s 300 IN A %s", LargeName, large))
		large = large.Next()
	}
	exNet := z.zone("example.net.",
		"example.net. 3600 IN SOA ns1.example.net. hostmaster.example.net. 1 7200 3600 1209600 60",
		"example.net. 3600 IN NS ns1.example.net.",
		"ns1.example.net. 3600 IN A 198.51.100.1",
		"www.example.net. 120 IN A 198.51.100.10",
		"v6only.example.net. 120 IN AAAA 2001:db8:1::1",
		"cdn.example.net. 120 IN CNAME www.example.com.",
		"dangling.example.net. 120 IN CNAME gone.example.com.",
	)
	for _, b := range []*zoneBuilder{cluster, exCom, exNet} {
		b.write()
	}

	// Cases: every service by A and SRV, then one of each behaviour.
	for _, s := range z.Services {
		z.expect(s.FQDN, dns.TypeA, "service ClusterIP")
		z.expect(s.SRV, dns.TypeSRV, "service port")
	}
	first := z.Services[0]
	z.expect("kubernetes.default.svc.cluster.local.", dns.TypeA, "API server service")
	z.expect("kube-dns.kube-system.svc.cluster.local.", dns.TypeA, "kube-dns service")
	z.expect("cluster.local.", dns.TypeSOA, "cluster apex SOA")
	z.expect(first.FQDN, dns.TypeAAAA, "NODATA: service has no IPv6")
	z.expect("nosuch."+first.Namespace+".svc.cluster.local.", dns.TypeA, "NXDOMAIN: no such service")
	z.expect("example.com."+first.Namespace+".svc.cluster.local.", dns.TypeA, "NXDOMAIN: search-path expansion (ndots:5)")
	z.expect(first.Namespace+".svc.cluster.local.", dns.TypeA, "NODATA: empty non-terminal")
	z.expect("example.com.", dns.TypeSOA, "apex SOA")
	z.expect("example.com.", dns.TypeNS, "apex NS")
	z.expect("example.com.", dns.TypeMX, "MX")
	z.expect("www.example.com.", dns.TypeA, "A")
	z.expect("www.example.com.", dns.TypeAAAA, "AAAA")
	z.expect("www.example.com.", dns.TypeTXT, "NODATA: no such type")
	z.expect(ChainName, dns.TypeA, "CNAME chain of two to A")
	z.expect(ChainName, dns.TypeAAAA, "CNAME chain of two to AAAA")
	z.expect(TXTName, dns.TypeTXT, "TXT, two records, one with two strings")
	z.expect("nosuch.example.com.", dns.TypeA, "NXDOMAIN")
	z.expect("www.example.net.", dns.TypeA, "A in the second zone")
	z.expect("v6only.example.net.", dns.TypeAAAA, "AAAA only")
	z.expect("v6only.example.net.", dns.TypeA, "NODATA: AAAA only")
	z.expect(CrossName, dns.TypeA, "CNAME into another zone, followed")
	z.expect("nosuch.example.net.", dns.TypeAAAA, "NXDOMAIN in the second zone")
	z.expect(LargeName, dns.TypeA, "large answer: truncated over plain UDP")
	z.Cases[len(z.Cases)-1].Large = true
	// A CNAME whose target does not exist: the CNAME is answered with the
	// target's NXDOMAIN (RFC 6604), and the authority section carries the
	// first zone's NS, not an SOA, so it is not checked.
	z.expect(DanglingName, dns.TypeA, "CNAME to a name that does not exist")
	z.Cases[len(z.Cases)-1].Zone = ""
	z.Cases = append(z.Cases, Case{Name: "www.example.org.", Type: dns.TypeA, Rcode: dns.RcodeRefused,
		Why: "no zone served: CoreDNS refuses (kube-dns would forward; this lab forwards nowhere)"})
	return z
}

type zoneBuilder struct {
	z      *Zones
	origin string
	lines  []string
}

// zone starts a zone with the given records (the SOA first), served from
// file db.ORIGIN.
func (z *Zones) zone(origin string, rrs ...string) *zoneBuilder {
	file := "db." + strings.TrimSuffix(origin, ".")
	z.Origins = append(z.Origins, origin)
	z.files[origin] = file
	b := &zoneBuilder{z: z, origin: origin, lines: []string{"$ORIGIN " + origin}}
	for _, rr := range rrs {
		b.add(rr)
	}
	return b
}

func (b *zoneBuilder) add(text string) {
	rr, err := dns.NewRR(text)
	if err != nil {
		panic(fmt.Sprintf("nstest: bad generated record %q: %v", text, err))
	}
	b.z.records = append(b.z.records, rr)
	b.lines = append(b.lines, rr.String())
}

// write puts the zone's file into Files.
func (b *zoneBuilder) write() {
	b.z.Files[b.z.files[b.origin]] = strings.Join(b.lines, "\n") + "\n"
}

// expect appends the case for (name, qtype), its reply worked out from the
// records as CoreDNS's file plugin answers: CNAMEs are followed, across
// zones too (the plugin looks the target up through the server itself).
func (z *Zones) expect(name string, qtype uint16, why string) {
	c := Case{Name: name, Type: qtype, Why: why, Rcode: dns.RcodeSuccess}
	c.Zone = z.zoneOf(name)
	for hops := 0; hops < 8; hops++ {
		var cname dns.RR
		exists := false
		for _, rr := range z.records {
			h := rr.Header()
			if !strings.EqualFold(h.Name, name) {
				continue
			}
			exists = true
			switch h.Rrtype {
			case qtype:
				c.Answer = append(c.Answer, rr)
			case dns.TypeCNAME:
				cname = rr
			}
		}
		if !exists && !z.isEmptyNonTerminal(name) {
			c.Rcode = dns.RcodeNameError
			c.Zone = z.zoneOf(name)
		}
		if cname == nil || qtype == dns.TypeCNAME {
			break
		}
		c.Answer = append(c.Answer, cname)
		name = cname.(*dns.CNAME).Target
	}
	z.Cases = append(z.Cases, c)
}

// isEmptyNonTerminal reports a name that owns no records but has some below
// it: it exists (NOERROR, no data).
func (z *Zones) isEmptyNonTerminal(name string) bool {
	return slices.ContainsFunc(z.records, func(rr dns.RR) bool {
		return dns.IsSubDomain(name, rr.Header().Name) && !strings.EqualFold(name, rr.Header().Name)
	})
}

func (z *Zones) zoneOf(name string) string {
	best := ""
	for _, o := range z.Origins {
		if dns.IsSubDomain(o, name) && len(o) > len(best) {
			best = o
		}
	}
	return best
}

// Case returns the case for (name, qtype).
func (z *Zones) Case(name string, qtype uint16) (Case, bool) {
	for _, c := range z.Cases {
		if strings.EqualFold(c.Name, name) && c.Type == qtype {
			return c, true
		}
	}
	return Case{}, false
}

// Corefile returns a Corefile serving every zone from its file on addr
// ("IP" or "IP:PORT", port 53 if none), one server block per zone, with the
// errors plugin so failures reach CoreDNS's output.
func (z *Zones) Corefile(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		host, port = addr, "53"
	}
	var b strings.Builder
	for _, o := range z.Origins {
		fmt.Fprintf(&b, "%s:%s {\n    bind %s\n    errors\n    file %s\n}\n", o, port, host, z.files[o])
	}
	return b.String()
}
