package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/dnsstandby/dnsstandby/bench/internal/testbed"
	"github.com/dnsstandby/dnsstandby/bench/lab"
)

// The metrics of dnsstandby's hedged answers, per listener: how many it
// sent by where the answer came from, and whether LocalDNS answered the
// query later or never.
const (
	hedgesMetric        = "dnsstandby_hedge_sent_total"
	hedgeOutcomesMetric = "dnsstandby_hedge_outcomes_total"
)

// standbyMetricsURL is dnsstandby's /metrics inside a node (standbyOptions'
// --metrics-addr).
const standbyMetricsURL = "http://127.0.0.1:9355/metrics"

// standbyMetrics reads dnsstandby's /metrics inside the node.
func (t *topology) standbyMetrics(ctx context.Context) (testbed.Metrics, error) {
	m, err := t.metrics(ctx, standbyMetricsURL)
	if err != nil {
		return nil, fmt.Errorf("dnsstandby metrics: %w", err)
	}
	return m, nil
}

// metricsPage is the page at url (a /metrics inside the node), read with
// the node's curl.
func (t *topology) metricsPage(ctx context.Context, url string) (string, error) {
	return t.node.Run(ctx, "curl", "-sSf", "--max-time", "5", url)
}

// metrics is the page at url, parsed.
func (t *topology) metrics(ctx context.Context, url string) (testbed.Metrics, error) {
	page, err := t.metricsPage(ctx, url)
	if err != nil {
		return nil, err
	}
	return testbed.ParseMetrics(strings.NewReader(page))
}

// The steering program's read test, per group (169.254.10.11:53/udp):
// packets it kept from dnsstandby's socket because earlier ones waited
// there unread past the limit, and the longest wait it saw within it.
const (
	unreadBypassedMetric = "dnsstandby_steer_unread_bypassed_total"
	unreadMaxWaitMetric  = "dnsstandby_steer_unread_max_wait_seconds"
)

// readTestNote says what the steering program's read test saw of the
// UDP group of listener (169.254.10.11:53) in the dnsstandby process
// running at the end (a restarted one's own): how many packets it kept
// from dnsstandby for not reading, and how close the longest wait came
// to the limit. Empty when the daemon has no read test there.
func readTestNote(m testbed.Metrics, listener string) string {
	group := map[string]string{"group": listener + "/udp"}
	if !m.Has(unreadMaxWaitMetric) || len(m.By(unreadMaxWaitMetric, "group", group)) == 0 {
		return ""
	}
	return fmt.Sprintf("steering read test of the dnsstandby running at the end: %.0f packets kept from dnsstandby for not reading, longest unread wait %.1f ms",
		m.Sum(unreadBypassedMetric, group), 1000*m.Sum(unreadMaxWaitMetric, group))
}

// hedgeCounts groups the hedge metrics by listener; nil when there are
// none. A counter vector shows no series before its first increment, so a
// daemon that hedges but has not hedged yet looks the same as one that
// cannot: both give nil.
func hedgeCounts(m testbed.Metrics) map[string]*lab.Hedges {
	if !m.Has(hedgesMetric) && !m.Has(hedgeOutcomesMetric) {
		return nil
	}
	out := map[string]*lab.Hedges{}
	get := func(listener string) *lab.Hedges {
		h := out[listener]
		if h == nil {
			h = &lab.Hedges{}
			out[listener] = h
		}
		return h
	}
	for _, s := range m {
		listener := string(s.Metric["listener"])
		n := int(s.Value)
		switch string(s.Metric["__name__"]) {
		case hedgesMetric:
			h := get(listener)
			h.Total += n
			switch s.Metric["source"] {
			case "cache":
				h.Cache += n
			case "stale":
				h.Stale += n
			case "upstream":
				h.Upstream += n
			}
		case hedgeOutcomesMetric:
			h := get(listener)
			switch s.Metric["localdns"] {
			case "later":
				h.Later += n
			case "never":
				h.Never += n
			}
		}
	}
	return out
}
