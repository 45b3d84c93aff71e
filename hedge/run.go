package hedge

import (
	"context"
	"net/netip"
	"time"
)

// Deadlines fire in ticks, at most one per Config.Tick. A tick runs where
// a goroutine is awake anyway: the tap's, after each read that emptied
// its queue (Drained), which also means every packet read by then has
// been matched. Drained tells the tap when the next deadline can come at
// the earliest (a query not yet read has a whole cache deadline ahead of
// it), and the tap sleeps until then: a healthy LocalDNS answers within
// a millisecond, so what waits at a read has most of the 50 ms ahead, and
// the tap wakes a few dozen times a second, not once per batch pause.
// Run's own timer is armed by the first query that waits and pushed out
// at each of those reads past the time the tap said it comes back, so it
// fires only when the tap did not — a lone query on a quiet node, a tap
// gone quiet — and then every Tick until it finds the table empty. A
// healthy LocalDNS under load thus costs no wake-up of its own, and an
// idle listener's hedger sleeps.

// drainedGrace is how long past the time a Drained asked to be called
// again Run's timer fires while entries wait: two Ticks, so that the tap,
// whose pause ends then, always comes first.
func (h *Hedger) drainedGrace() time.Duration { return 2 * h.cfg.Tick }

// Run fires deadlines until ctx is done, when the tap has not (see
// Drained). It is the Hedger's one goroutine; the daemon starts one per
// Hedger, once the fast hold has somewhere to go: no deadline fires
// before Run starts or after it returns. onSilent is called from a tick,
// on Run's goroutine or the tap's; it must not block, and may be nil
// (silences are then only counted).
func (h *Hedger) Run(ctx context.Context, onSilent func(unanswered int, since time.Time)) {
	h.tickMu.Lock()
	h.onSilent, h.running = onSilent, true
	h.tickMu.Unlock()
	h.mu.Lock()
	if h.tab.n > 0 {
		h.fallback.Reset(h.cfg.Tick)
		h.armed = true
	}
	h.mu.Unlock()
	defer func() {
		h.tickMu.Lock()
		h.running = false
		h.tickMu.Unlock()
		h.mu.Lock()
		h.fallback.Stop()
		h.armed = false
		h.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.fallback.C:
			h.st.ticks[tickTimer].Add(1)
			h.tickMu.Lock()
			h.tick(h.now(), h.onSilent)
			h.tickMu.Unlock()
			h.mu.Lock()
			if h.armed = h.tab.n > 0; h.armed {
				h.fallback.Reset(h.cfg.Tick)
			}
			h.mu.Unlock()
		}
	}
}

// Drained is the tap's word that it has read every packet queued until
// now (unix ns), but for queries it holds unseen, the first of which
// arrived at unseen (unix ns; 0 if none): the tick is done here, on the
// tap's goroutine, if one is due and Run runs. (A tap behind on its queue
// does not call it: replies still unread would be taken for missing.) It
// returns when the tap should read and call it again (unix ns): the
// earliest time a deadline can come, an unseen query's included.
func (h *Hedger) Drained(now, unseen int64) (next int64) {
	if now-h.lastTick.Load() >= int64(h.cfg.Tick) && h.tickMu.TryLock() {
		// Not when Run's fallback ticks right now.
		if h.running {
			h.st.ticks[tickTap].Add(1)
			h.tick(now, h.onSilent)
		}
		h.tickMu.Unlock()
	}
	// Push Run's timer out past the tap's next read (later: no wake-up),
	// whether or not entries wait now; it fires only once the tap has
	// gone quiet.
	h.mu.Lock()
	defer h.mu.Unlock()
	next = h.nextDeadline(now, unseen)
	if h.armed {
		h.fallback.Reset(time.Duration(next-now) + h.drainedGrace())
	}
	return next
}

// nextDeadline is the earliest time, at or after now, that work may fall
// due: a waiting entry's deadline, a need to judge, a linger to end, or
// the cache deadline of a query not yet seen (one that arrived at unseen,
// if not 0, or one yet to come). Called with h.mu held.
func (h *Hedger) nextDeadline(now, unseen int64) int64 {
	first := now
	if unseen != 0 {
		first = min(first, unseen)
	}
	next := first + h.d1
	head := func(q int, due func(e *entry) int64) {
		if i := h.tab.q[q].head; i >= 0 {
			next = min(next, due(&h.tab.e[i]))
		}
	}
	head(qlCache, func(e *entry) int64 { return e.at + h.d1 })
	head(qlUpstream, func(e *entry) int64 { return e.at + h.d2 })
	head(qlLate, func(e *entry) int64 { return e.at + h.d2 + int64(h.cfg.NeedAfter) })
	head(qlLinger, func(e *entry) int64 { return e.hedgedAt + int64(h.cfg.Linger) })
	if h.proofs.size > 0 {
		next = min(next, h.proofs.buf[h.proofs.head].due)
	}
	return max(next, now)
}

// tick does one round of deadline work at now; h.tickMu is held (tests
// call it alone).
func (h *Hedger) tick(now int64, onSilent func(int, time.Time)) {
	h.lastTick.Store(now)
	h.mu.Lock()
	h.tok.refill(now)
	h.need.refill(now)
	h.judgeNeed(now)
	h.updateDeadlines(now)
	h.expire(now)
	h.mu.Unlock()

	h.fireCache(now)
	h.fireUpstream(now)

	h.mu.Lock()
	n, since, fire := h.silent.check(now, h.cfg.SilentWindow, h.cfg.SilentMin)
	h.mu.Unlock()
	if fire {
		h.st.silent.Add(1)
		h.log.Warn("LocalDNS answered none of the hits it was sent", "unanswered", n, "since", time.Unix(0, since))
		if onSilent != nil {
			onSilent(n, time.Unix(0, since))
		}
	}
}

// expire ends the hedged entries whose Linger has passed.
func (h *Hedger) expire(now int64) {
	q := &h.tab.q[qlLinger]
	for q.head >= 0 {
		i := q.head
		e := &h.tab.e[i]
		if e.hedgedAt+int64(h.cfg.Linger) > now {
			return
		}
		switch {
		case e.resolving && !e.answered:
			h.st.skipped[sNoAnswer].Add(1)
		case e.sent != 0 && !e.answered:
			h.st.outcomes[oNever].Add(1)
		}
		h.tab.remove(i)
	}
}

// fireCache answers, from the cache, the queries past the cache deadline;
// those the cache cannot answer wait for the upstream deadline. The
// lookup and the send run unlocked, on a copy of the query, so the tap is
// never held up behind them.
func (h *Hedger) fireCache(now int64) {
	for {
		h.mu.Lock()
		i := h.tab.q[qlCache].head
		if i < 0 || h.tab.e[i].at+h.d1 > now {
			h.mu.Unlock()
			return
		}
		e := &h.tab.e[i]
		h.tab.unlink(i)
		if h.tok.tokens < 1 {
			h.st.skipped[sRate].Add(1)
			h.tab.remove(i)
			h.mu.Unlock()
			continue
		}
		e.state = stFiring
		gen, client, at := e.gen, e.client, e.at
		qn := copy(h.qbuf[:], h.tab.query(i, int(e.qlen)))
		h.mu.Unlock()

		n, stale := h.ans.Cached(h.dst[:], h.qbuf[:qn])
		n = min(max(n, 0), len(h.dst))
		var sum uint64
		if n > 0 {
			sum = h.sum(h.dst[:n])
		}

		h.mu.Lock()
		if e.gen != gen || e.state != stFiring {
			h.mu.Unlock() // LocalDNS answered while we looked
			continue
		}
		if n == 0 {
			e.state, e.miss = stUpstream, true
			h.tab.push(qlUpstream, i)
			h.mu.Unlock()
			continue
		}
		h.tok.take()
		e.state, e.hit, e.sent, e.hedgedAt = stHedged, true, sum, now
		e.miss = stale // LocalDNS likely forwards it too
		h.tab.push(qlLinger, i)
		h.silent.hit(at)
		h.mu.Unlock()
		if stale {
			h.st.hedges[hStale].Add(1)
		} else {
			h.st.hedges[hCache].Add(1)
		}
		if err := h.ans.Send(client, h.dst[:n]); err != nil {
			h.sendFailed(i, gen)
		}
	}
}

// sendFailed counts a hedge that did not go out; its outcome is not counted.
func (h *Hedger) sendFailed(i int32, gen uint32) {
	h.st.skipped[sSendError].Add(1)
	h.mu.Lock()
	if e := &h.tab.e[i]; e.gen == gen {
		e.sent = 0
	}
	h.mu.Unlock()
}

// fireUpstream hands the misses past the upstream deadline to Resolve,
// while the upstream budget (Config.NeedAfter) lasts; those over it wait
// NeedAfter more (qlLate), and LocalDNS's answer meanwhile ends them.
func (h *Hedger) fireUpstream(now int64) {
	for {
		h.mu.Lock()
		i := h.tab.q[qlUpstream].head
		if i < 0 || h.tab.e[i].at+h.d2 > now {
			h.mu.Unlock()
			break
		}
		e := &h.tab.e[i]
		h.tab.unlink(i)
		if h.need.tokens < 1 {
			e.state = stLate
			h.tab.push(qlLate, i)
			h.st.delayed.Add(1)
			h.mu.Unlock()
			continue
		}
		h.resolve(i, now, true) // unlocks
	}
	for {
		h.mu.Lock()
		i := h.tab.q[qlLate].head
		if i < 0 || h.tab.e[i].at+h.d2+int64(h.cfg.NeedAfter) > now {
			h.mu.Unlock()
			return
		}
		h.tab.unlink(i)
		// Still unanswered NeedAfter past the deadline: LocalDNS holds
		// this miss, which proves the next ones needed.
		h.need.give(2)
		h.st.needed.Add(1)
		h.resolve(i, now, false) // unlocks
	}
}

// resolve hedges entry i (unlinked, h.mu held) from the upstreams, if the
// rate cap lets it, and unlocks h.mu. With judge, the hedge spends one of
// the upstream budget and its need is judged NeedAfter later (judgeNeed).
func (h *Hedger) resolve(i int32, now int64, judge bool) {
	e := &h.tab.e[i]
	if !h.tok.take() {
		h.st.skipped[sRate].Add(1)
		h.tab.remove(i)
		h.mu.Unlock()
		return
	}
	e.state, e.resolving, e.hedgedAt = stHedged, true, now
	h.tab.push(qlLinger, i)
	gen, client := e.gen, e.client
	if judge {
		h.need.take()
		h.proofs.push(proof{i: i, gen: gen, due: now + int64(h.cfg.NeedAfter)})
	}
	qn := copy(h.qbuf[:], h.tab.query(i, int(e.qlen)))
	h.mu.Unlock()
	// One closure per upstream hedge: these are rate-capped misses, off
	// the per-query path.
	h.ans.Resolve(client, h.qbuf[:qn], func(reply []byte) { h.resolved(i, gen, client, reply) })
}

// resolved sends an upstream answer, unless LocalDNS answered first or the
// entry is gone (Linger passed, or retired).
func (h *Hedger) resolved(i int32, gen uint32, client netip.AddrPort, reply []byte) {
	if len(reply) == 0 {
		return
	}
	sum := h.sum(reply)
	h.mu.Lock()
	e := &h.tab.e[i]
	if e.gen != gen || !e.resolving {
		h.mu.Unlock()
		h.st.skipped[sLate].Add(1)
		return
	}
	e.resolving = false
	if e.answered {
		h.tab.remove(i)
		h.mu.Unlock()
		h.st.skipped[sAnswered].Add(1)
		return
	}
	e.sent = sum
	h.mu.Unlock()
	h.st.hedges[hUpstream].Add(1)
	if err := h.ans.Send(client, reply); err != nil {
		h.sendFailed(i, gen)
	}
}

// proofsMax bounds the upstream hedges awaiting their NeedAfter: more
// than Rate × NeedAfter, so none is dropped below the rate cap.
const proofsMax = 1024

// proof is an upstream hedge fired (entry i of generation gen) whose need
// is judged at due.
type proof struct {
	i   int32
	gen uint32
	due int64
}

// proofs is a FIFO of proof, oldest first (due grows with firing time),
// allocated once.
type proofs struct {
	buf        []proof
	head, size int
}

func (q *proofs) init(n int) { q.buf = make([]proof, n) }

// push adds p; a full FIFO drops it (the hedge earns nothing).
func (q *proofs) push(p proof) {
	if q.size == len(q.buf) {
		return
	}
	q.buf[(q.head+q.size)%len(q.buf)] = p
	q.size++
}

// judgeNeed gives two upstream hedges for each one fired that LocalDNS has
// still not answered NeedAfter later (its entry is still the same and not
// answered: LocalDNS holds that miss). Called with h.mu held.
func (h *Hedger) judgeNeed(now int64) {
	for h.proofs.size > 0 {
		p := h.proofs.buf[h.proofs.head]
		if p.due > now {
			return
		}
		h.proofs.head = (h.proofs.head + 1) % len(h.proofs.buf)
		h.proofs.size--
		if e := &h.tab.e[p.i]; e.gen == p.gen && !e.answered {
			h.need.give(2)
			h.st.needed.Add(1)
		}
	}
}

// alive records that LocalDNS sent a reply at at: it ends a silent run
// that began before and re-arms the fast hold.
func (h *Hedger) alive(at int64) {
	h.silent.reply(at)
}

// silence is the fast-hold detector. A run is the hits (queries the cache
// answered at the cache deadline) that arrived after the last LocalDNS
// reply. It trips when MinQueries of them arrived within SilentWindow of
// each other and no reply has been seen for SilentMin since the earliest.
// Only hits count: LocalDNS answers those from its cache, so their silence
// is not a slow forward.
type silence struct {
	lastReply int64
	ring      []int64 // arrival times of the run's last len(ring) hits
	n         int     // hits in the run
	since     int64   // earliest arrival in the run
	fired     bool    // signalled; re-armed by a reply or tracking on
}

func (s *silence) init(min int) { s.ring = make([]int64, min) }

func (s *silence) hit(at int64) {
	if at <= s.lastReply {
		return // LocalDNS has replied since this one arrived
	}
	if s.n == 0 || at < s.since {
		s.since = at
	}
	s.ring[s.n%len(s.ring)] = at
	s.n++
}

// check reports, once per silence, that the run trips at now.
func (s *silence) check(now int64, win, minSilence time.Duration) (n int, since int64, fire bool) {
	k := len(s.ring)
	if s.fired || s.n < k || now-s.since < int64(minSilence) {
		return 0, 0, false
	}
	// The last k hits: the newest and the oldest of them in the ring.
	newest, oldest := s.ring[(s.n-1)%k], s.ring[s.n%k]
	if newest-oldest > int64(win) {
		return 0, 0, false
	}
	s.fired = true
	return s.n, s.since, true
}

func (s *silence) reply(at int64) {
	if at > s.lastReply {
		s.lastReply = at
	}
	if at >= s.since {
		s.n, s.fired = 0, false
	}
}

func (s *silence) rearm() { s.n, s.fired = 0, false }
