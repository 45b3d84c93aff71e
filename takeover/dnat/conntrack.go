package dnat

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Flows lists the node's UDP conntrack entries (IPv4 and IPv6) in the
// network namespace of the calling thread. It dumps the whole table (tens
// of thousands of flows take a few milliseconds), so the Detector calls it
// at most once a second, and only for a suspect interval while not
// diverted or a clear one while diverted. Needs CAP_NET_ADMIN and
// nf_conntrack_netlink.
func Flows() ([]Flow, error) {
	var out []Flow
	for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, fam)
		if err != nil {
			return nil, fmt.Errorf("list conntrack: %w", err)
		}
		for _, f := range flows {
			if f.Forward.Protocol != unix.IPPROTO_UDP {
				continue
			}
			out = append(out, Flow{
				OrigSrc:  addrPort(f.Forward.SrcIP, f.Forward.SrcPort),
				OrigDst:  addrPort(f.Forward.DstIP, f.Forward.DstPort),
				ReplySrc: addrPort(f.Reverse.SrcIP, f.Reverse.SrcPort),
			})
		}
	}
	return out, nil
}

func addrPort(ip net.IP, port uint16) netip.AddrPort {
	a, _ := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(a.Unmap(), port)
}

// ClearListenFlows deletes the node's conntrack entries of the listen
// addresses addrs, UDP and TCP: those a client's query to one of them
// started (only a DNAT of them leaves such entries: LocalDNS's queries are
// NOTRACK), and those one of their replies started. It is for the moment
// a DNAT of the listen addresses ends (AKS's nat fallback gone): an entry
// it left, for up to 120 s, holds the query's tuple, so a later reply
// from LocalDNS to a client port it saw collides with it, and netfilter
// rewrites that reply's source port (53 to another), which a client's
// connected socket (glibc's) drops; every retry from that port then goes
// the same way. Entries of replies with a rewritten port are deleted with
// the rest. Needs CAP_NET_ADMIN and nf_conntrack_netlink.
func ClearListenFlows(addrs []netip.AddrPort) (int, error) {
	f := make(listenFlows, len(addrs))
	for i, a := range addrs {
		f[i] = netip.AddrPortFrom(a.Addr().Unmap(), a.Port()) // as addrPort gives the flows'
	}
	n := 0
	for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		k, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, fam, f)
		n += int(k)
		if err != nil {
			return n, fmt.Errorf("delete conntrack entries of the listen addresses: %w", err)
		}
	}
	return n, nil
}

// listenFlows matches the conntrack entries ClearListenFlows deletes: its
// addresses unmapped.
type listenFlows []netip.AddrPort

func (l listenFlows) MatchConntrackFlow(f *netlink.ConntrackFlow) bool {
	if p := f.Forward.Protocol; p != unix.IPPROTO_UDP && p != unix.IPPROTO_TCP {
		return false
	}
	dst, src := addrPort(f.Forward.DstIP, f.Forward.DstPort), addrPort(f.Forward.SrcIP, f.Forward.SrcPort)
	for _, a := range l {
		if dst == a || src == a {
			return true
		}
	}
	return false
}
