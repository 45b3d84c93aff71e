package daemon

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/dnsstandby/dnsstandby/cache"
	"github.com/dnsstandby/dnsstandby/corefile"
	"github.com/dnsstandby/dnsstandby/upstream"
)

// This file is the Corefile contract: which of LocalDNS's settings the
// daemon takes over (ApplyCorefile), and which it does not imitate and
// says so at start (ignored).

// ApplyCorefile takes from a LocalDNS Corefile's blocks (those serving
// the listen addresses, as corefile.Parse selected them):
//   - per zone with a forward, templates, hosts or whoami, on each of
//     cfg.Listen its block serves: a Route with its template stanzas, its
//     hosts plugin, whoami, its forward's servers, policy, force_tcp,
//     max_concurrent, max_fails, health_check (with no_rec and domain),
//     expire and failfast_all_unhealthy_upstreams, and its cache plugin's
//     capacity (success and denial together), TTL caps and floors,
//     SERVFAIL TTL, serve_stale duration and mode;
//   - into Ignored: every option and plugin LocalDNS uses that dnsstandby
//     does not imitate, and every note of the parser.
//
// It replaces cfg.Routes when the Corefile has any. The caller applies
// command-line settings afterwards, so that they win.
func ApplyCorefile(cfg *Config, s corefile.Settings) {
	cfg.Corefile = s.File
	var routes []Route
	for i := range s.Zones {
		z := &s.Zones[i]
		cfg.Ignored = append(cfg.Ignored, ignored(*z)...)
		if len(z.Upstreams) == 0 && len(z.Templates) == 0 && z.Hosts == nil && !z.Whoami {
			continue
		}
		for _, ap := range cfg.Listen {
			if s.ServesAt(z, ap) {
				routes = append(routes, zoneRoute(cfg, ap, *z))
			}
		}
	}
	for _, n := range s.Notes {
		cfg.Ignored = append(cfg.Ignored, n.String())
	}
	if len(routes) > 0 {
		cfg.Routes = routes
	}
}

// blockCache is the cache policy of a block's cache plugin, over the
// daemon's defaults for what the plugin does not set (the stale TTL). A
// block without serve_stale keeps the default stale window in verify
// mode: stale entries then go out only when the upstreams fail, where
// LocalDNS would answer SERVFAIL — a standby's last resort (listed in
// Ignored).
func blockCache(defaults cache.Config, pc *corefile.Cache) *cache.Config {
	c := defaults
	c.MaxEntries = pc.SuccessCapacity + pc.DenialCapacity
	c.MaxTTL, c.MaxNegTTL = pc.MaxTTL, pc.MaxNegTTL
	c.MinTTL, c.MinNegTTL = pc.MinTTL, pc.MinNegTTL
	c.ServfailTTL = pc.ServfailTTL
	c.MaxStale = pc.ServeStale
	c.StaleMode = cache.StaleImmediate
	if pc.StaleVerify {
		c.StaleMode = cache.StaleVerify
	}
	if pc.ServeStale == 0 {
		c.MaxStale, c.StaleMode = defaults.MaxStale, cache.StaleVerify
	}
	return &c
}

// zoneRoute is the route of zone z's block on the listen address ap.
func zoneRoute(cfg *Config, ap netip.AddrPort, z corefile.Zone) Route {
	r := NewRoute(z.Name, z.Upstreams...)
	r.Listen = ap
	r.Templates, r.Hosts = z.Templates, z.Hosts
	r.Whoami = z.Whoami && len(z.Upstreams) == 0 // after a forward, whoami never answers
	if z.Cache != nil && !r.Whoami {
		r.Cache = blockCache(cfg.Cache, z.Cache)
	}
	if len(z.Upstreams) == 0 {
		// No forward (or none dnsstandby can use): its settings are
		// zero and have nothing to apply to.
		return r
	}
	u := &r.Upstream
	u.Policy = upstream.Policy(z.ForwardPolicy)
	u.FailFast = z.FailfastAllUnhealthy
	u.ForceTCP = z.ForceTCP
	u.MaxConcurrent = z.MaxConcurrent
	u.MaxFails = z.MaxFails
	u.HealthCheckNoRec = z.HealthCheckNoRec
	if z.HealthCheckDomain != "" { // "": CoreDNS's ".", the default
		u.HealthCheckDomain = z.HealthCheckDomain
	}
	// A zero interval or expiry has no use here; keep the defaults.
	if z.HealthCheck > 0 {
		u.HealthCheck = z.HealthCheck
	} else {
		cfg.Ignored = append(cfg.Ignored, fmt.Sprintf("%s:%d: zone %s: forward health_check 0: dnsstandby checks down servers every %s", z.File, z.ForwardLine, z.Name, u.HealthCheck))
	}
	if z.Expire > 0 {
		u.ExpireTCP = z.Expire
	} else {
		cfg.Ignored = append(cfg.Ignored, fmt.Sprintf("%s:%d: zone %s: forward expire 0: dnsstandby closes idle connections after %s", z.File, z.ForwardLine, z.Name, u.ExpireTCP))
	}
	return r
}

// Plugins by what dnsstandby does about them.
var (
	// imitated: read by corefile and applied by ApplyCorefile (bind
	// selects the blocks).
	imitated = []string{"bind", "forward", "cache", "template", "hosts", "whoami"}
	// noAnswerEffect: plugins that log, export or check, and change no
	// answer; dnsstandby has its own logs, metrics and health endpoints.
	noAnswerEffect = []string{"errors", "log", "ready", "health", "loop", "prometheus", "reload", "debug", "dnstap", "pprof", "trace"}
)

// ignored lists what the zone's block does that dnsstandby does not, one
// line each with its place in the Corefile.
func ignored(z corefile.Zone) []string {
	var out []string
	add := func(format string, args ...any) {
		out = append(out, fmt.Sprintf("%s:%d: zone %s: ", z.File, z.Line, z.Name)+fmt.Sprintf(format, args...))
	}
	for _, p := range z.Plugins {
		switch {
		case slices.Contains(imitated, p) || slices.Contains(noAnswerEffect, p):
		case p == "nsid":
			add("nsid %q: dnsstandby answers NSID with its own (Pipeline.NSID), so that its answers can be told apart", z.NSID)
		default:
			add("plugin %s not imitated: its answers come from the upstreams in takeover", p)
		}
	}
	if len(z.Upstreams) > 0 {
		if z.Cache == nil {
			add("no cache plugin: LocalDNS asks upstream every time; dnsstandby caches the zone with its defaults (Cache), so that it can answer stale when the upstreams fail")
		}
		if !z.PreferUDP && !z.ForceTCP {
			add("forward without prefer_udp or force_tcp: LocalDNS asks over the client's protocol and passes a truncated reply on; dnsstandby asks over UDP and retries a truncated reply over TCP, as prefer_udp")
		}
		if len(z.ForwardExcept) > 0 {
			add("forward except %s: dnsstandby forwards those names too", strings.Join(z.ForwardExcept, " "))
		}
	}
	if c := z.Cache; c != nil {
		add("cache capacity success %d denial %d: dnsstandby bounds the two together, at most %d entries, within its share of Cache.MaxEntries and Cache.MaxBytes", c.SuccessCapacity, c.DenialCapacity, c.SuccessCapacity+c.DenialCapacity)
		if c.ServeStale == 0 {
			add("cache without serve_stale: LocalDNS answers SERVFAIL when the upstreams fail; dnsstandby answers from its expired entries then (verify mode, up to Cache.MaxStale, --serve-stale 0 turns it off), as a standby's last resort")
		}
		if c.Prefetch > 0 {
			add("cache prefetch %d: dnsstandby refreshes entries hit near expiry at Pipeline.RefreshRate instead", c.Prefetch)
		}
		if c.KeepTTL {
			add("cache keepttl: dnsstandby ages the TTLs it serves")
		}
		if len(c.Zones) > 0 || len(c.DisabledSuccess) > 0 || len(c.DisabledDenial) > 0 {
			add("cache zones and disable: dnsstandby caches every zone")
		}
	}
	return out
}
