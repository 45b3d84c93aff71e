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
	resp, _, err := g.udpAttempt(ctx, s, m, q, timeout, time.Time{})
	return resp, err
}

// overdue is a UDP attempt still unanswered at its speculative deadline,
// handed over with its open socket to be waited on in a goroutine of its
// own (see race) while the next attempt starts beside it. Its deadline is
// the attempt's own, as set when it started: moving the wait elsewhere
// changes nothing of how it ends or counts.
type overdue struct {
	s        *server
	q        *query
	c        *net.UDPConn
	bp       *[]byte
	deadline time.Time
	short    bool
	caps     bool
	caseOnly bool
	start    time.Time // when the attempt (ask) began, for the histogram
}

// udpAttempt is exchangeUDP with a speculative deadline, early (zero for
// none): if the server has not answered by then, and the caller is still
// waiting, the attempt is returned as an *overdue, its socket open and
// its deadline restored, instead of waited on here.
func (g *Group) udpAttempt(ctx context.Context, s *server, m *serverMetrics, q *query, timeout time.Duration, early time.Time) (*dns.Msg, *overdue, error) {
	deadline, short := attemptDeadline(ctx, timeout)
	c, err := net.DialUDP("udp", nil, s.udpAddr)
	if err != nil {
		return nil, nil, g.ioError(ctx, s, m, protoUDP, fmt.Errorf("dial: %w", err), short)
	}
	first := deadline
	if !early.IsZero() && early.Before(deadline) {
		first = early
	} else {
		early = time.Time{}
	}
	c.SetDeadline(first)
	stop := g.watch(ctx, c)

	caps := s.caps.Load()
	q.prepare(uint16(rand.Uint32()), caps)
	m.sent(protoUDP)
	if _, err := c.Write(q.msg); err != nil {
		stop()
		c.Close()
		return nil, nil, g.ioError(ctx, s, m, protoUDP, err, short)
	}
	bp := g.bufs.Get().(*[]byte)
	caseOnly := false // a reply came that differed only in the name's case
	resp, err := g.readUDP(c, s, m, q, *bp, &caseOnly)
	stopped := false
	if err != nil && !early.IsZero() && isTimeout(err) && time.Now().Before(deadline) {
		// The speculative deadline, unless a wake-up (the caller's ctx or
		// Close) came first: stop reports that it did not.
		stopped = true
		if stop() && g.stopped(ctx) == nil {
			c.SetDeadline(deadline)
			return nil, &overdue{s: s, q: q, c: c, bp: bp, deadline: deadline, short: short, caps: caps, caseOnly: caseOnly}, nil
		}
	}
	if !stopped {
		stop()
	}
	c.Close()
	g.bufs.Put(bp)
	if err != nil {
		return nil, nil, g.caseNotKept(s, caps && caseOnly, g.ioError(ctx, s, m, protoUDP, err, short))
	}
	return resp, nil, nil
}

// wait goes on with an overdue attempt until it ends, woken early when
// ctx is done or the group closes, as the attempt was before.
func (g *Group) wait(ctx context.Context, o *overdue) (*dns.Msg, error) {
	defer g.bufs.Put(o.bp)
	defer o.c.Close()
	stop := g.watch(ctx, o.c)
	resp, err := g.readUDP(o.c, o.s, &o.s.metrics, o.q, *o.bp, &o.caseOnly)
	stop()
	if err != nil {
		return nil, g.caseNotKept(o.s, o.caps && o.caseOnly, g.ioError(ctx, o.s, &o.s.metrics, protoUDP, err, o.short))
	}
	return resp, nil
}

// readUDP reads datagrams from c until one answers q, or the read fails.
func (g *Group) readUDP(c *net.UDPConn, s *server, m *serverMetrics, q *query, buf []byte, caseOnly *bool) (*dns.Msg, error) {
	for {
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			return nil, err
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
			*caseOnly = *caseOnly || why == reasonCase
			continue
		}
		return resp, nil
	}
}
