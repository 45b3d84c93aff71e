package responder

import (
	"net"
	"sync/atomic"
	"testing"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

// BenchmarkUDPHit is one cached answer through a real socket: the client
// writes a query on a connected loopback socket and reads the answer, the
// server's read loop receives it with recvmmsg, answers from the cache
// and sends with sendmmsg. The client's calls do not allocate, so the
// allocations reported are the server's: there must be none. Reads are
// counted for the steering program's read test, as the daemon has them.
func BenchmarkUDPHit(b *testing.B) {
	ap := nstest.FreeLoopbackAddr(b)
	s, _ := startServer(b, ap, &tableUpstream{}, func(c *Config) { c.ReadersPerSocket = 1 })
	var reads atomic.Uint64
	s.CountReads(ap, &reads)
	conn, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(ap))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	m := new(dns.Msg)
	m.SetQuestion("bench.example.", dns.TypeA)
	m.SetEdns0(1232, false)
	raw, err := m.Pack()
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 4096)
	roundTrip := func() int {
		if _, err := conn.Write(raw); err != nil {
			b.Fatal(err)
		}
		n, err := conn.Read(buf)
		if err != nil {
			b.Fatal(err)
		}
		return n
	}
	roundTrip() // the miss, which fills the cache
	b.ReportAllocs()
	for b.Loop() {
		roundTrip()
	}
}
