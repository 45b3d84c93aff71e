package lab

// UpstreamCounts are a node's queries to its upstreams from the fault on
// to the end of the run, the same for every client of the node: what
// kube-dns received (from LocalDNS and dnsstandby together) and, where the
// node runs dnsstandby, what dnsstandby sent and how many of those were
// speculative attempts (a second try started before the first had
// failed).
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
