package main

import (
	"strings"
	"testing"
	"time"

	"github.com/dnsstandby/dnsstandby/bench/internal/testbed"
	"github.com/dnsstandby/dnsstandby/bench/lab"
)

// TestCustomVnetCorefile: the node's root block forwards to both VNet DNS
// servers, in order, still with policy sequential; no other forward
// changes.
func TestCustomVnetCorefile(t *testing.T) {
	orig := lab.LocalDNSCorefile()
	got := customVnetCorefile(orig)
	both := "forward . " + lab.LocalDNSVnetDNS + " " + lab.LocalDNSVnetDNS2 + " {"
	if n := strings.Count(got, both); n != 1 {
		t.Fatalf("%d forwards to both VNet DNS servers, want 1:\n%s", n, got)
	}
	block := got[strings.Index(got, both):]
	block = block[:strings.Index(block, "}")]
	if !strings.Contains(block, "policy sequential") {
		t.Errorf("the forward to both is not sequential:\n%s", block)
	}
	if strings.Count(got, "forward . ") != strings.Count(orig, "forward . ") ||
		strings.Count(got, "forward . "+lab.LocalDNSKubeDNS+" {") != strings.Count(orig, "forward . "+lab.LocalDNSKubeDNS+" {") {
		t.Errorf("other forwards changed:\n%s", got)
	}
}

// upstreamRun is a run of scenario under setup for client, from the fault
// on: sent queries, firstTry of them on the first try, the slowest answer
// slowest ms, the fresh names' p99 freshP99 ms.
func upstreamRun(scenario, setup, client string, sent, firstTry int, slowest, freshP99 float64) lab.LabRun {
	a := &lab.AfterFault{Sent: sent, FirstTry: firstTry, AfterRetry: sent - firstTry, MaxMs: slowest,
		Fresh: &lab.FreshCounts{Sent: sent / 50, FirstTry: sent / 50, P99Ms: freshP99, MaxMs: slowest}}
	return lab.LabRun{Scenario: scenario, Setup: setup, Client: client, Listener: listenerOf(client), AfterFault: a}
}

func TestUpstreamChecks(t *testing.T) {
	both := []string{clientPod, clientNode}
	all := []string{setupShipped, setupPR9439, setupStandby}
	intp := func(n int) *int { return &n }
	withUpstream := func(r lab.LabRun, kube, req, spec, toKube *int) lab.LabRun {
		r.Upstream = &lab.UpstreamCounts{KubeDNSQueries: kube, StandbyRequests: req, StandbySpeculative: spec, StandbyToKubeDNS: toKube}
		return r
	}
	withLocalDNS := func(r lab.LabRun, forwards int) lab.LabRun {
		r.Upstream.LocalDNSToKubeDNS = intp(forwards)
		return r
	}
	tests := []struct {
		name     string
		scenario string
		setups   []string
		runs     []lab.LabRun
		want     []string // each check's String(), in order, up to "; found"
		found    []string // a part of each check's finding, in order
	}{
		{
			name: "blackhole: dnsstandby within every bound", scenario: scenarioBlackhole, setups: all,
			runs: []lab.LabRun{
				upstreamRun(scenarioBlackhole, setupPR9439, clientNode, 1000, 950, 3012, 2004),
				upstreamRun(scenarioBlackhole, setupStandby, clientPod, 1000, 1000, 20, 5),
				upstreamRun(scenarioBlackhole, setupStandby, clientNode, 1000, 1000, 600, 300),
			},
			want: []string{
				"PASS upstream-blackhole dnsstandby pod → 169.254.10.11: 100% answered on the first try",
				"PASS upstream-blackhole dnsstandby pod → 169.254.10.11: names never asked before: p99 ≤ 300 ms",
				"PASS upstream-blackhole dnsstandby pod → 169.254.10.11: no answer slower than 600 ms",
				"PASS upstream-blackhole dnsstandby node → 169.254.10.10: 100% answered on the first try",
				"PASS upstream-blackhole dnsstandby node → 169.254.10.10: names never asked before: p99 ≤ 300 ms",
				"PASS upstream-blackhole dnsstandby node → 169.254.10.10: no answer slower than 600 ms",
			},
			// LocalDNS alone's numbers where it has a run for the client.
			found: []string{"100.000% (1000 of 1000)", "p99 5.0 ms", "slowest 20.0 ms",
				"localdns-pr9439 in the same run: 95.000% (950 of 1000)", "localdns-pr9439 in the same run: p99 2004.0 ms", "localdns-pr9439 in the same run: slowest 3012.0 ms"},
		},
		{
			name: "backend dead: one retry, a slow fresh name, a slow answer", scenario: scenarioBackendDead, setups: all,
			runs: []lab.LabRun{
				upstreamRun(scenarioBackendDead, setupStandby, clientPod, 1000, 999, 600.5, 300.5),
			},
			want: []string{
				"FAIL kube-dns-backend-dead dnsstandby pod → 169.254.10.11: 100% answered on the first try",
				"FAIL kube-dns-backend-dead dnsstandby pod → 169.254.10.11: names never asked before: p99 ≤ 300 ms",
				"FAIL kube-dns-backend-dead dnsstandby pod → 169.254.10.11: no answer slower than 600 ms",
				"FAIL kube-dns-backend-dead dnsstandby node → 169.254.10.10: a run with counts from the fault on",
			},
			found: []string{"99.900%", "p99 300.5 ms", "slowest 600.5 ms", "none"},
		},
		{
			name: "no dnsstandby among the setups", scenario: scenarioBlackhole, setups: []string{setupPR9439},
			runs: []lab.LabRun{upstreamRun(scenarioBlackhole, setupPR9439, clientNode, 1000, 950, 3012, 2004)},
		},
		{
			name: "healthy: speculation within its share, dnsstandby's own kube-dns queries within 2%", scenario: "healthy", setups: all,
			runs: []lab.LabRun{
				withLocalDNS(withUpstream(upstreamRun("healthy", setupPR9439, clientPod, 1000, 1000, 5, 0), intp(10000), nil, nil, nil), 10000),
				withLocalDNS(withUpstream(upstreamRun("healthy", setupStandby, clientPod, 1000, 1000, 5, 0), intp(10199), intp(1000), intp(101), intp(203)), 9996),
			},
			want: []string{
				"PASS healthy dnsstandby node-wide → upstreams: dnsstandby's speculative attempts ≤ 1%",
				"PASS healthy dnsstandby node-wide → 10.0.0.10: dnsstandby's own queries ≤ 2% of kube-dns's from the node",
			},
			found: []string{"101 speculative of 10199 upstream queries (0.990%; dnsstandby's own: 1000)", "203 of 10199 queries (1.99%); LocalDNS's forwards to it 9996; from localdns-pr9439's node: 10000 (+1.99%), its LocalDNS's forwards 10000"},
		},
		{
			// The other node's count is shown, not judged: it moves with
			// how each LocalDNS warmed up.
			name: "healthy: too much speculation, too many own kube-dns queries", scenario: "healthy", setups: all,
			runs: []lab.LabRun{
				withUpstream(upstreamRun("healthy", setupPR9439, clientPod, 1000, 1000, 5, 0), intp(9700), nil, nil, nil),
				withUpstream(upstreamRun("healthy", setupStandby, clientPod, 1000, 1000, 5, 0), intp(9700), intp(1000), intp(98), intp(195)),
			},
			want: []string{
				"FAIL healthy dnsstandby node-wide → upstreams: dnsstandby's speculative attempts ≤ 1%",
				"FAIL healthy dnsstandby node-wide → 10.0.0.10: dnsstandby's own queries ≤ 2%",
			},
			found: []string{"98 speculative of 9700 upstream queries (1.010%", "195 of 9700 queries (2.01%); LocalDNS's forwards to it not read; from localdns-pr9439's node: 9700 (+0.00%), its LocalDNS's forwards not read"},
		},
		{
			// The code before speculative attempts: the series is missing,
			// which fails rather than passes.
			name: "healthy: a dnsstandby without the metric", scenario: "healthy", setups: all,
			runs: []lab.LabRun{
				withUpstream(upstreamRun("healthy", setupPR9439, clientPod, 1000, 1000, 5, 0), intp(10000), nil, nil, nil),
				withUpstream(upstreamRun("healthy", setupStandby, clientPod, 1000, 1000, 5, 0), intp(10000), intp(0), nil, intp(0)),
			},
			want: []string{
				"FAIL healthy dnsstandby node-wide → upstreams: dnsstandby's speculative attempts ≤ 1%",
				"PASS healthy dnsstandby node-wide → 10.0.0.10: dnsstandby's own queries ≤ 2%",
			},
			found: []string{"exports no dnsstandby_upstream_speculative_total", "0 of 10000 queries"},
		},
		{
			name: "healthy without LocalDNS alone: nothing to compare with", scenario: "healthy", setups: []string{setupStandby},
			runs: []lab.LabRun{
				withUpstream(upstreamRun("healthy", setupStandby, clientPod, 1000, 1000, 5, 0), intp(100), intp(2), intp(0), intp(2)),
			},
			want: []string{
				"PASS healthy dnsstandby node-wide → upstreams: dnsstandby's speculative attempts ≤ 1%",
				"PASS healthy dnsstandby node-wide → 10.0.0.10: dnsstandby's own queries ≤ 2%",
			},
			found: []string{"0 speculative of 100 upstream queries", "2 of 100 queries (2.00%)"},
		},
		{
			// A node that asked kube-dns nothing has shown nothing.
			name: "healthy: no upstream queries at all", scenario: "healthy", setups: []string{setupStandby},
			runs: []lab.LabRun{
				withUpstream(upstreamRun("healthy", setupStandby, clientPod, 1000, 1000, 5, 0), intp(0), intp(0), intp(0), intp(0)),
			},
			want: []string{
				"FAIL healthy dnsstandby node-wide → upstreams: dnsstandby's speculative attempts ≤ 1%",
				"FAIL healthy dnsstandby node-wide → 10.0.0.10: dnsstandby's own queries ≤ 2%",
			},
			found: []string{"kube-dns got no queries from the node", "0 of 0 queries"},
		},
		{
			name: "healthy: dnsstandby's counters not read", scenario: "healthy", setups: []string{setupStandby},
			runs: []lab.LabRun{
				withUpstream(upstreamRun("healthy", setupStandby, clientPod, 1000, 1000, 5, 0), intp(100), nil, nil, nil),
			},
			want: []string{
				"FAIL healthy dnsstandby node-wide → upstreams: dnsstandby's speculative attempts ≤ 1%",
				"FAIL healthy dnsstandby node-wide → 10.0.0.10: dnsstandby's own queries ≤ 2%",
			},
			found: []string{"dnsstandby_upstream_requests_total not read"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := upstreamChecks(tc.scenario, tc.setups, both, tc.runs)
			if len(got) != len(tc.want) {
				t.Fatalf("%d checks, want %d:\n%v", len(got), len(tc.want), got)
			}
			for i, c := range got {
				if s := c.String(); !strings.HasPrefix(s, tc.want[i]) {
					t.Errorf("check %d: %s\nwant %s...", i, s, tc.want[i])
				}
			}
			for _, part := range tc.found {
				if !anyFound(got, part) {
					t.Errorf("no check found %q:\n%v", part, got)
				}
			}
		})
	}
}

// anyFound reports whether a check's finding contains part.
func anyFound(checks []lab.Check, part string) bool {
	for _, c := range checks {
		if strings.Contains(c.Found, part) {
			return true
		}
	}
	return false
}

// TestMetricCount: a counter's series summed, nil where the page has
// none of it or there is no page.
func TestMetricCount(t *testing.T) {
	page := "dnsstandby_upstream_requests_total{proto=\"udp\",server=\"a\"} 30\n" +
		"dnsstandby_upstream_requests_total{proto=\"tcp\",server=\"a\"} 10\n"
	m, err := testbed.ParseMetrics(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	if got := metricCount(m, upstreamRequestsMetric, nil); got == nil || *got != 40 {
		t.Errorf("requests %v, want 40", got)
	}
	if got := metricCount(m, upstreamRequestsMetric, map[string]string{"proto": "tcp"}); got == nil || *got != 10 {
		t.Errorf("tcp requests %v, want 10", got)
	}
	if got := metricCount(m, upstreamRequestsMetric, map[string]string{"server": "b"}); got == nil || *got != 0 {
		t.Errorf("requests to a server with no series %v, want 0", got)
	}
	if got := metricCount(m, upstreamSpeculativeMetric, nil); got != nil {
		t.Errorf("speculative %d, want nil: not exported", *got)
	}
	if got := metricCount(nil, upstreamRequestsMetric, nil); got != nil {
		t.Errorf("no page: %d, want nil", *got)
	}
}

// TestUpstreamScenarios: both scenarios are in the lab, ask names never
// asked before, add their upstreams and run about a minute of load.
func TestUpstreamScenarios(t *testing.T) {
	for _, name := range []string{scenarioBlackhole, scenarioBackendDead} {
		sc, ok := findScenario(name)
		if !ok {
			t.Fatalf("no scenario %s", name)
		}
		if !sc.fresh || sc.upstreams == nil || sc.standbyOnly {
			t.Errorf("%s: fresh %v, upstreams hook %v, standby only %v", name, sc.fresh, sc.upstreams != nil, sc.standbyOnly)
		}
		if d := sc.baseline + sc.observe; d > 75*time.Second {
			t.Errorf("%s: %v of load, want about a minute", name, d)
		}
	}
}
