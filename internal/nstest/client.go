package nstest

import (
	"fmt"
	"net"
	"time"

	"github.com/miekg/dns"
)

// Dial opens a connection from inside the namespace: network is "udp" or
// "tcp" (or a 4/6 variant), laddr a local "ADDR:PORT" to bind or "", raddr
// the peer. The socket stays in the namespace; use it from any goroutine.
func (n *Namespace) Dial(network, laddr, raddr string, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	if laddr != "" {
		var err error
		switch network {
		case "tcp", "tcp4", "tcp6":
			d.LocalAddr, err = net.ResolveTCPAddr(network, laddr)
		default:
			d.LocalAddr, err = net.ResolveUDPAddr(network, laddr)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: dial %s %s: local address: %w", n.name, network, raddr, err)
		}
	}
	var conn net.Conn
	// A literal address dials in the calling goroutine, so the socket is
	// made on Do's thread, inside the namespace.
	err := n.Do(func() error {
		var err error
		conn, err = d.Dial(network, raddr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial %s %s: %w", network, raddr, err)
	}
	return conn, nil
}

// Exchange sends m to server ("ADDR:PORT") from a new socket in the
// namespace (bound to laddr unless it is "") and returns the reply. network
// is "udp" or "tcp". A UDP reply is read into a buffer as large as m's EDNS
// payload size, 512 bytes without EDNS, so truncation shows as it would to
// a real client.
func (n *Namespace) Exchange(network, laddr, server string, m *dns.Msg, timeout time.Duration) (*dns.Msg, error) {
	conn, err := n.Dial(network, laddr, server, timeout)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	c := dns.Client{Net: network, Timeout: timeout}
	r, _, err := c.ExchangeWithConn(m, &dns.Conn{Conn: conn})
	if err != nil {
		return nil, fmt.Errorf("%s: exchange %s %s with %s over %s: %w",
			n.name, m.Question[0].Name, dns.TypeToString[m.Question[0].Qtype], server, network, err)
	}
	return r, nil
}
