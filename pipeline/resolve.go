package pipeline

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"
	"unsafe"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/cache"
	"github.com/dnsstandby/dnsstandby/upstream"
	"github.com/dnsstandby/dnsstandby/wire"
)

// flightKey identifies queries one upstream exchange can answer: the cache
// key's fields, and the route whose upstream and cache it uses.
type flightKey struct {
	route         *Route
	name          string // wire format, lower case
	qtype, qclass uint16
	do, cd        bool
}

// clientKey is whom MaxPerClient counts: a source address, over UDP and
// over TCP apart (see Config.MaxPerClient).
type clientKey struct {
	addr netip.Addr
	tcp  bool
}

// zoneKey is what MaxPerZone counts: a fetch zone of a route.
type zoneKey struct {
	route *Route
	zone  string // fetchZone's: a suffix of the flight key's name
}

// flight is one upstream resolution and the queries waiting on it.
type flight struct {
	key     flightKey
	zone    zoneKey
	req     *dns.Msg  // what goes upstream
	waiters []*waiter // guarded by Pipeline.mu
	// staleServed is set (under Pipeline.mu) once the stale budget ran out
	// and the waiters were answered stale; later joiners get stale at once.
	staleServed bool
}

// waiter is one client query waiting on a flight. It keeps what the
// answer needs — ID, flags, the question and the EDNS facts, in q — and
// nothing else: neither the query's bytes nor a parsed message, which a
// client could pad to make each waiting query cost us far more than it
// cost to send.
type waiter struct {
	q      wire.Query   // QName is the waiter's own copy; no other slice is set
	cache  *cache.Cache // the route's, for stale answers; nil: none
	client netip.Addr
	udp    bool
	reply  func([]byte)
	start  time.Time // when Resolve took the query
}

// waiterCost is what one waiting query is counted as against
// MaxWaitingBytes: the waiter, its question name, and the reply function
// and the closure behind it (the responder's are under 64 bytes).
func waiterCost(w *waiter) int {
	return int(unsafe.Sizeof(waiter{})) + len(w.q.QName) + 64
}

// newWaiter returns a waiter for q, the query parsed from a buffer the
// caller reuses: only the question name is copied out of it.
func newWaiter(q *wire.Query, client netip.Addr, udp bool, reply func([]byte)) *waiter {
	w := &waiter{q: *q, client: client, udp: udp, reply: reply, start: time.Now()}
	w.q.QName = append([]byte(nil), q.QName...)
	w.q.QEnd = 0 // an offset into the buffer, which the waiter does not keep
	return w
}

// clip returns the part of msg a query is read from: over UDP the first
// wire.MaxQueryLen bytes, all LocalDNS reads of a datagram, so that a
// longer one gets the answer LocalDNS gives it (FORMERR, unless what fits
// is a whole query); over TCP all of msg, or ok false if it is longer
// than any query (the responder closes such a connection before reading
// it).
func clip(msg []byte, udp bool) (_ []byte, ok bool) {
	if len(msg) <= wire.MaxQueryLen {
		return msg, true
	}
	if udp {
		return msg[:wire.MaxQueryLen], true
	}
	return nil, false
}

// Resolve answers a query the cache could not: it joins or starts an
// upstream resolution and replies when that ends, with a stale entry if the
// upstreams fail, or SERVFAIL (REFUSED if the upstream group refused the
// query with upstream.ErrLimitExceeded); a route with Direct answers at
// once. from is the client's address and port. It does not block; reply
// may be called from another goroutine, exactly once, or never if the
// query is dropped, and must not keep the slice it is given after it
// returns. msg is read during the call only: the caller may reuse it at
// once.
func (p *Pipeline) Resolve(msg []byte, from netip.AddrPort, udp bool, reply func([]byte)) {
	msg, ok := clip(msg, udp)
	if !ok {
		return
	}
	client := from.Addr()
	var q wire.Query
	err := wire.ParseQuery(msg, &q)
	w := newWaiter(&q, client, udp, reply)
	switch {
	case errors.Is(err, wire.ErrShort):
		return
	case err != nil:
		p.replyBuilt(w, srcError, dns.RcodeFormatError, writeFormErr)
		return
	case q.Stray > 0:
		// Worker.Answer refuses these before they get here; Resolve
		// refuses them too rather than parse them below.
		p.replyBuilt(w, srcError, dns.RcodeFormatError, writeStray)
		return
	}
	// miekg/dns's parse is stricter than the hot path's (it reads the
	// OPT's options, for one): what it refuses, CoreDNS answers FORMERR.
	// msg holds no more than a question, an OPT and a TSIG in at most
	// 512 bytes here, so the parsed message is small, and it is dropped
	// before the query waits.
	req := new(dns.Msg)
	if err := req.Unpack(msg); err != nil || len(req.Question) != 1 {
		p.replyBuilt(w, srcError, dns.RcodeFormatError, writeFormErr)
		return
	}
	route := p.route(q.QName)
	if route == nil {
		p.replyRcode(w, dns.RcodeRefused)
		return
	}
	if route.Direct != nil {
		// An answer for this client alone: neither shared nor cached.
		buf := getBuf()
		defer putBuf(buf)
		out, ok := p.render(&w.q, route.Direct(req, from, !udp), (*buf)[:limitFor(&w.q, udp)])
		p.finishRendered(w, out, ok)
		return
	}
	w.cache = route.Cache
	key := keyOf(route, &q)
	ck := clientKey{client, !udp}
	cost := waiterCost(w)

	p.mu.Lock()
	if p.perClient[ck] >= p.cfg.MaxPerClient {
		p.mu.Unlock()
		p.stats.overload[overClient].Add(1)
		if udp {
			// The address may be forged: a client that is who it says
			// asks again over TCP.
			p.replyStaleOrTC(w)
		} else {
			p.replyStaleOr(w, dns.RcodeServerFailure)
		}
		return
	}
	f := p.flights[key]
	var zone zoneKey
	var status cache.Status
	if f == nil {
		// Only a new flight needs these: a query joining one, as most do
		// in a flood of one name, costs nothing more. status says whether
		// pods asked for the name before: a forger's random names are
		// never in the cache.
		zone = zoneKey{route, fetchZone(key.name, len(route.wireZone))}
		status = route.Cache.Status(&q)
		over := -1
		switch {
		case p.closed || len(p.flights) >= p.inflightCap(status != cache.Miss):
			over = overGlobal
		case p.perZone[zone] >= p.cfg.MaxPerZone:
			over = overZone
		}
		if over >= 0 {
			p.mu.Unlock()
			p.stats.overload[over].Add(1)
			p.replyStaleOr(w, dns.RcodeServerFailure)
			return
		}
	}
	if p.waiting >= maxWaitingPerFlight*p.cfg.MaxInflight || p.waitingBytes+cost > p.cfg.MaxWaitingBytes {
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
	p.perClient[ck]++
	p.waiting++
	p.waitingBytes += cost
	if f != nil {
		f.waiters = append(f.waiters, w)
		p.mu.Unlock()
		p.stats.coalesced.Add(1)
		return
	}
	f = &flight{key: key, zone: zone, req: upstreamRequest(req.Question[0], &q, p.cfg.UDPSize), waiters: []*waiter{w}}
	p.startLocked(f)
	p.mu.Unlock()

	// In verify mode a query with a stale entry waits only StaleBudget.
	var budget time.Duration
	if route.Cache.StaleMode() == cache.StaleVerify && status == cache.Stale {
		budget = p.cfg.StaleBudget
	}
	go p.fly(f, route.Upstream, budget)
}

// knownShare: names the cache does not know may hold no more than this
// part of MaxInflight, in quarters.
const knownShare = 3

// inflightCap is how many flights may be running for a new one to start:
// MaxInflight for a name the cache knows, three quarters of it (at least
// one) for one it does not.
func (p *Pipeline) inflightCap(known bool) int {
	if known {
		return p.cfg.MaxInflight
	}
	return max(1, p.cfg.MaxInflight*knownShare/4)
}

// startLocked registers f as running; p.mu is held.
func (p *Pipeline) startLocked(f *flight) {
	p.flights[f.key] = f
	p.perZone[f.zone]++
	p.running++
}

// endLocked unregisters f, whose exchange is over: it no longer counts
// against the caps, and a query for its key starts a new one; p.mu is
// held.
func (p *Pipeline) endLocked(f *flight) {
	delete(p.flights, f.key)
	if n := p.perZone[f.zone] - 1; n > 0 {
		p.perZone[f.zone] = n
	} else {
		delete(p.perZone, f.zone)
	}
}

// maxWaitingPerFlight bounds queries parked on flights, in units of
// MaxInflight, so that their number stays bounded even when every flight
// is joined by many clients; MaxWaitingBytes bounds their memory.
const maxWaitingPerFlight = 16

// refresh starts a background resolution for q on route r (an entry
// served stale in immediate mode, or expiring) unless one is running;
// nobody waits on it.
func (p *Pipeline) refresh(q *wire.Query, r *Route) {
	key := keyOf(r, q)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.flights[key] != nil || p.closed {
		return
	}
	// The name is in the cache: a known name's cap, and its zone's.
	zone := zoneKey{r, fetchZone(key.name, len(r.wireZone))}
	if len(p.flights) >= p.inflightCap(true) || p.perZone[zone] >= p.cfg.MaxPerZone {
		return
	}
	qn, err := question(q)
	if err != nil {
		return
	}
	f := &flight{key: key, zone: zone, req: upstreamRequest(qn, q, p.cfg.UDPSize)}
	p.startLocked(f)
	p.stats.refreshes.Add(1)
	go p.fly(f, r.Upstream, 0)
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
		case <-ctx.Done():
			// An Exchanger honours its context, and returns at once; the
			// waiters do not depend on it: the timeout and Drain's
			// cancellation hold whatever the exchange does.
			res, waiting = exchangeResult{err: ctx.Err()}, false
		case <-budgetC:
			budgetC = nil
			p.mu.Lock()
			f.staleServed = true
			ws := f.waiters
			f.waiters = nil
			p.mu.Unlock()
			for _, w := range udpFirst(ws) {
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
	p.endLocked(f)
	ws := f.waiters
	f.waiters = nil
	p.mu.Unlock()
	for _, w := range udpFirst(ws) {
		if ok {
			p.replyUpstream(w, res.resp)
		} else {
			p.replyStaleOr(w, failRcode)
		}
		p.release(w)
	}
}

// udpFirst orders a flight's waiters, which it owns, UDP first: a UDP
// answer is one datagram sent at once, while a TCP answer is copied into
// its connection's queue (the responder never lets a reply wait on a
// client reading, but the UDP clients need not wait for the copies).
func udpFirst(ws []*waiter) []*waiter {
	slices.SortStableFunc(ws, func(a, b *waiter) int {
		switch {
		case a.udp == b.udp:
			return 0
		case a.udp:
			return -1
		}
		return 1
	})
	return ws
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
	p.waitingBytes -= waiterCost(w)
	ck := clientKey{w.client, !w.udp}
	if n := p.perClient[ck] - 1; n > 0 {
		p.perClient[ck] = n
	} else {
		delete(p.perClient, ck)
	}
	p.mu.Unlock()
}

// keyOf returns the flight key of the query q on route r.
func keyOf(r *Route, q *wire.Query) flightKey {
	var lower [wire.MaxNameLen]byte
	n := wire.LowerName(lower[:], q.QName)
	return flightKey{route: r, name: string(lower[:n]), qtype: q.QType, qclass: q.QClass,
		do: q.EDNS && q.DO, cd: q.Flags&wire.FlagCD != 0}
}

// question is q's question as miekg/dns has it, the client's 0x20 case
// kept.
func question(q *wire.Query) (dns.Question, error) {
	name, _, err := dns.UnpackDomainName(q.QName, 0)
	if err != nil {
		return dns.Question{}, fmt.Errorf("question name: %w", err)
	}
	return dns.Question{Name: name, Qtype: q.QType, Qclass: q.QClass}, nil
}

// upstreamRequest is the query sent upstream for a client's query q,
// whose question is qn: same question (0x20 case kept, as CoreDNS's
// forward does), RD and CD, and an OPT of our own carrying the client's DO
// bit. The client's other EDNS options (cookies, NSID, padding) are
// between it and us.
func upstreamRequest(qn dns.Question, q *wire.Query, udpSize uint16) *dns.Msg {
	up := new(dns.Msg)
	up.Id = dns.Id()
	up.Opcode = dns.OpcodeQuery
	up.RecursionDesired = q.Flags&wire.FlagRD != 0
	up.CheckingDisabled = q.Flags&wire.FlagCD != 0
	up.Question = []dns.Question{qn}
	up.SetEdns0(udpSize, q.EDNS && q.DO)
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
