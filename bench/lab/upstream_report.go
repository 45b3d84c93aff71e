package lab

// UpstreamCounts are a node's queries to its upstreams over the run, read
// at its end, the same for every client of the node: what kube-dns
// received (from LocalDNS and dnsstandby together) and, where the node
// runs dnsstandby, what dnsstandby sent and how many of those were
// speculative attempts (a second try started before the first had
// failed). They count from the node's start, warm-up included: once
// LocalDNS's cache is warm, a short run leaves kube-dns next to nothing
// to count (healthy: one query in its 20 s after the warm-up, the
// cluster's TTL being 30 s).
type UpstreamCounts struct {
	// KubeDNSQueries is what kube-dns's CoreDNS received (all its pods
	// behind the ClusterIP), from its coredns_dns_requests_total; nil
	// where it could not be read.
	KubeDNSQueries *int `json:"kubedns_queries,omitempty"`
	// StandbyRequests is dnsstandby_upstream_requests_total (speculative
	// attempts included); nil where the node runs no dnsstandby or it was
	// not read.
	StandbyRequests *int `json:"standby_upstream_requests,omitempty"`
	// StandbySpeculative is dnsstandby_upstream_speculative_total; nil
	// where dnsstandby does not export it.
	StandbySpeculative *int `json:"standby_speculative,omitempty"`
}
