package upstream

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"time"

	"github.com/miekg/dns"
)

// exchangeUDP sends q to s from a fresh connected socket and waits for the
// reply until the attempt's deadline.
//
// The fresh socket gets a random source port from the kernel, and being
// connected, the kernel drops datagrams from any other source; q gets a
// random ID. A datagram that does not match (source, ID, question) is
// counted and ignored and the read goes on: a spoofed or late datagram
// must not end the attempt, or spoofing would be a cheap way to make us
// fail over.
func (g *Group) exchangeUDP(ctx context.Context, s *server, m *serverMetrics, q *query, timeout time.Duration) (*dns.Msg, error) {
	deadline, short := attemptDeadline(ctx, timeout)
	c, err := net.DialUDP("udp", nil, s.udpAddr)
	if err != nil {
		return nil, g.ioError(ctx, s, m, protoUDP, fmt.Errorf("dial: %w", err), short)
	}
	defer c.Close()
	c.SetDeadline(deadline)
	defer g.watch(ctx, c)()

	q.setID(uint16(rand.Uint32()))
	m.sent(protoUDP)
	if _, err := c.Write(q.msg); err != nil {
		return nil, g.ioError(ctx, s, m, protoUDP, err, short)
	}
	bp := g.bufs.Get().(*[]byte)
	defer g.bufs.Put(bp)
	buf := *bp
	for {
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			return nil, g.ioError(ctx, s, m, protoUDP, err, short)
		}
		if netip.AddrPortFrom(from.Addr().Unmap(), from.Port()) != s.want {
			m.count(reasonMismatch) // the kernel filters these; checked anyway
			continue
		}
		resp, why, ok := q.accept(buf[:n])
		if !ok {
			m.count(why)
			continue
		}
		return resp, nil
	}
}
