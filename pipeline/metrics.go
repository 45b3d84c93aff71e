package pipeline

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Answer sources, the label of dnsstandby_queries_total.
const (
	srcCache    = iota // a fresh cache entry
	srcStale           // a stale cache entry (RFC 8767)
	srcUpstream        // an upstream reply
	srcServfail        // nothing to answer with
	srcError           // FORMERR, NOTIMP, REFUSED (no route, or upstream over max_concurrent), BADVERS
	numSources
)

var sourceNames = [numSources]string{"cache", "stale", "upstream", "servfail", "error"}

// Reasons a query is dropped unanswered.
const (
	dropShort    = iota // shorter than a DNS header
	dropResponse        // QR=1: a response, not a query
	numDrops
)

var dropNames = [numDrops]string{"short", "response"}

// Caps that turned a query away from the upstreams.
const (
	overClient = iota
	overGlobal
	numOver
)

var overNames = [numOver]string{"client", "global"}

// hotStats are one worker's counters: written by one goroutine only, so
// hot-path increments never bounce a cache line between cores.
type hotStats struct {
	answers [numSources]atomic.Uint64
	drops   [numDrops]atomic.Uint64
	_       [64]byte
}

// missStats are the miss path's counters.
type missStats struct {
	answers   [numSources]atomic.Uint64
	overload  [numOver]atomic.Uint64
	coalesced atomic.Uint64
	refreshes atomic.Uint64
	failures  atomic.Uint64
	latency   prometheus.Histogram
}

var latencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}

var (
	descQueries = prometheus.NewDesc("dnsstandby_queries_total",
		"Queries answered, by what answered them: cache, stale, upstream, servfail, error (FORMERR, NOTIMP, REFUSED, BADVERS; REFUSED for no route or an upstream group over its max_concurrent).", []string{"source"}, nil)
	descDropped = prometheus.NewDesc("dnsstandby_queries_dropped_total",
		"Datagrams dropped unanswered: short (no DNS header), response (QR set).", []string{"reason"}, nil)
	descOverload = prometheus.NewDesc("dnsstandby_upstream_capped_total",
		"Misses answered stale or SERVFAIL without asking upstream because a cap was reached: client (per source address) or global.", []string{"scope"}, nil)
	descCoalesced = prometheus.NewDesc("dnsstandby_coalesced_total",
		"Misses that joined an identical upstream query already in flight.", nil, nil)
	descRefreshes = prometheus.NewDesc("dnsstandby_stale_refreshes_total",
		"Background refreshes: of entries hit in the last tenth of their life, and of entries served stale in immediate mode.", nil, nil)
	descResolveFailures = prometheus.NewDesc("dnsstandby_resolve_failures_total",
		"Upstream resolutions that failed (every upstream errored or timed out, or the upstream group was over its max_concurrent).", nil, nil)
	descInflight = prometheus.NewDesc("dnsstandby_inflight",
		"Upstream resolutions in progress.", nil, nil)
)

func (s *missStats) observeUpstream(d time.Duration, err error) {
	if err != nil {
		s.failures.Add(1)
	}
	if s.latency != nil {
		s.latency.Observe(d.Seconds())
	}
}

// Describe implements prometheus.Collector.
func (p *Pipeline) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descQueries, descDropped, descOverload, descCoalesced, descRefreshes, descResolveFailures, descInflight} {
		ch <- d
	}
	p.stats.latency.Describe(ch)
}

// Collect implements prometheus.Collector.
func (p *Pipeline) Collect(ch chan<- prometheus.Metric) {
	var answers [numSources]uint64
	var drops [numDrops]uint64
	for i := range answers {
		answers[i] = p.stats.answers[i].Load()
	}
	p.workersMu.Lock()
	for _, w := range p.workers {
		for i := range answers {
			answers[i] += w.answers[i].Load()
		}
		for i := range drops {
			drops[i] += w.drops[i].Load()
		}
	}
	p.workersMu.Unlock()
	for i, n := range answers {
		ch <- prometheus.MustNewConstMetric(descQueries, prometheus.CounterValue, float64(n), sourceNames[i])
	}
	for i, n := range drops {
		ch <- prometheus.MustNewConstMetric(descDropped, prometheus.CounterValue, float64(n), dropNames[i])
	}
	for i := range numOver {
		ch <- prometheus.MustNewConstMetric(descOverload, prometheus.CounterValue, float64(p.stats.overload[i].Load()), overNames[i])
	}
	ch <- prometheus.MustNewConstMetric(descCoalesced, prometheus.CounterValue, float64(p.stats.coalesced.Load()))
	ch <- prometheus.MustNewConstMetric(descRefreshes, prometheus.CounterValue, float64(p.stats.refreshes.Load()))
	ch <- prometheus.MustNewConstMetric(descResolveFailures, prometheus.CounterValue, float64(p.stats.failures.Load()))
	ch <- prometheus.MustNewConstMetric(descInflight, prometheus.GaugeValue, float64(p.Inflight()))
	p.stats.latency.Collect(ch)
}

// Answered returns how many queries were answered from each source, by
// source name; tests and the status command use it.
func (p *Pipeline) Answered() map[string]uint64 {
	out := make(map[string]uint64, numSources)
	for i := range numSources {
		out[sourceNames[i]] = p.stats.answers[i].Load()
	}
	p.workersMu.Lock()
	for _, w := range p.workers {
		for i := range numSources {
			out[sourceNames[i]] += w.answers[i].Load()
		}
	}
	p.workersMu.Unlock()
	return out
}
