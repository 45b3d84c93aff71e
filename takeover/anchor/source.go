package anchor

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// A packet the node itself sends to a local address takes its source from
// that address's local route, which the kernel makes naming the address
// itself: the node's own lookups to 169.254.10.10 leave from
// 169.254.10.10. Delivered on the node, that is fine. But AKS's LocalDNS
// fallback in its nat design (an iptables nat chain in OUTPUT) DNATs them
// to the VNet's DNS server or to kube-dns, the source stays, and a reply
// to a link-local address never comes back: without dnsstandby the
// address is gone with LocalDNS's link and the node's own address is the
// source. So the anchor's own local routes name the node's address toward
// each address's upstream (Config.SourceToward). Where LocalDNS's link
// holds the address too, the kernel uses the route added first; either
// way every packet still reaches the same sockets.

// nodeSource is the source the node uses toward held's SourceToward, or
// the zero Addr when it has none or it is unusable as a source for the
// held addresses.
func (a *Anchor) nodeSource(held netip.Addr) netip.Addr {
	toward, ok := a.cfg.SourceToward[held]
	if !ok {
		return netip.Addr{}
	}
	routes, err := a.nl.RouteGet(toward.AsSlice())
	if err != nil || len(routes) == 0 {
		return netip.Addr{}
	}
	src, ok := netip.AddrFromSlice(routes[0].Src)
	if !ok {
		return netip.Addr{}
	}
	src = src.Unmap()
	if !src.Is4() || src.IsLinkLocalUnicast() || src.IsLoopback() || src.IsUnspecified() || slices.Contains(a.cfg.Addrs, src) {
		return netip.Addr{}
	}
	return src
}

// setSources makes the local route of each held IPv4 address through the
// link (index) name its nodeSource, or the address itself without one: the
// new route is appended before the old one is deleted, so the address is
// never without a local route, and only routes through our link are
// touched (a replace would take the first route of that destination,
// which may be LocalDNS's). Run by reconcile once the addresses are on
// the link; it records the source in use.
func (a *Anchor) setSources(index int) error {
	routes, err := a.nl.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_LOCAL, LinkIndex: index},
		netlink.RT_FILTER_TABLE|netlink.RT_FILTER_OIF)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return fmt.Errorf("anchor link %s: list local routes: %w", a.cfg.Link, err)
	}
	var errs []error
	inUse := map[netip.Addr]netip.Addr{}
	for _, addr := range a.cfg.Addrs {
		if !addr.Is4() {
			continue
		}
		src := a.nodeSource(addr)
		want := src
		if !want.IsValid() {
			want = addr
		}
		have, stale := false, []netlink.Route(nil)
		for _, r := range routes {
			if r.Type != unix.RTN_LOCAL || r.Dst == nil || !r.Dst.IP.Equal(addr.AsSlice()) {
				continue
			}
			if prefsrc, ok := netip.AddrFromSlice(r.Src); ok && prefsrc.Unmap() == want {
				have = true
			} else {
				stale = append(stale, r)
			}
		}
		if !have {
			r := netlink.Route{
				LinkIndex: index, Table: unix.RT_TABLE_LOCAL, Type: unix.RTN_LOCAL,
				Scope: netlink.SCOPE_HOST, Protocol: unix.RTPROT_KERNEL,
				Dst: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(32, 32)}, Src: want.AsSlice(),
			}
			if err := a.nl.RouteAppend(&r); err != nil && !errors.Is(err, unix.EEXIST) {
				errs = append(errs, fmt.Errorf("local route to %s from %s: %w", addr, want, err))
				continue // keep the old route: the address stays usable
			}
		}
		if src.IsValid() {
			inUse[addr] = src
		}
		for _, r := range stale {
			if err := a.nl.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("delete local route to %s from %s: %w", addr, net.IP(r.Src), err))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("anchor link %s: %w", a.cfg.Link, err)
	}
	if was := a.swapSources(inUse); !maps.Equal(was, inUse) {
		a.cfg.Logger.Info("anchor: the node's own packets to the addresses leave from", "link", a.cfg.Link,
			"sources", sourcesText(a.cfg.Addrs, inUse), "was", sourcesText(a.cfg.Addrs, was))
	}
	return nil
}

// sourcesText says, for the log, what source each held IPv4 address's
// packets from the node take: "169.254.10.10 from 10.0.0.4, 169.254.10.11
// from itself".
func sourcesText(addrs []netip.Addr, sources map[netip.Addr]netip.Addr) string {
	var parts []string
	for _, addr := range addrs {
		if !addr.Is4() {
			continue
		}
		from := "itself"
		if src, ok := sources[addr]; ok {
			from = src.String()
		}
		parts = append(parts, addr.String()+" from "+from)
	}
	return strings.Join(parts, ", ")
}
