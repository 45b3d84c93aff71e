package upstream

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/internal/latency"
)

// Speculative attempts. CoreDNS's forward waits out its 2 s read timeout
// on a server that silently drops before it asks the next; so does this
// group, attempt by attempt. But it need not wait idle: a UDP attempt
// unanswered at its server's speculative deadline (SpeculativeMult × the
// server's p99, clamped) has the exchange's next attempt started beside
// it, and the first reply wins. The next attempt is the next server of
// the exchange's order, whatever the Policy, or, in a group of one
// server, the same server again from a fresh socket: a new 5-tuple, on
// which kube-proxy picks a kube-dns backend again. Only servers in
// service get them (but a group's only server always): those marked down
// are asked only when every attempt has failed, as before. Each attempt's
// failure counts for its server's health as any attempt's does. The
// attempt left waiting keeps its own deadline and counts for health as
// before, so a silent server is still marked down after MaxFails timeouts
// and probed; only the caller stops waiting on it.
//
// Caps: a speculative attempt is extra load only when the attempt it
// runs beside answers too. Those, counted as they prove extra, are held
// to SpeculativeShare of the queries sent over SpeculativeWindow (or
// speculativeExtraFloor, if more); every
// speculative attempt takes a token from a bucket (SpeculativeRate a
// second, SpeculativeBurst). A speculative attempt against a silent
// server replaces the one its timeout would have started 2 s later, so
// only the rate bounds those. An attempt not started for a cap is counted
// as skipped.

// maxSpeculative is how many speculative attempts one exchange may start.
// Against a ClusterIP with a dead backend, each attempt from a fresh
// socket draws it again with kube-proxy's odds: with one of two dead (two
// replicas, kube-dns's usual count) five attempts leave one exchange in
// 32 to wait out the timeout, one of three dead one in 243; with two
// attempts, the lab's pods' group saw 3 of about 40 exchanges fail that
// way. All are started within a few speculative deadlines; the caps bound
// what they add.
const maxSpeculative = 4

// speculativeExtraFloor is how many proved-extra attempts the share cap
// allows over its window whatever the share: dnsstandby's own groups ask
// little while LocalDNS is healthy (its hedges only), and 1% of a few
// hundred queries is a few, so one slow reply proved extra would stop
// speculation for a whole window — just when a hold sends every miss
// through the group and a dead kube-dns backend takes a third of them
// (seen in the lab: 20 pod queries lost in a 4.6 s hold). A handful of
// extra queries loads no server.
const speculativeExtraFloor = 5

// specReason is why a speculative attempt went where it did.
type specReason uint8

const (
	specNextServer  specReason = iota // the next server of the exchange's order
	specFreshSocket                   // the only server, from a new socket
	numSpecReasons
)

func (r specReason) String() string {
	if r == specFreshSocket {
		return "fresh_socket"
	}
	return "next_server"
}

// specResult is what became of a speculative attempt.
type specResult uint8

const (
	specWon  specResult = iota // its reply was the exchange's
	specLost                   // another attempt's was, or none came
	numSpecResults
)

func (r specResult) String() string {
	if r == specLost {
		return "lost"
	}
	return "won"
}

// specSkip is the cap that kept a speculative attempt from starting.
type specSkip uint8

const (
	skipShare specSkip = iota
	skipRate
	numSpecSkips
)

func (r specSkip) String() string {
	if r == skipRate {
		return "rate"
	}
	return "share"
}

// serverLatency is a server's reply time over SpeculativeWindow and the
// speculative deadline read from it.
type serverLatency struct {
	after atomic.Int64 // the speculative deadline, ns after an attempt starts
	floor int64        // SpeculativeMin, ns

	mu     sync.Mutex // guards following
	win    latency.Window
	readAt int64 // when after was last computed, unix ns
}

func (l *serverLatency) init(cfg Config) {
	l.win.Init(cfg.SpeculativeWindow)
	l.after.Store(int64(cfg.SpeculativeMin))
	l.floor = int64(cfg.SpeculativeMin)
}

// recomputeEvery bounds how often a server's p99 is read from its window:
// the read walks 128 counters, and the p99 of a 10 s window does not move
// faster.
const recomputeEvery = int64(50 * time.Millisecond)

// observe records an accepted reply's latency: in the histogram, and in
// the window the server's speculative deadline comes from.
func (g *Group) observe(s *server, d time.Duration) {
	s.metrics.observe(d)
	now := time.Now().UnixNano()
	l := &s.lat
	l.mu.Lock()
	l.win.Add(now, int64(d))
	if now-l.readAt >= recomputeEvery {
		l.readAt = now
		p99 := float64(l.win.Quantile(now, 0.99)) * g.cfg.SpeculativeMult
		l.after.Store(int64(min(max(p99, float64(g.cfg.SpeculativeMin)), float64(g.cfg.SpeculativeMax))))
	}
	l.mu.Unlock()
}

// speculativeAfter is how long an attempt on s waits alone: the deadline
// read from its p99, or the floor while an attempt on it has gone overdue
// with no reply from it since. A server gone silent then costs the first
// query one deadline and the next ones the floor, until it is marked down;
// one that is only slow replies soon and has its deadline back.
func (s *server) speculativeAfter() time.Duration {
	if s.lastOverdue.Load() > s.lastReply.Load() {
		return time.Duration(s.lat.floor)
	}
	return time.Duration(s.lat.after.Load())
}

// speculativeDeadline returns when an attempt on s starting now is
// overdue, or zero when the group does not speculate.
func (g *Group) speculativeDeadline(s *server) time.Time {
	if !g.spec.on {
		return time.Time{}
	}
	return time.Now().Add(s.speculativeAfter())
}

// specState is the group's speculative caps and counters.
type specState struct {
	on    bool // SpeculativeRate > 0 and not ForceTCP
	share float64

	extra   atomic.Uint64 // speculative attempts proved extra, ever
	started [numSpecReasons][numSpecResults]atomic.Uint64
	skipped [numSpecSkips]atomic.Uint64

	mu sync.Mutex // guards following
	// The share's window: counts since base[0], taken when the clock
	// entered the previous half of SpeculativeWindow (or earlier, if no
	// speculation was asked for then), so they cover half a window to
	// a whole one, or more after a quiet spell.
	half  int64
	epoch int64
	base  [2]struct{ sent, extra uint64 }
	// The rate's token bucket.
	rate, burst, tokens float64
	last                int64
}

func (p *specState) init(cfg Config) {
	p.on = cfg.SpeculativeRate > 0 && !cfg.ForceTCP
	p.share = cfg.SpeculativeShare
	p.half = max(int64(cfg.SpeculativeWindow/2), 1)
	p.rate, p.burst = cfg.SpeculativeRate, float64(cfg.SpeculativeBurst)
	p.tokens = p.burst
}

// allow takes a speculative attempt's place under the caps at now, or
// counts it skipped.
func (g *Group) allow(now int64) bool {
	p := &g.spec
	sent := g.sent()
	extra := p.extra.Load()
	p.mu.Lock()
	defer p.mu.Unlock()
	if ep := now / p.half; ep != p.epoch {
		p.base[0] = p.base[1]
		p.base[1].sent, p.base[1].extra = sent, extra
		p.epoch = ep
	}
	if float64(extra-p.base[0].extra) >= p.share*float64(sent-p.base[0].sent)+speculativeExtraFloor {
		p.skipped[skipShare].Add(1)
		return false
	}
	if p.last != 0 && now > p.last {
		p.tokens = min(p.burst, p.tokens+float64(now-p.last)/1e9*p.rate)
	}
	p.last = max(p.last, now)
	if p.tokens < 1 {
		p.skipped[skipRate].Add(1)
		return false
	}
	p.tokens--
	return true
}

// sent is the queries sent to every server, ever.
func (g *Group) sent() uint64 {
	var n uint64
	for _, s := range g.servers {
		for p := range numProtos {
			n += s.metrics.requests[p].Load()
		}
	}
	return n
}

// lane is one attempt of a race.
type lane struct {
	spec   bool
	reason specReason
}

// laneResult is how a lane's attempt ended.
type laneResult struct {
	lane int
	resp *dns.Msg
	err  error
}

// raceState is what a race's lanes share; it outlives the race's Exchange
// while lanes still wait.
type raceState struct {
	results chan laneResult // room for every lane: a lane never blocks
	ctx     context.Context // the lanes': the caller's deadline, cancelled only if the caller gives up first
	cancel  context.CancelFunc

	mu      sync.Mutex // guards following
	running int        // lanes not yet ended, and race itself until it returns; the last cancels ctx
	replies int        // lanes that got a reply
}

// leave is race's end: ctx is cancelled once no lane runs either.
func (r *raceState) leave() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.running--
	if r.running == 0 {
		r.cancel()
	}
}

// raceContext is the lanes' context: the caller's deadline and values,
// but not its cancellation, which comes after Exchange returns and must
// not cut short an attempt left waiting (it would not count for health).
func raceContext(ctx context.Context) (context.Context, context.CancelFunc) {
	base := context.WithoutCancel(ctx)
	if d, ok := ctx.Deadline(); ok {
		return context.WithDeadline(base, d)
	}
	return context.WithCancel(base)
}

// race finishes an exchange whose attempt first is overdue: first goes on
// waiting in a goroutine of its own, a speculative attempt starts beside
// it if the caps allow, and so on at each newest attempt's speculative
// deadline; when every attempt in flight has failed, the next server of
// the order is asked as before. The first reply wins. Attempts still
// waiting when Exchange returns run on to their own end, owned by the
// group (Close wakes them and waits for them).
func (g *Group) race(ctx context.Context, cur *cursor, first *overdue, truncated *dns.Msg, fails []error) (*dns.Msg, error) {
	r := &raceState{results: make(chan laneResult, len(g.servers)+maxSpeculative), running: 1}
	r.ctx, r.cancel = raceContext(ctx)
	defer r.leave()
	lanes := make([]lane, 0, len(g.servers)+maxSpeculative)
	winner := -1
	defer func() {
		for i, l := range lanes {
			if !l.spec {
				continue
			}
			res := specLost
			if i == winner {
				res = specWon
			}
			g.spec.started[l.reason][res].Add(1)
		}
	}()
	closed := func() (*dns.Msg, error) {
		return truncatedOr(truncated, &Error{Failures: fails, Cause: ErrClosed})
	}

	q := first.q
	q.detach() // first's attempt is not waiting on it until its lane starts
	lanes = append(lanes, lane{})
	if !g.startLane(r, 0, first.s, nil, first) {
		return closed()
	}
	inflight, specs := 1, 0
	newest, since := first.s, first.start
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		// The newest attempt's speculative deadline.
		if specs < maxSpeculative {
			if wait := time.Until(since.Add(newest.speculativeAfter())); wait > 0 {
				timer.Reset(wait)
			} else {
				newest.lastOverdue.Store(time.Now().UnixNano())
				s, reason, ok := g.speculative(cur, specs)
				if ok {
					lanes = append(lanes, lane{spec: true, reason: reason})
					if !g.startLane(r, len(lanes)-1, s, q.clone(), nil) {
						return closed()
					}
					inflight, specs = inflight+1, specs+1
					newest, since = s, time.Now()
					continue
				}
				specs = maxSpeculative // no candidate, or capped: no more
			}
		}
		select {
		case res := <-r.results:
			inflight--
			if res.err == nil {
				winner = res.lane
				return res.resp, nil
			}
			if res.resp != nil && truncated == nil {
				truncated = res.resp
			}
			if f, ok := errors.AsType[*failure](res.err); ok {
				fails = append(fails, f)
			} else if inflight == 0 {
				return truncatedOr(truncated, &Error{Failures: fails, Cause: res.err})
			}
			if inflight > 0 {
				continue
			}
			// Every attempt in flight failed: on to the next server, as
			// without speculation.
			s := g.next(cur)
			if s == nil {
				if len(fails) == 0 {
					return nil, &Error{Cause: ErrNoHealthy}
				}
				return truncatedOr(truncated, &Error{Failures: fails})
			}
			lanes = append(lanes, lane{})
			if !g.startLane(r, len(lanes)-1, s, q.clone(), nil) {
				return closed()
			}
			inflight++
			newest, since = s, time.Now()
		case <-timer.C:
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				r.cancel() // the attempts are not held against their servers
			}
			return truncatedOr(truncated, &Error{Failures: fails, Cause: ctx.Err()})
		case <-g.ctx.Done():
			return closed()
		}
	}
}

// speculative picks where the exchange's next speculative attempt goes,
// and takes its place under the caps: in a group of one server, that
// server again; otherwise the next server in service of the order.
func (g *Group) speculative(cur *cursor, specs int) (*server, specReason, bool) {
	if specs >= maxSpeculative {
		return nil, 0, false
	}
	if len(g.servers) == 1 {
		// Even while it is marked down: it is asked anyway, having no
		// other, and two lost flows in a row mark a ClusterIP with one
		// dead backend in three down whenever the group asks little
		// (one in nine pairs), while a fresh socket reaches a live one
		// two times in three. One silent on every socket loses the
		// extra packets too; one overloaded answers both, which the
		// share caps.
		return g.servers[0], specFreshSocket, g.allow(time.Now().UnixNano())
	}
	if g.peek(cur) == nil || cur.pass != 0 {
		return nil, 0, false // none left in service
	}
	if !g.allow(time.Now().UnixNano()) {
		return nil, 0, false
	}
	return g.next(cur), specNextServer, true
}

// startLane runs one attempt of race r in a goroutine the group owns: on
// s with q, or, with o, the overdue attempt's wait and the rest of it.
// It reports false, having closed o, when the group is closing.
func (g *Group) startLane(r *raceState, i int, s *server, q *query, o *overdue) bool {
	r.mu.Lock()
	r.running++
	r.mu.Unlock()
	g.mu.Lock()
	ok := g.goLocked(func() {
		var resp *dns.Msg
		var err error
		if o != nil {
			resp, err = g.wait(r.ctx, o)
			resp, err = g.afterUDP(r.ctx, o.s, o.q, o.start, resp, err)
		} else {
			resp, _, err = g.ask(r.ctx, s, q, time.Time{})
		}
		r.end(g, resp != nil)
		r.results <- laneResult{lane: i, resp: resp, err: err}
	})
	g.mu.Unlock()
	if !ok {
		if o != nil {
			o.c.Close()
			g.bufs.Put(o.bp)
		}
		r.end(g, false)
	}
	return ok
}

// end records that a lane ended, with a reply or not. A second reply in
// one race proves a speculative attempt extra: it counts against the
// share.
func (r *raceState) end(g *Group, replied bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if replied {
		r.replies++
		if r.replies > 1 {
			g.spec.extra.Add(1)
		}
	}
	r.running--
	if r.running == 0 {
		r.cancel()
	}
}
