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
	hedgesMetric        = "dnsstandby_hedges_total"
	hedgeOutcomesMetric = "dnsstandby_hedge_outcomes_total"
)

// standbyMetricsURL is dnsstandby's /metrics inside a node (standbyOptions'
// --metrics-addr).
const standbyMetricsURL = "http://127.0.0.1:9355/metrics"

// hedges reads dnsstandby's hedge counters from its /metrics inside the
// node, by listener address (169.254.10.11:53). A daemon that exports
// neither metric gives nil, no error: the report says n/a.
func (t *topology) hedges(ctx context.Context) (map[string]*lab.Hedges, error) {
	page, err := t.node.Run(ctx, "curl", "-sSf", "--max-time", "5", standbyMetricsURL)
	if err != nil {
		return nil, fmt.Errorf("dnsstandby metrics: %w", err)
	}
	m, err := testbed.ParseMetrics(strings.NewReader(page))
	if err != nil {
		return nil, fmt.Errorf("dnsstandby metrics: %w", err)
	}
	return hedgeCounts(m), nil
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
