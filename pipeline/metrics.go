package pipeline

import (
	"strconv"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// Answer sources, the label of dnsstandby_queries_total.
const (
	srcCache    = iota // a fresh cache entry
	srcStale           // a stale cache entry (RFC 8767)
	srcUpstream        // an upstream reply
	srcServfail        // nothing to answer with
	srcError           // FORMERR, NOTIMP, REFUSED (no route, or upstream over max_concurrent), BADVERS
	// srcTruncated: an empty answer with TC set, to a UDP client over its
	// cap (MaxPerClient), asking it to come again over TCP.
	srcTruncated
	numSources
)

var sourceNames = [numSources]string{"cache", "stale", "upstream", "servfail", "error", "truncated"}

// Query types counted by name, as CoreDNS's metrics name them; every other
// type is "other".
var typeNames = [...]string{"A", "AAAA", "PTR", "SRV", "CNAME", "TXT", "MX", "NS", "SOA", "HTTPS", "SVCB", "other"}

const numTypes = len(typeNames)

// typeIndex is t's place in typeNames.
func typeIndex(t uint16) int {
	switch t {
	case dns.TypeA:
		return 0
	case dns.TypeAAAA:
		return 1
	case dns.TypePTR:
		return 2
	case dns.TypeSRV:
		return 3
	case dns.TypeCNAME:
		return 4
	case dns.TypeTXT:
		return 5
	case dns.TypeMX:
		return 6
	case dns.TypeNS:
		return 7
	case dns.TypeSOA:
		return 8
	case dns.TypeHTTPS:
		return 9
	case dns.TypeSVCB:
		return 10
	}
	return numTypes - 1
}

// Rcodes counted by name; any other is "other".
var rcodeNames = [...]string{"NOERROR", "FORMERR", "SERVFAIL", "NXDOMAIN", "NOTIMP", "REFUSED", "BADVERS", "other"}

const numRcodes = len(rcodeNames)

// rcodeIndex is rcode's place in rcodeNames.
func rcodeIndex(rcode int) int {
	switch rcode {
	case dns.RcodeSuccess, dns.RcodeFormatError, dns.RcodeServerFailure, dns.RcodeNameError, dns.RcodeNotImplemented, dns.RcodeRefused:
		return rcode
	case dns.RcodeBadVers:
		return 6
	}
	return numRcodes - 1
}

// The transports a query came over.
var protoNames = [...]string{"udp", "tcp"}

func protoIndex(udp bool) int {
	if udp {
		return 0
	}
	return 1
}

// sampleEvery: the hot path times one answer in this many.
const sampleEvery = 64

// Reasons a query is dropped unanswered.
const (
	dropShort    = iota // shorter than a DNS header
	dropResponse        // QR=1: a response, not a query
	dropLong            // a TCP query longer than wire.MaxQueryLen
	numDrops
)

var dropNames = [numDrops]string{"short", "response", "long"}

// Caps that turned a query away from the upstreams.
const (
	overClient = iota // MaxPerClient
	overGlobal        // MaxInflight (its share for new names), the waiting caps
	overZone          // MaxPerZone
	numOver
)

var overNames = [numOver]string{"client", "global", "zone"}

// hotStats are one worker's counters: written by one goroutine only, so
// hot-path increments never bounce a cache line between cores.
type hotStats struct {
	answers  [numSources]atomic.Uint64
	drops    [numDrops]atomic.Uint64
	requests [len(protoNames)][numTypes]atomic.Uint64
	rcodes   [numRcodes]atomic.Uint64
	_        [64]byte
}

// missStats are the miss path's counters.
type missStats struct {
	answers   [numSources]atomic.Uint64
	rcodes    [numRcodes]atomic.Uint64
	overload  [numOver]atomic.Uint64
	coalesced atomic.Uint64
	refreshes atomic.Uint64
	failures  atomic.Uint64
	latency   prometheus.Histogram
	// durations is dnsstandby_response_duration_seconds; duration holds
	// its histogram of each source, looked up once.
	durations *prometheus.HistogramVec
	duration  [numSources]prometheus.Observer
}

// initHistograms makes the histograms.
func (s *missStats) initHistograms() {
	s.latency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "dnsstandby_resolve_duration_seconds",
		Help:    "Time to resolve a miss upstream, failures included.",
		Buckets: latencyBuckets,
	})
	s.durations = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "dnsstandby_response_duration_seconds",
		Help: "Time from a query to its answer, by what answered it (as dnsstandby_queries_total): " +
			"for the misses, from the cache's miss to the reply; cache, stale and error answers of the hot path are timed one in " + strconv.Itoa(sampleEvery) + ".",
		Buckets: durationBuckets,
	}, []string{"source"})
	for i := range numSources {
		s.duration[i] = s.durations.WithLabelValues(sourceNames[i])
	}
}

// durationBuckets span a cache hit (microseconds) to an upstream
// timeout (seconds).
var durationBuckets = []float64{.00001, .000025, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}

var latencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}

var (
	descQueries = prometheus.NewDesc("dnsstandby_queries_total",
		"Queries answered, by what answered them: cache, stale, upstream, servfail, error (FORMERR, NOTIMP, REFUSED, BADVERS; REFUSED for no route or an upstream group over its max_concurrent), truncated (empty, TC set: a UDP client over its per-client cap, to ask again over TCP).", []string{"source"}, nil)
	descDropped = prometheus.NewDesc("dnsstandby_queries_dropped_total",
		"Queries dropped unanswered: short (no DNS header), response (QR set), long (over TCP, longer than any query).", []string{"reason"}, nil)
	descOverload = prometheus.NewDesc("dnsstandby_upstream_capped_total",
		"Misses answered without asking upstream because a cap was reached (stale if the cache can, else SERVFAIL, or TC over UDP at the client cap): client (per source address and transport), zone (per fetch zone) or global (in flight, three quarters of it for names the cache does not know; waiting).", []string{"scope"}, nil)
	descCoalesced = prometheus.NewDesc("dnsstandby_coalesced_total",
		"Misses that joined an identical upstream query already in flight.", nil, nil)
	descRefreshes = prometheus.NewDesc("dnsstandby_stale_refreshes_total",
		"Background refreshes: of entries hit in the last tenth of their life, and of entries served stale in immediate mode.", nil, nil)
	descResolveFailures = prometheus.NewDesc("dnsstandby_resolve_failures_total",
		"Upstream resolutions that failed (every upstream errored or timed out, or the upstream group was over its max_concurrent).", nil, nil)
	descInflight = prometheus.NewDesc("dnsstandby_inflight",
		"Upstream resolutions in progress.", nil, nil)
	descRequests = prometheus.NewDesc("dnsstandby_requests_total",
		"Queries received and not dropped, by transport and query type (A, AAAA, PTR, SRV, CNAME, TXT, MX, NS, SOA, HTTPS, SVCB, other), as CoreDNS's coredns_dns_requests_total.", []string{"proto", "type"}, nil)
	descResponses = prometheus.NewDesc("dnsstandby_responses_total",
		"Answers sent, by rcode (NOERROR, FORMERR, SERVFAIL, NXDOMAIN, NOTIMP, REFUSED, BADVERS, other), as CoreDNS's coredns_dns_responses_total.", []string{"rcode"}, nil)
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
	for _, d := range []*prometheus.Desc{descQueries, descDropped, descOverload, descCoalesced, descRefreshes, descResolveFailures, descInflight, descRequests, descResponses} {
		ch <- d
	}
	p.stats.latency.Describe(ch)
	p.stats.durations.Describe(ch)
}

// Collect implements prometheus.Collector.
func (p *Pipeline) Collect(ch chan<- prometheus.Metric) {
	var answers [numSources]uint64
	var drops [numDrops]uint64
	var requests [len(protoNames)][numTypes]uint64
	var rcodes [numRcodes]uint64
	for i := range answers {
		answers[i] = p.stats.answers[i].Load()
	}
	for i := range rcodes {
		rcodes[i] = p.stats.rcodes[i].Load()
	}
	p.workersMu.Lock()
	for _, w := range p.workers {
		for i := range answers {
			answers[i] += w.answers[i].Load()
		}
		for i := range drops {
			drops[i] += w.drops[i].Load()
		}
		for i := range requests {
			for j := range requests[i] {
				requests[i][j] += w.requests[i][j].Load()
			}
		}
		for i := range rcodes {
			rcodes[i] += w.rcodes[i].Load()
		}
	}
	p.workersMu.Unlock()
	for i := range requests {
		for j, n := range requests[i] {
			ch <- prometheus.MustNewConstMetric(descRequests, prometheus.CounterValue, float64(n), protoNames[i], typeNames[j])
		}
	}
	for i, n := range rcodes {
		ch <- prometheus.MustNewConstMetric(descResponses, prometheus.CounterValue, float64(n), rcodeNames[i])
	}
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
	p.stats.durations.Collect(ch)
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
