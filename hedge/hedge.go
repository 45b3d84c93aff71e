// Package hedge answers the UDP queries LocalDNS leaves unanswered. The
// packet tap hands it every query that arrives on a listen address and
// every reply LocalDNS sends from it; the Hedger matches them, and when a
// query is still unanswered at its deadline it answers from dnsstandby's
// own socket on the same address: from the cache at the cache deadline,
// else from the upstreams at the later upstream deadline. The client takes
// the first matching reply and ignores the second. It also signals a "fast
// hold" when LocalDNS answers none of what it is sent, so the daemon can
// move traffic away within a couple hundred milliseconds instead of
// waiting for its probes.
//
// It owns the matching table (fixed size, allocated once), the adaptive
// deadlines, the hedge rate cap and the fast-hold detector. It does not own
// the sockets, the cache or the upstreams: those are the Answerer's.
package hedge

import (
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dnsstandby/dnsstandby/internal/latency"
	"github.com/dnsstandby/dnsstandby/wire"
)

// Answerer is what the daemon gives the Hedger: its cache pipeline and its
// UDP socket on the listen address. Cached, Resolve and Send are called
// from Run's goroutine, Fresh from the tap's (Reply).
type Answerer interface {
	// Cached writes into dst (at least 4096 bytes) an answer to query from
	// dnsstandby's cache, fresh or stale; 0 when the cache has none.
	Cached(dst, query []byte) (n int, stale bool)
	// Fresh reports whether the cache holds a fresh answer to query,
	// counting and refreshing nothing.
	Fresh(query []byte) bool
	// Resolve answers query from the upstreams in the background and
	// calls send with the reply once (never if there is none). It must not
	// block, and must copy query: it is only valid during the call.
	Resolve(client netip.AddrPort, query []byte, send func(reply []byte))
	// Send writes reply to client from dnsstandby's UDP socket on the
	// listen address.
	Send(client netip.AddrPort, reply []byte) error
}

// Config says how the Hedger hedges. Start from DefaultConfig.
type Config struct {
	// Table is how many queries are tracked at once, 16 to 1<<20. Each
	// slot holds the query's bytes (up to 512), so 8192 costs about 4.5 MiB.
	Table int

	// The cache deadline is CacheMult × LocalDNS's p99 reply latency,
	// clamped to [CacheMin, CacheMax]; the upstream deadline likewise, and
	// never below the cache deadline.
	CacheMult                float64
	CacheMin, CacheMax       time.Duration
	UpstreamMult             float64
	UpstreamMin, UpstreamMax time.Duration
	// Window is how far back the latency quantile looks (kept in two
	// halves, so it covers Window/2 to Window).
	Window time.Duration

	// Linger is how long a hedged query is kept to learn whether LocalDNS
	// answers it later or never, and to recognise our own hedge when the
	// tap sees it go out.
	Linger time.Duration

	// Rate and Burst cap the hedges sent (cache and upstream alike) with a
	// token bucket, so an outage or a flood of forged queries cannot make
	// dnsstandby a reflector.
	Rate  float64 // per second
	Burst int

	// Upstream hedges must prove needed to keep coming. A miss LocalDNS
	// answers past the upstream deadline is usually only slow (a busy
	// node, a slow upstream), and asking for it again adds to the
	// upstreams' load for a few milliseconds gained; a miss LocalDNS holds
	// on a silent upstream server is answered a second or more after
	// ours. So an upstream hedge is needed when LocalDNS has still not
	// answered NeedAfter after it fired; each needed one earns two more.
	// Otherwise upstream hedges are limited to UpstreamBurst at once,
	// refilled at UpstreamRefill a second, and one over the budget waits
	// NeedAfter more: still unanswered then, it is needed (and sent).
	NeedAfter      time.Duration
	UpstreamBurst  int
	UpstreamRefill float64 // per second

	// MinQueries hits past their cache deadline, all within SilentWindow
	// of each other and with no LocalDNS reply seen since the earliest
	// arrived, make a fast hold: Run's onSilent is called once.
	MinQueries   int
	SilentWindow time.Duration
	// SilentMin is how long the silence must have lasted: longer than
	// the stall of a CPU-throttled LocalDNS (a CFS period is 100 ms),
	// which hedging covers without moving traffic.
	SilentMin time.Duration
	// Tick is how often deadlines fire while queries wait: after the
	// tap's reads (Drained), or from Run when the tap is quiet.
	Tick time.Duration

	// Logger receives events (fast hold); never one line per query. Nil
	// discards.
	Logger *slog.Logger
}

// DefaultConfig returns the settings the daemon uses.
func DefaultConfig() Config {
	return Config{
		Table: 8192,
		// LocalDNS answers a hit in about a millisecond; 50 ms is far out
		// in its tail, past the stalls of a busy node's scheduler (the lab
		// hedged 0.16% of a healthy LocalDNS's queries at 25 ms), yet far
		// under a client's 1 s (musl) or 5 s (glibc) retry. 150 ms keeps a
		// dropped query's answer under 200 ms.
		CacheMult: 4, CacheMin: 50 * time.Millisecond, CacheMax: 150 * time.Millisecond,
		// Misses are LocalDNS's slow path (it forwards them too); hedging
		// them early would double the upstreams' load, so the wait is 8 ×
		// LocalDNS's p99, within bounds. 200 ms at the most: a miss LocalDNS
		// holds on a silent upstream server (CoreDNS waits its 2 s read
		// timeout) is then answered in at most 200 ms + the upstream
		// group's speculative deadline (50 ms on a server that was fast)
		// + a round trip, a p99 under 300 ms (TestSilentUpstream; 300–500
		// ms gave 580 ms). What it costs: a miss slower than the wait is
		// asked twice; on a node whose internet answers 2% of misses in
		// 200–400 ms that is about 1% more upstream queries.
		UpstreamMult: 8, UpstreamMin: 150 * time.Millisecond, UpstreamMax: 200 * time.Millisecond,
		Window: 10 * time.Second,
		Linger: 2 * time.Second,
		Rate:   2000,
		Burst:  2000,
		// A slow miss of a busy LocalDNS comes within a few hundred ms of
		// the hedge; one held on a silent server about 1.8 s after
		// (CoreDNS's 2 s read timeout less our deadline). 250 ms past the
		// upstream deadline (at most 200 ms) keeps a delayed hedge's
		// answer under 600 ms. The burst covers the first moments of a
		// silent server's misses at full speed; the refill, a slow node's
		// tail: 0.2 a second is 12 a minute, under 1% of a node's
		// upstream queries at 25 misses a second.
		NeedAfter:      250 * time.Millisecond,
		UpstreamBurst:  40,
		UpstreamRefill: 0.2,
		MinQueries:     8,
		// At fewer than MinQueries hits a second, the probes detect an
		// outage; the fast hold is for busy nodes.
		SilentWindow: time.Second,
		// Past a CFS throttling stall (a 100 ms period) and the stalls of
		// a CPU-starved node (the lab saw LocalDNS silent 150 ms while
		// warming its cache on two busy CPUs): hedging covers those, and
		// a hold would take LocalDNS's traffic for its whole hold-down.
		SilentMin: 250 * time.Millisecond,
		Tick:      5 * time.Millisecond,
	}
}

// Validate checks c; errors name the field.
func (c *Config) Validate() error {
	durRange := func(name string, d, lo, hi time.Duration) error {
		if d < lo || d > hi {
			return fmt.Errorf("hedge: %s must be %v to %v, got %v", name, lo, hi, d)
		}
		return nil
	}
	mult := func(name string, m float64) error {
		if !(m >= 1 && m <= 1000) {
			return fmt.Errorf("hedge: %s must be 1 to 1000, got %v", name, m)
		}
		return nil
	}
	var errs []error
	if c.Table < 16 || c.Table > 1<<20 {
		errs = append(errs, fmt.Errorf("hedge: Table must be 16 to %d, got %d", 1<<20, c.Table))
	}
	errs = append(errs,
		mult("CacheMult", c.CacheMult),
		mult("UpstreamMult", c.UpstreamMult),
		durRange("CacheMin", c.CacheMin, time.Millisecond, time.Minute),
		durRange("CacheMax", c.CacheMax, c.CacheMin, time.Minute),
		durRange("UpstreamMin", c.UpstreamMin, time.Millisecond, time.Minute),
		durRange("UpstreamMax", c.UpstreamMax, c.UpstreamMin, time.Minute),
		durRange("Window", c.Window, 100*time.Millisecond, time.Hour),
		durRange("Linger", c.Linger, 10*time.Millisecond, time.Minute),
		durRange("SilentWindow", c.SilentWindow, time.Millisecond, time.Minute),
		durRange("SilentMin", c.SilentMin, 0, time.Minute),
		durRange("Tick", c.Tick, 100*time.Microsecond, time.Second),
	)
	if !(c.Rate > 0 && c.Rate <= 1e7) {
		errs = append(errs, fmt.Errorf("hedge: Rate must be above 0 and at most 1e7, got %v", c.Rate))
	}
	if c.Burst < 1 || c.Burst > 1e7 {
		errs = append(errs, fmt.Errorf("hedge: Burst must be 1 to 1e7, got %d", c.Burst))
	}
	if err := durRange("NeedAfter", c.NeedAfter, time.Millisecond, c.Linger); err != nil {
		errs = append(errs, err)
	}
	if c.UpstreamBurst < 1 || c.UpstreamBurst > 1e7 {
		errs = append(errs, fmt.Errorf("hedge: UpstreamBurst must be 1 to 1e7, got %d", c.UpstreamBurst))
	}
	if !(c.UpstreamRefill > 0 && c.UpstreamRefill <= 1e7) {
		errs = append(errs, fmt.Errorf("hedge: UpstreamRefill must be above 0 and at most 1e7, got %v", c.UpstreamRefill))
	}
	if c.MinQueries < 1 || c.MinQueries > 1024 {
		errs = append(errs, fmt.Errorf("hedge: MinQueries must be 1 to 1024, got %d", c.MinQueries))
	}
	return errors.Join(errs...)
}

// Hedger matches one listen address's queries and replies and hedges the
// unanswered ones. Query, Reply and Drained are called from the tap's
// goroutine, Run from its own; SetTracking, Stats, Deadlines and Collect
// from any.
type Hedger struct {
	cfg  Config
	ans  Answerer
	log  *slog.Logger
	now  func() int64 // unix ns; tests replace it
	seed maphash.Seed

	mu   sync.Mutex
	tab  table
	hitW latency.Window // latency of queries not known to be cache misses: sets the cache deadline
	allW latency.Window // every matched reply's latency: sets the upstream deadline
	d1   int64          // cache deadline, ns
	d2   int64          // upstream deadline, ns
	tok  bucket
	// need is the upstream hedges' budget (Config.NeedAfter); proofs are
	// the upstream hedges sent, oldest first, whose need is judged at due.
	need   bucket
	proofs proofs
	track  struct {
		on bool
		at int64 // when on last changed: queries are judged by the state at their arrival
	}
	silent silence
	armed  bool // fallback is set

	// classifyAbove is CacheMin/CacheMult: slower replies are looked up
	// to tell hits from misses (classify).
	classifyAbove int64

	// tickMu makes ticks one at a time, on Run's goroutine or the tap's
	// (Drained); it guards the following and qbuf, dst.
	tickMu   sync.Mutex
	running  bool                                  // Run runs: deadlines may fire
	onSilent func(unanswered int, since time.Time) // Run's
	qbuf     [wire.MaxQueryLen]byte
	dst      [4096]byte
	// lastTick is when the last tick ran (unix ns); fallback is Run's
	// timer, armed (h.armed, under h.mu) from the first query that waits
	// until it fires on an empty table.
	lastTick atomic.Int64
	fallback *time.Timer
	// The tap's goroutine only.
	tapQ [wire.MaxQueryLen]byte

	st   counters
	hist prometheus.Histogram
}

// New returns a Hedger for one listen address, tracking on.
func New(cfg Config, ans Answerer) (*Hedger, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if ans == nil {
		return nil, errors.New("hedge: nil Answerer")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := &Hedger{
		cfg:  cfg,
		ans:  ans,
		log:  log.With("component", "hedge"),
		now:  func() int64 { return time.Now().UnixNano() },
		seed: maphash.MakeSeed(),
		hist: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dnsstandby_localdns_reply_duration_seconds",
			Help:    "LocalDNS's reply latency as seen on the wire: from the query's arrival to its reply's departure.",
			Buckets: prometheus.ExponentialBuckets(0.00025, 2, 15), // 0.25 ms to 4 s
		}),
	}
	h.fallback = time.NewTimer(time.Hour)
	h.fallback.Stop()
	h.classifyAbove = int64(float64(cfg.CacheMin) / cfg.CacheMult)
	h.tab.init(cfg.Table)
	h.hitW.Init(cfg.Window)
	h.allW.Init(cfg.Window)
	h.silent.init(cfg.MinQueries)
	h.track.on = true
	h.st.tracking.Store(true)
	h.tok = bucket{rate: cfg.Rate, burst: float64(cfg.Burst), tokens: float64(cfg.Burst)}
	h.need = bucket{rate: cfg.UpstreamRefill, burst: float64(cfg.UpstreamBurst), tokens: float64(cfg.UpstreamBurst)}
	h.proofs.init(proofsMax)
	h.updateDeadlines(h.now())
	return h, nil
}

// SetTracking switches tracking of new queries. Queries whose arrival
// time is before the switch are judged by the state before it, because the
// tap hands them over a few milliseconds late. Entries already tracked are
// hedged and matched either way. Switching on re-arms the fast hold.
func (h *Hedger) SetTracking(on bool) {
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.track.on == on {
		return
	}
	h.track.on, h.track.at = on, now
	h.st.tracking.Store(on)
	if on {
		h.silent.rearm()
	}
}

// tracking reports whether a query that arrived at at is tracked.
func (h *Hedger) tracking(at int64) bool {
	if at >= h.track.at {
		return h.track.on
	}
	return !h.track.on
}

// Deadlines returns the current cache and upstream deadlines.
func (h *Hedger) Deadlines() (cache, upstream time.Duration) {
	return time.Duration(h.st.d1.Load()), time.Duration(h.st.d2.Load())
}

// Query takes a query that arrived at at (unix ns) from client. msg is
// only read during the call.
func (h *Hedger) Query(at int64, client netip.AddrPort, msg []byte) {
	if len(msg) > wire.MaxQueryLen {
		h.st.queries[qTooLong].Add(1)
		return
	}
	qend, ok := parseQuestion(msg, false)
	if !ok {
		h.st.queries[qMalformed].Add(1)
		return
	}
	id := uint16(msg[0])<<8 | uint16(msg[1])
	key := h.keyHash(client, id, msg[wire.HeaderLen:qend])

	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.tracking(at) {
		h.st.queries[qUntracked].Add(1)
		return
	}
	if i := h.tab.find(key, client, id, msg[wire.HeaderLen:qend]); i >= 0 {
		e := &h.tab.e[i]
		if e.state != stHedged {
			// A retransmission of a query still waiting: keep the first
			// arrival, which is what the client's clock counts from.
			h.st.queries[qDuplicate].Add(1)
			return
		}
		// The same query again after a hedge: start over.
		h.retire(i)
	}
	i := h.tab.alloc()
	if i < 0 {
		// Full: make room by retiring the oldest hedged entry, whose
		// outcome is the least needed; waiting ones are never dropped.
		if old := h.tab.q[qlLinger].head; old >= 0 {
			h.retire(old)
			i = h.tab.alloc()
		}
		if i < 0 {
			h.st.queries[qTableFull].Add(1)
			return
		}
	}
	e := &h.tab.e[i]
	e.at, e.client, e.id, e.key = at, client, id, key
	e.qlen, e.qend = uint16(len(msg)), uint16(qend)
	copy(h.tab.query(i, len(msg)), msg)
	e.state = stCache
	h.tab.insert(i)
	h.tab.pushByArrival(qlCache, i)
	h.st.queries[qTracked].Add(1)
	if !h.armed {
		// Run ticks unless the tap does first. Armed once, not each time
		// the table goes from empty to one (per query on a healthy node):
		// a timer moved earlier can cost the runtime a wake-up.
		h.fallback.Reset(h.drainedGrace())
		h.armed = true
	}
}

// Reply takes a reply sent to client at at. own reports that it is one of
// the Hedger's own hedges seen leaving: the tap must not take it as
// LocalDNS's.
func (h *Hedger) Reply(at int64, client netip.AddrPort, msg []byte) (own bool) {
	qend, ok := parseQuestion(msg, true)
	if !ok {
		h.mu.Lock()
		h.alive(at)
		h.mu.Unlock()
		h.st.replies[rMalformed].Add(1)
		return false
	}
	id := uint16(msg[0])<<8 | uint16(msg[1])
	key := h.keyHash(client, id, msg[wire.HeaderLen:qend])

	h.mu.Lock()
	i := h.tab.find(key, client, id, msg[wire.HeaderLen:qend])
	if i < 0 {
		h.alive(at)
		h.mu.Unlock()
		h.st.replies[rUnknown].Add(1)
		return false
	}
	e := &h.tab.e[i]
	if e.state == stHedged && e.sent != 0 && !e.ownSeen && h.sum(msg) == e.sent {
		e.ownSeen = true
		if e.answered {
			h.tab.remove(i)
		}
		h.mu.Unlock()
		h.st.replies[rOwn].Add(1)
		return true
	}
	h.alive(at)
	if e.answered {
		h.mu.Unlock()
		h.st.replies[rRepeat].Add(1) // LocalDNS answered twice, or a copy
		return false
	}
	h.st.replies[rMatched].Add(1)
	lat := at - e.at
	if e.state != stHedged {
		// In time: nothing to hedge. Whether it was a hit decides which
		// deadline its latency sets; a fast reply is one either way.
		if e.miss || lat <= h.classifyAbove {
			h.latency(at, lat, e.miss)
			h.tab.remove(i)
			h.mu.Unlock()
			return false
		}
		qn := copy(h.tapQ[:], h.tab.query(i, int(e.qlen)))
		h.tab.remove(i)
		h.mu.Unlock()
		h.classify(at, lat, h.tapQ[:qn])
		return false
	}
	h.latency(at, lat, e.miss)
	e.answered = true
	if e.sent != 0 {
		h.st.outcomes[oLater].Add(1)
	}
	// Keep it while our own echo may still come, or an upstream answer
	// is due (it will not be sent now).
	if e.ownSeen || (e.sent == 0 && !e.resolving) {
		h.tab.remove(i)
	}
	h.mu.Unlock()
	return false
}

// Answered takes a reply sent to client at at whose query, which
// arrived at queryAt, the tap matched to it itself (in the kernel) and
// never showed: LocalDNS answered a query nobody tracked, and Answered
// does for it what Query and Reply together would, bar the work of
// matching: the count of a tracked and matched query, and LocalDNS's
// latency. A tracked query this reply also answers (its retransmission,
// shown on its own) is settled as Reply settles it. msg is only read
// during the call; own is always false, since the kernel matches only
// LocalDNS's own replies.
func (h *Hedger) Answered(queryAt, at int64, client netip.AddrPort, msg []byte) (own bool) {
	h.mu.Lock()
	if h.tab.n > 0 && h.tracks(client, msg) {
		// Rare standing by: the tap shows a query only once LocalDNS is
		// slow with it.
		h.mu.Unlock()
		return h.Reply(at, client, msg)
	}
	h.alive(at)
	if !h.tracking(queryAt) {
		h.mu.Unlock()
		h.st.queries[qUntracked].Add(1)
		return false
	}
	h.st.queries[qTracked].Add(1)
	h.st.replies[rMatched].Add(1)
	lat := at - queryAt
	if lat <= h.classifyAbove {
		h.latency(at, lat, false)
		h.mu.Unlock()
		return false
	}
	h.mu.Unlock()
	qend, ok := parseQuestion(msg, true)
	if !ok {
		return false
	}
	// The query as it asked: the reply's header and question, QR clear,
	// no records.
	qn := copy(h.tapQ[:], msg[:qend])
	h.tapQ[2] &^= 0x80
	clear(h.tapQ[6:wire.HeaderLen])
	h.classify(at, lat, h.tapQ[:qn])
	return false
}

// tracks reports whether a tracked query is the one reply msg to client
// answers; the caller holds mu.
func (h *Hedger) tracks(client netip.AddrPort, msg []byte) bool {
	qend, ok := parseQuestion(msg, true)
	if !ok {
		return false
	}
	id := uint16(msg[0])<<8 | uint16(msg[1])
	return h.tab.find(h.keyHash(client, id, msg[wire.HeaderLen:qend]), client, id, msg[wire.HeaderLen:qend]) >= 0
}

// classify records a slow reply's latency as a hit's or a miss's by asking
// the cache, which mirrors LocalDNS's: a fresh answer there means LocalDNS
// had one too (the tap inserts this reply only after Reply returns). Only
// the hits' latency sets the cache deadline; a few percent of misses,
// which LocalDNS forwards, would otherwise make its p99 theirs. Replies
// faster than classifyAbove cannot lift the cache deadline above CacheMin
// and are not looked up, so this costs a lookup for the few slow replies.
func (h *Hedger) classify(at, lat int64, query []byte) {
	hit := h.ans.Fresh(query)
	h.mu.Lock()
	h.latency(at, lat, !hit)
	h.mu.Unlock()
}

// latency records one of LocalDNS's reply latencies, d, seen at at.
func (h *Hedger) latency(at, d int64, miss bool) {
	if d < 0 {
		d = 0
	}
	h.hist.Observe(float64(d) / 1e9)
	if !miss {
		h.hitW.Add(at, d)
	}
	h.allW.Add(at, d)
}

// retire removes a hedged entry before its outcome is known.
func (h *Hedger) retire(i int32) {
	e := &h.tab.e[i]
	if e.sent != 0 && !e.answered {
		h.st.outcomes[oUnknown].Add(1)
	}
	h.tab.remove(i)
}

// keyHash hashes what identifies a query: client, ID and question bytes.
func (h *Hedger) keyHash(client netip.AddrPort, id uint16, question []byte) uint64 {
	var b [16 + 2 + 2 + wire.MaxNameLen + 4]byte
	a := client.Addr().As16()
	copy(b[:], a[:])
	p := client.Port()
	b[16], b[17], b[18], b[19] = byte(p>>8), byte(p), byte(id>>8), byte(id)
	n := 20 + copy(b[20:], question)
	return maphash.Bytes(h.seed, b[:n])
}

// sum is the hash a hedge is recognised by; never 0, which means none.
func (h *Hedger) sum(msg []byte) uint64 {
	s := maphash.Bytes(h.seed, msg)
	if s == 0 {
		s = 1
	}
	return s
}

// clamp bounds mult × q to [lo, hi].
func clamp(q int64, mult float64, lo, hi time.Duration) int64 {
	d := float64(q) * mult
	if d > math.MaxInt64/2 {
		d = math.MaxInt64 / 2
	}
	return min(max(int64(d), int64(lo)), int64(hi))
}

// updateDeadlines recomputes both deadlines from the latency windows.
// With no samples the p99 is 0 and the minimums apply; with fewer than 100
// the p99 is the largest sample, which errs long.
func (h *Hedger) updateDeadlines(now int64) {
	c := h.cfg
	h.d1 = clamp(h.hitW.Quantile(now, 0.99), c.CacheMult, c.CacheMin, c.CacheMax)
	h.d2 = max(clamp(h.allW.Quantile(now, 0.99), c.UpstreamMult, c.UpstreamMin, c.UpstreamMax), h.d1)
	h.st.d1.Store(h.d1)
	h.st.d2.Store(h.d2)
}

// bucket is the hedges' token bucket.
type bucket struct {
	rate, burst, tokens float64
	last                int64
}

func (b *bucket) refill(now int64) {
	if b.last != 0 && now > b.last {
		b.tokens = min(b.burst, b.tokens+float64(now-b.last)/1e9*b.rate)
	}
	if now > b.last {
		b.last = now
	}
}

// give adds n tokens, up to the burst.
func (b *bucket) give(n float64) { b.tokens = min(b.burst, b.tokens+n) }

// take spends one token if there is one.
func (b *bucket) take() bool {
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
