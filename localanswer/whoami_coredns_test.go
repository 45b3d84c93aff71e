package localanswer

import (
	"net/netip"
	"testing"

	"github.com/miekg/dns"
)

// whoamiConformCorefile is AKS's health-check block, and a root block, on
// ports of their own.
const whoamiConformCorefile = `health-check.localdns.local:5310 {
    bind 169.254.10.10
    whoami
}
.:5311 {
    bind 169.254.10.10
    whoami
}
`

// TestWhoamiConformsToCoreDNS asks CoreDNS 1.13.1 and Whoami the same
// questions from a client in the namespace, over UDP and TCP, and wants
// the same replies.
func TestWhoamiConformsToCoreDNS(t *testing.T) {
	l := newConformLab(t, whoamiConformCorefile, 5310, 5311)
	tests := []struct {
		port  uint16
		name  string
		qtype uint16
		class uint16
	}{
		{5310, "health-check.localdns.local.", dns.TypeA, dns.ClassINET},
		{5310, "Health-Check.LocalDNS.Local.", dns.TypeA, dns.ClassINET},
		{5310, "health-check.localdns.local.", dns.TypeAAAA, dns.ClassINET},
		{5310, "health-check.localdns.local.", dns.TypeTXT, dns.ClassINET},
		{5310, "x.health-check.localdns.local.", dns.TypeSRV, dns.ClassINET},
		{5310, "health-check.localdns.local.", dns.TypeA, dns.ClassCHAOS},
		{5311, ".", dns.TypeNS, dns.ClassINET},
		{5311, "mcr.microsoft.com.", dns.TypeA, dns.ClassINET},
		{5311, "1.0.1.10.in-addr.arpa.", dns.TypePTR, dns.ClassINET},
	}
	agree, total := 0, 0
	for _, network := range []string{"udp", "tcp"} {
		for i, tt := range tests {
			server := netip.AddrPortFrom(netip.MustParseAddr(conformAddr), tt.port)
			q := new(dns.Msg)
			q.SetQuestion(tt.name, tt.qtype)
			q.Question[0].Qclass = tt.class
			q.Id = uint16(100 + i)
			theirs, ours := l.exchange(t, network, server, q)
			total++
			if d := conformDiff(theirs, ours); d != "" {
				t.Errorf("port %d %s %s %s %s: %s", tt.port, network, tt.name,
					dns.ClassToString[tt.class], dns.TypeToString[tt.qtype], d)
				continue
			}
			if tt.class == dns.ClassINET && len(ours.Extra) != 2 {
				t.Errorf("%s %s: additional %v, want the address and the SRV", network, tt.name, ours.Extra)
			}
			agree++
		}
	}
	t.Logf("whoami: %d/%d replies agree with CoreDNS", agree, total)
}
