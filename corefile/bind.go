package corefile

import (
	"net"
	"net/netip"
	"slices"

	"github.com/coredns/caddy/caddyfile"
)

// interfaceAddrs returns the addresses of the named interface, and false
// when there is no such interface. It is a variable so that tests do not
// depend on the machine's interfaces.
var interfaceAddrs = func(name string) ([]netip.Addr, bool) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return nil, false
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return nil, true
	}
	var out []netip.Addr
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(ipn.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		// CoreDNS gives link-local IPv6 addresses the interface as zone.
		if ip.Is6() && (ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast()) {
			ip = ip.WithZone(name)
		}
		out = append(out, ip)
	}
	return out, true
}

// bind reads every bind directive of a block, as CoreDNS's bind plugin
// does: addresses or interface names, less those in `except`. present is
// false when the block has no bind at all (it listens everywhere). hosts
// are the same addresses as CoreDNS keeps them: an address as written, an
// interface's addresses in their canonical form.
func (p *parser) bind(toks []caddyfile.Token) (addrs []netip.Addr, hosts []string, present bool, err error) {
	if len(toks) == 0 {
		return nil, nil, false, nil
	}
	d := p.directive("bind", toks)
	for {
		ok, err := d.next()
		if err != nil {
			return nil, nil, true, err
		}
		if !ok {
			break
		}
		args := d.RemainingArgs()
		if len(args) == 0 {
			return nil, nil, true, d.errf("at least one address or interface name is expected")
		}
		ips, err := d.bindAddrs(args)
		if err != nil {
			return nil, nil, true, err
		}
		var except []boundAddr
		for d.NextBlock() {
			switch d.Val() {
			case "except":
				ex := d.RemainingArgs()
				if len(ex) == 0 {
					return nil, nil, true, d.errf("at least one address or interface must be given to except subdirective")
				}
				exs, err := d.bindAddrs(ex)
				if err != nil {
					return nil, nil, true, err
				}
				except = append(except, exs...)
			default:
				return nil, nil, true, d.errf("invalid option %q", d.Val())
			}
		}
		for _, ip := range ips {
			if slices.ContainsFunc(except, func(e boundAddr) bool { return e.host == ip.host }) {
				continue
			}
			if !bindable(ip.addr) {
				return nil, nil, true, d.errf("%s is not an address of this node: CoreDNS cannot listen on it", ip.host)
			}
			hosts = append(hosts, ip.host)
			if !slices.Contains(addrs, ip.addr) {
				addrs = append(addrs, ip.addr)
			}
		}
	}
	return addrs, hosts, true, nil
}

// boundAddr is a bind address, and its text as CoreDNS keeps it.
type boundAddr struct {
	addr netip.Addr
	host string
}

// bindAddrs resolves bind arguments as CoreDNS does: an interface name
// gives the interface's addresses, anything else must be an address. An
// address must be one CoreDNS can listen on: see bindable.
func (d *directive) bindAddrs(args []string) ([]boundAddr, error) {
	var out []boundAddr
	for _, a := range args {
		ips, ok := interfaceAddrs(a)
		if ok {
			for _, ip := range ips {
				out = append(out, boundAddr{ip, ip.String()})
			}
			continue
		}
		ip, err := netip.ParseAddr(a)
		if err != nil {
			return nil, d.errf("not a valid IP address or interface name: %q", a)
		}
		out = append(out, boundAddr{ip.Unmap(), a})
	}
	return out, nil
}

// LocalDNSAddrs are the addresses localdns.sh puts on its link before it
// starts CoreDNS: LocalDNS can always listen on them, whether they are on
// this node at the moment or not (its link is deleted when it stops).
var LocalDNSAddrs = []netip.Addr{netip.MustParseAddr("169.254.10.10"), netip.MustParseAddr("169.254.10.11")}

// bindable reports whether CoreDNS, started as LocalDNS starts it, can
// listen on ip: a wildcard, a loopback address (all of 127/8 is local),
// one of LocalDNSAddrs, or an address of one of this node's interfaces.
func bindable(ip netip.Addr) bool {
	ip = ip.Unmap().WithZone("")
	if ip.IsUnspecified() || ip.IsLoopback() || slices.Contains(LocalDNSAddrs, ip) {
		return true
	}
	return slices.Contains(hostAddrs(), ip)
}

// hostAddrs returns the addresses of every interface of this node. It is
// a variable so that tests do not depend on the machine's interfaces.
var hostAddrs = func() []netip.Addr {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, a := range as {
		if ipn, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(ipn.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out
}

// bindCovers reports whether a block bound to bind listens on addr. An
// empty list is no bind: every address. 0.0.0.0 covers every IPv4
// address; :: every address, as Go listens dual-stack on it.
func bindCovers(bind []netip.Addr, addr netip.Addr) bool {
	if len(bind) == 0 {
		return true
	}
	addr = addr.Unmap().WithZone("")
	for _, b := range bind {
		b = b.WithZone("")
		switch {
		case b == addr:
			return true
		case b.IsUnspecified() && b.Is6():
			return true
		case b.IsUnspecified() && b.Is4() && addr.Is4():
			return true
		}
	}
	return false
}
