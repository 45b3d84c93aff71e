package corefile

import (
	"errors"
	"net/netip"
	"slices"
)

// Listeners returns the addresses some server block of s serves plain
// DNS on, among known and every address a block's bind names on each port
// that block's keys name; known first, in order. Whether a block serves
// an address is decided as Settings decides it (port, bind and its
// except; no bind is every address). Bind arguments that are interface
// names propose no address. `dnsstandby check` and `run --validate` use
// it to find the listeners of LocalDNS that dnsstandby does not cover.
func (s *Source) Listeners(known []netip.AddrPort) ([]netip.AddrPort, error) {
	candidates := slices.Clone(known)
	add := func(ap netip.AddrPort) {
		if ap.Addr().IsValid() && !ap.Addr().IsUnspecified() && !slices.Contains(candidates, ap) {
			candidates = append(candidates, ap)
		}
	}
	for _, b := range s.Blocks {
		var ports []uint16
		for _, k := range b.Keys {
			// A key parseKey refuses, Settings refuses too.
			if pk, err := parseKey(k); err == nil && pk.port > 0 && pk.port < 1<<16 && !slices.Contains(ports, uint16(pk.port)) {
				ports = append(ports, uint16(pk.port))
			}
		}
		for _, tok := range b.Directives["bind"] {
			ip, err := netip.ParseAddr(tok.Text)
			if err != nil {
				continue // "bind", an interface name, "except", a brace
			}
			for _, p := range ports {
				add(netip.AddrPortFrom(ip.Unmap().WithZone(""), p))
			}
		}
	}
	var out []netip.AddrPort
	for _, c := range candidates {
		_, err := s.Settings([]netip.AddrPort{c})
		switch {
		case errors.Is(err, ErrNoServerBlock):
		case err != nil:
			return nil, err
		default:
			out = append(out, c)
		}
	}
	return out, nil
}

// Covers reports whether a server listening on listen answers queries sent
// to ap: the same address and port, or a wildcard of ap's port, as a bind
// covers (0.0.0.0 every IPv4 address, :: every address).
func Covers(listen []netip.AddrPort, ap netip.AddrPort) bool {
	return slices.ContainsFunc(listen, func(l netip.AddrPort) bool {
		return l.Port() == ap.Port() && bindCovers([]netip.Addr{l.Addr().Unmap()}, ap.Addr())
	})
}
