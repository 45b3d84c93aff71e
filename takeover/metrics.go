package takeover

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// stats are the controller's counters, exported through Collect.
type stats struct {
	mode            atomic.Int32
	modeSince       atomic.Int64 // unix nanoseconds the current mode began
	probeOK         atomic.Uint64
	probeFail       atomic.Uint64
	adoptErrors     atomic.Uint64
	heartbeatErrors atomic.Uint64

	mu          sync.Mutex // guards transitions
	transitions map[[3]string]uint64

	durations *prometheus.HistogramVec // time spent in hold and takeover
	probeRTT  prometheus.Histogram     // answered probes of LocalDNS
}

// possibleTransitions are every mode change the Machine can make, as
// (from, to, reason); TestPossibleTransitions holds the list to the
// Machine. Their counters start at zero, so that increase() over them
// sees the first change too, not only the ones after it.
var possibleTransitions = []Transition{
	{From: Mirror, To: Takeover, Reason: ReasonPeerExit},
	{From: Mirror, To: Hold, Reason: ReasonPeerHung},
	{From: Mirror, To: Hold, Reason: ReasonPeerSilent},
	{From: Mirror, To: Hold, Reason: ReasonOperator},
	{From: Hold, To: Takeover, Reason: ReasonPeerExit},
	{From: Hold, To: Takeover, Reason: ReasonOperatorRelease},
	{From: Hold, To: Mirror, Reason: ReasonPeerHealthy},
	{From: Hold, To: Mirror, Reason: ReasonOperatorRelease},
	{From: Takeover, To: Hold, Reason: ReasonPeerRestarted},
	{From: Takeover, To: Hold, Reason: ReasonOperator},
}

func newStats() *stats {
	transitions := map[[3]string]uint64{}
	for _, tr := range possibleTransitions {
		transitions[[3]string{tr.From.String(), tr.To.String(), string(tr.Reason)}] = 0
	}
	durations := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "dnsstandby_mode_duration_seconds",
		Help:    "How long each stretch of hold or takeover lasted.",
		Buckets: []float64{0.1, 0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600},
	}, []string{"mode"})
	// Both modes' histograms exist from the start, as the transitions
	// do, so that rate() over them sees the first stretch too.
	for _, m := range []Mode{Hold, Takeover} {
		durations.WithLabelValues(m.String())
	}
	return &stats{
		transitions: transitions,
		durations:   durations,
		probeRTT: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "dnsstandby_peer_probe_duration_seconds",
			Help: "Round-trip time of the probes of LocalDNS it answered: a LocalDNS slowing down shows here before it fails them.",
			// From a healthy loopback answer to the probe timeout (300 ms).
			Buckets: []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3},
		}),
	}
}

func (s *stats) setMode(m Mode) {
	s.modeSince.Store(time.Now().UnixNano())
	s.mode.Store(int32(m))
}

func (s *stats) probe(ok bool, rtt time.Duration) {
	if ok {
		s.probeOK.Add(1)
		s.probeRTT.Observe(rtt.Seconds())
	} else {
		s.probeFail.Add(1)
	}
}

// transition counts tr; endedS is how long the mode it left lasted.
func (s *stats) transition(tr Transition, endedS float64) {
	s.setMode(tr.To)
	s.mu.Lock()
	s.transitions[[3]string{tr.From.String(), tr.To.String(), string(tr.Reason)}]++
	s.mu.Unlock()
	if tr.From != Mirror {
		s.durations.WithLabelValues(tr.From.String()).Observe(endedS)
	}
}

var (
	descMode = prometheus.NewDesc("dnsstandby_mode",
		"1 for the current mode: mirror (LocalDNS answers), hold (LocalDNS bound but kept from traffic), takeover (LocalDNS gone).", []string{"mode"}, nil)
	descModeSince = prometheus.NewDesc("dnsstandby_mode_entered_timestamp_seconds",
		"When the current mode began, in seconds since the epoch: time() minus it is how long the mode has lasted.", nil, nil)
	descTransitions = prometheus.NewDesc("dnsstandby_mode_transitions_total",
		"Mode changes by from, to and reason.", []string{"from", "to", "reason"}, nil)
	descFailovers = prometheus.NewDesc("dnsstandby_failovers_total",
		"Changes from mirror to hold or takeover, by reason.", []string{"reason"}, nil)
	descFailbacks = prometheus.NewDesc("dnsstandby_failbacks_total",
		"Changes back to mirror, by reason.", []string{"reason"}, nil)
	descProbes = prometheus.NewDesc("dnsstandby_peer_probes_total",
		"Probes of LocalDNS by result.", []string{"result"}, nil)
	descPeerSockets = prometheus.NewDesc("dnsstandby_peer_sockets",
		"LocalDNS sockets seen in our reuseport groups.", nil, nil)
	descAdopted = prometheus.NewDesc("dnsstandby_peer_sockets_adopted",
		"LocalDNS sockets in the steering maps.", nil, nil)
	descAdoptErrors = prometheus.NewDesc("dnsstandby_peer_adopt_errors_total",
		"LocalDNS sockets that could not be adopted into the steering maps.", nil, nil)
	// descAnchorReady stands in for the anchor's own gauge when the anchor
	// could not be made.
	descAnchorReady = prometheus.NewDesc("dnsstandby_anchor_ready",
		"1 when the anchor link is up with every listen address on it.", nil, nil)
	descHeartbeatErrors = prometheus.NewDesc("dnsstandby_steer_heartbeat_errors_total",
		"Heartbeats that could not be written to the steering program.", nil, nil)
	// descHeartbeatErrorsOld is descHeartbeatErrors under the name it had
	// before every steering metric took the steer_ prefix, exported beside
	// it for one release (CHANGELOG.md says when it goes).
	descHeartbeatErrorsOld = prometheus.NewDesc("dnsstandby_steering_heartbeat_errors_total",
		"Deprecated: dnsstandby_steer_heartbeat_errors_total under its old name, removed in the release after the first tagged one.", nil, nil)
)

// Describe implements prometheus.Collector.
func (c *Controller) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descMode, descModeSince, descTransitions, descFailovers, descFailbacks, descProbes,
		descPeerSockets, descAdopted, descAdoptErrors, descHeartbeatErrors, descHeartbeatErrorsOld, descFallback} {
		ch <- d
	}
	c.stats.durations.Describe(ch)
	c.stats.probeRTT.Describe(ch)
	c.steer.Describe(ch) // dnsstandby_steer_*
	if c.anchor != nil {
		c.anchor.Describe(ch) // dnsstandby_anchor_*
	} else if c.anchorFailed {
		ch <- descAnchorReady
	}
}

// Collect implements prometheus.Collector.
func (c *Controller) Collect(ch chan<- prometheus.Metric) {
	s := c.stats
	cur := Mode(s.mode.Load())
	for _, m := range []Mode{Mirror, Hold, Takeover} {
		v := 0.0
		if m == cur {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(descMode, prometheus.GaugeValue, v, m.String())
	}
	ch <- prometheus.MustNewConstMetric(descModeSince, prometheus.GaugeValue, float64(s.modeSince.Load())/1e9)
	failovers, failbacks := map[string]uint64{}, map[string]uint64{}
	s.mu.Lock()
	for k, n := range s.transitions {
		ch <- prometheus.MustNewConstMetric(descTransitions, prometheus.CounterValue, float64(n), k[0], k[1], k[2])
		switch {
		case k[0] == "mirror":
			failovers[k[2]] += n
		case k[1] == "mirror":
			failbacks[k[2]] += n
		}
	}
	s.mu.Unlock()
	for r, n := range failovers {
		ch <- prometheus.MustNewConstMetric(descFailovers, prometheus.CounterValue, float64(n), r)
	}
	for r, n := range failbacks {
		ch <- prometheus.MustNewConstMetric(descFailbacks, prometheus.CounterValue, float64(n), r)
	}
	ch <- prometheus.MustNewConstMetric(descProbes, prometheus.CounterValue, float64(s.probeOK.Load()), "ok")
	ch <- prometheus.MustNewConstMetric(descProbes, prometheus.CounterValue, float64(s.probeFail.Load()), "fail")
	c.mu.Lock()
	sockets := len(c.peer.Sockets)
	adopted := 0
	for g, in := range c.adopted {
		adopted += len(in) - c.mptcp[g]
	}
	c.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(descPeerSockets, prometheus.GaugeValue, float64(sockets))
	ch <- prometheus.MustNewConstMetric(descAdopted, prometheus.GaugeValue, float64(adopted))
	ch <- prometheus.MustNewConstMetric(descAdoptErrors, prometheus.CounterValue, float64(s.adoptErrors.Load()))
	ch <- prometheus.MustNewConstMetric(descHeartbeatErrors, prometheus.CounterValue, float64(s.heartbeatErrors.Load()))
	ch <- prometheus.MustNewConstMetric(descHeartbeatErrorsOld, prometheus.CounterValue, float64(s.heartbeatErrors.Load()))
	c.collectFallback(ch)
	s.probeRTT.Collect(ch)
	c.steer.Collect(ch)
	if c.anchor != nil {
		c.anchor.Collect(ch)
	} else if c.anchorFailed {
		ch <- prometheus.MustNewConstMetric(descAnchorReady, prometheus.GaugeValue, 0)
	}
	s.durations.Collect(ch)
}
