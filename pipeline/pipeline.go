// Package pipeline decides how each query is answered: from the cache when
// it can (the hot path, no allocation), else from an upstream, else from a
// stale cache entry, else SERVFAIL — or REFUSED when the upstream group
// refused the query for being over its MaxConcurrent, as LocalDNS's forward
// does over max_concurrent.
//
// Data flows one way: listeners (package responder) → pipeline → cache and
// upstreams. The pipeline owns the miss path: coalescing of identical
// in-flight queries, the per-client and global caps on upstream work, the
// serve-stale policy (RFC 8767, `verify` or `immediate` as in CoreDNS),
// refresh-ahead, and what goes into the cache. It never touches sockets —
// the responder hands it bytes and a way to reply — and knows nothing of
// takeover: whether dnsstandby is serving at all is decided elsewhere, and
// takeover never reaches into this package, the responder, the cache or
// the upstreams.
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/cache"
	"github.com/dnsstandby/dnsstandby/wire"
)

// Exchanger sends a query upstream and returns the reply. upstream.Group
// implements it.
type Exchanger interface {
	Exchange(ctx context.Context, req *dns.Msg) (*dns.Msg, error)
}

// Route sends queries for names under Zone to Upstream, or answers them
// with Direct. Its Cache is the zone's: answers learned through one route
// are never served for another, as each of CoreDNS's server blocks has a
// cache of its own.
type Route struct {
	Zone     string // fully qualified, e.g. "." or "cluster.local."
	Upstream Exchanger
	// Cache holds the zone's answers and says how stale ones are used
	// (cache.Config.StaleMode). Required unless Direct is set.
	Cache *cache.Cache
	// Direct, if set, answers instead of Upstream, for one client: the
	// answer depends on who asks (whoami), so it is neither shared with
	// other clients asking the same nor cached. It must not block.
	Direct func(req *dns.Msg, client netip.AddrPort, tcp bool) *dns.Msg

	wireZone []byte // Zone in wire format, lower case; set by sortRoutes
}

// Config configures a Pipeline. Start from DefaultConfig and set
// Routes.
type Config struct {
	Routes []Route // at least one

	// StaleBudget is how long, in a route whose cache is in verify mode, a
	// query with a stale entry waits for upstreams before the stale answer
	// goes out. Must be positive.
	StaleBudget time.Duration
	// UpstreamTimeout bounds one upstream resolution; a query with nothing
	// stale to fall back on gets SERVFAIL when it runs out. Must be
	// positive.
	UpstreamTimeout time.Duration

	// MaxInflight caps concurrent upstream resolutions. A name the cache
	// knows (an entry, stale or expiring: a name pods asked before) may
	// start one up to the cap; a name it does not know, only up to three
	// quarters of it: a flood of new names leaves the last quarter to
	// the names pods use. Over it a query is answered stale or SERVFAIL
	// at once. Must be positive.
	MaxInflight int
	// MaxPerZone caps the concurrent upstream resolutions of the names
	// under one fetch zone (a name's registrable domain, or its route's
	// zone if longer: see fetchZone), as BIND's fetches-per-zone: a zone
	// whose servers are slow, or a random-subdomain flood of one, takes
	// no more. Over it a query is answered stale or SERVFAIL at once.
	// Must be positive.
	MaxPerZone int
	// MaxPerClient caps the queries one client may have waiting on the
	// miss path, a client being a source address over UDP and another
	// over TCP: TCP's addresses are proven by the handshake, UDP's can be
	// forged. Over it a query is answered stale, or else over UDP with an
	// empty truncated answer (the client asks again over TCP, where one
	// forging its address cannot reach its cap, as BIND's rate limiting
	// slips) and over TCP with SERVFAIL. Must be positive.
	MaxPerClient int
	// MaxWaitingBytes caps the memory of the queries waiting on upstream
	// resolutions, in bytes, each counted as what it keeps (its waiter,
	// question name and reply function: 200 to 460 bytes); over it a
	// query is answered stale or SERVFAIL at once. It holds whatever
	// MaxInflight is set to. Must be positive.
	MaxWaitingBytes int

	// RefreshRate bounds background refreshes of entries hit in the last
	// tenth of their life, per second; 0 disables them.
	RefreshRate int

	// UDPSize is advertised to EDNS clients and upstreams, in bytes, at
	// least 512; NSID is sent to clients that ask for it ("" for none).
	UDPSize uint16
	NSID    string

	// Logger is tagged component=pipeline; nil discards.
	Logger *slog.Logger
}

// DefaultConfig returns the tunables' defaults; Routes are left for the
// caller.
func DefaultConfig() Config {
	return Config{
		// Pods' resolvers (glibc: 5 s, musl: 2.5 s per try) retry well after
		// this: a stale answer within half a second is an answer on the
		// first try.
		StaleBudget:     500 * time.Millisecond,
		UpstreamTimeout: 2 * time.Second,
		// LocalDNS runs its forward with max_concurrent 1000.
		MaxInflight: 1000,
		// A tenth of MaxInflight. LocalDNS's cluster.local block is one
		// fetch zone: at kube-dns's usual millisecond, 100 resolutions
		// at once are 100,000 misses a second; when kube-dns is slow,
		// names the cache knows are answered stale past the cap.
		MaxPerZone: 100,
		// One pod may use a tenth of that; the Zalando incident in the
		// reported incidents was one client's query storm taking cluster DNS down.
		MaxPerClient: 100,
		// The default MaxInflight lets 16,000 queries wait (16 a flight);
		// 8 MiB holds that many even for the longest names (460 bytes
		// each).
		MaxWaitingBytes: 8 << 20,
		// A tenth of MaxInflight: refreshing ahead never crowds out misses.
		RefreshRate: 100,
		UDPSize:     1232,
		NSID:        "dnsstandby",
	}
}

// Validate checks c's tunables as New takes them (New checks the Routes
// too); its errors name the Config field. The daemon calls it for
// `dnsstandby run --validate`, before there are routes.
func (c *Config) Validate() error {
	if err := c.validate(); err != nil {
		return fmt.Errorf("pipeline: %w", err)
	}
	return nil
}

func (c *Config) validate() error {
	switch {
	case c.StaleBudget <= 0:
		return fmt.Errorf("StaleBudget must be positive, got %s", c.StaleBudget)
	case c.UpstreamTimeout <= 0:
		return fmt.Errorf("UpstreamTimeout must be positive, got %s", c.UpstreamTimeout)
	case c.MaxInflight <= 0:
		return fmt.Errorf("MaxInflight must be positive, got %d", c.MaxInflight)
	case c.MaxPerZone <= 0:
		return fmt.Errorf("MaxPerZone must be positive, got %d", c.MaxPerZone)
	case c.MaxPerClient <= 0:
		return fmt.Errorf("MaxPerClient must be positive, got %d", c.MaxPerClient)
	case c.MaxWaitingBytes <= 0:
		return fmt.Errorf("MaxWaitingBytes must be positive, got %d", c.MaxWaitingBytes)
	case c.RefreshRate < 0:
		return fmt.Errorf("RefreshRate must not be negative, got %d", c.RefreshRate)
	case c.UDPSize < wire.MinUDPSize:
		return fmt.Errorf("UDPSize must be at least %d, got %d", wire.MinUDPSize, c.UDPSize)
	}
	return nil
}

// Pipeline answers queries. Create it with New; Drain it before closing
// the sockets its replies go to.
type Pipeline struct {
	cfg    Config
	routes atomic.Pointer[[]Route] // most specific zone first; replaced whole by SetRoutes
	nsid   []byte                  // or nil
	log    *slog.Logger            // always non-nil, tagged component=pipeline

	ctx    context.Context // good until Drain gives up waiting
	cancel context.CancelFunc

	mu        sync.Mutex // guards following
	running   int        // flights started and not yet done replying
	flights   map[flightKey]*flight
	perClient map[clientKey]int
	perZone   map[zoneKey]int // flights by fetch zone
	waiting   int             // queries waiting on flights
	// waitingBytes is what they keep, as waiterCost counts it.
	waitingBytes int
	closed       bool // no new flights after Close

	workersMu sync.Mutex // guards workers
	workers   []*Worker

	refreshes *tokenBucket // always non-nil

	stats missStats
}

// New validates cfg and returns a pipeline; it takes cfg as given.
func New(cfg Config) (*Pipeline, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(cfg.Routes) == 0 {
		return nil, errors.New("pipeline: Routes is empty")
	}
	routes, err := sortRoutes(cfg.Routes)
	if err != nil {
		return nil, fmt.Errorf("pipeline: Routes: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Pipeline{
		refreshes: newTokenBucket(float64(cfg.RefreshRate), float64(cfg.RefreshRate)),
		cfg:       cfg,
		log:       log.With("component", "pipeline"),
		flights:   make(map[flightKey]*flight),
		perClient: make(map[clientKey]int),
		perZone:   make(map[zoneKey]int),
	}
	p.routes.Store(&routes)
	if cfg.NSID != "" {
		p.nsid = []byte(cfg.NSID)
	}
	p.stats.initHistograms()
	p.ctx, p.cancel = context.WithCancel(context.Background())
	return p, nil
}

// Drain waits until every resolution in flight has answered its clients,
// or ctx ends; then it cancels whatever is left (those clients get
// SERVFAIL or stale) and waits for that too, at most cancelGrace: so it
// returns by then whatever the upstreams and clients do, and the daemon's
// shutdown (and its snapshot) is never held up. New misses arriving
// during the drain still resolve. Drain is safe to call more than once.
func (p *Pipeline) Drain(ctx context.Context) {
	// A counter polled, not a WaitGroup: TCP connections may still start
	// flights while we wait, and a WaitGroup must not grow from zero
	// during a Wait.
	const poll = 5 * time.Millisecond
	for p.runningFlights() > 0 && ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-time.After(poll):
		}
	}
	p.mu.Lock()
	p.closed = true
	left := p.running
	p.mu.Unlock()
	if left > 0 {
		p.log.Info("drain timed out: cancelling upstream resolutions in flight", slog.Int("inflight", left))
	}
	p.cancel()
	// A cancelled flight stops waiting for its exchange at once and its
	// replies never block (the responder queues TCP answers), so this is
	// short; the bound holds even if a reply function blocks.
	for end := time.Now().Add(cancelGrace); p.runningFlights() > 0 && time.Now().Before(end); {
		time.Sleep(poll)
	}
	if left := p.runningFlights(); left > 0 {
		p.log.Info("drain: resolutions still answering their clients", slog.Int("inflight", left))
	}
}

// cancelGrace is how long Drain waits for cancelled flights to answer
// their clients: stale or SERVFAIL from memory, well under a millisecond
// each.
const cancelGrace = 250 * time.Millisecond

func (p *Pipeline) runningFlights() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.running
}

// Inflight returns the number of upstream resolutions in progress.
func (p *Pipeline) Inflight() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.flights)
}

// MaxUDPAnswer caps UDP answers whatever size the client advertises;
// larger answers go out truncated and the client retries over TCP. It
// bounds the reply buffers each UDP read loop keeps for a batch.
const MaxUDPAnswer = 4096

// Action tells the caller of Worker.Answer what to do next.
type Action uint8

const (
	// Drop: send nothing (unreadable, or a response sent to us).
	Drop Action = iota
	// Reply: send the n bytes written to dst.
	Reply
	// Resolve: the cache cannot answer; pass a copy of the query to
	// Pipeline.Resolve.
	Resolve
)

// Worker is one read loop's handle on the pipeline: it owns scratch space
// and counters so that the hot path shares no written memory with other
// loops. A Worker must be used by one goroutine at a time.
type Worker struct {
	p    *Pipeline
	q    wire.Query
	tick uint64 // answers so far, to time one in sampleEvery
	hotStats
	// The replies PrefetchMirror parsed, for InsertMirror; aheadNext is
	// the one to replace next.
	ahead     [2]parsedReply
	aheadNext int
}

// NewWorker returns a worker for one read loop.
func (p *Pipeline) NewWorker() *Worker {
	w := &Worker{p: p}
	p.workersMu.Lock()
	p.workers = append(p.workers, w)
	p.workersMu.Unlock()
	return w
}

// Answer handles msg on the hot path: it writes an answer into dst when
// the cache or a protocol error decides it, without allocating. udp says
// whether the client's UDP payload size limits the answer (else TCP's
// 65535). Of a UDP query only the first wire.MaxQueryLen bytes are read,
// as LocalDNS reads them; a TCP query longer than that is dropped. dst
// must hold at least 512 bytes.
func (w *Worker) Answer(dst, msg []byte, udp bool) (int, Action) {
	// One answer in sampleEvery is timed: reading the clock twice would
	// cost more than the rest of a cache hit.
	w.tick++
	var start time.Time
	timed := w.tick%sampleEvery == 0
	if timed {
		start = time.Now()
	}
	n, act, src, rcode := w.answer(dst, msg, udp)
	if act == Drop {
		return n, act
	}
	w.requests[protoIndex(udp)][typeIndex(w.q.QType)].Add(1)
	if act == Reply {
		if rcode < 0 {
			rcode = int(dst[3] & 0x0f)
		}
		w.answers[src].Add(1)
		w.rcodes[rcodeIndex(rcode)].Add(1)
		if timed {
			w.p.stats.duration[src].Observe(time.Since(start).Seconds())
		}
	}
	return n, act
}

// Cached answers msg from the cache alone, fresh or stale: a hedge for a
// query LocalDNS was sent and has left unanswered, so a stale answer beats
// none whatever the route's stale mode. It refreshes nothing: LocalDNS,
// sent the same query, is fetching the name, and its reply refreshes the
// mirror; a refresh here would double an upstream's queries just when it
// is slow. n is 0 when the cache cannot answer (a miss, a route without a
// cache, a query the hot path refuses). It counts the cache's hit or miss
// but not a request: the query was LocalDNS's, and the hedge is counted by
// its sender. Like Answer, it does not allocate; dst must hold at least
// 512 bytes.
func (w *Worker) Cached(dst, msg []byte) (n int, stale bool) {
	n, act, src, _ := w.answer(dst, msg, true)
	switch {
	case act == Reply && src == srcCache:
		return n, false
	case act == Reply && src == srcStale:
		return n, true
	case act != Resolve:
		return 0, false
	}
	r := w.p.route(w.q.QName)
	if r == nil || r.Cache == nil {
		return 0, false
	}
	n, st := r.Cache.ServeAgain(dst, &w.q, limitFor(&w.q, true), true)
	if n == 0 {
		return 0, false
	}
	return n, st == cache.Stale
}

// Fresh reports whether the cache holds a fresh answer to msg, writing,
// counting and refreshing nothing, nor moving the entry in the LRU order:
// the hedger asks it of a query LocalDNS answered slowly, to tell its hits
// (LocalDNS had the answer too) from its misses. It does not allocate.
func (w *Worker) Fresh(msg []byte) bool {
	msg, ok := clip(msg, true)
	if !ok || wire.CheckHeader(msg) != wire.Accept || wire.ParseQuery(msg, &w.q) != nil {
		return false
	}
	r := w.p.route(w.q.QName)
	if r == nil || r.Cache == nil {
		return false
	}
	return r.Cache.Status(&w.q).IsFresh()
}

// answer is Answer's decision: what to write, and for a reply, its source
// and its rcode (-1: the one in dst's header).
func (w *Worker) answer(dst, msg []byte, udp bool) (int, Action, int, int) {
	q := &w.q
	q.QType = 0 // counted as "other" if the parse stops before the type
	// The checks come in the order CoreDNS (miekg/dns's server, then
	// CoreDNS's own) makes them, so that a query wrong in two ways gets
	// LocalDNS's rcode: the header first (QR, opcode, section counts),
	// then the rest of the message, then EDNS.
	if len(msg) < wire.HeaderLen {
		w.drops[dropShort].Add(1)
		return 0, Drop, 0, 0
	}
	msg, ok := clip(msg, udp)
	if !ok {
		w.drops[dropLong].Add(1)
		return 0, Drop, 0, 0
	}
	switch wire.CheckHeader(msg) {
	case wire.Ignore:
		// Never answer a response: two servers answering each other's
		// answers would loop.
		w.drops[dropResponse].Add(1)
		return 0, Drop, 0, 0
	case wire.RejectNotImp:
		_ = wire.ParseQuery(msg, q) // the header is all the reply takes
		return writeReject(dst, q, dns.RcodeNotImplemented), Reply, srcError, dns.RcodeNotImplemented
	case wire.RejectFormat:
		_ = wire.ParseQuery(msg, q)
		return writeReject(dst, q, dns.RcodeFormatError), Reply, srcError, dns.RcodeFormatError
	}
	err := wire.ParseQuery(msg, q)
	switch {
	case err != nil && len(msg) == wire.HeaderLen:
		// A header that promises a question and ends: miekg/dns reads it
		// as a message without one, which CoreDNS answers SERVFAIL.
		return writeHeaderOnly(dst, q, dns.RcodeServerFailure), Reply, srcError, dns.RcodeServerFailure
	case err != nil:
		return writeFormErr(dst, q), Reply, srcError, dns.RcodeFormatError
	case q.Opcode() != dns.OpcodeQuery:
		// NOTIFY: CoreDNS would hand it down its plugins; a resolver has
		// no zone to be notified of.
		return writeError(dst, q, dns.RcodeNotImplemented), Reply, srcError, dns.RcodeNotImplemented
	case q.EDNS && q.EDNSVersion != 0:
		return writeError(dst, q, dns.RcodeBadVers), Reply, srcError, dns.RcodeBadVers
	case q.QType == dns.TypeAXFR || q.QType == dns.TypeIXFR:
		// Zone transfers are not a resolver's business.
		return writeError(dst, q, dns.RcodeRefused), Reply, srcError, dns.RcodeRefused
	case q.Stray > 0:
		// Records a query has no use for are refused before anything is
		// made of them: stricter than CoreDNS, which takes one answer,
		// one authority and two additional records and unpacks them
		// (RDATA of compression pointers costs it some 40 times their
		// size), as Unbound refuses any.
		return writeStray(dst, q), Reply, srcError, dns.RcodeFormatError
	}
	r := w.p.route(q.QName)
	if r == nil || r.Cache == nil {
		return 0, Resolve, 0, 0 // REFUSED, or an answer for this client alone
	}
	limit := limitFor(q, udp)
	c := r.Cache
	n, st := c.Serve(dst, q, limit, c.StaleMode() == cache.StaleImmediate)
	switch {
	case n > 0 && st == cache.Fresh:
		return n, Reply, srcCache, -1
	case n > 0 && st == cache.Expiring:
		// Refresh ahead, so that a long takeover keeps serving fresh
		// answers rather than letting them go stale.
		if w.p.refreshes.allow() {
			w.p.refresh(q, r)
		}
		return n, Reply, srcCache, -1
	case n > 0 && st == cache.Stale:
		w.p.refresh(q, r)
		return n, Reply, srcStale, -1
	}
	return 0, Resolve, 0, 0
}
