// Package sockname turns a socket's local address (getsockname) into a
// netip.AddrPort, for the parts of takeover that check sockets: peer (a
// socket duplicated from LocalDNS) and steer (a socket to adopt).
package sockname

import (
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// Of returns the local address the socket fd is bound to. An IPv4-mapped
// IPv6 address is returned as it is, not unmapped: a socket bound to one
// is a different member of a reuseport group than one bound to the IPv4
// address.
func Of(fd int) (netip.AddrPort, error) {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("getsockname: %w", err)
	}
	return FromSockaddr(sa)
}

// FromSockaddr converts an IPv4 or IPv6 socket address.
func FromSockaddr(sa unix.Sockaddr) (netip.AddrPort, error) {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port)), nil
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), uint16(sa.Port)), nil
	}
	return netip.AddrPort{}, fmt.Errorf("not an IPv4 or IPv6 socket (%T)", sa)
}
