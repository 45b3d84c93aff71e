package hedge

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Query results.
const (
	qTracked   = iota
	qUntracked // tracking was off when it arrived
	qTableFull
	qMalformed // not a single-question QUERY, or a bad name
	qTooLong   // longer than wire.MaxQueryLen
	qDuplicate // the same query (client, ID, question) while the first waits
	numQueryResults
)

var queryResults = [numQueryResults]string{"tracked", "untracked", "table_full", "malformed", "too_long", "duplicate"}

// Reply results.
const (
	rMatched   = iota // LocalDNS's reply to a tracked query
	rOwn              // our own hedge seen leaving
	rUnknown          // to no tracked query
	rMalformed        // not a single-question response
	rRepeat           // LocalDNS's second reply to a query
	numReplyResults
)

var replyResults = [numReplyResults]string{"matched", "own", "unknown", "malformed", "repeat"}

// Hedge sources.
const (
	hCache = iota
	hStale
	hUpstream
	numSources
)

var sources = [numSources]string{"cache", "stale", "upstream"}

// Outcomes of a hedge that was sent.
const (
	oLater   = iota // LocalDNS answered too, after it
	oNever          // LocalDNS did not answer within Linger
	oUnknown        // retired before Linger (table full, query repeated)
	numOutcomes
)

var outcomes = [numOutcomes]string{"later", "never", "unknown"}

// Reasons a due hedge was not sent.
const (
	sRate      = iota // over Rate/Burst
	sNoAnswer         // Resolve gave no answer within Linger
	sSendError        // Send failed
	sAnswered         // the upstream answer came after LocalDNS's
	sLate             // the upstream answer came after the entry was gone
	numSkips
)

var skips = [numSkips]string{"rate", "no_answer", "send_error", "answered", "late"}

// counters are written under the Hedger's lock or by Run; atomics let
// Stats and Collect read them from anywhere.
// What ran a tick.
const (
	tickTap   = iota // Drained, on the tap's goroutine
	tickTimer        // Run's fallback timer
	numTickers
)

var tickers = [numTickers]string{"tap", "timer"}

type counters struct {
	queries  [numQueryResults]atomic.Uint64
	replies  [numReplyResults]atomic.Uint64
	hedges   [numSources]atomic.Uint64
	outcomes [numOutcomes]atomic.Uint64
	skipped  [numSkips]atomic.Uint64
	silent   atomic.Uint64
	ticks    [numTickers]atomic.Uint64
	needed   atomic.Uint64
	delayed  atomic.Uint64
	d1, d2   atomic.Int64
	tracking atomic.Bool
}

// Stats is a snapshot for the daemon's status.
type Stats struct {
	Queries  map[string]uint64 // by result: tracked, untracked, table_full, malformed, too_long, duplicate
	Replies  map[string]uint64 // by result: matched, own, unknown, malformed, repeat
	Hedges   map[string]uint64 // sent, by source: cache, stale, upstream
	Outcomes map[string]uint64 // of sent hedges, by what LocalDNS did: later, never, unknown
	Skipped  map[string]uint64 // due hedges not sent, by reason: rate, no_answer, send_error, answered, late
	// Silent counts fast holds signalled.
	Silent uint64
	// Needed counts the upstream hedges that proved needed: LocalDNS had
	// not answered them NeedAfter after they fired, or after they were
	// due (Delayed ones).
	Needed uint64
	// Delayed counts upstream hedges delayed NeedAfter for want of budget.
	Delayed uint64
	// CacheDeadline and UpstreamDeadline are the current deadlines.
	CacheDeadline, UpstreamDeadline time.Duration
	// Entries is how many queries the table holds; Table its size.
	Entries, Table int
	// Samples is how many LocalDNS latencies set the cache deadline now.
	Samples uint64
	// Tracking is whether new queries are tracked (SetTracking).
	Tracking bool
}

// HedgesTotal sums Hedges.
func (s Stats) HedgesTotal() uint64 {
	var n uint64
	for _, v := range s.Hedges {
		n += v
	}
	return n
}

// Stats returns the Hedger's counters now.
func (h *Hedger) Stats() Stats {
	c := &h.st
	mk := func(names []string, vs []atomic.Uint64) map[string]uint64 {
		m := make(map[string]uint64, len(names))
		for i, n := range names {
			m[n] = vs[i].Load()
		}
		return m
	}
	h.mu.Lock()
	entries, samples := h.tab.n, h.hitW.Samples(h.now())
	h.mu.Unlock()
	return Stats{
		Queries:          mk(queryResults[:], c.queries[:]),
		Replies:          mk(replyResults[:], c.replies[:]),
		Hedges:           mk(sources[:], c.hedges[:]),
		Outcomes:         mk(outcomes[:], c.outcomes[:]),
		Skipped:          mk(skips[:], c.skipped[:]),
		Silent:           c.silent.Load(),
		Needed:           c.needed.Load(),
		Delayed:          c.delayed.Load(),
		CacheDeadline:    time.Duration(c.d1.Load()),
		UpstreamDeadline: time.Duration(c.d2.Load()),
		Entries:          entries,
		Table:            len(h.tab.e),
		Samples:          samples,
		Tracking:         c.tracking.Load(),
	}
}

var (
	descQueries = prometheus.NewDesc("dnsstandby_hedge_queries_total",
		"UDP queries the hedger saw arrive for LocalDNS, by result (tracked, untracked, table_full, malformed, too_long, duplicate).", []string{"result"}, nil)
	descReplies = prometheus.NewDesc("dnsstandby_hedge_replies_total",
		"UDP replies the hedger saw leave from LocalDNS's address, by result (matched, own, unknown, malformed, repeat).", []string{"result"}, nil)
	descHedges = prometheus.NewDesc("dnsstandby_hedge_sent_total",
		"Hedged answers sent for queries LocalDNS left unanswered past the deadline, by source (cache, stale, upstream).", []string{"source"}, nil)
	descOutcomes = prometheus.NewDesc("dnsstandby_hedge_outcomes_total",
		"Hedges sent, by whether LocalDNS answered the query later, never (within the linger time) or unknown (retired early).", []string{"localdns"}, nil)
	descSkipped = prometheus.NewDesc("dnsstandby_hedge_skipped_total",
		"Hedges due but not sent, by reason (rate, no_answer, send_error, answered, late).", []string{"reason"}, nil)
	descNeeded = prometheus.NewDesc("dnsstandby_hedge_upstream_needed_total",
		"Upstream hedges that proved needed: LocalDNS had still not answered them NeedAfter (250 ms by default) after they fired or were due. Each earns two more; without them upstream hedges beyond a small budget wait NeedAfter more.", nil, nil)
	descDelayed = prometheus.NewDesc("dnsstandby_hedge_upstream_delayed_total",
		"Upstream hedges delayed NeedAfter past the upstream deadline for want of budget (none proved needed lately); LocalDNS's answer meanwhile ends them.", nil, nil)
	descDeadline = prometheus.NewDesc("dnsstandby_hedge_deadline_seconds",
		"Current hedge deadline, by stage (cache, upstream).", []string{"stage"}, nil)
	descSilent = prometheus.NewDesc("dnsstandby_localdns_silent_total",
		"Fast holds signalled: LocalDNS answered none of the cache hits it was sent.", nil, nil)
	descTicks = prometheus.NewDesc("dnsstandby_hedge_ticks_total",
		"Rounds of deadline work, by what ran them: tap (after a read, on the tap's goroutine) or timer (the hedger's own wake-up, only while queries wait and the tap is quiet).", []string{"by"}, nil)
	descEntries = prometheus.NewDesc("dnsstandby_hedge_entries",
		"Queries the hedger's table holds.", nil, nil)
	descTracking = prometheus.NewDesc("dnsstandby_hedge_tracking",
		"1 while the hedger tracks new queries, 0 while dnsstandby answers them itself.", nil, nil)

	// The names before every hedge metric took the hedge_ prefix, exported
	// beside the new ones with the same values for one release, so that
	// rules and dashboards can move over (CHANGELOG.md says when they go).
	descHedgesOld = prometheus.NewDesc("dnsstandby_hedges_total",
		"Deprecated: dnsstandby_hedge_sent_total under its old name, removed in the release after the first tagged one.", []string{"source"}, nil)
	descSkippedOld = prometheus.NewDesc("dnsstandby_hedges_skipped_total",
		"Deprecated: dnsstandby_hedge_skipped_total under its old name, removed in the release after the first tagged one.", []string{"reason"}, nil)
)

// Describe implements prometheus.Collector.
func (h *Hedger) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descQueries, descReplies, descHedges, descOutcomes, descSkipped, descDeadline, descSilent, descEntries, descTracking,
		descNeeded, descDelayed, descTicks, descHedgesOld, descSkippedOld} {
		ch <- d
	}
	h.hist.Describe(ch)
}

// Collect implements prometheus.Collector.
func (h *Hedger) Collect(ch chan<- prometheus.Metric) {
	c := &h.st
	counters := func(d *prometheus.Desc, names []string, vs []atomic.Uint64) {
		for i, n := range names {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(vs[i].Load()), n)
		}
	}
	counters(descQueries, queryResults[:], c.queries[:])
	counters(descReplies, replyResults[:], c.replies[:])
	counters(descHedges, sources[:], c.hedges[:])
	counters(descOutcomes, outcomes[:], c.outcomes[:])
	counters(descSkipped, skips[:], c.skipped[:])
	counters(descTicks, tickers[:], c.ticks[:])
	counters(descHedgesOld, sources[:], c.hedges[:])
	counters(descSkippedOld, skips[:], c.skipped[:])
	ch <- prometheus.MustNewConstMetric(descDeadline, prometheus.GaugeValue, time.Duration(c.d1.Load()).Seconds(), "cache")
	ch <- prometheus.MustNewConstMetric(descDeadline, prometheus.GaugeValue, time.Duration(c.d2.Load()).Seconds(), "upstream")
	ch <- prometheus.MustNewConstMetric(descSilent, prometheus.CounterValue, float64(c.silent.Load()))
	ch <- prometheus.MustNewConstMetric(descNeeded, prometheus.CounterValue, float64(c.needed.Load()))
	ch <- prometheus.MustNewConstMetric(descDelayed, prometheus.CounterValue, float64(c.delayed.Load()))
	h.mu.Lock()
	n := h.tab.n
	h.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(descEntries, prometheus.GaugeValue, float64(n))
	tr := 0.0
	if c.tracking.Load() {
		tr = 1
	}
	ch <- prometheus.MustNewConstMetric(descTracking, prometheus.GaugeValue, tr)
	h.hist.Collect(ch)
}
