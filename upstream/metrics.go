package upstream

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// proto is the transport of an attempt.
type proto uint8

const (
	protoUDP proto = iota
	protoTCP
	numProtos
)

func (p proto) String() string {
	if p == protoTCP {
		return "tcp"
	}
	return "udp"
}

// reason classifies what went wrong on the way to a server.
type reason uint8

const (
	// reasonTimeout: the attempt's own Timeout passed without a reply, or
	// the caller's deadline after at least half of it.
	reasonTimeout reason = iota
	// reasonRefused: ICMP port unreachable on UDP, or a refused TCP dial.
	reasonRefused
	// reasonNetwork: any other socket error.
	reasonNetwork
	// reasonMismatch: a datagram or message that does not answer the
	// query (wrong source, ID or question: spoofed, late or stray). It is
	// ignored and the read goes on.
	reasonMismatch
	// reasonMalformed: a matching reply that does not unpack; ignored too.
	reasonMalformed
	// reasonCase: a reply that matches but for the letter case of the
	// question's name (spoofed, or from a server that does not keep
	// case); ignored too.
	reasonCase
	// reasonTCPClosed: a pooled TCP connection the server had closed; the
	// query is retried once on a fresh one.
	reasonTCPClosed
	numReasons
)

func (r reason) String() string {
	switch r {
	case reasonTimeout:
		return "timeout"
	case reasonRefused:
		return "refused"
	case reasonNetwork:
		return "network"
	case reasonMismatch:
		return "mismatch"
	case reasonMalformed:
		return "malformed"
	case reasonCase:
		return "case_mismatch"
	case reasonTCPClosed:
		return "tcp_closed"
	}
	return "unknown"
}

// durationBuckets are CoreDNS's plugin.TimeBuckets (0.25 ms to 8 s,
// doubling), so that this histogram lines up with CoreDNS's
// coredns_forward_request_duration_seconds on one dashboard.
var durationBuckets = prometheus.ExponentialBuckets(0.00025, 2, 16)

const numBuckets = 16

// serverMetrics are one server's counters: plain atomics on the query
// path, turned into Prometheus metrics only when scraped.
type serverMetrics struct {
	requests [numProtos]atomic.Uint64
	errors   [numReasons]atomic.Uint64
	buckets  [numBuckets + 1]atomic.Uint64 // per bucket, not cumulative; the last is +Inf
	sumNanos atomic.Int64
}

func (m *serverMetrics) sent(p proto)   { m.requests[p].Add(1) }
func (m *serverMetrics) count(r reason) { m.errors[r].Add(1) }

// observe records the latency of an accepted reply.
func (m *serverMetrics) observe(d time.Duration) {
	s := d.Seconds()
	i := 0
	for i < numBuckets && s > durationBuckets[i] {
		i++
	}
	m.buckets[i].Add(1)
	m.sumNanos.Add(int64(d))
}

// ServerStats is a point-in-time copy of one server's state and counters.
type ServerStats struct {
	Server   string            // host:port as configured
	Healthy  bool              // not marked down
	Fails    int               // consecutive failed attempts
	Requests map[string]uint64 // queries sent, by proto: udp, tcp
	Errors   map[string]uint64 // by reason, as in dnsstandby_upstream_errors_total
	Replies  uint64            // replies accepted, as timed by the histogram
}

// Stats returns every server's state and counters, in Config order.
func (g *Group) Stats() []ServerStats {
	out := make([]ServerStats, len(g.servers))
	for i, s := range g.servers {
		st := ServerStats{
			Server:   s.name,
			Healthy:  !s.down.Load(),
			Fails:    int(s.fails.Load()),
			Requests: make(map[string]uint64, numProtos),
			Errors:   make(map[string]uint64, numReasons),
		}
		for p := range numProtos {
			st.Requests[p.String()] = s.metrics.requests[p].Load()
		}
		for r := range numReasons {
			st.Errors[r.String()] = s.metrics.errors[r].Load()
		}
		for j := range s.metrics.buckets {
			st.Replies += s.metrics.buckets[j].Load()
		}
		out[i] = st
	}
	return out
}

// Metric help texts, also the tests' expected exposition.
const (
	helpRequests = "Queries sent to an upstream server, by transport; TC and pool retries count again, health probes do not."
	helpErrors   = "Upstream failures and ignored replies, by reason: timeout, refused, network, mismatch, malformed, case_mismatch, tcp_closed."
	helpDuration = "Time from sending a query to a server to accepting its reply, TC retry over TCP included."
	helpHealthy  = "1 if the upstream server is in service, 0 if it is marked down and being probed."
	helpCase     = "1 while questions to the upstream server go in random letter case (0x20), 0 once it was seen not to keep case and is asked in the client's."
	helpRejects  = "Queries refused without asking any server because MaxConcurrent queries were in flight (CoreDNS: coredns_forward_max_concurrent_rejects_total)."
	helpSpec     = "Speculative attempts started beside an attempt unanswered at its server's speculative deadline, by reason (next_server, fresh_socket) and result (won: its reply was used; lost: another attempt's was, or none came)."
	helpSkipped  = "Speculative attempts not started for a cap, by reason: share (those proved extra reached SpeculativeShare of the queries sent), rate (SpeculativeRate)."
)

// Metric descriptions.
var (
	descRequests = prometheus.NewDesc("dnsstandby_upstream_requests_total", helpRequests, []string{"server", "proto"}, nil)
	descErrors   = prometheus.NewDesc("dnsstandby_upstream_errors_total", helpErrors, []string{"server", "reason"}, nil)
	descDuration = prometheus.NewDesc("dnsstandby_upstream_duration_seconds", helpDuration, []string{"server"}, nil)
	descHealthy  = prometheus.NewDesc("dnsstandby_upstream_healthy", helpHealthy, []string{"server"}, nil)
	descCase     = prometheus.NewDesc("dnsstandby_upstream_case_randomized", helpCase, []string{"server"}, nil)
	descRejects  = prometheus.NewDesc("dnsstandby_upstream_max_concurrent_rejects_total", helpRejects, nil, nil)
	descSpec     = prometheus.NewDesc("dnsstandby_upstream_speculative_total", helpSpec, []string{"reason", "result"}, nil)
	descSkipped  = prometheus.NewDesc("dnsstandby_upstream_speculative_skipped_total", helpSkipped, []string{"reason"}, nil)
)

// Describe implements prometheus.Collector.
func (g *Group) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRequests, descErrors, descDuration, descHealthy, descCase, descRejects, descSpec, descSkipped} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (g *Group) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descRejects, prometheus.CounterValue, float64(g.rejects.Load()))
	for r := range numSpecReasons {
		for res := range numSpecResults {
			ch <- prometheus.MustNewConstMetric(descSpec, prometheus.CounterValue, float64(g.spec.started[r][res].Load()), r.String(), res.String())
		}
	}
	for r := range numSpecSkips {
		ch <- prometheus.MustNewConstMetric(descSkipped, prometheus.CounterValue, float64(g.spec.skipped[r].Load()), r.String())
	}
	for _, s := range g.servers {
		m := &s.metrics
		for p := range numProtos {
			ch <- prometheus.MustNewConstMetric(descRequests, prometheus.CounterValue, float64(m.requests[p].Load()), s.name, p.String())
		}
		for r := range numReasons {
			ch <- prometheus.MustNewConstMetric(descErrors, prometheus.CounterValue, float64(m.errors[r].Load()), s.name, r.String())
		}
		// Buckets are read one by one while queries go on, so count is
		// their sum as read: the histogram stays self-consistent.
		cum := make(map[float64]uint64, numBuckets)
		var n uint64
		for i, ub := range durationBuckets {
			n += m.buckets[i].Load()
			cum[ub] = n
		}
		n += m.buckets[numBuckets].Load()
		sum := time.Duration(m.sumNanos.Load()).Seconds()
		ch <- prometheus.MustNewConstHistogram(descDuration, n, sum, cum, s.name)
		healthy := 1.0
		if s.down.Load() {
			healthy = 0
		}
		ch <- prometheus.MustNewConstMetric(descHealthy, prometheus.GaugeValue, healthy, s.name)
		caps := 0.0
		if s.caps.Load() {
			caps = 1
		}
		ch <- prometheus.MustNewConstMetric(descCase, prometheus.GaugeValue, caps, s.name)
	}
}
