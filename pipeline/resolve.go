package pipeline

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/cache"
	"github.com/dnsstandby/dnsstandby/upstream"
	"github.com/dnsstandby/dnsstandby/wire"
)

// flightKey identifies queries one upstream exchange can answer: the cache
// key's fields, and the route whose upstream and cache it uses.
type flightKey struct {
	route         *Route
	name          string // lower case
	qtype, qclass uint16
	do, cd        bool
}

// flight is one upstream resolution and the queries waiting on it.
type flight struct {
	key     flightKey
	req     *dns.Msg  // what goes upstream
	waiters []*waiter // guarded by Pipeline.mu
	// staleServed is set (under Pipeline.mu) once the stale budget ran out
	// and the waiters were answered stale; later joiners get stale at once.
	staleServed bool
}

// waiter is one client query waiting on a flight.
type waiter struct {
	raw    []byte       // the query as received (owned)
	req    *dns.Msg     // raw, parsed
	cache  *cache.Cache // the route's, for stale answers; nil: none
	client netip.Addr
	udp    bool
	reply  func([]byte)
	start  time.Time // when Resolve took the query
}

// Resolve answers a query the cache could not: it joins or starts an
// upstream resolution and replies when that ends, with a stale entry if the
// upstreams fail, or SERVFAIL (REFUSED if the upstream group refused the
// query with upstream.ErrLimitExceeded); a route with Direct answers at
// once. from is the client's address and port. It does not block; reply may be called from
// another goroutine, exactly once, or never if the query is dropped. msg
// must not be modified after the call (pass a copy of a read buffer).
func (p *Pipeline) Resolve(msg []byte, from netip.AddrPort, udp bool, reply func([]byte)) {
	client := from.Addr()
	req := new(dns.Msg)
	w := &waiter{raw: msg, req: req, client: client, udp: udp, reply: reply, start: time.Now()}
	var q wire.Query
	_ = wire.ParseQuery(msg, &q)
	if err := req.Unpack(msg); err != nil || len(req.Question) != 1 {
		// The hot path's parse accepted it, miekg/dns's stricter one did not.
		buf := make([]byte, maxErrorLen)
		p.finish(w, srcError, dns.RcodeFormatError, buf[:writeFormErr(buf, &q)])
		return
	}
	route := p.route(q.QName)
	if route == nil {
		p.replyRcode(w, dns.RcodeRefused)
		return
	}
	if route.Direct != nil {
		// An answer for this client alone: neither shared nor cached.
		out, ok := p.render(&q, req, route.Direct(req, from, !udp), make([]byte, limitFor(&q, udp)))
		p.finishRendered(w, out, ok)
		return
	}
	w.cache = route.Cache
	key := keyOf(route, req)

	p.mu.Lock()
	if p.perClient[client] >= p.cfg.MaxPerClient {
		p.mu.Unlock()
		p.stats.overload[overClient].Add(1)
		p.replyStaleOr(w, dns.RcodeServerFailure)
		return
	}
	f := p.flights[key]
	if f == nil && (len(p.flights) >= p.cfg.MaxInflight || p.closed) {
		p.mu.Unlock()
		p.stats.overload[overGlobal].Add(1)
		p.replyStaleOr(w, dns.RcodeServerFailure)
		return
	}
	if f == nil && p.waiting >= maxWaitingPerFlight*p.cfg.MaxInflight {
		p.mu.Unlock()
		p.stats.overload[overGlobal].Add(1)
		p.replyStaleOr(w, dns.RcodeServerFailure)
		return
	}
	if f != nil && f.staleServed {
		// This flight already gave up waiting in favour of stale data.
		p.mu.Unlock()
		p.replyStaleOr(w, dns.RcodeServerFailure)
		return
	}
	p.perClient[client]++
	p.waiting++
	if f != nil {
		f.waiters = append(f.waiters, w)
		p.mu.Unlock()
		p.stats.coalesced.Add(1)
		return
	}
	f = &flight{key: key, req: upstreamRequest(req, p.cfg.UDPSize), waiters: []*waiter{w}}
	p.flights[key] = f
	p.running++
	p.mu.Unlock()

	// In verify mode a query with a stale entry waits only StaleBudget.
	var budget time.Duration
	if c := route.Cache; c.StaleMode() == cache.StaleVerify && c.Status(&q) == cache.Stale {
		budget = p.cfg.StaleBudget
	}
	go p.fly(f, route.Upstream, budget)
}

// maxWaitingPerFlight bounds queries parked on flights, in units of
// MaxInflight, so memory stays bounded even when every flight is joined by
// many clients.
const maxWaitingPerFlight = 16

// refresh starts a background resolution for msg (an entry served stale
// in immediate mode, or expiring) unless one is running; nobody waits on
// it.
func (p *Pipeline) refresh(msg []byte) {
	req := new(dns.Msg)
	if err := req.Unpack(msg); err != nil || len(req.Question) != 1 {
		return
	}
	var q wire.Query
	_ = wire.ParseQuery(msg, &q)
	route := p.route(q.QName)
	if route == nil || route.Cache == nil {
		return
	}
	key := keyOf(route, req)
	p.mu.Lock()
	if p.flights[key] != nil || len(p.flights) >= p.cfg.MaxInflight || p.closed {
		p.mu.Unlock()
		return
	}
	f := &flight{key: key, req: upstreamRequest(req, p.cfg.UDPSize)}
	p.flights[key] = f
	p.running++
	p.mu.Unlock()
	p.stats.refreshes.Add(1)
	go p.fly(f, route.Upstream, 0)
}

type exchangeResult struct {
	resp *dns.Msg
	err  error
}

// fly runs one flight: the upstream exchange, the stale budget if any, and
// the replies.
func (p *Pipeline) fly(f *flight, up Exchanger, budget time.Duration) {
	defer func() {
		p.mu.Lock()
		p.running--
		p.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.UpstreamTimeout)
	defer cancel()
	done := make(chan exchangeResult, 1)
	start := time.Now()
	go func() {
		resp, err := up.Exchange(ctx, f.req)
		done <- exchangeResult{resp, err}
	}()

	var budgetC <-chan time.Time
	if budget > 0 {
		t := time.NewTimer(budget)
		defer t.Stop()
		budgetC = t.C
	}
	var res exchangeResult
	for waiting := true; waiting; {
		select {
		case res = <-done:
			waiting = false
		case <-budgetC:
			budgetC = nil
			p.mu.Lock()
			f.staleServed = true
			ws := f.waiters
			f.waiters = nil
			p.mu.Unlock()
			for _, w := range ws {
				p.replyStaleOr(w, dns.RcodeServerFailure)
				p.release(w)
			}
		}
	}
	p.stats.observeUpstream(time.Since(start), res.err)

	ok := res.err == nil && res.resp != nil
	if ok {
		p.insert(f, res.resp)
	}
	// A failed resolution is answered stale when it can be, else as
	// LocalDNS answers it: SERVFAIL, or REFUSED when the upstream group
	// refused the query for its max_concurrent (CoreDNS forward answers
	// ErrLimitExceeded with REFUSED).
	failRcode := dns.RcodeServerFailure
	if errors.Is(res.err, upstream.ErrLimitExceeded) {
		failRcode = dns.RcodeRefused
	}
	p.mu.Lock()
	delete(p.flights, f.key)
	ws := f.waiters
	f.waiters = nil
	p.mu.Unlock()
	for _, w := range ws {
		if ok {
			p.replyUpstream(w, res.resp)
		} else {
			p.replyStaleOr(w, failRcode)
		}
		p.release(w)
	}
}

// insert caches an upstream reply under the key it was asked for. The
// reply's CD bit and DO bit are set from the request, so that an upstream
// that does not echo them cannot file an answer under another key.
func (p *Pipeline) insert(f *flight, resp *dns.Msg) {
	m := *resp
	m.CheckingDisabled = f.key.cd
	m.Extra = withoutOPT(resp.Extra)
	if f.key.do {
		opt := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
		opt.SetDo()
		m.Extra = append(m.Extra, opt)
	}
	// Not cacheable (SERVFAIL, truncated...) is normal; the reply still goes out.
	_ = f.key.route.Cache.InsertMsg(&m)
}

// release ends w's claim on the caps.
func (p *Pipeline) release(w *waiter) {
	p.mu.Lock()
	p.waiting--
	if n := p.perClient[w.client] - 1; n > 0 {
		p.perClient[w.client] = n
	} else {
		delete(p.perClient, w.client)
	}
	p.mu.Unlock()
}

// keyOf returns the flight key of a parsed query on route r.
func keyOf(r *Route, req *dns.Msg) flightKey {
	q := req.Question[0]
	k := flightKey{route: r, name: strings.ToLower(q.Name), qtype: q.Qtype, qclass: q.Qclass, cd: req.CheckingDisabled}
	if opt := req.IsEdns0(); opt != nil {
		k.do = opt.Do()
	}
	return k
}

// upstreamRequest is the query sent upstream for a client's req: same
// question (0x20 case kept, as CoreDNS's forward does), RD and CD, and an
// OPT of our own carrying the client's DO bit. The client's other EDNS
// options (cookies, NSID, padding) are between it and us.
func upstreamRequest(req *dns.Msg, udpSize uint16) *dns.Msg {
	up := new(dns.Msg)
	up.Id = dns.Id()
	up.Opcode = dns.OpcodeQuery
	up.RecursionDesired = req.RecursionDesired
	up.CheckingDisabled = req.CheckingDisabled
	up.Question = []dns.Question{req.Question[0]}
	do := false
	if opt := req.IsEdns0(); opt != nil {
		do = opt.Do()
	}
	up.SetEdns0(udpSize, do)
	return up
}

func withoutOPT(rrs []dns.RR) []dns.RR {
	out := make([]dns.RR, 0, len(rrs))
	for _, rr := range rrs {
		if rr.Header().Rrtype != dns.TypeOPT {
			out = append(out, rr)
		}
	}
	return out
}
