package upstream

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"time"

	"github.com/miekg/dns"
)

// exchangeTCP sends q to s over a pooled or fresh TCP connection (RFC 1035
// §4.2.2 framing) and waits for the reply until the attempt's deadline.
// A pooled connection that fails other than by timing out was most likely
// closed by the server while idle; the query is then sent once more, on a
// fresh connection, within the same deadline.
func (g *Group) exchangeTCP(ctx context.Context, s *server, m *serverMetrics, q *query, timeout time.Duration) (*dns.Msg, error) {
	deadline, short := attemptDeadline(ctx, timeout)
	caps := s.caps.Load()
	q.prepare(uint16(rand.Uint32()), caps)
	for retry := false; ; retry = true {
		var c net.Conn
		if !retry {
			c = s.pool.get(time.Now(), g.cfg.ExpireTCP)
		}
		pooled := c != nil
		if c == nil {
			d := net.Dialer{Deadline: deadline}
			var err error
			if c, err = d.DialContext(ctx, "tcp", s.name); err != nil {
				return nil, g.ioError(ctx, s, m, protoTCP, fmt.Errorf("dial: %w", err), short)
			}
		}
		resp, reusable, caseOnly, err := g.roundTrip(ctx, c, m, q, deadline)
		if err == nil {
			if reusable {
				s.pool.put(c, time.Now())
			} else {
				c.Close()
			}
			return resp, nil
		}
		c.Close()
		if pooled && !isTimeout(err) && g.stopped(ctx) == nil {
			m.count(reasonTCPClosed)
			s.pool.flush()
			continue
		}
		return nil, g.caseNotKept(s, caps && caseOnly, g.ioError(ctx, s, m, protoTCP, err, short))
	}
}

// roundTrip writes q on c and reads messages until one matches. reusable
// is false when c may yet have its deadline moved by a wake-up and so
// must not go back to the pool. caseOnly reports that a message came that
// differed from a reply only in the case of the question's name.
func (g *Group) roundTrip(ctx context.Context, c net.Conn, m *serverMetrics, q *query, deadline time.Time) (resp *dns.Msg, reusable, caseOnly bool, err error) {
	c.SetDeadline(deadline)
	stop := g.watch(ctx, c)
	defer func() {
		if !stop() {
			reusable = false
		}
	}()

	m.sent(protoTCP)
	// One write, so that length and message leave in one segment.
	if _, err := c.Write(q.framed); err != nil {
		return nil, false, false, fmt.Errorf("write: %w", err)
	}
	bp := g.bufs.Get().(*[]byte)
	defer g.bufs.Put(bp)
	buf := *bp
	for {
		if _, err := io.ReadFull(c, buf[:2]); err != nil {
			return nil, false, caseOnly, fmt.Errorf("read length: %w", err)
		}
		b := buf[:binary.BigEndian.Uint16(buf)]
		if _, err := io.ReadFull(c, b); err != nil {
			return nil, false, caseOnly, fmt.Errorf("read message: %w", err)
		}
		// On a connection used by one query at a time nothing else should
		// arrive; whatever does is skipped like a stray datagram.
		resp, why, ok := q.accept(b)
		if !ok {
			m.count(why)
			caseOnly = caseOnly || why == reasonCase
			continue
		}
		return resp, true, false, nil
	}
}
