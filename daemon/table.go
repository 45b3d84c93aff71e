package daemon

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteTable writes what the daemon would run with, for a person: per
// listen address, each zone's upstreams and forward settings; the cache
// policy; and what LocalDNS does that dnsstandby does not imitate.
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
	cc, n := c.Cache, max(len(c.Listen), 1)
	fmt.Fprintf(w, "\ncache, one per listener: %d entries and %g MiB each; TTL %s to %s (negative %s to %s); SERVFAIL %s; serve stale %s, %s, TTL %s\n",
		max(cc.MaxEntries/n, 1), float64(cc.MaxBytes/int64(n))/(1<<20), cc.MinTTL, cc.MaxTTL, cc.MinNegTTL, cc.MaxNegTTL,
		cc.ServfailTTL, cc.MaxStale, c.Pipeline.StaleMode, cc.StaleTTL)
	fmt.Fprintf(w, "mirror feed: %s; steering: %s\n", c.Mirror, c.Takeover.Steering)
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
