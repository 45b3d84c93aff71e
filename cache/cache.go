// Package cache is dnsstandby's packet cache: it stores validated DNS
// responses in wire format, keyed as CoreDNS keys them, and serves hits by
// copying the stored bytes and patching ID, flags, question and TTLs, with
// no allocation and no parsing beyond the query's question. It is bounded
// by entries and bytes, keeps expired entries servable for a stale window
// (RFC 8767), and can be written to and loaded from a snapshot.
//
// Entries come in through InsertMsg (upstream replies, from the pipeline),
// Insert and InsertMirror (LocalDNS's replies, from the mirror feed) and
// Load (a snapshot), each validating what it stores; Serve is the hot path
// out. The cache never talks to the network and starts no goroutine.
package cache

import (
	"fmt"
	"hash/maphash"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// Config holds the cache's limits and TTL policy. Start from DefaultConfig.
type Config struct {
	// MaxEntries and MaxBytes bound the cache; the least recently used
	// entries are evicted first. MaxBytes counts stored bytes plus a fixed
	// estimate of per-entry overhead.
	MaxEntries int
	MaxBytes   int64

	// MaxTTL and MaxNegTTL cap how long positive and negative answers stay
	// fresh; MinTTL and MinNegTTL are floors. A floor extends freshness
	// only: the TTL served never exceeds the record's own TTL minus age.
	MaxTTL    time.Duration
	MaxNegTTL time.Duration
	MinTTL    time.Duration
	MinNegTTL time.Duration

	// ServfailTTL is how long a SERVFAIL is cached; 0 disables it.
	ServfailTTL time.Duration

	// MaxStale is how long past expiry an entry may still be served stale;
	// StaleTTL is the TTL such answers carry; StaleMode is how the caller
	// uses them (the cache itself serves stale only when told to).
	MaxStale  time.Duration
	StaleTTL  time.Duration
	StaleMode StaleMode

	// MirrorMaxTTL caps how long an entry from the mirror feed
	// (InsertMirror) stays fresh, and the TTL it is served with, below
	// MaxTTL and MaxNegTTL and above any floor. LocalDNS's replies are
	// taken on trust from the wire: the cap bounds how long one that was
	// not LocalDNS's can be served fresh when LocalDNS never sends that
	// name again (while it does, a reply that differs replaces the entry).
	MirrorMaxTTL time.Duration

	// ProbationPercent is the share, in percent (1 to 100) of each
	// shard's MaxEntries and MaxBytes, that mirrored entries no client has
	// been seen to use may hold. An entry from InsertMirror starts on
	// probation unless its key is already cached; it leaves probation when
	// Serve answers from it or LocalDNS is seen to send the same answer
	// again. Entries on probation make room among themselves first, oldest
	// first, and push out used entries only while those hold more than
	// their own share (100 - ProbationPercent): so a flood of names nobody
	// else asks cannot evict the entries clients use.
	ProbationPercent int

	// UDPSize is the payload size advertised in the OPT of answers.
	UDPSize uint16
	// NSID, when non-empty, is sent to clients whose query asks for it.
	NSID string

	// Shards is the number of independently locked LRU shards, a power of
	// two; 0 picks one from MaxEntries.
	Shards int

	// Now is the clock; nil means time.Now. Tests inject their own.
	Now func() time.Time

	// Logger is tagged component=cache; nil discards. The cache logs
	// only snapshot loads and saves, at debug level: the caller reports
	// them.
	Logger *slog.Logger
}

// DefaultConfig returns the settings LocalDNS gives CoreDNS's cache in the
// AKS pod block (`cache 3600 { ... serve_stale 72000s verify; servfail 0 }`),
// with CoreDNS's 5 s TTL floor and RFC 8767's 30 s stale TTL.
func DefaultConfig() Config {
	return Config{
		// Room for LocalDNS's own capacity in every block dnsstandby
		// caches: AgentBaker's Corefile has six, 9984 success + 9984
		// denial entries each (6 x 19,968 = 119,808), which the daemon
		// shares this bound among.
		MaxEntries: 120_000,
		MaxBytes:   64 << 20,
		MaxTTL:     3600 * time.Second,
		MaxNegTTL:  3600 * time.Second,
		MinTTL:     5 * time.Second,
		MinNegTTL:  5 * time.Second,
		MaxStale:   72000 * time.Second,
		StaleTTL:   30 * time.Second,
		StaleMode:  StaleVerify,
		// Five minutes: longer than the TTLs of cluster names (kube-dns
		// serves 5 to 30 s), so it changes nothing for them; an external
		// name LocalDNS keeps for an hour is re-mirrored, or refreshed from
		// the upstreams in hold and takeover, every five minutes.
		MirrorMaxTTL: 300 * time.Second,
		// A quarter of the cache for names seen once: room for a burst of
		// new names to prove themselves, and three quarters that a flood
		// of names nobody else asks cannot touch.
		ProbationPercent: 25,
		// 1232 avoids IP fragmentation on any path (DNS flag day 2020).
		UDPSize: 1232,
	}
}

// Validate checks c as New takes it; its errors name the Config field.
// The daemon calls it for `dnsstandby run --validate`.
func (c *Config) Validate() error {
	if err := c.validate(); err != nil {
		return fmt.Errorf("cache: %w", err)
	}
	return nil
}

func (c *Config) validate() error {
	switch {
	case c.MaxEntries <= 0:
		return fmt.Errorf("MaxEntries must be positive, got %d", c.MaxEntries)
	case c.MaxBytes <= 0:
		return fmt.Errorf("MaxBytes must be positive, got %d", c.MaxBytes)
	case c.MaxTTL < time.Second:
		return fmt.Errorf("MaxTTL must be at least 1s, got %s", c.MaxTTL)
	case c.MaxNegTTL < time.Second:
		return fmt.Errorf("MaxNegTTL must be at least 1s, got %s", c.MaxNegTTL)
	case c.MinTTL < 0:
		return fmt.Errorf("MinTTL must not be negative, got %s", c.MinTTL)
	case c.MinNegTTL < 0:
		return fmt.Errorf("MinNegTTL must not be negative, got %s", c.MinNegTTL)
	case c.ServfailTTL < 0:
		return fmt.Errorf("ServfailTTL must not be negative, got %s", c.ServfailTTL)
	case c.MaxStale < 0:
		return fmt.Errorf("MaxStale must not be negative, got %s", c.MaxStale)
	case c.StaleTTL < 0:
		return fmt.Errorf("StaleTTL must not be negative, got %s", c.StaleTTL)
	case c.MirrorMaxTTL < time.Second:
		return fmt.Errorf("MirrorMaxTTL must be at least 1s, got %s", c.MirrorMaxTTL)
	case c.ProbationPercent < 1 || c.ProbationPercent > 100:
		return fmt.Errorf("ProbationPercent must be 1 to 100, got %d", c.ProbationPercent)
	case c.StaleMode != StaleVerify && c.StaleMode != StaleImmediate:
		return fmt.Errorf("StaleMode %d is neither StaleVerify nor StaleImmediate", c.StaleMode)
	case c.MinTTL > c.MaxTTL:
		return fmt.Errorf("MinTTL %s is above MaxTTL %s", c.MinTTL, c.MaxTTL)
	case c.MinNegTTL > c.MaxNegTTL:
		return fmt.Errorf("MinNegTTL %s is above MaxNegTTL %s", c.MinNegTTL, c.MaxNegTTL)
	case c.StaleTTL > time.Duration(maxTTL)*time.Second:
		return fmt.Errorf("StaleTTL %s is above the largest TTL, %ds", c.StaleTTL, maxTTL)
	case c.UDPSize < 512:
		return fmt.Errorf("UDPSize must be at least 512, got %d", c.UDPSize)
	case len(c.NSID) > 512:
		return fmt.Errorf("NSID must be at most 512 bytes, got %d", len(c.NSID))
	case c.Shards < 0 || c.Shards&(c.Shards-1) != 0:
		return fmt.Errorf("Shards must be 0 or a power of two, got %d", c.Shards)
	}
	return nil
}

// StaleMode is how stale entries are used: CoreDNS's serve_stale mode.
type StaleMode uint8

const (
	// StaleVerify asks upstreams first and serves the stale entry only if
	// they fail within the caller's budget (CoreDNS `serve_stale ...
	// verify`, what LocalDNS's blocks use).
	StaleVerify StaleMode = iota
	// StaleImmediate serves the stale entry at once and refreshes it in
	// the background (CoreDNS's default).
	StaleImmediate
)

func (m StaleMode) String() string {
	if m == StaleImmediate {
		return "immediate"
	}
	return "verify"
}

// ParseStaleMode parses "verify" or "immediate".
func ParseStaleMode(s string) (StaleMode, error) {
	switch s {
	case "verify":
		return StaleVerify, nil
	case "immediate":
		return StaleImmediate, nil
	}
	return 0, fmt.Errorf("stale mode %q: want verify or immediate", s)
}

// StaleMode returns the cache's Config.StaleMode.
func (c *Cache) StaleMode() StaleMode { return c.cfg.StaleMode }

// maxTTL is the largest TTL RFC 2181 §8 allows.
const maxTTL = 1<<31 - 1

// Per shard, at least this many entries before the cache is split further:
// small caches (tests, tiny nodes) keep exact LRU order in one shard.
const minEntriesPerShard = 1024

// 64 shards keep lock contention negligible on nodes with up to a few dozen
// cores while costing under 10 KiB.
const maxShards = 64

// Status says what a lookup found.
type Status uint8

const (
	Miss  Status = iota // nothing servable
	Fresh               // an entry within its TTL
	Stale               // an expired entry within the stale window
	// Expiring is a fresh entry in the last tenth of its life (at least
	// the last second): the caller should refresh it in the background so
	// that hits keep finding fresh answers while upstreams are reachable.
	Expiring
)

func (s Status) String() string {
	switch s {
	case Fresh:
		return "fresh"
	case Stale:
		return "stale"
	case Expiring:
		return "expiring"
	}
	return "miss"
}

// IsFresh reports whether s is a fresh hit, expiring or not.
func (s Status) IsFresh() bool { return s == Fresh || s == Expiring }

// Cache is a sharded, bounded packet cache. It is safe for concurrent use.
type Cache struct {
	cfg      Config
	now      func() time.Time // always non-nil
	nsid     []byte           // or nil
	seed     maphash.Seed
	shards   []shard
	shardMsk uint64

	rejects [numReasons]atomic.Uint64

	log *slog.Logger // always non-nil, tagged component=cache; last, off the hot path's lines
}

// shard is one LRU with its lock. Entries are stored by value; their data
// is immutable once inserted, so a hit copies the entry and reads its bytes
// after unlocking.
type shard struct {
	mu         sync.RWMutex // guards following
	lru        *simplelru.LRU[uint64, entry]
	bytes      int64
	maxEntries int
	maxBytes   int64

	// Entries on probation (entryProbation): how many, their bytes, their
	// bounds, and the order they came in (oldest first; an entry that
	// left probation or the cache leaves a stale reference behind, which
	// is skipped when it comes up).
	probEntries int
	probBytes   int64
	maxProb     int
	maxProbB    int64
	probQ       probQueue

	memo memo // mirrored entries a repeat may skip; its slots are atomic

	hits, staleHits, misses, inserts, evictions atomic.Uint64
	_                                           [64]byte // keep shards on separate cache lines
}

// New validates cfg, taken as given, and returns an empty cache.
func New(cfg Config) (*Cache, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	n := cfg.Shards
	if n == 0 {
		n = 1
		for n < maxShards && cfg.MaxEntries/(n*2) >= minEntriesPerShard {
			n *= 2
		}
	}
	c := &Cache{
		cfg:      cfg,
		now:      cfg.Now,
		seed:     maphash.MakeSeed(),
		shards:   make([]shard, n),
		shardMsk: uint64(n - 1),
	}
	if c.now == nil {
		c.now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c.log = log.With("component", "cache")
	if cfg.NSID != "" {
		c.nsid = []byte(cfg.NSID)
	}
	for i := range c.shards {
		s := &c.shards[i]
		s.maxEntries = cfg.MaxEntries / n
		if i < cfg.MaxEntries%n {
			s.maxEntries++
		}
		s.maxEntries = max(s.maxEntries, 1)
		s.maxBytes = max(cfg.MaxBytes/int64(n), 1)
		s.maxProb = max(s.maxEntries*cfg.ProbationPercent/100, 1)
		s.maxProbB = max(s.maxBytes*int64(cfg.ProbationPercent)/100, 1)
		// One more than the bound: the shard evicts before adding, so that
		// it can count and account evictions itself.
		s.lru, _ = simplelru.NewLRU[uint64, entry](s.maxEntries+1, nil)
		s.memo = newMemo(s.maxEntries)
	}
	return c, nil
}

func (c *Cache) shardFor(h uint64) *shard { return &c.shards[h&c.shardMsk] }

// Len returns the number of entries, expired ones included until they are
// evicted or looked up past the stale window.
func (c *Cache) Len() int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		n += s.lru.Len()
		s.mu.Unlock()
	}
	return n
}

// Purge removes every entry.
func (c *Cache) Purge() {
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		s.lru.Purge()
		s.memo.clear()
		s.bytes = 0
		s.probEntries, s.probBytes, s.probQ = 0, 0, probQueue{}
		s.mu.Unlock()
	}
}

// promoteEvery is how stale an entry's place in the LRU order may get. A
// hit takes only the read lock; moving the entry to the front needs the
// write lock and writes to several list nodes, which on every hit made
// parallel hits on different cores slower than hits on one (cache-line
// traffic, measured with BenchmarkServeHitParallel). At one promotion per
// second per entry, eviction order is exact to the second.
const promoteEvery = int64(time.Second)

// get returns the entry stored under h, marking it recently used at most
// once per promoteEvery, and taking it off probation the first time.
func (s *shard) get(h uint64, now int64) (entry, bool) {
	s.mu.RLock()
	e, ok := s.lru.Peek(h)
	s.mu.RUnlock()
	if ok && (now-e.used >= promoteEvery || e.flags&entryProbation != 0) {
		s.mu.Lock()
		if cur, ok := s.lru.Peek(h); ok && cur.stored == e.stored {
			cur.used = now
			s.confirm(&cur)
			s.lru.Add(h, cur) // an existing key: moves to the front, evicts nothing
		}
		s.mu.Unlock()
	}
	return e, ok
}

// confirm takes e, held under the write lock, off probation: a client
// uses it.
func (s *shard) confirm(e *entry) {
	if e.flags&entryProbation != 0 {
		e.flags &^= entryProbation
		s.probEntries--
		s.probBytes -= e.cost()
	}
}

// account adds e (sign 1) to the shard's totals or takes it out (-1).
func (s *shard) account(e *entry, sign int64) {
	s.bytes += sign * e.cost()
	if e.flags&entryProbation != 0 {
		s.probEntries += int(sign)
		s.probBytes += sign * e.cost()
	}
}

// add stores e under h, evicting entries to stay within bounds. An error
// entry never replaces a servable answer: while upstreams fail, the old
// answer is worth more than the failure.
//
// An entry on probation that replaces one under the same key leaves
// probation: its name was asked before. A new one, when the shard is
// full, makes room first among the entries on probation, oldest first,
// down to their share; only then
// are least recently used entries evicted, and at that point the used
// ones hold more than their own share, so that entries on probation
// never push used ones below it.
func (s *shard) add(h uint64, e entry, staleUntil func(entry) int64, now int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.memo.forget(h)
	if old, ok := s.lru.Peek(h); ok {
		if e.isError() && !old.isError() && now < staleUntil(old) {
			return false
		}
		s.lru.Remove(h)
		s.account(&old, -1)
		e.flags &^= entryProbation
	}
	// Only when the shard is full: while it has room, a name seen once
	// costs no other entry anything, and evicting it would lose an answer
	// a client may ask for once LocalDNS is gone. The queue itself (which
	// keeps references to entries that left probation or the cache until
	// they come up) is kept within the shard's entry bound.
	if e.flags&entryProbation != 0 {
		for s.probQ.len() > 0 && (s.probQ.len() >= s.maxEntries ||
			s.full(e) && (s.probQ.len() >= s.maxProb || s.probBytes+e.cost() > s.maxProbB)) {
			s.evictProbation()
		}
	}
	for s.lru.Len() > 0 && s.full(e) {
		oh, old, _ := s.lru.RemoveOldest()
		s.memo.forget(oh)
		s.account(&old, -1)
		s.evictions.Add(1)
	}
	s.lru.Add(h, e)
	s.account(&e, 1)
	s.inserts.Add(1)
	if e.flags&entryProbation != 0 {
		s.probQ.push(probRef{h: h, stored: e.stored})
	}
	return true
}

// full reports whether adding e would take the shard over a bound.
func (s *shard) full(e entry) bool {
	return s.lru.Len() >= s.maxEntries || s.bytes+e.cost() > s.maxBytes
}

// evictProbation takes the oldest reference off the probation queue and
// evicts its entry if that is still on probation.
func (s *shard) evictProbation() {
	ref := s.probQ.pop()
	if cur, ok := s.lru.Peek(ref.h); ok && cur.stored == ref.stored && cur.flags&entryProbation != 0 {
		s.lru.Remove(ref.h)
		s.memo.forget(ref.h)
		s.account(&cur, -1)
		s.evictions.Add(1)
	}
}

// removeIf drops the entry under h if it is still the one the caller saw.
func (s *shard) removeIf(h uint64, stored int64) {
	s.mu.Lock()
	if old, ok := s.lru.Peek(h); ok && old.stored == stored {
		s.lru.Remove(h)
		s.memo.forget(h)
		s.account(&old, -1)
	}
	s.mu.Unlock()
}

// probRef names one version of an entry: its key's hash and when it was
// stored.
type probRef struct {
	h      uint64
	stored int64
}

// probQueue holds references to entries put on probation, oldest first:
// a ring that grows as needed.
type probQueue struct {
	buf     []probRef
	head, n int
}

func (q *probQueue) len() int { return q.n }

func (q *probQueue) push(r probRef) {
	if q.n == len(q.buf) {
		grown := make([]probRef, max(2*len(q.buf), 16))
		for i := range q.n {
			grown[i] = q.buf[(q.head+i)%len(q.buf)]
		}
		q.buf, q.head = grown, 0
	}
	q.buf[(q.head+q.n)%len(q.buf)] = r
	q.n++
}

// pop removes and returns the oldest reference; the queue must not be
// empty.
func (q *probQueue) pop() probRef {
	r := q.buf[q.head]
	q.head = (q.head + 1) % len(q.buf)
	q.n--
	return r
}
