package responder

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// listenConfig returns a ListenConfig whose sockets join a reuseport group
// (so they share LocalDNS's address and port: every member needs
// SO_REUSEPORT and the same effective UID) and may bind before the address
// exists (IP_FREEBIND: LocalDNS's start-up deletes and re-creates it).
func listenConfig(v6 bool) net.ListenConfig {
	return net.ListenConfig{
		Control: func(network, address string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); serr != nil {
					serr = fmt.Errorf("SO_REUSEPORT: %w", serr)
					return
				}
				if v6 {
					serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_FREEBIND, 1)
				} else {
					serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_FREEBIND, 1)
				}
				if serr != nil {
					serr = fmt.Errorf("IP_FREEBIND: %w", serr)
				}
			})
			return errors.Join(err, serr)
		},
	}
}

func network(base string, ap netip.AddrPort) string {
	if ap.Addr().Is4() {
		return base + "4"
	}
	return base + "6"
}

// listenUDP opens one reuseport UDP socket on ap.
func listenUDP(ap netip.AddrPort, rcvbuf int) (*net.UDPConn, error) {
	lc := listenConfig(!ap.Addr().Is4())
	pc, err := lc.ListenPacket(context.Background(), network("udp", ap), ap.String())
	if err != nil {
		return nil, fmt.Errorf("listen udp %s: %w", ap, err)
	}
	conn := pc.(*net.UDPConn)
	setRcvbuf(conn, rcvbuf)
	return conn, nil
}

// setRcvbuf asks for a receive buffer of n bytes, past net.core.rmem_max
// when privileged. A larger queue rides out the burst that arrives when
// LocalDNS dies and its share of traffic lands on us at once; failing to
// get it is not an error.
func setRcvbuf(conn *net.UDPConn, n int) {
	if n <= 0 {
		return
	}
	rc, err := conn.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, n) != nil {
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, n)
		}
	})
}

// listenTCP opens one reuseport TCP listener on ap.
func listenTCP(ap netip.AddrPort) (*net.TCPListener, error) {
	lc := listenConfig(!ap.Addr().Is4())
	// Plain TCP, not Go's default MPTCP (where net.mptcp.enabled=1): a
	// steering program's socket map takes only TCP and UDP sockets.
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(context.Background(), network("tcp", ap), ap.String())
	if err != nil {
		return nil, fmt.Errorf("listen tcp %s: %w", ap, err)
	}
	return ln.(*net.TCPListener), nil
}
