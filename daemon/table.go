package daemon

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteTable writes what the daemon would run with, for a person: per
// listen address, each zone's upstreams and forward settings, then its
// cache; and what LocalDNS does that dnsstandby does not imitate.
// `dnsstandby run --validate` prints it.
func (c *Config) WriteTable(w io.Writer) error {
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
