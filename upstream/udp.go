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

	caps := s.caps.Load()
	q.prepare(uint16(rand.Uint32()), caps)
	m.sent(protoUDP)
	if _, err := c.Write(q.msg); err != nil {
		return nil, g.ioError(ctx, s, m, protoUDP, err, short)
	}
	bp := g.bufs.Get().(*[]byte)
	defer g.bufs.Put(bp)
	buf := *bp
	caseOnly := false // a reply came that differed only in the name's case
	for {
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			return nil, g.caseNotKept(s, caps && caseOnly, g.ioError(ctx, s, m, protoUDP, err, short))
		}
		if netip.AddrPortFrom(from.Addr().Unmap(), from.Port()) != s.want {
			m.count(reasonMismatch) // the kernel filters these; checked anyway
			continue
		}
		resp, why, ok := q.accept(buf[:n])
		if !ok {
			// A reply in the wrong case may be a spoofer's: the read goes
			// on, for the server's own in the case it was asked.
			m.count(why)
			caseOnly = caseOnly || why == reasonCase
			continue
		}
		return resp, nil
	}
}
