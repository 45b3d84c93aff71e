package localanswer

import "github.com/miekg/dns"

// Whoami answers as CoreDNS 1.13.1's whoami plugin does, for any name and
// type: NOERROR, authoritative, no answer records, and in the additional
// section the client's address (A for IPv4 and IPv4-mapped IPv6, else
// AAAA) under the query name as the client wrote it, then an SRV record
// _udp.NAME or _tcp.NAME with the client's port and target ".". Both
// have TTL 0 and the query's class. It never passes a query on.
type Whoami struct{}

// Answer implements Answerer.
func (Whoami) Answer(r Request) (*dns.Msg, bool) {
	name, class := ".", uint16(0)
	if len(r.Msg.Question) > 0 {
		name, class = r.Msg.Question[0].Name, r.Msg.Question[0].Qclass
	}
	m := new(dns.Msg)
	m.SetReply(r.Msg)
	m.Authoritative = true

	var addr dns.RR
	if ip := r.Client.Addr().Unmap(); ip.Is4() {
		addr = &dns.A{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeA, Class: class}, A: ip.AsSlice()}
	} else {
		addr = &dns.AAAA{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeAAAA, Class: class}, AAAA: ip.WithZone("").AsSlice()}
	}
	proto := "_udp."
	if r.TCP {
		proto = "_tcp."
	}
	srvName := proto + name
	if name == "." {
		srvName = proto
	}
	srv := &dns.SRV{
		Hdr:    dns.RR_Header{Name: srvName, Rrtype: dns.TypeSRV, Class: class},
		Port:   r.Client.Port(),
		Target: ".",
	}
	m.Extra = []dns.RR{addr, srv}
	return m, true
}
