package check

import (
	"github.com/dnsstandby/dnsstandby/status"

	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// upstreamTarget is an upstream to test: one the daemon reports, or one
// given with --upstream.
type upstreamTarget struct {
	Server string // ADDR:PORT
	Zone   string // the zone the daemon forwards there; "." for flags
	// Question is the name whose SOA is asked: the zone itself, or for
	// the root zone the cluster's domain, which kube-dns answers from its
	// own data without going further.
	Question string
}

// upstreamProbe is what one query to an upstream got.
type upstreamProbe struct {
	upstreamTarget
	Rcode int           // the reply's rcode, when Err is nil
	RTT   time.Duration // when Err is nil
	Err   error
}

// answered reports whether the upstream is of use: a reply that is an
// answer (NOERROR, or NXDOMAIN for a zone it does not serve), not a
// refusal or a failure of its own.
func (p upstreamProbe) answered() bool {
	return p.Err == nil && (p.Rcode == dns.RcodeSuccess || p.Rcode == dns.RcodeNameError)
}

// upstreamTargets lists what to test: the daemon's upstreams, then those
// of the flags it does not have, each once.
func upstreamTargets(d *status.Daemon, flags []netip.AddrPort, clusterDomain string) []upstreamTarget {
	var out []upstreamTarget
	seen := map[string]bool{}
	add := func(server, zone string) {
		if seen[server+" "+zone] {
			return
		}
		seen[server+" "+zone] = true
		q := dns.Fqdn(zone)
		if q == "." {
			q = dns.Fqdn(clusterDomain)
		}
		out = append(out, upstreamTarget{Server: server, Zone: zone, Question: q})
	}
	if d != nil {
		for _, u := range d.Upstreams {
			add(u.Server, u.Zone)
		}
	}
	for _, f := range flags {
		if !slices.ContainsFunc(out, func(t upstreamTarget) bool { return t.Server == f.String() }) {
			add(f.String(), ".")
		}
	}
	return out
}

// upstreamResult judges the upstreams: every miss dnsstandby cannot answer
// from cache goes there, in a takeover all of them.
func upstreamResult(probes []upstreamProbe, daemonReported bool) Result {
	const name = "upstreams"
	if len(probes) == 0 {
		found := "no upstream to test: no --upstream given"
		if !daemonReported {
			found += ", and the daemon does not report its upstreams"
		}
		return Result{Name: name, Status: Warn, Found: found, Fix: "give the kube-dns ClusterIP with --upstream ADDR"}
	}
	var parts, bad []string
	for _, p := range probes {
		zone := ""
		if p.Zone != "." {
			zone = " (zone " + p.Zone + ")"
		}
		switch {
		case p.Err != nil:
			parts = append(parts, fmt.Sprintf("%s%s no answer: %v", p.Server, zone, p.Err))
		default:
			parts = append(parts, fmt.Sprintf("%s%s %s for SOA %s in %s", p.Server, zone, dns.RcodeToString[p.Rcode], p.Question, p.RTT.Round(10*time.Microsecond)))
		}
		if !p.answered() {
			bad = append(bad, p.Server)
		}
	}
	found := strings.Join(parts, ", ")
	switch {
	case len(bad) == len(probes):
		// In a takeover every miss, and in verify mode every stale entry,
		// then gets SERVFAIL or a stale answer.
		return Result{Name: name, Status: Fail, Found: found + ": no upstream answers",
			Fix: "check the route to the upstreams (kube-dns ClusterIP) from the node, and kube-dns itself"}
	case len(bad) > 0:
		return Result{Name: name, Status: Warn, Found: found,
			Fix: "check " + strings.Join(bad, ", ") + ", or remove it from dnsstandby's upstreams"}
	}
	return Result{Name: name, Status: Pass, Found: found}
}
