package daemon

import (
	"fmt"
	"io"
	"net/netip"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dnsstandby/dnsstandby/corefile"
	"github.com/dnsstandby/dnsstandby/lastgood"
)

// WriteTable writes what the daemon would run with, for a person: per
// listen address, each zone's upstreams and forward settings, then its
// cache; and what LocalDNS does that dnsstandby does not imitate.
// `dnsstandby run --validate` prints it.
func (c *Config) WriteTable(w io.Writer) error {
	c.writeProvenance(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "LISTENER\tZONE\tLOCAL\tUPSTREAMS\tPOLICY\tTRANSPORT\tMAX_CONCURRENT\tMAX_FAILS\tHEALTH_CHECK")
	for _, ap := range c.Listen {
		for _, r := range c.routesFor(ap) {
			u := r.Upstream
			servers := make([]string, len(u.Servers))
			for i, s := range u.Servers {
				servers[i] = s.String()
			}
			transport := "udp, tcp on truncation"
			if u.ForceTCP {
				transport = "tcp"
			}
			conc := "none"
			if u.MaxConcurrent > 0 {
				conc = fmt.Sprint(u.MaxConcurrent)
			}
			if len(servers) == 0 {
				fmt.Fprintf(tw, "%s\t%s\t%s\t-\t-\t-\t-\t-\t-\n", ap, r.Zone, localAnswers(r))
				continue
			}
			policy := string(u.Policy)
			if u.FailFast {
				policy += ", failfast"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", ap, r.Zone, localAnswers(r), strings.Join(servers, " "), policy, transport, conc, u.MaxFails, u.HealthCheck)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "LISTENER\tZONE\tCACHE_ENTRIES\tCACHE_MIB\tTTL\tNEGATIVE_TTL\tSERVFAIL_TTL\tSERVE_STALE\tSTALE_TTL")
	n := c.caches()
	for _, ap := range c.Listen {
		for _, r := range c.routesFor(ap) {
			if !r.cached() {
				fmt.Fprintf(tw, "%s\t%s\tnone\t-\t-\t-\t-\t-\t-\n", ap, r.Zone)
				continue
			}
			cc := c.cacheConfig(&r, n)
			stale := "off"
			if cc.MaxStale > 0 {
				stale = fmt.Sprintf("%s %s", cc.MaxStale, cc.StaleMode)
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%.3g\t%s-%s\t%s-%s\t%s\t%s\t%s\n", ap, r.Zone, cc.MaxEntries, float64(cc.MaxBytes)/(1<<20),
				cc.MinTTL, cc.MaxTTL, cc.MinNegTTL, cc.MaxNegTTL, cc.ServfailTTL, stale, cc.StaleTTL)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nmirror feed: %s; steering: %s\n", c.Mirror, c.Takeover.Steering)
	if c.Corefile != "" {
		fmt.Fprintf(w, "\nfrom %s, not imitated (%d):\n", c.Corefile, len(c.Ignored))
		for _, line := range c.Ignored {
			fmt.Fprintf(w, "  %s\n", line)
		}
	}
	return nil
}

// writeProvenance says where the configuration comes from, and the rule
// that chose it.
func (c *Config) writeProvenance(w io.Writer) {
	p := c.Provenance
	switch p.Source {
	case SourceFile:
		fmt.Fprintf(w, "configuration: from the Corefile %s (sha256 %s)\n", p.Corefile, short(p.SHA256))
	case SourceLastGood:
		fmt.Fprintf(w, "configuration: the LAST KNOWN GOOD, from %s (sha256 %s, first applied %s, %s ago)\n", p.Corefile, short(p.SHA256),
			p.Applied.Format(time.RFC3339), time.Since(p.Applied).Round(time.Second))
		fmt.Fprintf(w, "  the Corefile is refused (%s): %v\n", corefile.Reason(p.Refused), p.Refused)
	case SourceFallback:
		fmt.Fprintln(w, "configuration: the FALLBACK")
		fmt.Fprintf(w, "  the Corefile is refused (%s): %v\n", corefile.Reason(p.Refused), p.Refused)
		if p.LastGood != nil {
			fmt.Fprintf(w, "  the last known good is unusable: %v\n", p.LastGood)
		} else if c.StateDir != "" {
			fmt.Fprintf(w, "  no last known good in %s\n", c.StateDir)
		}
	case SourceFlags:
		fmt.Fprintln(w, "configuration: from the flags (no --localdns-corefile)")
	}
	if p.Source != SourceFlags {
		fmt.Fprintf(w, "judged for: %s", p.Build)
		if p.BuildErr != nil {
			fmt.Fprintf(w, " (not LocalDNS's own: %v)", p.BuildErr)
		}
		fmt.Fprintln(w)
		lg := "none (no --state-dir)"
		if c.StateDir != "" {
			lg = lastgood.Path(c.StateDir)
		}
		fmt.Fprintf(w, "rule: the Corefile, else the last known good (%s), else the fallback (%s)\n\n", lg, c.fallbackString())
	} else {
		fmt.Fprintln(w)
	}
}

// fallbackString says where the fallback sends misses.
func (c *Config) fallbackString() string {
	f := c.Fallback
	kube := "no --fallback-upstream"
	if len(f.Upstreams) > 0 {
		kube = "kube-dns " + joinAddrPorts(f.Upstreams)
	}
	node := "none"
	if f.ResolvConf != "" {
		node = f.ResolvConf
		if rs := c.nodeResolvers(); len(rs) > 0 {
			node += ": " + joinAddrPorts(rs)
		} else {
			node += ": none usable"
		}
	}
	return fmt.Sprintf("%s; names outside cluster.local on %s: the node's resolvers, %s", kube, f.NodeListen, node)
}

func joinAddrPorts(aps []netip.AddrPort) string {
	s := make([]string, len(aps))
	for i, ap := range aps {
		s[i] = ap.String()
	}
	return strings.Join(s, " ")
}

// short is the first 12 digits of a hash, as git shows a commit.
func short(h string) string { return h[:min(len(h), 12)] }

// localAnswers says which answers the route makes itself, in the order
// they are asked: "templates 2, hosts", "whoami", or "-".
func localAnswers(r Route) string {
	var parts []string
	if n := len(r.Templates); n > 0 {
		parts = append(parts, fmt.Sprintf("templates %d", n))
	}
	if r.Hosts != nil {
		parts = append(parts, "hosts "+r.Hosts.File)
	}
	if r.Whoami {
		parts = append(parts, "whoami")
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}
