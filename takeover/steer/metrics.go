package steer

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics, namespace dnsstandby, subsystem steer. A Steerer is a
// prometheus.Collector: register it, and every scrape reads the state (the
// peer counts straight from the sockarrays, so they show sockets LocalDNS
// closed as gone).
var (
	// levelDesc is 1 for the steering level in use, 0 for the others.
	levelDesc = prometheus.NewDesc("dnsstandby_steer_level",
		"Steering level in use (1) among off, own and adopt.", []string{"level"}, nil)
	// wantedDesc is 1 for the highest level asked for (Config.Want; auto
	// asks for adopt), so that an alert can compare it with the level in
	// use whatever level a node is deployed with.
	wantedDesc = prometheus.NewDesc("dnsstandby_steer_level_wanted",
		"Highest steering level asked for (1) among off, own and adopt; auto asks for adopt.", []string{"level"}, nil)
	// modeDesc is 1 for the mode the program applies now (after the level
	// is taken into account), 0 for the others.
	modeDesc = prometheus.NewDesc("dnsstandby_steer_mode",
		"Steering mode the program applies (1) among hash, to-peer and to-us.", []string{"mode"}, nil)
	// groupLevelDesc is 1 for the level each group steers at: own for a
	// group whose LocalDNS socket could not be adopted (MPTCP).
	groupLevelDesc = prometheus.NewDesc("dnsstandby_steer_group_level",
		"Steering level of each reuseport group (1) among own and adopt.", []string{"group", "level"}, nil)
	// peersDesc counts the live LocalDNS sockets in each group's map.
	peersDesc = prometheus.NewDesc("dnsstandby_steer_peers",
		"LocalDNS sockets adopted into the group's steering map and still open.", []string{"group"}, nil)
	// heartbeatAgeDesc is the time since the last successful Heartbeat;
	// past the stall limit the program no longer selects our socket.
	heartbeatAgeDesc = prometheus.NewDesc("dnsstandby_steer_heartbeat_age_seconds",
		"Seconds since the steering heartbeat was last written.", nil, nil)
	// unreadBypassedDesc counts the packets the program did not give our
	// socket because earlier ones had waited on it unread past the limit
	// (only packets that would have come to us: in to-us, or in to-peer
	// with no peer). Groups with the read test only (Reads).
	unreadBypassedDesc = prometheus.NewDesc("dnsstandby_steer_unread_bypassed_total",
		"Packets the steering program kept from our socket because packets had waited on it unread past the limit (a stalled dnsstandby).", []string{"group"}, nil)
	// unreadMaxWaitDesc is the longest the program saw a packet wait on
	// our socket unread, within the limit: how close a dnsstandby that
	// reads came to being taken for stalled.
	unreadMaxWaitDesc = prometheus.NewDesc("dnsstandby_steer_unread_max_wait_seconds",
		"Longest the steering program saw packets wait on our socket unread without passing the limit.", []string{"group"}, nil)
	// mapErrorsDesc counts failed map writes by map (config, sockarray).
	mapErrorsDesc = prometheus.NewDesc("dnsstandby_steer_map_update_errors_total",
		"Failed writes to the steering maps.", []string{"map"}, nil)
	// adoptionsDesc counts LocalDNS sockets put into a peer slot.
	adoptionsDesc = prometheus.NewDesc("dnsstandby_steer_adoptions_total",
		"LocalDNS sockets adopted into a steering map.", nil, nil)
)

// Describe implements prometheus.Collector.
func (s *Steerer) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{levelDesc, wantedDesc, modeDesc, groupLevelDesc, peersDesc, heartbeatAgeDesc,
		unreadBypassedDesc, unreadMaxWaitDesc, mapErrorsDesc, adoptionsDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (s *Steerer) Collect(ch chan<- prometheus.Metric) {
	for _, l := range []Level{Off, Own, Adopt} {
		ch <- prometheus.MustNewConstMetric(levelDesc, prometheus.GaugeValue, b2f(l == s.level), l.String())
		ch <- prometheus.MustNewConstMetric(wantedDesc, prometheus.GaugeValue, b2f(l == s.want), l.String())
	}
	ch <- prometheus.MustNewConstMetric(mapErrorsDesc, prometheus.CounterValue, float64(s.configErrors.Load()), "config")
	ch <- prometheus.MustNewConstMetric(mapErrorsDesc, prometheus.CounterValue, float64(s.sockarrayErrors.Load()), "sockarray")
	ch <- prometheus.MustNewConstMetric(adoptionsDesc, prometheus.CounterValue, float64(s.adoptions.Load()))

	s.mu.Lock()
	defer s.mu.Unlock()
	eff := s.cfg.Mode.effective(s.level)
	if s.closed {
		eff = Hash
	}
	for _, m := range []Mode{Hash, ToPeer, ToUs} {
		ch <- prometheus.MustNewConstMetric(modeDesc, prometheus.GaugeValue, b2f(m == eff), m.String())
	}
	if !s.lastBeat.IsZero() {
		ch <- prometheus.MustNewConstMetric(heartbeatAgeDesc, prometheus.GaugeValue, time.Since(s.lastBeat).Seconds())
	}
	for _, name := range s.order {
		g := s.groups[name]
		if n, err := g.peers(); err == nil {
			ch <- prometheus.MustNewConstMetric(peersDesc, prometheus.GaugeValue, float64(n), name)
		}
		if g.reads != nil {
			if bypassed, maxWait, err := g.liveValue(); err == nil {
				ch <- prometheus.MustNewConstMetric(unreadBypassedDesc, prometheus.CounterValue, float64(bypassed), name)
				ch <- prometheus.MustNewConstMetric(unreadMaxWaitDesc, prometheus.GaugeValue, maxWait.Seconds(), name)
			}
		}
		gl := g.level(s.level)
		for _, l := range []Level{Own, Adopt} {
			ch <- prometheus.MustNewConstMetric(groupLevelDesc, prometheus.GaugeValue, b2f(l == gl), name, l.String())
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
