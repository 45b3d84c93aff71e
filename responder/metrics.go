package responder

import "github.com/prometheus/client_golang/prometheus"

var (
	descUDPTruncated = prometheus.NewDesc("dnsstandby_udp_oversized_queries_total",
		"UDP datagrams dropped because they were larger than any DNS query.", nil, nil)
	descUDPSendFailures = prometheus.NewDesc("dnsstandby_udp_send_failures_total",
		"UDP answers the kernel refused to send.", nil, nil)
	descUDPReadErrors = prometheus.NewDesc("dnsstandby_udp_read_errors_total",
		"Errors from recvmmsg on the UDP sockets.", nil, nil)
	descTCPAccepted = prometheus.NewDesc("dnsstandby_tcp_connections_accepted_total",
		"TCP connections accepted.", nil, nil)
	descTCPEvicted = prometheus.NewDesc("dnsstandby_tcp_connections_evicted_total",
		"TCP connections closed to admit a new one, by reason: idle (the longest idle, at the connection cap), busy (at the cap with none idle, the oldest of the address holding the most; its waiting queries dropped), address (at the new one's address's own cap, one of that address's).", []string{"reason"}, nil)
	descTCPRejected = prometheus.NewDesc("dnsstandby_tcp_connections_rejected_total",
		"TCP connections closed at once because the server was draining.", nil, nil)
	descTCPOversized = prometheus.NewDesc("dnsstandby_tcp_oversized_queries_total",
		"TCP connections closed because a query's length was over 512 bytes, longer than any DNS query.", nil, nil)
	descTCPWriteOverflows = prometheus.NewDesc("dnsstandby_tcp_write_overflows_total",
		"TCP connections closed because the answers waiting to be written to them passed the queue's bound: a client not reading its answers.", nil, nil)
	descTCPOpen = prometheus.NewDesc("dnsstandby_tcp_connections",
		"Open TCP connections.", nil, nil)
)

// Describe implements prometheus.Collector.
func (s *Server) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descUDPTruncated, descUDPSendFailures, descUDPReadErrors, descTCPAccepted, descTCPEvicted, descTCPRejected, descTCPOversized, descTCPWriteOverflows, descTCPOpen} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (s *Server) Collect(ch chan<- prometheus.Metric) {
	st := &s.stats
	counter := func(d *prometheus.Desc, v uint64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	counter(descUDPTruncated, st.udpTruncatedQueries.Load())
	counter(descUDPSendFailures, st.udpSendFailures.Load())
	counter(descUDPReadErrors, st.udpReadErrors.Load())
	counter(descTCPAccepted, st.tcpAccepted.Load())
	for i := range st.tcpEvicted {
		ch <- prometheus.MustNewConstMetric(descTCPEvicted, prometheus.CounterValue, float64(st.tcpEvicted[i].Load()), evictionNames[i])
	}
	counter(descTCPRejected, st.tcpRejected.Load())
	counter(descTCPOversized, st.tcpOversized.Load())
	counter(descTCPWriteOverflows, st.tcpWriteOverflows.Load())
	ch <- prometheus.MustNewConstMetric(descTCPOpen, prometheus.GaugeValue, float64(st.tcpOpen.Load()))
}
