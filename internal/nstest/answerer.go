package nstest

import (
	"net"
	"net/netip"
	"testing"

	"github.com/miekg/dns"
)

// StartAnswerer runs a DNS server over UDP on a free loopback address of
// the test's own namespace, answering every question with one A record
// for addr (TTL 60, RA set, as a recursive upstream answers), until the
// test ends. It stands in for kube-dns where what matters is which
// upstream answered.
func StartAnswerer(t testing.TB, addr string) netip.AddrPort {
	t.Helper()
	ap := FreeLoopbackAddr(t)
	pc, err := net.ListenPacket("udp", ap.String())
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		m.RecursionAvailable = true
		if rr, err := dns.NewRR(r.Question[0].Name + " 60 IN A " + addr); err == nil {
			m.Answer = []dns.RR{rr}
		}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return ap
}
