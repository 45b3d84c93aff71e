package upstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/miekg/dns"
)

// Exchange sends req to the servers in the order of the Policy and
// returns the first reply, whatever its rcode: a SERVFAIL from kube-dns is
// its answer, not a reason to ask elsewhere. Servers marked down are
// skipped; when every server not marked down has failed, those marked down
// are tried too, in the same order, so that no exchange gives up without
// trying every server — unless FailFast, which never asks a server marked
// down. A timeout or a network error moves on to the next server.
//
// ctx bounds the whole exchange. req is not modified; the reply carries
// req's ID and question. A truncated reply is retried over TCP on the same
// server, and returned only when no server gives a full one. When no
// server answered the error is an *Error; a request that cannot be sent
// (not exactly one question, does not pack) fails before any attempt, and
// so does one over MaxConcurrent (an *Error with Cause ErrLimitExceeded)
// and, with FailFast, one that finds every server marked down (Cause
// ErrNoHealthy).
func (g *Group) Exchange(ctx context.Context, req *dns.Msg) (*dns.Msg, error) {
	if g.closed.Load() {
		return nil, &Error{Cause: ErrClosed}
	}
	if limit := g.cfg.MaxConcurrent; limit > 0 {
		// As CoreDNS forward counts: the exchange over the cap takes a
		// slot for the moment it takes to refuse it.
		n := g.concurrent.Add(1)
		defer g.concurrent.Add(-1)
		if n > int64(limit) {
			g.rejects.Add(1)
			return nil, &Error{Cause: ErrLimitExceeded}
		}
	}
	q, err := newQuery(req)
	if err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}

	// No allocation for up to smallGroup servers (a forward has at most
	// 15 in CoreDNS).
	var (
		orderBuf [smallGroup]int
		triedBuf [smallGroup]bool
		cur      cursor
	)
	if n := len(g.servers); n <= smallGroup {
		cur.order, cur.tried = orderBuf[:n], triedBuf[:n]
	} else {
		cur.order, cur.tried = make([]int, n), make([]bool, n)
	}
	g.order(cur.order)
	var (
		truncated *dns.Msg // the first TC=1 reply, kept as a last resort
		fails     []error
	)
	for {
		s := g.next(&cur)
		if s == nil {
			break
		}
		if err := g.stopped(ctx); err != nil {
			return truncatedOr(truncated, &Error{Failures: fails, Cause: err})
		}
		resp, late, err := g.ask(ctx, s, q, g.speculativeDeadline(s))
		if late != nil {
			// Unanswered at its speculative deadline: the rest of the
			// exchange runs as a race (speculate.go).
			return g.race(ctx, &cur, late, truncated, fails)
		}
		if err == nil {
			return resp, nil
		}
		if resp != nil && truncated == nil {
			truncated = resp
		}
		var f *failure
		if !errors.As(err, &f) {
			return truncatedOr(truncated, &Error{Failures: fails, Cause: err})
		}
		fails = append(fails, err)
	}
	if len(fails) == 0 {
		// Every attempt made either answered, returned, or failed into
		// fails: none was made, which only FailFast with every server
		// marked down leads to. CoreDNS answers SERVFAIL.
		return nil, &Error{Cause: ErrNoHealthy}
	}
	return truncatedOr(truncated, &Error{Failures: fails})
}

// cursor walks an exchange's servers: first those in service, in the
// policy's order, then (unless FailFast) those marked down, in the same
// order.
type cursor struct {
	order []int  // server indexes in the order of the policy
	tried []bool // by server index
	pass  int    // 0: servers in service; 1: the others
	at    int    // next position in order
}

// next returns the server the exchange asks next, marking it tried, or
// nil when none is left.
func (g *Group) next(c *cursor) *server {
	s := g.peek(c)
	if s != nil {
		c.tried[c.order[c.at]] = true
		c.at++
	}
	return s
}

// peek moves c to the server the exchange asks next and returns it,
// without marking it tried; nil when none is left.
func (g *Group) peek(c *cursor) *server {
	for c.pass < 2 {
		if c.pass == 1 && g.cfg.FailFast {
			return nil
		}
		for ; c.at < len(c.order); c.at++ {
			i := c.order[c.at]
			if s := g.servers[i]; !c.tried[i] && (c.pass == 1 || !s.down.Load()) {
				return s
			}
		}
		c.pass, c.at = c.pass+1, 0
	}
	return nil
}

// smallGroup is the most servers an exchange orders without allocating.
const smallGroup = 16

// order fills order, of len(g.servers), with the indexes of the servers
// in the order this exchange asks them, as CoreDNS forward's policies
// list them. It does not allocate.
func (g *Group) order(order []int) {
	for i := range order {
		order[i] = i
	}
	n := len(order)
	if n < 2 {
		return
	}
	switch g.cfg.Policy {
	case PolicyRoundRobin:
		// The counter's next value picks the first server; the others
		// follow in Config order, not rotated (CoreDNS's roundRobin.List).
		k := int(g.robin.Add(1) % uint64(n))
		order[0] = k
		for i := 1; i <= k; i++ {
			order[i] = i - 1
		}
	case PolicyRandom:
		// Fisher–Yates: every order equally likely, as rand.Perm gives
		// CoreDNS, without its allocation.
		for i := n - 1; i > 0; i-- {
			j := rand.IntN(i + 1)
			order[i], order[j] = order[j], order[i]
		}
	}
}

func truncatedOr(truncated *dns.Msg, err error) (*dns.Msg, error) {
	if truncated != nil {
		return truncated, nil
	}
	return nil, err
}

// stopped returns why no new attempt may start, or nil.
func (g *Group) stopped(ctx context.Context) error {
	if g.closed.Load() {
		return ErrClosed
	}
	return ctx.Err()
}

// ask gets a reply from s: over UDP and, if that reply is truncated, over
// TCP; over TCP alone with ForceTCP. When only the TCP retry fails it
// returns the truncated reply with the TCP error. s's health is updated
// here: any reply counts as an answer, and only an attempt that got no
// reply at all counts as a failure (a server whose UDP works but TCP does
// not still serves most queries). A UDP attempt still unanswered at early
// (zero: never) is returned as late, to be waited on beside the next
// attempt (race).
func (g *Group) ask(ctx context.Context, s *server, q *query, early time.Time) (resp *dns.Msg, late *overdue, err error) {
	start := time.Now()
	if g.cfg.ForceTCP {
		resp, err := g.askTCP(ctx, s, q, start, nil)
		return resp, nil, err
	}
	resp, late, err = g.udpAttempt(ctx, s, &s.metrics, q, g.cfg.Timeout, early)
	if late != nil {
		late.start = start
		return nil, late, nil
	}
	resp, err = g.afterUDP(ctx, s, q, start, resp, err)
	return resp, nil, err
}

// afterUDP finishes ask once its UDP attempt has ended with resp or err:
// the retry in the caller's case for a server that does not keep it, the
// health, and the TCP retry of a truncated reply.
func (g *Group) afterUDP(ctx context.Context, s *server, q *query, start time.Time, resp *dns.Msg, err error) (*dns.Msg, error) {
	if f, ok := errors.AsType[*failure](err); ok && f.caseOnly {
		g.answered(s)
		if g.stopped(ctx) == nil {
			resp, err = g.exchangeUDP(ctx, s, &s.metrics, q, g.cfg.Timeout)
		}
	}
	if err != nil {
		g.failed(s, start, err)
		return nil, err
	}
	g.answered(s)
	if !resp.Truncated {
		g.observe(s, time.Since(start))
		return resp, nil
	}
	return g.askTCP(ctx, s, q, start, resp)
}

// askTCP asks s over TCP: the retry of the truncated UDP reply udp, or
// with ForceTCP (udp nil) the only attempt.
func (g *Group) askTCP(ctx context.Context, s *server, q *query, start time.Time, udp *dns.Msg) (*dns.Msg, error) {
	resp, err := g.attempt(ctx, s, q, g.exchangeTCP)
	if err != nil {
		if udp == nil {
			g.failed(s, start, err)
		}
		return udp, err
	}
	g.answered(s)
	g.observe(s, time.Since(start))
	return resp, nil
}

// attempt makes one exchange with s and, if s turned out not to keep the
// case of questions (caseNotKept), a second one at once in the caller's
// case, within what is left of the caller's time: s did answer, and the
// query should not fail over, or fail, for a case it cannot keep.
func (g *Group) attempt(ctx context.Context, s *server, q *query,
	exchange func(context.Context, *server, *serverMetrics, *query, time.Duration) (*dns.Msg, error)) (*dns.Msg, error) {
	resp, err := exchange(ctx, s, &s.metrics, q, g.cfg.Timeout)
	if f, ok := errors.AsType[*failure](err); ok && f.caseOnly {
		g.answered(s)
		if g.stopped(ctx) == nil {
			resp, err = exchange(ctx, s, &s.metrics, q, g.cfg.Timeout)
		}
	}
	return resp, err
}

// caseNotKept turns 0x20 off for s when an attempt in random case (caps)
// saw replies that differed from its question only in the case of the
// name (caseOnly) and none in its own case for the whole of its time (err
// is its timeout). A spoofer's reply in the wrong case cannot do this: the
// server's own reply, in the case asked, would end the attempt first. A
// server that lower-cases, or answers in a case of its own, does it to
// every query; it is asked in the caller's case from then on, and its
// replies taken in any case (as CoreDNS forward takes them), which leaves
// it the ID and the port against spoofing. The server's metric
// dnsstandby_upstream_case_randomized goes to 0, and the change is logged
// once.
func (g *Group) caseNotKept(s *server, caseOnly bool, err error) error {
	f, ok := errors.AsType[*failure](err)
	if !caseOnly || !ok || f.why != reasonTimeout {
		return err
	}
	f.caseOnly = true
	if s.caps.CompareAndSwap(true, false) {
		g.log.Warn("upstream server does not keep the letter case of questions: asking it without 0x20 randomization from now on",
			slog.String("server", s.name))
	}
	return err
}

// attemptDeadline returns when an attempt starting now ends: after the
// attempt's own timeout, or at the caller's deadline if that comes first.
// short reports that the caller's deadline leaves the server less than
// half its timeout: an attempt it ends is not a fair test of the server
// (see ioError).
func attemptDeadline(ctx context.Context, timeout time.Duration) (deadline time.Time, short bool) {
	now := time.Now()
	d := now.Add(timeout)
	if cd, ok := ctx.Deadline(); ok && cd.Before(d) {
		return cd, cd.Sub(now) < timeout/2
	}
	return d, false
}

// aLongTimeAgo is a deadline that makes pending I/O fail at once.
var aLongTimeAgo = time.Unix(1, 0)

// watch makes c's pending and later I/O fail at once when ctx is done or
// the group closes. Call it after setting c's deadline, which would
// otherwise undo the wake-up. The returned stop reports whether c was left
// alone; if not, c's deadline may yet be moved and c must not be pooled.
func (g *Group) watch(ctx context.Context, c net.Conn) (stop func() bool) {
	wake := func() { c.SetDeadline(aLongTimeAgo) }
	stopCaller := context.AfterFunc(ctx, wake)
	stopGroup := context.AfterFunc(g.ctx, wake)
	return func() bool {
		a := stopCaller()
		b := stopGroup()
		return a && b
	}
}

// failure is an attempt that got no reply: it counts against the server
// and the exchange moves on. One with caseOnly got replies, but only in
// another letter case than asked (see caseNotKept).
type failure struct {
	server   string
	proto    proto
	why      reason
	err      error
	caseOnly bool
}

func (f *failure) Error() string {
	if f.caseOnly {
		return fmt.Sprintf("%s over %s: %s: %v (its replies did not keep the letter case of the question)", f.server, f.proto, f.why, f.err)
	}
	return fmt.Sprintf("%s over %s: %s: %v", f.server, f.proto, f.why, f.err)
}

func (f *failure) Unwrap() error { return f.err }

// ioError turns an attempt's I/O error into a *failure, counted in m, or,
// when Close or the caller cut the attempt short, into the error that ends
// the exchange without blaming the server.
//
// A cancelled caller never blames the server. The caller's deadline does
// when it left the server at least half of its Timeout (short false): the
// server was then silent for all the time the query could wait, as long
// as, or nearly as long as, its own Timeout, and that is what a timeout
// means. This is the daemon's case with one upstream, whose Timeout is the
// pipeline's whole deadline (and the last server's when several share it):
// the caller's deadline, set a moment before the attempt's, always fires
// first, and were it not counted a blackholed kube-dns would never be
// marked down. A deadline that leaves less is the caller's choice, not the
// server's fault.
func (g *Group) ioError(ctx context.Context, s *server, m *serverMetrics, p proto, err error, short bool) error {
	timeout := isTimeout(err)
	deadline := errors.Is(ctx.Err(), context.DeadlineExceeded)
	switch {
	case g.closed.Load():
		return ErrClosed
	case errors.Is(ctx.Err(), context.Canceled):
		return ctx.Err()
	case short && (timeout || deadline):
		// A short attempt's deadline is the caller's, and may fire a
		// moment before ctx notices.
		return context.DeadlineExceeded
	}
	why := reasonNetwork
	switch {
	case timeout:
		why = reasonTimeout
	case errors.Is(err, syscall.ECONNREFUSED):
		why = reasonRefused
	case deadline:
		// Ended at the caller's deadline by the dialer or by watch's
		// wake-up, with an error of their own.
		why = reasonTimeout
	}
	m.count(why)
	return &failure{server: s.name, proto: p, why: why, err: err}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Error is returned by Exchange when no server answered.
type Error struct {
	// Failures are the failed attempts, in order: each names the server,
	// the transport and the reason.
	Failures []error
	// Cause is what cut the exchange short or kept it from starting —
	// the caller's ctx.Err(), ErrClosed, ErrLimitExceeded or ErrNoHealthy
	// — or nil when every server it could ask was tried.
	Cause error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("upstream: ")
	switch {
	case e.Cause != nil:
		b.WriteString(e.Cause.Error())
		if len(e.Failures) > 0 {
			b.WriteString(" after ")
		}
	default:
		b.WriteString("no answer: ")
	}
	for i, f := range e.Failures {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(f.Error())
	}
	return b.String()
}

// Unwrap lets errors.Is find the cause (context.DeadlineExceeded,
// context.Canceled, ErrClosed, ErrLimitExceeded, ErrNoHealthy) and the
// failures' socket errors.
func (e *Error) Unwrap() []error {
	out := make([]error, 0, len(e.Failures)+1)
	if e.Cause != nil {
		out = append(out, e.Cause)
	}
	return append(out, e.Failures...)
}
