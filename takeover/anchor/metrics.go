package anchor

import "github.com/prometheus/client_golang/prometheus"

var (
	// descReadds counts repairs after start, by what was put back: "link"
	// (re-created after someone deleted it; its addresses come with it and
	// are not counted again), "up" (set up after someone set it down),
	// "address" (re-added to a link that still existed).
	descReadds = prometheus.NewDesc("dnsstandby_anchor_readds_total",
		"Things someone removed from the anchor link and the anchor put back, by what (link, up, address).",
		[]string{"what"}, nil)
	// descResyncs counts full repair passes after a netlink subscription
	// failed, usually ENOBUFS: the kernel dropped events for us.
	descResyncs = prometheus.NewDesc("dnsstandby_anchor_resyncs_total",
		"Full resyncs of the anchor after a netlink subscription failed (events were dropped).", nil, nil)
	// descRepairErrors counts failed repair passes; each is retried.
	descRepairErrors = prometheus.NewDesc("dnsstandby_anchor_repair_errors_total",
		"Anchor repair passes that failed and were retried.", nil, nil)
	// descReady is 1 while the link is up with every address present.
	descReady = prometheus.NewDesc("dnsstandby_anchor_ready",
		"1 while the anchor link is up and holds every listen address, else 0.", nil, nil)
	// descAddresses is how many of the configured addresses are present.
	descAddresses = prometheus.NewDesc("dnsstandby_anchor_addresses",
		"Listen addresses present on the anchor link.", nil, nil)
)

// Describe implements prometheus.Collector.
func (a *Anchor) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descReadds, descResyncs, descRepairErrors, descReady, descAddresses} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (a *Anchor) Collect(ch chan<- prometheus.Metric) {
	s := a.Stats()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	counter(descReadds, s.LinkReadds, "link")
	counter(descReadds, s.UpReadds, "up")
	counter(descReadds, s.AddressReadds, "address")
	counter(descResyncs, s.Resyncs)
	counter(descRepairErrors, s.RepairErrors)
	ready := 0.0
	if s.Ready {
		ready = 1
	}
	ch <- prometheus.MustNewConstMetric(descReady, prometheus.GaugeValue, ready)
	ch <- prometheus.MustNewConstMetric(descAddresses, prometheus.GaugeValue, float64(s.Addresses))
}
