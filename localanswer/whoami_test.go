package localanswer

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/miekg/dns"
)

// TestWhoami checks whoami's answer for each client family and transport.
func TestWhoami(t *testing.T) {
	tests := []struct {
		name   string
		qname  string
		qtype  uint16
		client string
		tcp    bool
		extra  []string
	}{
		{"IPv4 UDP", "health-check.localdns.local.", dns.TypeA, "10.244.0.5:40000", false,
			[]string{"health-check.localdns.local. 0 IN A 10.244.0.5", "_udp.health-check.localdns.local. 0 IN SRV 0 0 40000 ."}},
		{"IPv4 TCP, any type, case kept", "Health-Check.LocalDNS.local.", dns.TypeMX, "10.244.0.5:1234", true,
			[]string{"Health-Check.LocalDNS.local. 0 IN A 10.244.0.5", "_tcp.Health-Check.LocalDNS.local. 0 IN SRV 0 0 1234 ."}},
		{"IPv4-mapped is IPv4", "a.", dns.TypeA, "[::ffff:10.0.0.1]:53", false,
			[]string{"a. 0 IN A 10.0.0.1", "_udp.a. 0 IN SRV 0 0 53 ."}},
		{"IPv6", "a.", dns.TypeAAAA, "[fd00::1]:5353", true,
			[]string{"a. 0 IN AAAA fd00::1", "_tcp.a. 0 IN SRV 0 0 5353 ."}},
		{"root", ".", dns.TypeNS, "10.0.0.1:9", false,
			[]string{". 0 IN A 10.0.0.1", "_udp. 0 IN SRV 0 0 9 ."}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := new(dns.Msg)
			q.SetQuestion(tt.qname, tt.qtype)
			m, ok := Whoami{}.Answer(Request{Msg: q, Client: netip.MustParseAddrPort(tt.client), TCP: tt.tcp})
			if !ok {
				t.Fatal("passed on")
			}
			if m.Rcode != dns.RcodeSuccess || !m.Authoritative || !m.Response || m.Id != q.Id || len(m.Answer) != 0 || len(m.Ns) != 0 {
				t.Errorf("reply %v", m)
			}
			if got := hostsRRs(m.Extra); !slices.Equal(got, tt.extra) {
				t.Errorf("additional\n %q\nwant\n %q", got, tt.extra)
			}
		})
	}
}
