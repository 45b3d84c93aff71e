package tap

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"

	"github.com/miekg/dns"
)

var (
	localDNS   = netip.MustParseAddr("169.254.10.11")
	localDNS6  = netip.MustParseAddr("fd00:10::11")
	podAddr    = netip.MustParseAddr("10.244.0.7")
	podAddr6   = netip.MustParseAddr("fd00:244::7")
	otherAddr  = netip.MustParseAddr("169.254.10.10")
	otherAddr6 = netip.MustParseAddr("fd00:10::10")
)

// udpPacket builds an IP packet (v4 or v6 by src) carrying a UDP datagram
// from src to dst with payload, with correct lengths and a zero (offloaded)
// checksum, as a cooked packet socket shows an outgoing reply.
func udpPacket(src, dst netip.AddrPort, payload []byte) []byte {
	udp := make([]byte, udpHeader+len(payload))
	binary.BigEndian.PutUint16(udp[0:], src.Port())
	binary.BigEndian.PutUint16(udp[2:], dst.Port())
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	copy(udp[udpHeader:], payload)
	if src.Addr().Is4() {
		ip := make([]byte, ipv4MinHeader, ipv4MinHeader+len(udp))
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(ipv4MinHeader+len(udp)))
		binary.BigEndian.PutUint16(ip[4:], 0x1234) // ID
		binary.BigEndian.PutUint16(ip[6:], 0x4000) // DF
		ip[8] = 64
		ip[9] = protoUDP
		s, d := src.Addr().As4(), dst.Addr().As4()
		copy(ip[12:], s[:])
		copy(ip[16:], d[:])
		return append(ip, udp...)
	}
	ip := make([]byte, ipv6Header, ipv6Header+len(udp))
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(len(udp)))
	ip[6] = protoUDP
	ip[7] = 64
	s, d := src.Addr().As16(), dst.Addr().As16()
	copy(ip[8:], s[:])
	copy(ip[24:], d[:])
	return append(ip, udp...)
}

// reply is a LocalDNS reply from ap to a pod, of the family of ap.
func reply(ap netip.AddrPort, payload []byte) []byte {
	dst := netip.AddrPortFrom(podAddr, 40000)
	if ap.Addr().Is6() {
		dst = netip.AddrPortFrom(podAddr6, 40000)
	}
	return udpPacket(ap, dst, payload)
}

// query is a pod's query to ap, of the family of ap.
func query(ap netip.AddrPort, payload []byte) []byte {
	src := netip.AddrPortFrom(podAddr, 40000)
	if ap.Addr().Is6() {
		src = netip.AddrPortFrom(podAddr6, 40000)
	}
	return udpPacket(src, ap, payload)
}

// dnsReply returns a cacheable wire-format answer for name.
func dnsReply(t testing.TB, name string) []byte {
	t.Helper()
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	m := new(dns.Msg)
	m.SetReply(q)
	rr, err := dns.NewRR(dns.Fqdn(name) + " 60 IN A 192.0.2.1")
	if err != nil {
		t.Fatal(err)
	}
	m.Answer = append(m.Answer, rr)
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// dnsQuery returns a wire-format query for name, type A.
func dnsQuery(t testing.TB, name string) []byte {
	t.Helper()
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	b, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// withIPv6NextHeader puts an extension header of type nh (8 bytes, next
// header UDP) between the fixed header and UDP.
func withIPv6NextHeader(pkt []byte, nh uint8) []byte {
	out := make([]byte, 0, len(pkt)+8)
	out = append(out, pkt[:ipv6Header]...)
	out[6] = nh
	binary.BigEndian.PutUint16(out[4:], uint16(len(pkt)-ipv6Header+8))
	out = append(out, protoUDP, 0, 0, 0, 0, 0, 0, 0)
	return append(out, pkt[ipv6Header:]...)
}

func mutate(pkt []byte, fn func(p []byte) []byte) []byte {
	return fn(append([]byte(nil), pkt...))
}

// many returns n distinct IPv6 addresses (the longest filter program).
func many(n int) []netip.Addr {
	var a []netip.Addr
	for i := range n {
		a = append(a, netip.MustParseAddr(fmt.Sprintf("fd00::%x", i+1)))
	}
	return a
}
