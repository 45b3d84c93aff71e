package tap

import (
	"encoding/binary"
	"net/netip"
)

// reason says why the tap did not hand a packet to the sink. The sink's
// own rejects (the cache's reasons) are counted apart.
type reason uint8

const (
	reasonNone        reason = iota
	reasonShort              // shorter than the headers it claims, or than an IP header
	reasonNotIP              // neither IPv4 nor IPv6
	reasonBadIP              // IPv4 IHL below 5, or a total/payload length that is impossible
	reasonFragment           // an IPv4 fragment (MF or offset set)
	reasonIPv6Ext            // an IPv6 extension header before UDP (fragment header included)
	reasonNotUDP             // another transport protocol
	reasonBadUDP             // UDP length below 8 or disagreeing with the IP length
	reasonEmpty              // a UDP datagram without payload
	reasonSource             // not from a configured address and port (the kernel filter should have dropped it)
	reasonOversize           // larger than the read slot (MSG_TRUNC)
	reasonDuplicate          // the same bytes just seen on another interface (a bridge and its port)
	reasonDisabled           // a valid reply read while inserting is paused (SetEnabled(false))
	reasonSinkError          // the sink failed with an error that is not a cache reject
	reasonOwnHedge           // a reply the observer says dnsstandby sent itself (a hedge)
	reasonDestination        // a query not to a configured address and port (the kernel filter should have dropped it)
	numReasons
)

var reasonNames = [numReasons]string{
	"", "short", "not_ipv4_ipv6", "bad_ip_header", "fragment", "ipv6_extension",
	"not_udp", "bad_udp", "empty", "wrong_source", "oversize", "duplicate",
	"disabled", "sink_error", "own_hedge", "wrong_destination",
}

func (r reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return "unknown"
}

const (
	ipv4MinHeader = 20
	ipv6Header    = 40
	udpHeader     = 8
)

// isIPv6ExtHeader reports the next-header values RFC 8200 §4 and the IANA
// registry list as IPv6 extension headers (hop-by-hop, routing, fragment,
// ESP, AH, destination options, mobility, HIP, shim6, experimental).
func isIPv6ExtHeader(nh uint8) bool {
	switch nh {
	case 0, 43, 44, 50, 51, 60, 135, 139, 140, 253, 254:
		return true
	}
	return false
}

// parsePacket reads an IPv4 or IPv6 packet carrying UDP, as a cooked
// AF_PACKET socket delivers it (starting at the IP header), and returns the
// UDP source, destination and payload; payload aliases pkt. Bytes after the IP packet's
// own length (link-layer padding) are ignored. The UDP checksum is not
// verified: on outgoing packets checksum offload leaves it partial or unset.
func parsePacket(pkt []byte) (src, dst netip.AddrPort, payload []byte, r reason) {
	if len(pkt) < 1 {
		return src, dst, nil, reasonShort
	}
	var saddr, daddr netip.Addr
	var l4 []byte
	switch pkt[0] >> 4 {
	case 4:
		if len(pkt) < ipv4MinHeader {
			return src, dst, nil, reasonShort
		}
		ihl := int(pkt[0]&0x0f) * 4
		if ihl < ipv4MinHeader {
			return src, dst, nil, reasonBadIP
		}
		total := int(binary.BigEndian.Uint16(pkt[2:]))
		if total < ihl {
			return src, dst, nil, reasonBadIP
		}
		if total > len(pkt) {
			return src, dst, nil, reasonShort
		}
		if binary.BigEndian.Uint16(pkt[6:])&ipv4FragMask != 0 {
			return src, dst, nil, reasonFragment
		}
		if pkt[9] != protoUDP {
			return src, dst, nil, reasonNotUDP
		}
		saddr = netip.AddrFrom4([4]byte(pkt[12:16]))
		daddr = netip.AddrFrom4([4]byte(pkt[16:20]))
		l4 = pkt[ihl:total]
	case 6:
		if len(pkt) < ipv6Header {
			return src, dst, nil, reasonShort
		}
		plen := int(binary.BigEndian.Uint16(pkt[4:]))
		if plen == 0 {
			return src, dst, nil, reasonBadIP // a jumbogram (RFC 2675) or nothing: not a DNS reply
		}
		if ipv6Header+plen > len(pkt) {
			return src, dst, nil, reasonShort
		}
		switch nh := pkt[6]; {
		case nh == protoUDP:
		case nh == 44:
			return src, dst, nil, reasonFragment
		case isIPv6ExtHeader(nh):
			return src, dst, nil, reasonIPv6Ext
		default:
			return src, dst, nil, reasonNotUDP
		}
		saddr = netip.AddrFrom16([16]byte(pkt[8:24]))
		daddr = netip.AddrFrom16([16]byte(pkt[24:40]))
		l4 = pkt[ipv6Header : ipv6Header+plen]
	default:
		return src, dst, nil, reasonNotIP
	}
	if len(l4) < udpHeader {
		return src, dst, nil, reasonShort
	}
	ulen := int(binary.BigEndian.Uint16(l4[4:]))
	if ulen != len(l4) {
		// Below 8 it is malformed; above, it claims bytes the packet does
		// not hold; below the IP payload, bytes of the packet belong to no
		// one. A sender's kernel writes it equal, so any difference is a
		// packet this tap does not understand.
		return src, dst, nil, reasonBadUDP
	}
	if ulen == udpHeader {
		return src, dst, nil, reasonEmpty
	}
	src = netip.AddrPortFrom(saddr, binary.BigEndian.Uint16(l4[0:]))
	dst = netip.AddrPortFrom(daddr, binary.BigEndian.Uint16(l4[2:]))
	return src, dst, l4[udpHeader:], reasonNone
}
