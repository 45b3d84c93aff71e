package main

import (
	"reflect"
	"strings"
	"testing"

	"github.com/dnsstandby/dnsstandby/bench/internal/testbed"
	"github.com/dnsstandby/dnsstandby/bench/lab"
)

// TestHedgeRules: each rule against runs that meet it, miss it by a
// little, and show nothing.
func TestHedgeRules(t *testing.T) {
	after := func(edit func(a *lab.AfterFault)) lab.LabRun {
		a := &lab.AfterFault{AtMs: 5000, Sent: 100000, FirstTry: 100000, P99Ms: 1.2, MaxGapMs: 0, GlibcOK: 100, GlibcMaxMs: 12}
		if edit != nil {
			edit(a)
		}
		return lab.LabRun{AfterFault: a}
	}
	// healthy's checks count from its (empty) fault on, after LocalDNS's
	// warm-up: what came before, here 900 queries dnsstandby answered,
	// does not count.
	healthy := func(edit func(a *lab.AfterFault)) lab.LabRun {
		hedges := 50
		a := &lab.AfterFault{Sent: 100000, FirstTry: 100000, AnsweredBy: lab.AnsweredBy{LocalDNS: 99950, Standby: 50}, Hedges: &hedges}
		if edit != nil {
			edit(a)
		}
		return lab.LabRun{Summary: lab.Summary{Sent: 101000, AnsweredFirstTry: 101000, AnsweredBy: lab.AnsweredBy{LocalDNS: 100050, Standby: 950}},
			Hedges: &lab.Hedges{Total: 950}, AfterFault: a}
	}
	hedged := func(n int) *int { return &n }
	run := func(r lab.LabRun, edit func(r *lab.LabRun)) lab.LabRun { edit(&r); return r }
	tests := []struct {
		scenario, require string // require: the rule's prefix
		run               lab.LabRun
		pass              bool
		found             string // a part of it
	}{
		{"hang", "0 queries unanswered", after(nil), true, "0 unanswered of 100000"},
		{"hang", "0 queries unanswered", after(func(a *lab.AfterFault) { a.Unanswered, a.FirstTry = 1, 99999 }), false, "1 unanswered"},
		{"hang", "0 queries unanswered", after(func(a *lab.AfterFault) { *a = lab.AfterFault{} }), false, "of 0 sent"},
		{"hang", "≥ 99.9% answered on the first try", after(func(a *lab.AfterFault) { a.FirstTry, a.AfterRetry = 99900, 100 }), true, "99.900%"},
		{"hang", "≥ 99.9% answered on the first try", after(func(a *lab.AfterFault) { a.FirstTry, a.AfterRetry = 99899, 101 }), false, "99899 of 100000"},
		{"hang", "longest first-try gap ≤ 250 ms", after(func(a *lab.AfterFault) { a.MaxGapMs = 250 }), true, "250 ms"},
		{"hang", "longest first-try gap ≤ 250 ms", after(func(a *lab.AfterFault) { a.MaxGapMs = 1000.5 }), false, "1000 ms"},
		{"hang", "no glibc lookup failed or over 1 s", after(func(a *lab.AfterFault) { a.GlibcMaxMs = 1000 }), true, "slowest 1000 ms"},
		{"hang", "no glibc lookup failed or over 1 s", after(func(a *lab.AfterFault) { a.GlibcMaxMs = 1001 }), false, "slowest 1001 ms"},
		{"hang", "no glibc lookup failed or over 1 s", after(func(a *lab.AfterFault) { a.GlibcFail = 1 }), false, "1 failed"},
		{"hang", "no glibc lookup failed or over 1 s", after(func(a *lab.AfterFault) { a.GlibcOK = 0 }), false, "0 ok"},
		{"lossy", "≥ 99.99% answered on the first try", after(func(a *lab.AfterFault) { a.FirstTry, a.AfterRetry = 99990, 10 }), true, "99.990%"},
		{"lossy", "≥ 99.99% answered on the first try", after(func(a *lab.AfterFault) { a.FirstTry, a.AfterRetry = 90000, 10000 }), false, "90.000%"},
		{"lossy", "p99 ≤ 200 ms", after(func(a *lab.AfterFault) { a.P99Ms = 200 }), true, "p99 200.0 ms"},
		{"lossy", "p99 ≤ 200 ms", after(func(a *lab.AfterFault) { a.P99Ms = 1001.3 }), false, "p99 1001.3 ms"},
		{"brownout", "0 queries unanswered", after(nil), true, "0 unanswered"},
		{"brownout", "≥ 99.9% answered on the first try", after(func(a *lab.AfterFault) { a.FirstTry, a.AfterRetry = 95000, 5000 }), false, "95.000%"},
		{"healthy", "hedges ≤ 0.1%", healthy(nil), true, "50 hedges for 100000 sent (0.050%)"},
		{"healthy", "hedges ≤ 0.1%", healthy(func(a *lab.AfterFault) { a.Hedges = hedged(101) }), false, "(0.101%)"},
		{"healthy", "hedges ≤ 0.1%", healthy(func(a *lab.AfterFault) { a.Hedges = nil }), true, "no hedges reported"},
		{"healthy", "LocalDNS (by NSID) gives ≥ 99.9%", healthy(nil), true, "99.950% (99950 of 100000 answers; dnsstandby 50)"},
		{"healthy", "LocalDNS (by NSID) gives ≥ 99.9%", healthy(func(a *lab.AfterFault) { a.AnsweredBy = lab.AnsweredBy{LocalDNS: 99800, Standby: 200} }), false, "99.800%"},
		{"healthy", "LocalDNS (by NSID) gives ≥ 99.9%", healthy(func(a *lab.AfterFault) { a.FirstTry, a.AnsweredBy = 0, lab.AnsweredBy{} }), false, "0 of 0"},
		{"healthy", "0 mismatched replies", run(healthy(nil), func(r *lab.LabRun) { r.Duplicates = 7 }), true, "0 mismatched, 7 duplicates"},
		{"healthy", "0 mismatched replies", run(healthy(nil), func(r *lab.LabRun) { r.Mismatched = 1 }), false, "1 mismatched"},
	}
	rules := hedgeRules()
	for _, tc := range tests {
		i := 0
		for i < len(rules) && (rules[i].scenario != tc.scenario || !strings.HasPrefix(rules[i].require, tc.require)) {
			i++
		}
		if i == len(rules) {
			t.Errorf("%s: no rule %q", tc.scenario, tc.require)
			continue
		}
		pass, found := rules[i].check(tc.run)
		if pass != tc.pass || !strings.Contains(found, tc.found) {
			t.Errorf("%s %q: pass %v, found %q; want %v and %q", tc.scenario, tc.require, pass, found, tc.pass, tc.found)
		}
	}
}

// TestCheckRunsHedges: the hedge rules apply to the dnsstandby setup's
// runs of their scenarios, on every client, only when switched on.
func TestCheckRunsHedges(t *testing.T) {
	good := func(scenario, setup, client string) lab.LabRun {
		return lab.LabRun{Scenario: scenario, Setup: setup, Client: client, Listener: listenerOf(client),
			AfterFault: &lab.AfterFault{Sent: 1000, FirstTry: 1000, P99Ms: 1, GlibcOK: 10, GlibcMaxMs: 5}}
	}
	both := []string{clientPod, clientNode}
	all := []string{setupShipped, setupPR9439, setupStandby}
	tests := []struct {
		name     string
		scenario string
		setups   []string
		hedges   bool
		runs     []lab.LabRun
		want     int // checks
		failed   int
	}{
		{"off", "hang", all, false, []lab.LabRun{good("hang", setupStandby, clientPod), good("hang", setupStandby, clientNode)}, 0, 0},
		{"hang, both clients", "hang", all, true, []lab.LabRun{good("hang", setupStandby, clientPod), good("hang", setupStandby, clientNode)}, 8, 0},
		{"the other setups' runs are not checked", "lossy", all, true,
			[]lab.LabRun{good("lossy", setupShipped, clientPod), good("lossy", setupStandby, clientPod), good("lossy", setupStandby, clientNode)}, 4, 0},
		{"a missing run fails once", "brownout", all, true, []lab.LabRun{good("brownout", setupStandby, clientPod)}, 3, 1},
		{"without the dnsstandby setup nothing is checked", "hang", []string{setupShipped}, true, []lab.LabRun{good("hang", setupShipped, clientPod)}, 0, 0},
		{"a scenario without hedge rules", "planned-restart", all, true, []lab.LabRun{good("planned-restart", setupStandby, clientPod)}, 0, 0},
		{"lossless and hedge rules together", "crash-storm", all, true,
			[]lab.LabRun{good("crash-storm", setupStandby, clientPod), good("crash-storm", setupStandby, clientNode)}, 4, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := checkRuns(tc.scenario, tc.setups, both, tc.runs, tc.hedges)
			failed := 0
			for _, c := range got {
				if !c.Pass {
					failed++
				}
				if c.Setup != setupStandby || c.Scenario != tc.scenario || c.Listener != listenerOf(c.Client) {
					t.Errorf("check on the wrong run: %s", c)
				}
			}
			if len(got) != tc.want || failed != tc.failed {
				t.Errorf("%d checks, %d failed; want %d, %d: %v", len(got), failed, tc.want, tc.failed, got)
			}
		})
	}
}

func TestHedgeCounts(t *testing.T) {
	const withHedges = `# TYPE dnsstandby_hedge_sent_total counter
dnsstandby_hedge_sent_total{listener="169.254.10.11:53",source="cache"} 7
dnsstandby_hedge_sent_total{listener="169.254.10.11:53",source="stale"} 2
dnsstandby_hedge_sent_total{listener="169.254.10.10:53",source="upstream"} 1
# TYPE dnsstandby_hedge_outcomes_total counter
dnsstandby_hedge_outcomes_total{listener="169.254.10.11:53",localdns="later"} 8
dnsstandby_hedge_outcomes_total{listener="169.254.10.11:53",localdns="never"} 1
# TYPE dnsstandby_queries_total counter
dnsstandby_queries_total{listener="169.254.10.11:53"} 100
`
	const without = "# TYPE dnsstandby_queries_total counter\ndnsstandby_queries_total{listener=\"169.254.10.11:53\"} 100\n"
	tests := []struct {
		name, page string
		want       map[string]*lab.Hedges
	}{
		{"hedging daemon", withHedges, map[string]*lab.Hedges{
			"169.254.10.11:53": {Total: 9, Cache: 7, Stale: 2, Later: 8, Never: 1},
			"169.254.10.10:53": {Total: 1, Upstream: 1},
		}},
		{"daemon without hedges", without, nil},
	}
	for _, tc := range tests {
		m, err := testbed.ParseMetrics(strings.NewReader(tc.page))
		if err != nil {
			t.Fatal(err)
		}
		if got := hedgeCounts(m); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestReadTestNote: the note names the listener's UDP group's counts,
// and is empty for a daemon without the read test there.
func TestReadTestNote(t *testing.T) {
	const page = `# TYPE dnsstandby_steer_unread_bypassed_total counter
dnsstandby_steer_unread_bypassed_total{group="169.254.10.11:53/udp"} 3
dnsstandby_steer_unread_bypassed_total{group="169.254.10.10:53/udp"} 0
# TYPE dnsstandby_steer_unread_max_wait_seconds gauge
dnsstandby_steer_unread_max_wait_seconds{group="169.254.10.11:53/udp"} 0.0123
dnsstandby_steer_unread_max_wait_seconds{group="169.254.10.10:53/udp"} 0.0021
`
	m, err := testbed.ParseMetrics(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	for listener, want := range map[string]string{
		"169.254.10.11": "3 packets kept from dnsstandby for not reading, longest unread wait 12.3 ms",
		"169.254.10.10": "0 packets kept from dnsstandby for not reading, longest unread wait 2.1 ms",
		"169.254.10.12": "",
	} {
		if got := readTestNote(m, listener+":53"); !strings.HasSuffix(got, want) || (want == "") != (got == "") {
			t.Errorf("%s: %q, want one ending in %q", listener, got, want)
		}
	}
	if got := readTestNote(nil, "169.254.10.11:53"); got != "" {
		t.Errorf("no metrics: %q, want none", got)
	}
}

// TestLossyCorefile: every server block of LocalDNS's Corefile gets the
// lossy line once, and nothing else changes.
func TestLossyCorefile(t *testing.T) {
	orig := lab.LocalDNSCorefile()
	got := lossyCorefile(orig)
	line := "    lossy 10 " + lossySwitch + "\n"
	// Four blocks: the health check, the node's root and cluster.local,
	// the pods' root.
	if n := strings.Count(got, line); n != 4 || n != strings.Count(orig, "    bind ") {
		t.Errorf("%d lossy lines for %d bind lines:\n%s", n, strings.Count(orig, "    bind "), got)
	}
	if strings.ReplaceAll(got, line, "") != orig {
		t.Errorf("more than the lossy lines changed:\n%s", got)
	}
	for _, b := range strings.Split(got, "\n}\n") {
		if strings.Contains(b, "bind ") && !strings.Contains(b, "bind 169.254.10.1") {
			t.Errorf("unexpected bind in %q", b)
		}
		if strings.Contains(b, "bind ") && !strings.Contains(b, line) {
			t.Errorf("block without the lossy line:\n%s", b)
		}
	}
}
