package main

import (
	"cmp"
	"os"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/dnsstandby/dnsstandby/admin"
	"github.com/dnsstandby/dnsstandby/check"
	"github.com/dnsstandby/dnsstandby/takeover"
)

// statusHandler serves the admin socket: hold and release go to the
// takeover controller, and status is the controller's Status with the
// figures `dnsstandby check` weighs beside it (check.DaemonStatus): the
// options asked for, the upstreams, the mirror feed and the cache.
//
// The figures come from the daemon's own metrics registry, which every
// part registers with (upstream groups under their zone label, the tap or
// the dnstap receiver, the cache): the status then says what /metrics
// says, and needs no handle on parts that run sets up conditionally.
type statusHandler struct {
	admin.Handler                     // always non-nil: the takeover controller
	figures       prometheus.Gatherer // always non-nil: the daemon's registry
	cfg           check.DaemonConfig
	mirrorFeed    string // tap, dnstap or none
	maxEntries    int64
	maxBytes      int64
	pid           int
}

// newStatusHandler wraps the takeover controller for admin.Listen.
func newStatusHandler(ctrl admin.Handler, o *runOptions, figures prometheus.Gatherer) *statusHandler {
	feed, _, _ := parseMirror(o.mirror) // checked by parseRunFlags
	h := &statusHandler{
		Handler:    ctrl,
		figures:    figures,
		cfg:        check.DaemonConfig{Steering: o.steering, Mirror: o.mirror, AnchorLink: o.anchorLink},
		mirrorFeed: feed,
		maxEntries: int64(o.cacheEntries),
		maxBytes:   int64(o.cacheBytes),
		pid:        os.Getpid(),
	}
	for _, l := range o.listen {
		h.cfg.Listen = append(h.cfg.Listen, l.String())
	}
	return h
}

// Metric names the figures are read from (README "Metrics").
const (
	metricUpstreamHealthy   = "dnsstandby_upstream_healthy"
	metricMirrorRecords     = "dnsstandby_mirror_records_total"
	metricTapEnabled        = "dnsstandby_mirror_tap_enabled"
	metricDnstapConnections = "dnsstandby_mirror_dnstap_connections"
	metricCacheEntries      = "dnsstandby_cache_entries"
	metricCacheBytes        = "dnsstandby_cache_bytes"
	metricCacheEvictions    = "dnsstandby_cache_evictions_total"
)

// Status implements admin.Handler.
func (h *statusHandler) Status() any {
	ts, ok := h.Handler.Status().(takeover.Status)
	if !ok {
		return h.Handler.Status() // not the controller: nothing to add to
	}
	cfg := h.cfg
	st := check.DaemonStatus{Status: ts, PID: h.pid, Config: &cfg}
	// Gather returns what it could collect along with any error; a
	// figure that is missing stays at its zero value.
	fams, _ := h.figures.Gather()
	byName := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		byName[f.GetName()] = f
	}

	st.Upstreams = []check.DaemonUpstream{}
	for _, m := range byName[metricUpstreamHealthy].GetMetric() {
		st.Upstreams = append(st.Upstreams, check.DaemonUpstream{
			Zone:    cmp.Or(label(m, "zone"), "."),
			Server:  label(m, "server"),
			Healthy: value(m) == 1,
		})
	}
	slices.SortStableFunc(st.Upstreams, func(a, b check.DaemonUpstream) int { return cmp.Compare(a.Zone, b.Zone) })

	mirror := &check.DaemonMirror{Feed: h.mirrorFeed}
	switch h.mirrorFeed {
	case "tap":
		if f := byName[metricTapEnabled]; f != nil {
			mirror.Running = true
			mirror.Enabled = first(f) == 1
		}
	case "dnstap":
		if f := byName[metricDnstapConnections]; f != nil {
			mirror.Running, mirror.Enabled = true, true
			mirror.Connections = int(first(f))
		}
	}
	for _, m := range byName[metricMirrorRecords].GetMetric() {
		switch label(m, "result") {
		case "accepted":
			mirror.Accepted += uint64(value(m))
		case "rejected":
			mirror.Rejected += uint64(value(m))
		}
	}
	st.Mirror = mirror

	st.Cache = &check.DaemonCache{
		Entries:    int64(first(byName[metricCacheEntries])),
		Bytes:      int64(first(byName[metricCacheBytes])),
		Evictions:  uint64(first(byName[metricCacheEvictions])),
		MaxEntries: h.maxEntries,
		MaxBytes:   h.maxBytes,
	}
	return st
}

// label returns the value of the metric's label name, or "".
func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// value returns a gauge's or a counter's value.
func value(m *dto.Metric) float64 {
	if g := m.GetGauge(); g != nil {
		return g.GetValue()
	}
	return m.GetCounter().GetValue()
}

// first returns the value of a family's only (first) metric, or 0.
func first(f *dto.MetricFamily) float64 {
	if ms := f.GetMetric(); len(ms) > 0 {
		return value(ms[0])
	}
	return 0
}
