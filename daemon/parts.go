package daemon

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/dnsstandby/dnsstandby/hedge"
	"github.com/dnsstandby/dnsstandby/localanswer"
	"github.com/dnsstandby/dnsstandby/mirror/dnstap"
	"github.com/dnsstandby/dnsstandby/mirror/tap"
	"github.com/dnsstandby/dnsstandby/takeover/anchor"
	"github.com/dnsstandby/dnsstandby/upstream"
)

// This file builds each part's Config from the daemon's, one function per
// part, for Run to start the part with and for Validate to check: so that
// `dnsstandby run --validate` refuses exactly what start would. Loggers
// and what only the running daemon has are set by Run.

// minAttemptTimeout is the least time one upstream attempt gets, however
// many servers share Pipeline.UpstreamTimeout (never more than all of it).
const minAttemptTimeout = 250 * time.Millisecond

// upstreamConfig is route r's upstream group: its forward, each attempt
// getting its share of Pipeline.UpstreamTimeout, so that a group whose
// first server does not answer has time to try the next. An attempt is
// never longer than the whole resolution: the upstream group counts a
// server silent for its Timeout as timed out, and with a longer Timeout
// the resolution's deadline would always end the attempt first.
func (c *Config) upstreamConfig(r *Route) upstream.Config {
	uc := r.Upstream
	if n := len(uc.Servers); n > 0 {
		total := c.Pipeline.UpstreamTimeout
		uc.Timeout = min(max(total/time.Duration(n), minAttemptTimeout), total)
	}
	return uc
}

// hostsConfig is route r's hosts plugin.
func hostsConfig(r *Route) localanswer.HostsConfig {
	hc := localanswer.DefaultHostsConfig()
	hc.Hosts = *r.Hosts
	return hc
}

// tapConfig is the mirror tap of the listen address ap.
func (c *Config) tapConfig(ap netip.AddrPort) tap.Config {
	tc := tap.DefaultConfig()
	tc.Addrs, tc.Port = []netip.Addr{ap.Addr()}, ap.Port()
	if !c.TapRing {
		tc.RingSize = 0
	}
	return tc
}

// hedgeConfig is the hedger of one listen address; OnSilent and Logger are
// Run's.
func (c *Config) hedgeConfig() hedge.Config { return c.Hedge }

// dnstapConfig is the dnstap receiver.
func (c *Config) dnstapConfig() dnstap.Config {
	dc := dnstap.DefaultConfig()
	dc.Path = c.Mirror.DnstapPath
	return dc
}

// anchorConfig is the anchor link, holding every listen address; the
// node's own packets to an IPv4 one leave from its address toward that
// listener's upstream (where a DNAT of them, AKS's nat fallback, sends
// them: .10's VNet DNS, .11's kube-dns).
func (c *Config) anchorConfig() anchor.Config {
	ac := anchor.DefaultConfig()
	ac.Link, ac.Kind, ac.Cleanup, ac.Addrs = c.Anchor.Link, c.Anchor.Kind, c.Anchor.Cleanup, c.listenAddrs()
	for _, ap := range c.Listen {
		held := ap.Addr().Unmap()
		if _, done := ac.SourceToward[held]; done || !held.Is4() {
			continue
		}
		if up := c.upstream4(ap); up.IsValid() {
			if ac.SourceToward == nil {
				ac.SourceToward = map[netip.Addr]netip.Addr{}
			}
			ac.SourceToward[held] = up
		}
	}
	return ac
}

// upstream4 is the first IPv4 upstream server of listen's root zone, else
// of its first route that has one; the zero Addr if none has.
func (c *Config) upstream4(listen netip.AddrPort) netip.Addr {
	var any netip.Addr
	for _, r := range c.routesFor(listen) {
		for _, s := range r.Upstream.Servers {
			a := s.Addr().Unmap()
			if !a.Is4() {
				continue
			}
			if r.Zone == "." {
				return a
			}
			if !any.IsValid() {
				any = a
			}
			break
		}
	}
	return any
}

// validateParts checks every part's Config as Run builds it, so that what
// a part's constructor would refuse is refused before anything starts.
func (c *Config) validateParts() error {
	n := c.caches()
	for _, ap := range c.Listen {
		for _, r := range c.routesFor(ap) {
			where := fmt.Sprintf("zone %s on %s", r.Zone, ap)
			if r.cached() {
				cc := c.cacheConfig(&r, n)
				if err := cc.Validate(); err != nil {
					return fmt.Errorf("daemon: cache of %s: %w", where, err)
				}
			}
			if len(r.Upstream.Servers) > 0 {
				uc := c.upstreamConfig(&r)
				if err := uc.Validate(); err != nil {
					return fmt.Errorf("daemon: upstream for %s: %w", where, err)
				}
			}
			if len(r.Templates) > 0 {
				if _, err := localanswer.NewTemplates(r.Templates); err != nil {
					return fmt.Errorf("daemon: templates of %s: %w", where, err)
				}
			}
			if r.Hosts != nil {
				if err := hostsConfig(&r).Validate(); err != nil {
					return fmt.Errorf("daemon: hosts of %s: %w", where, err)
				}
			}
		}
	}
	rc := c.Responder
	rc.Listen = c.Listen
	type check struct {
		field string
		fn    func() error
	}
	checks := []check{
		{"Pipeline", c.Pipeline.Validate},
		{"Responder", rc.Validate},
		{"Takeover", c.Takeover.Validate},
	}
	if c.Anchor.Link != "" {
		checks = append(checks, check{"Anchor", c.anchorConfig().Validate})
	}
	if c.hedging() {
		hc := c.hedgeConfig()
		checks = append(checks, check{"Hedge", hc.Validate})
	}
	switch c.Mirror.Kind {
	case MirrorTap:
		for _, ap := range c.Listen {
			tc := c.tapConfig(ap)
			if err := tc.Validate(); err != nil {
				return fmt.Errorf("daemon: Mirror: listener %s: %w", ap, err)
			}
		}
	case MirrorDnstap:
		dc := c.dnstapConfig()
		checks = append(checks, check{"Mirror", dc.Validate})
	}
	for _, ch := range checks {
		if err := ch.fn(); err != nil {
			return fmt.Errorf("daemon: %s: %w", ch.field, err)
		}
	}
	return nil
}
