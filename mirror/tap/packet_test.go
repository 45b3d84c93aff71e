package tap

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
)

func TestParsePacket(t *testing.T) {
	payload := []byte("a DNS reply, as far as the parser cares")
	src4 := netip.AddrPortFrom(localDNS, 53)
	src6 := netip.AddrPortFrom(localDNS6, 53)
	v4 := reply(src4, payload)
	v6 := reply(src6, payload)
	dst4 := netip.AddrPortFrom(podAddr, 40000) // where reply sends
	dst6 := netip.AddrPortFrom(podAddr6, 40000)
	setU16 := func(off int, v uint16) func([]byte) []byte {
		return func(p []byte) []byte { binary.BigEndian.PutUint16(p[off:], v); return p }
	}
	setByte := func(off int, v byte) func([]byte) []byte {
		return func(p []byte) []byte { p[off] = v; return p }
	}
	udp4, udp6 := ipv4MinHeader, ipv6Header // where UDP starts

	tests := []struct {
		name string
		pkt  []byte
		want reason
	}{
		{"ipv4", v4, reasonNone},
		{"ipv4 with options", mutate(v4, func(p []byte) []byte {
			out := append([]byte(nil), p[:ipv4MinHeader]...)
			out[0] = 0x46
			binary.BigEndian.PutUint16(out[2:], uint16(len(p)+4))
			out = append(out, 1, 1, 1, 0) // NOP NOP NOP EOL
			return append(out, p[ipv4MinHeader:]...)
		}), reasonNone},
		{"ipv4 with link padding after it", append(append([]byte(nil), v4...), 0, 0, 0, 0), reasonNone},
		{"ipv6", v6, reasonNone},
		{"ipv6 with link padding after it", append(append([]byte(nil), v6...), 0, 0), reasonNone},

		{"empty", nil, reasonShort},
		{"ipv4 shorter than a header", v4[:ipv4MinHeader-1], reasonShort},
		{"ipv6 shorter than a header", v6[:ipv6Header-1], reasonShort},
		{"ipv4 cut in the payload", v4[:len(v4)-1], reasonShort},
		{"ipv6 cut in the payload", v6[:len(v6)-1], reasonShort},
		{"version 0 (ARP, cooked)", mutate(v4, setByte(0, 0x00)), reasonNotIP},
		{"version 5", mutate(v4, setByte(0, 0x55)), reasonNotIP},

		{"ipv4 IHL 4", mutate(v4, setByte(0, 0x44)), reasonBadIP},
		{"ipv4 IHL 0", mutate(v4, setByte(0, 0x40)), reasonBadIP},
		{"ipv4 IHL beyond total length", mutate(reply(src4, []byte("x")), setByte(0, 0x4f)), reasonBadIP},
		{"ipv4 IHL beyond the packet", mutate(v4[:udp4+udpHeader], func(p []byte) []byte {
			p[0] = 0x4f
			binary.BigEndian.PutUint16(p[2:], 60)
			return p
		}), reasonShort},
		{"ipv4 total length beyond the packet", mutate(v4, setU16(2, uint16(len(v4)+1))), reasonShort},
		{"ipv4 total length below IHL", mutate(v4, setU16(2, 19)), reasonBadIP},
		{"ipv4 total length cuts the UDP header", mutate(v4, setU16(2, ipv4MinHeader+4)), reasonShort},
		{"ipv4 total length shorter than UDP says", mutate(v4, setU16(2, uint16(len(v4)-1))), reasonBadUDP},

		{"ipv4 more fragments", mutate(v4, setU16(6, 0x2000)), reasonFragment},
		{"ipv4 later fragment", mutate(v4, setU16(6, 0x00b9)), reasonFragment},
		{"ipv4 DF is fine", mutate(v4, setU16(6, 0x4000)), reasonNone},
		{"ipv4 TCP", mutate(v4, setByte(9, 6)), reasonNotUDP},
		{"ipv4 ICMP", mutate(v4, setByte(9, 1)), reasonNotUDP},

		{"udp length longer than the packet", mutate(v4, setU16(udp4+4, uint16(len(v4)-udp4+1))), reasonBadUDP},
		{"udp length shorter than the packet", mutate(v4, setU16(udp4+4, uint16(len(v4)-udp4-1))), reasonBadUDP},
		{"udp length below the header", mutate(v4, setU16(udp4+4, 7)), reasonBadUDP},
		{"udp length 0", mutate(v6, setU16(udp6+4, 0)), reasonBadUDP},
		{"ipv6 udp length lies", mutate(v6, setU16(udp6+4, uint16(len(v6)-udp6+8))), reasonBadUDP},
		{"udp without payload", reply(src4, nil), reasonEmpty},

		{"ipv6 payload length beyond the packet", mutate(v6, setU16(4, uint16(len(v6)-ipv6Header+1))), reasonShort},
		{"ipv6 payload length 0 (jumbogram)", mutate(v6, setU16(4, 0)), reasonBadIP},
		{"ipv6 hop-by-hop", withIPv6NextHeader(v6, 0), reasonIPv6Ext},
		{"ipv6 routing header", withIPv6NextHeader(v6, 43), reasonIPv6Ext},
		{"ipv6 destination options", withIPv6NextHeader(v6, 60), reasonIPv6Ext},
		{"ipv6 fragment header", withIPv6NextHeader(v6, 44), reasonFragment},
		{"ipv6 ESP", withIPv6NextHeader(v6, 50), reasonIPv6Ext},
		{"ipv6 TCP", mutate(v6, setByte(6, 6)), reasonNotUDP},
		{"ipv6 ICMPv6", mutate(v6, setByte(6, 58)), reasonNotUDP},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src, dst, got, r := parsePacket(tt.pkt)
			if r != tt.want {
				t.Fatalf("reason %q, want %q", r, tt.want)
			}
			if r != reasonNone {
				if got != nil || src.IsValid() || dst.IsValid() {
					t.Errorf("rejected packet returned payload %q, source %v, destination %v", got, src, dst)
				}
				return
			}
			if !bytes.Equal(got, payload) {
				t.Errorf("payload %q, want %q", got, payload)
			}
			v4 := tt.pkt[0]>>4 == 4
			if want := map[bool]netip.AddrPort{true: src4, false: src6}[v4]; src != want {
				t.Errorf("source %v, want %v", src, want)
			}
			if want := map[bool]netip.AddrPort{true: dst4, false: dst6}[v4]; dst != want {
				t.Errorf("destination %v, want %v", dst, want)
			}
		})
	}
}

func TestParsePacketAliases(t *testing.T) {
	pkt := reply(netip.AddrPortFrom(localDNS, 53), []byte("xyz"))
	_, _, payload, r := parsePacket(pkt)
	if r != reasonNone {
		t.Fatal(r)
	}
	if &payload[0] != &pkt[ipv4MinHeader+udpHeader] {
		t.Error("payload is a copy, want a slice of the packet")
	}
	if n := testing.AllocsPerRun(100, func() { parsePacket(pkt) }); n != 0 {
		t.Errorf("parsePacket allocates %v times", n)
	}
}

// FuzzParsePacket checks that no input panics the parser, that a payload
// it returns lies inside the packet, and that what it accepts is
// consistent with the headers.
func FuzzParsePacket(f *testing.F) {
	payload := dnsReply(f, "svc-1.default.svc.cluster.local")
	v4 := reply(netip.AddrPortFrom(localDNS, 53), payload)
	v6 := reply(netip.AddrPortFrom(localDNS6, 53), payload)
	f.Add(v4)
	f.Add(v6)
	f.Add(withIPv6NextHeader(v6, 0))
	f.Add(withIPv6NextHeader(v6, 44))
	f.Add(mutate(v4, func(p []byte) []byte { p[0] = 0x4f; return p }))
	f.Add(mutate(v4, func(p []byte) []byte { p[6] = 0x20; return p }))
	f.Add(v4[:30])
	f.Add([]byte{})
	f.Add(query(netip.AddrPortFrom(localDNS, 53), payload))
	f.Add(query(netip.AddrPortFrom(localDNS6, 53), payload))
	f.Fuzz(func(t *testing.T, pkt []byte) {
		src, dst, got, r := parsePacket(pkt)
		if r != reasonNone {
			if got != nil {
				t.Fatalf("rejected (%s) with a payload", r)
			}
			return
		}
		if len(got) == 0 || !src.IsValid() || !dst.IsValid() {
			t.Fatalf("accepted without payload, source or destination: %q %v %v", got, src, dst)
		}
		// The payload is the packet's tail before any padding: it must
		// sit inside pkt, right after a UDP header whose length covers it.
		start := cap(pkt) - cap(got)
		if start < udpHeader || start+len(got) > len(pkt) {
			t.Fatalf("payload at %d+%d outside the packet of %d", start, len(got), len(pkt))
		}
		if ulen := int(binary.BigEndian.Uint16(pkt[start-4:])); ulen != len(got)+udpHeader {
			t.Fatalf("udp length %d for a payload of %d", ulen, len(got))
		}
		if v := pkt[0] >> 4; (v == 4) != src.Addr().Is4() || (v == 4) != dst.Addr().Is4() || (v != 4 && v != 6) {
			t.Fatalf("version %d gave source %v, destination %v", v, src, dst)
		}
		// The ports are the UDP header's, right before the payload.
		if binary.BigEndian.Uint16(pkt[start-8:]) != src.Port() || binary.BigEndian.Uint16(pkt[start-6:]) != dst.Port() {
			t.Fatalf("ports %v %v do not match the UDP header", src, dst)
		}
	})
}
