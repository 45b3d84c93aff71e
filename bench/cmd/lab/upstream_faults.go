package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dnsstandby/dnsstandby/bench/internal/testbed"
	"github.com/dnsstandby/dnsstandby/bench/lab"
)

// The scenarios where LocalDNS stays healthy and one of its upstreams goes
// silent: a custom VNet DNS server that blackholes (upstream-blackhole), a
// kube-dns pod on a dead node behind the ClusterIP (kube-dns-backend-dead).
// Every name no cache holds then waits on the silent server, in LocalDNS's
// forward (its 2 s read timeout) unless someone tries another server or
// another flow first.
const (
	scenarioBlackhole   = "upstream-blackhole"
	scenarioBackendDead = "kube-dns-backend-dead"
)

// nodeExtras are what a scenario adds to a node's upstreams (scenario's
// upstreams hook): nil where it adds nothing.
type nodeExtras struct {
	vnet2     *lab.Upstream  // the second VNet DNS server (upstream-blackhole)
	clusterIP *lab.ClusterIP // kube-dns as pods behind the ClusterIP (kube-dns-backend-dead)
}

// customVnetCorefile is LocalDNS's Corefile on a node whose custom VNet
// has two DNS servers: localdns.sh's replace_azurednsip_in_corefile
// writes resolv.conf's servers, space-separated, wherever the rendering
// has Azure's DNS (a sed over the whole file); the lab's Corefile already
// has the first written in, so the second joins it the same way. The
// node's root block then forwards to both with its policy sequential:
// the second is asked only when the first fails.
func customVnetCorefile(corefile string) string {
	return strings.ReplaceAll(corefile, lab.LocalDNSVnetDNS, lab.LocalDNSVnetDNS+" "+lab.LocalDNSVnetDNS2)
}

// addVnetDNS2 starts the node's second VNet DNS server.
func addVnetDNS2(_ context.Context, t *topology) error {
	up, err := lab.StartVnetDNS2(t.node, t.bins.coredns, t.zones)
	if err != nil {
		return err
	}
	t.extra.vnet2 = up
	t.closers = append(t.closers, up.Close)
	return nil
}

// addClusterIP puts kube-dns's pods behind the ClusterIP, before LocalDNS
// starts: the nat rules then decide every flow LocalDNS and dnsstandby
// open to kube-dns (the plain kube-dns on the ClusterIP stays, unasked).
func addClusterIP(ctx context.Context, t *topology) error {
	c, err := lab.StartClusterIP(ctx, t.node, t.bins.coredns, t.zones)
	if err != nil {
		return err
	}
	t.extra.clusterIP = c
	t.closers = append(t.closers, c.Close)
	return nil
}

// Marks of the two scenarios.
const (
	blackholeMark = "VNet DNS 1 blackholed"
	podDeadMark   = "kube-dns pod 1 dead"
)

// upstreamBlackhole makes the first VNet DNS server drop everything.
func upstreamBlackhole(ctx context.Context, t *topology, ev *events) error {
	if err := t.up.Vnet.Blackhole(ctx); err != nil {
		return err
	}
	ev.mark(blackholeMark)
	return nil
}

// kubeDNSBackendDead makes the first kube-dns pod drop everything, the
// nat rules unchanged.
func kubeDNSBackendDead(ctx context.Context, t *topology, ev *events) error {
	if t.extra.clusterIP == nil {
		return errors.New("kube-dns pod: the node has no ClusterIP backends")
	}
	if err := t.extra.clusterIP.StopPod(ctx, 0); err != nil {
		return err
	}
	ev.mark(podDeadMark)
	return nil
}

// Metrics of dnsstandby's upstream queries.
const (
	upstreamRequestsMetric    = "dnsstandby_upstream_requests_total"
	upstreamSpeculativeMetric = "dnsstandby_upstream_speculative_total"
)

// LocalDNS's metrics inside the node, and its answered forwards: CoreDNS
// 1.11 on counts them in its proxy's duration histogram.
const (
	localDNSMetricsURL    = "http://127.0.0.1:9253/metrics"
	localDNSForwardMetric = "coredns_proxy_request_duration_seconds_count"
)

// upstreamCounts are the node's upstream counts now: kube-dns's request
// counter, LocalDNS's answered forwards to it and, from m (dnsstandby's
// metrics, nil where the node runs none or they were not read),
// dnsstandby's upstream counters.
func (t *topology) upstreamCounts(m testbed.Metrics) *lab.UpstreamCounts {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n float64
	var err error
	if c := t.extra.clusterIP; c != nil {
		n, err = c.Requests(ctx)
	} else {
		n, err = t.up.Kube.Requests(ctx, clusterIP)
	}
	u := &lab.UpstreamCounts{
		StandbyRequests:    metricCount(m, upstreamRequestsMetric, nil),
		StandbySpeculative: metricCount(m, upstreamSpeculativeMetric, nil),
		StandbyToKubeDNS:   metricCount(m, upstreamRequestsMetric, map[string]string{"server": clusterIP + ":53"}),
	}
	if lm, err := t.metrics(ctx, localDNSMetricsURL); err == nil {
		u.LocalDNSToKubeDNS = metricCount(lm, localDNSForwardMetric, map[string]string{"proxy_name": "forward", "to": clusterIP + ":53"})
	} // else unread (LocalDNS down): nil, and the finding says so
	if err != nil {
		// The runs stand without it; the checks that need it fail.
		fmt.Fprintf(os.Stderr, "lab: %s: kube-dns requests: %v\n", t.setup, err)
	} else {
		k := int(n)
		u.KubeDNSQueries = &k
	}
	return u
}

// metricCount is the sum of a counter's series in m with the labels in
// match, nil where m has no series of it at all.
func metricCount(m testbed.Metrics, name string, match map[string]string) *int {
	if m == nil || !m.Has(name) {
		return nil
	}
	n := int(m.Sum(name, match))
	return &n
}

// Bounds of issue 25's checks.
const (
	upstreamFreshP99Ms  = 300  // names never asked before, p99, from the fault on
	upstreamSlowestMs   = 600  // any answer, from the fault on
	speculativeMaxShare = 0.01 // dnsstandby's speculative attempts of the node's upstream queries, healthy
	kubeDNSMaxShare     = 0.02 // dnsstandby's own share of kube-dns's queries from its node, healthy
)

// upstreamChecks are the checks of the silent-upstream scenarios and what
// healthy must show of dnsstandby's upstream queries:
//   - upstream-blackhole, kube-dns-backend-dead: dnsstandby's setup answers
//     every query on its first try, names never asked before with a p99
//     within upstreamFreshP99Ms and nothing slower than upstreamSlowestMs,
//     from the fault on; each check's finding says what LocalDNS alone
//     (setupPR9439) showed in the same run;
//   - healthy: from the fault on (lab.UpstreamCounts), dnsstandby's
//     speculative attempts are at most speculativeMaxShare of the node's
//     upstream queries, and dnsstandby's own queries to kube-dns are at
//     most kubeDNSMaxShare of what kube-dns got from its node.
func upstreamChecks(scenario string, setups, clients []string, runs []lab.LabRun) []lab.Check {
	if !slices.Contains(setups, setupStandby) {
		return nil
	}
	find := func(setup, client string) *lab.LabRun {
		i := slices.IndexFunc(runs, func(r lab.LabRun) bool {
			return r.Scenario == scenario && r.Setup == setup && r.Client == client && r.AfterFault != nil
		})
		if i < 0 {
			return nil
		}
		return &runs[i]
	}
	var out []lab.Check
	switch scenario {
	case scenarioBlackhole, scenarioBackendDead:
		for _, client := range clients {
			base := lab.Check{Scenario: scenario, Setup: setupStandby, Listener: listenerOf(client), Client: client}
			r := find(setupStandby, client)
			if r == nil {
				base.Require, base.Found = "a run with counts from the fault on", "none"
				out = append(out, base)
				continue
			}
			alone := find(setupPR9439, client)
			for _, c := range []struct {
				require string
				check   func(a *lab.AfterFault) (bool, string)
			}{
				{"100% answered on the first try from the fault on", func(a *lab.AfterFault) (bool, string) {
					return a.Sent > 0 && a.FirstTry == a.Sent, fmt.Sprintf("%.3f%% (%d of %d)", 100*a.FirstTryShare(), a.FirstTry, a.Sent)
				}},
				{fmt.Sprintf("names never asked before: p99 ≤ %d ms from the fault on", upstreamFreshP99Ms), func(a *lab.AfterFault) (bool, string) {
					f := a.Fresh
					if f == nil || f.Sent == 0 {
						return false, "no names never asked before in the load"
					}
					return f.Unanswered == 0 && f.P99Ms <= upstreamFreshP99Ms,
						fmt.Sprintf("p99 %.1f ms, slowest %.1f ms, %d unanswered of %d", f.P99Ms, f.MaxMs, f.Unanswered, f.Sent)
				}},
				{fmt.Sprintf("no answer slower than %d ms from the fault on", upstreamSlowestMs), func(a *lab.AfterFault) (bool, string) {
					return a.Sent > 0 && a.Unanswered == 0 && a.MaxMs <= upstreamSlowestMs,
						fmt.Sprintf("slowest %.1f ms, %d unanswered of %d", a.MaxMs, a.Unanswered, a.Sent)
				}},
			} {
				check := base
				check.Require = c.require
				check.Pass, check.Found = c.check(r.AfterFault)
				if alone != nil {
					_, found := c.check(alone.AfterFault)
					check.Found += "; " + setupPR9439 + " in the same run: " + found
				}
				out = append(out, check)
			}
		}
	case "healthy":
		// Node-wide: every client's run carries the node's counts.
		r := find(setupStandby, clients[0])
		if r == nil {
			return nil
		}
		out = append(out, speculativeCheck(*r), kubeDNSLoadCheck(*r, find(setupPR9439, clients[0])))
	}
	return out
}

// nodeWide is the client named in checks on a node's counts rather than
// one client's run.
const nodeWide = "node-wide"

// speculativeCheck: dnsstandby's speculative attempts from the fault on are
// at most speculativeMaxShare of the node's upstream queries, counted
// where they arrive (kube-dns): LocalDNS's and dnsstandby's alike. A
// healthy dnsstandby sends few upstream queries of its own, so a share of
// those would judge next to nothing; a node whose kube-dns got none
// fails, having shown nothing.
func speculativeCheck(r lab.LabRun) lab.Check {
	c := lab.Check{Scenario: r.Scenario, Setup: r.Setup, Client: nodeWide, Listener: "upstreams",
		Require: fmt.Sprintf("dnsstandby's speculative attempts ≤ %.0f%% of the node's upstream queries (kube-dns's) from the fault on", 100*speculativeMaxShare)}
	u := r.Upstream
	switch {
	case u == nil || u.KubeDNSQueries == nil || u.StandbyRequests == nil:
		c.Found = "kube-dns's requests or dnsstandby's " + upstreamRequestsMetric + " not read"
	case u.StandbySpeculative == nil:
		c.Found = fmt.Sprintf("dnsstandby exports no %s (%d upstream queries)", upstreamSpeculativeMetric, *u.StandbyRequests)
	case *u.KubeDNSQueries == 0:
		c.Found = "kube-dns got no queries from the node"
	default:
		spec, node := *u.StandbySpeculative, *u.KubeDNSQueries
		share := float64(spec) / float64(node)
		c.Pass = share <= speculativeMaxShare
		c.Found = fmt.Sprintf("%d speculative of %d upstream queries (%.3f%%; dnsstandby's own: %d)", spec, node, 100*share, *u.StandbyRequests)
	}
	return c
}

// kubeDNSLoadCheck: what dnsstandby adds to kube-dns's load from the
// fault on, its own queries to the ClusterIP, is at most kubeDNSMaxShare
// of what kube-dns got from its node. Measured on the node itself: the
// two nodes' LocalDNS caches warm up differently under the full load
// (each loses queries at first, and not the same), which moved kube-dns's
// counts between the nodes by -22.6% to +6.2% with dnsstandby sending
// nothing. What LocalDNS alone's node sent (alone, nil where it did not
// run) is given for comparison.
func kubeDNSLoadCheck(r lab.LabRun, alone *lab.LabRun) lab.Check {
	c := lab.Check{Scenario: r.Scenario, Setup: r.Setup, Client: nodeWide, Listener: clusterIP,
		Require: fmt.Sprintf("dnsstandby's own queries ≤ %.0f%% of kube-dns's from the node, from the fault on", 100*kubeDNSMaxShare)}
	u := r.Upstream
	if u == nil || u.KubeDNSQueries == nil || u.StandbyToKubeDNS == nil {
		c.Found = "kube-dns's requests or dnsstandby's " + upstreamRequestsMetric + " not read"
		return c
	}
	own, node := *u.StandbyToKubeDNS, *u.KubeDNSQueries
	c.Pass = node > 0 && float64(own) <= kubeDNSMaxShare*float64(node)
	c.Found = fmt.Sprintf("%d of %d queries (%.2f%%)", own, node, 100*float64(own)/float64(max(node, 1)))
	c.Found += "; LocalDNS's forwards to it " + countText(u.LocalDNSToKubeDNS)
	if alone != nil && alone.Upstream != nil && alone.Upstream.KubeDNSQueries != nil {
		want := *alone.Upstream.KubeDNSQueries
		c.Found += fmt.Sprintf("; from %s's node: %d (%+.2f%%), its LocalDNS's forwards %s", setupPR9439, want,
			100*(float64(node)/float64(max(want, 1))-1), countText(alone.Upstream.LocalDNSToKubeDNS))
	}
	return c
}

// countText is n for a finding, "not read" where it is nil.
func countText(n *int) string {
	if n == nil {
		return "not read"
	}
	return strconv.Itoa(*n)
}
