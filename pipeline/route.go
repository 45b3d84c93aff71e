package pipeline

import (
	"fmt"
	"slices"
	"strings"

	"github.com/miekg/dns"
)

// sortRoutes validates routes and orders them most specific zone first, so
// that the first match is the longest.
func sortRoutes(in []Route) ([]Route, error) {
	out := make([]Route, 0, len(in))
	seen := make(map[string]bool)
	for _, r := range in {
		zone := dns.CanonicalName(r.Zone)
		if _, ok := dns.IsDomainName(zone); !ok {
			return nil, fmt.Errorf("route zone %q is not a domain name", r.Zone)
		}
		if r.Upstream == nil && r.Direct == nil {
			return nil, fmt.Errorf("route %s has no upstream", zone)
		}
		if seen[zone] {
			return nil, fmt.Errorf("zone %s routed twice", zone)
		}
		seen[zone] = true
		out = append(out, Route{Zone: zone, Upstream: r.Upstream, Direct: r.Direct})
	}
	slices.SortStableFunc(out, func(a, b Route) int {
		return dns.CountLabel(b.Zone) - dns.CountLabel(a.Zone)
	})
	return out, nil
}

// route returns the route for a lower-case name, or nil if no zone
// covers it.
func (p *Pipeline) route(name string) *Route {
	routes := *p.routes.Load()
	for i := range routes {
		z := routes[i].Zone
		if z == "." || name == z || strings.HasSuffix(name, "."+z) {
			return &routes[i]
		}
	}
	return nil
}

// SetRoutes replaces the routes, as New checks them, at once for every
// query that looks one up afterwards; a resolution already under way
// finishes with the upstream it started with, so the caller closes a
// replaced upstream only once such resolutions are done (UpstreamTimeout
// bounds them).
func (p *Pipeline) SetRoutes(routes []Route) error {
	sorted, err := sortRoutes(routes)
	if err != nil {
		return fmt.Errorf("pipeline: Routes: %w", err)
	}
	p.routes.Store(&sorted)
	return nil
}
