package pipeline

import (
	"errors"
	"fmt"
	"slices"
	"unsafe"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/wire"
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
		switch {
		case r.Upstream == nil && r.Direct == nil:
			return nil, fmt.Errorf("route %s has no upstream", zone)
		case r.Direct == nil && r.Cache == nil:
			return nil, fmt.Errorf("route %s has no cache", zone)
		}
		if seen[zone] {
			return nil, fmt.Errorf("zone %s routed twice", zone)
		}
		seen[zone] = true
		wireZone := make([]byte, 256)
		n, err := dns.PackDomainName(zone, wireZone, 0, nil, false)
		if err != nil {
			return nil, fmt.Errorf("route zone %q: %w", r.Zone, err)
		}
		r.Zone, r.wireZone = zone, wireZone[:n]
		out = append(out, r)
	}
	slices.SortStableFunc(out, func(a, b Route) int {
		return dns.CountLabel(b.Zone) - dns.CountLabel(a.Zone)
	})
	return out, nil
}

// errNoRoute: no route with a cache covers the name.
var errNoRoute = errors.New("no cached route for the name")

// route returns the route for a wire-format name (any letter case), or nil
// if no zone covers it. It matches whole labels, as CoreDNS does, so that
// a name whose label holds an escaped dot (`a\.cluster.local.`) is not
// taken for a name under that zone. It does not allocate.
func (p *Pipeline) route(name []byte) *Route {
	routes := *p.routes.Load()
	for i := range routes {
		if inZone(name, routes[i].wireZone) {
			return &routes[i]
		}
	}
	return nil
}

// inZone reports whether the wire-format name (uncompressed, well formed)
// is zone (wire format, lower case) or under it.
func inZone(name, zone []byte) bool {
	for off := 0; off < len(name); off += int(name[off]) + 1 {
		if len(name)-off == len(zone) {
			return equalFold(name[off:], zone)
		}
		if len(name)-off < len(zone) || name[off] == 0 {
			return false
		}
	}
	return false
}

// equalFold compares a wire-format name with a lower-case one, folding
// ASCII letters only (RFC 4343). Length octets are below 64, so they never
// fold.
func equalFold(name, lower []byte) bool {
	for i, c := range name {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
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

// InsertMirror files a reply LocalDNS sent (the mirror feed) in the cache
// of the route its question falls under, as cache.InsertMirror checks
// it; a name no cached route covers is not filed. Errors are returned
// unwrapped: this runs for every reply LocalDNS sends, and the feed
// counts them by kind.
func (p *Pipeline) InsertMirror(resp []byte) error {
	var q wire.Query
	if err := wire.ParseQuery(resp, &q); err != nil {
		return err
	}
	r := p.route(q.QName)
	if r == nil || r.Cache == nil {
		return errNoRoute
	}
	return r.Cache.InsertMirrorParsed(resp, &q, 0)
}

// parsedReply is a reply Worker.PrefetchMirror parsed and routed.
type parsedReply struct {
	resp []byte // nil: none
	q    wire.Query
	r    *Route
	hint uint64 // cache.PrefetchMirror's, for cache.InsertMirrorParsed
}

// PrefetchMirror parses resp, a reply the mirror feed files next but one
// with InsertMirror, routes it, and asks the CPU to fetch what the cache
// will read for it (cache.PrefetchMirror). The tap shows each reply in
// its ring one record before it files the one before it.
func (w *Worker) PrefetchMirror(resp []byte) {
	a := &w.ahead[w.aheadNext]
	w.aheadNext = (w.aheadNext + 1) % len(w.ahead)
	*a = parsedReply{}
	if wire.ParseQuery(resp, &a.q) != nil {
		return
	}
	if r := w.p.route(a.q.QName); r != nil && r.Cache != nil {
		a.resp, a.r = resp, r
		a.hint = r.Cache.PrefetchMirror(&a.q)
	}
}

// InsertMirror is Pipeline.InsertMirror, which for one of the last two
// replies PrefetchMirror took (the same bytes in the same place: the
// tap's ring keeps a record where it is until the record is filed) does
// not parse and route the reply again. Those two are the most a reply
// can be behind its prefetch, so a parse is never taken for later bytes
// in the same place.
func (w *Worker) InsertMirror(resp []byte) error {
	for i := range w.ahead {
		a := &w.ahead[i]
		if a.resp != nil && len(a.resp) == len(resp) && unsafe.SliceData(a.resp) == unsafe.SliceData(resp) {
			a.resp = nil
			return a.r.Cache.InsertMirrorParsed(resp, &a.q, a.hint)
		}
	}
	return w.p.InsertMirror(resp)
}
