package daemon

import (
	"maps"
	"net/netip"
	"testing"
)

// TestAnchorSourceToward: each IPv4 listen address's local route takes
// its source toward that listener's root-zone upstream (else its first
// route's), never another listener's, and an IPv6 one keeps its own.
func TestAnchorSourceToward(t *testing.T) {
	ap := netip.MustParseAddrPort
	a := netip.MustParseAddr
	node, pods, v6 := ap("169.254.10.10:53"), ap("169.254.10.11:53"), ap("[fd53::11]:53")
	routed := func(listen netip.AddrPort, zone string, servers ...netip.AddrPort) Route {
		r := NewRoute(zone, servers...)
		r.Listen = listen
		return r
	}
	tests := []struct {
		name   string
		listen []netip.AddrPort
		routes []Route
		want   map[netip.Addr]netip.Addr
	}{
		{"AKS: VNet DNS for the node, kube-dns for pods", []netip.AddrPort{node, pods}, []Route{
			routed(node, "cluster.local.", ap("10.0.0.10:53")),
			routed(node, ".", ap("168.63.129.16:53")),
			routed(pods, ".", ap("10.0.0.10:53")),
		}, map[netip.Addr]netip.Addr{a("169.254.10.10"): a("168.63.129.16"), a("169.254.10.11"): a("10.0.0.10")}},
		{"one route for every listener", []netip.AddrPort{node, pods}, []Route{NewRoute(".", ap("10.0.0.10:53"))},
			map[netip.Addr]netip.Addr{a("169.254.10.10"): a("10.0.0.10"), a("169.254.10.11"): a("10.0.0.10")}},
		{"no root zone: the first route with a server", []netip.AddrPort{pods}, []Route{
			routed(pods, "cluster.local.", ap("[fd00::10]:53"), ap("10.0.0.10:53")),
		}, map[netip.Addr]netip.Addr{a("169.254.10.11"): a("10.0.0.10")}},
		{"IPv6 upstreams only", []netip.AddrPort{pods}, []Route{routed(pods, ".", ap("[fd00::10]:53"))}, nil},
		{"IPv6 listener", []netip.AddrPort{v6}, []Route{NewRoute(".", ap("10.0.0.10:53"))}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Listen, cfg.Routes = tt.listen, tt.routes
			ac := cfg.anchorConfig()
			if !maps.Equal(ac.SourceToward, tt.want) {
				t.Errorf("SourceToward = %v, want %v", ac.SourceToward, tt.want)
			}
			if err := ac.Validate(); err != nil {
				t.Errorf("anchor config refused: %v", err)
			}
		})
	}
}
