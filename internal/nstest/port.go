package nstest

import (
	"net"
	"net/netip"
	"testing"
)

// FreeLoopbackAddr returns 127.0.0.1 with a port that is free for both UDP
// and TCP right now, for tests that run servers on the host's loopback
// without root.
func FreeLoopbackAddr(t testing.TB) netip.AddrPort {
	t.Helper()
	for range 20 {
		u, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		ap := u.LocalAddr().(*net.UDPAddr).AddrPort()
		u.Close()
		if l, err := net.ListenTCP("tcp4", net.TCPAddrFromAddrPort(ap)); err == nil {
			l.Close()
			return ap
		}
	}
	t.Fatal("no port free for both UDP and TCP on 127.0.0.1")
	return netip.AddrPort{}
}
