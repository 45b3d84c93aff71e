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
