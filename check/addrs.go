package check

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// addrFacts is which links hold which addresses (netlink), or why that is
// not known.
type addrFacts struct {
	Links map[netip.Addr][]string // address -> names of the links holding it
	Err   error
}

// distinctAddrs are the listen addresses without ports, in order.
func distinctAddrs(listen []netip.AddrPort) []netip.Addr {
	var out []netip.Addr
	for _, l := range listen {
		if a := l.Addr().Unmap(); !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// addressResult judges one listen address: the kernel delivers pods'
// queries to a socket bound to it only while it is local, on some link.
// LocalDNS puts it on its own link and deletes that link when it stops;
// dnsstandby's anchor link keeps it local meanwhile.
func addressResult(addr netip.Addr, f addrFacts) Result {
	name := "address " + addr.String()
	switch {
	case f.Err != nil:
		return Result{Name: name, Status: Warn, Found: fmt.Sprintf("cannot list addresses: %v", f.Err),
			Fix: "run dnsstandby check in the node's network namespace"}
	case addr.IsUnspecified():
		return Result{Name: name, Status: Pass, Found: "the wildcard address: local on every link"}
	}
	links := f.Links[addr]
	if len(links) == 0 {
		return Result{Name: name, Status: Fail,
			Found: addr.String() + " is on no link: pods' queries to it are routed away, and nobody answers them",
			Fix:   "start dnsstandby (its anchor link, --anchor-link, holds the address) or localdns.service (it adds the address to its link)"}
	}
	return Result{Name: name, Status: Pass, Found: "local on " + strings.Join(links, ", ")}
}
