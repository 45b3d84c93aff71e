package lab

// UpstreamCounts are a node's queries to its upstreams from the fault on
// (Since), the same for every client of the node: what kube-dns received
// (from LocalDNS and dnsstandby together) and, where the node runs
// dnsstandby, what dnsstandby sent and how many of those were speculative
// attempts (a second try started before the first had failed). The
// warm-up is left out: LocalDNS starts cold under the full load and drops
// queries at first, which dnsstandby answers, so its upstream queries then
// say nothing about a healthy node.
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
	// StandbyToKubeDNS is the part of StandbyRequests sent to kube-dns's
	// ClusterIP: dnsstandby's own share of KubeDNSQueries.
	StandbyToKubeDNS *int `json:"standby_to_kubedns,omitempty"`
	// LocalDNSToKubeDNS is what LocalDNS forwarded to kube-dns's ClusterIP
	// and had answered (its proxy's duration histogram's count); nil where
	// it was not read.
	LocalDNSToKubeDNS *int `json:"localdns_to_kubedns,omitempty"`
}

// Since is u less base (the counts at the fault): a field is nil where
// either lacks it.
func (u *UpstreamCounts) Since(base *UpstreamCounts) *UpstreamCounts {
	if u == nil || base == nil {
		return nil
	}
	diff := func(a, b *int) *int {
		if a == nil || b == nil {
			return nil
		}
		d := *a - *b
		return &d
	}
	return &UpstreamCounts{
		KubeDNSQueries:     diff(u.KubeDNSQueries, base.KubeDNSQueries),
		StandbyRequests:    diff(u.StandbyRequests, base.StandbyRequests),
		StandbySpeculative: diff(u.StandbySpeculative, base.StandbySpeculative),
		StandbyToKubeDNS:   diff(u.StandbyToKubeDNS, base.StandbyToKubeDNS),
		LocalDNSToKubeDNS:  diff(u.LocalDNSToKubeDNS, base.LocalDNSToKubeDNS),
	}
}
