package main

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dnsstandby/dnsstandby/bench/lab"
)

// gapRun is r with its longest first-try gap from the fault on set to
// ms, and a longer one over the whole run (the warm-up's).
func gapRun(r lab.LabRun, ms float64) lab.LabRun {
	a := *r.AfterFault
	a.MaxGapMs = ms
	r.AfterFault, r.MaxGapMs = &a, 900
	return r
}

// freshRun is r with 200 queries for fresh names from the fault on, lost
// of them unanswered.
func freshRun(r lab.LabRun, lost int) lab.LabRun {
	a := *r.AfterFault
	a.Fresh = &lab.FreshCounts{Sent: 200, FirstTry: 200 - lost, Unanswered: lost, AnsweredBy: lab.AnsweredBy{Standby: 200 - lost}}
	r.AfterFault = &a
	return r
}

// recoveredRun is r with a recovery window in which LocalDNS gave
// localdns answers and dnsstandby standby.
func recoveredRun(r lab.LabRun, localdns, standby int) lab.LabRun {
	r.Recovered = &lab.AfterFault{AtMs: 60000, Sent: localdns + standby, FirstTry: localdns + standby,
		AnsweredBy: lab.AnsweredBy{LocalDNS: localdns, Standby: standby}}
	return r
}

// faultRun is r with the fault's error err.
func faultRun(r lab.LabRun, err string) lab.LabRun {
	r.FaultError = err
	return r
}

func TestCheckRuns(t *testing.T) {
	run := func(scenario, setup, client string, a *lab.AfterFault) lab.LabRun {
		return lab.LabRun{Scenario: scenario, Setup: setup, Client: client, Listener: listenerOf(client), AfterFault: a}
	}
	clean := func() *lab.AfterFault { return &lab.AfterFault{AtMs: 11000, Sent: 120000, AfterRetry: 3, GlibcOK: 300} }
	lost := func(queries, lookups int) *lab.AfterFault {
		a := clean()
		a.Unanswered, a.GlibcFail = queries, lookups
		return a
	}
	both := []string{clientPod, clientNode}
	all := []string{setupShipped, setupPR9439, setupStandby}
	tests := []struct {
		name     string
		scenario string
		setups   []string
		clients  []string
		runs     []lab.LabRun
		want     []string // "PASS|FAIL client require-prefix", in order
	}{
		{
			name: "a scenario without rules", scenario: "hang", setups: all, clients: both,
			runs: []lab.LabRun{run("hang", setupStandby, clientPod, lost(2000, 5))},
		},
		{
			name: "dnsstandby not among the setups", scenario: "crash-storm", setups: []string{setupShipped}, clients: both,
			runs: []lab.LabRun{run("crash-storm", setupShipped, clientPod, lost(100000, 300))},
		},
		{
			name: "both clients lossless; other setups' losses are not checked", scenario: "crash-storm", setups: all, clients: both,
			runs: []lab.LabRun{
				run("crash-storm", setupShipped, clientPod, lost(100000, 300)),
				run("crash-storm", setupStandby, clientPod, clean()),
				run("crash-storm", setupStandby, clientNode, clean()),
			},
			want: []string{"PASS pod 0 queries", "PASS pod 0 glibc", "PASS node 0 queries", "PASS node 0 glibc"},
		},
		{
			name: "the node's listener loses queries", scenario: "permanent-failure", setups: all, clients: both,
			runs: []lab.LabRun{
				run("permanent-failure", setupStandby, clientPod, clean()),
				run("permanent-failure", setupStandby, clientNode, lost(2, 0)),
			},
			want: []string{"PASS pod 0 queries", "PASS pod 0 glibc", "FAIL node 0 queries", "PASS node 0 glibc"},
		},
		{
			name: "a glibc lookup fails", scenario: "interface-teardown", setups: all, clients: both,
			runs: []lab.LabRun{
				run("interface-teardown", setupStandby, clientPod, lost(0, 1)),
				run("interface-teardown", setupStandby, clientNode, clean()),
			},
			want: []string{"PASS pod 0 queries", "FAIL pod 0 glibc", "PASS node 0 queries", "PASS node 0 glibc"},
		},
		{
			name: "nothing sent or looked up proves nothing", scenario: "crash-storm", setups: all, clients: []string{clientPod},
			runs: []lab.LabRun{run("crash-storm", setupStandby, clientPod, &lab.AfterFault{})},
			want: []string{"FAIL pod 0 queries", "FAIL pod 0 glibc"},
		},
		{
			name: "a missing run fails", scenario: "crash-storm", setups: all, clients: both,
			runs: []lab.LabRun{
				run("crash-storm", setupStandby, clientPod, clean()),
				run("crash-storm", setupStandby, clientNode, nil),
			},
			want: []string{"PASS pod 0 queries", "PASS pod 0 glibc", "FAIL node a run"},
		},
		{
			// With hedge checks off (as this table runs), the handover's
			// gap check still applies.
			name: "a surge handover leaves a gap", scenario: "standby-surge", setups: []string{setupStandby}, clients: both,
			runs: []lab.LabRun{
				gapRun(run("standby-surge", setupStandby, clientPod, clean()), 3),
				gapRun(run("standby-surge", setupStandby, clientNode, clean()), 25),
			},
			want: []string{"PASS pod 0 queries", "PASS pod 0 glibc", "PASS node 0 queries", "PASS node 0 glibc",
				"PASS pod no gap over 20 ms", "FAIL node no gap over 20 ms"},
		},
		{
			name: "an upgrade: lossless, no gap, the new build running", scenario: "standby-upgrade", setups: []string{setupStandby}, clients: both,
			runs: []lab.LabRun{
				gapRun(run("standby-upgrade", setupStandby, clientPod, clean()), 4),
				gapRun(run("standby-upgrade", setupStandby, clientNode, clean()), 0),
			},
			want: []string{"PASS pod 0 queries", "PASS pod 0 glibc", "PASS node 0 queries", "PASS node 0 glibc",
				"PASS pod no gap over 20 ms", "PASS node no gap over 20 ms",
				"PASS pod the unit's binary and its running process are the new build",
				"PASS node the unit's binary and its running process are the new build"},
		},
		{
			name: "an upgrade that left the old build running fails however clean", scenario: "standby-upgrade", setups: []string{setupStandby}, clients: both,
			runs: []lab.LabRun{
				faultRun(gapRun(run("standby-upgrade", setupStandby, clientPod, clean()), 4), "upgrade: the running dnsstandby says old"),
				faultRun(gapRun(run("standby-upgrade", setupStandby, clientNode, clean()), 0), "upgrade: the running dnsstandby says old"),
			},
			want: []string{"PASS pod 0 queries", "PASS pod 0 glibc", "PASS node 0 queries", "PASS node 0 glibc",
				"PASS pod no gap over 20 ms", "PASS node no gap over 20 ms",
				"FAIL pod the unit's binary and its running process are the new build",
				"FAIL node the unit's binary and its running process are the new build"},
		},
		{
			// Elsewhere a fault's error is a note, not a verdict.
			name: "a restart's fault error is not checked", scenario: "standby-restart", setups: []string{setupStandby}, clients: []string{clientPod},
			runs: []lab.LabRun{faultRun(gapRun(run("standby-restart", setupStandby, clientPod, clean()), 4), "restart dnsstandby: exit status 1")},
			want: []string{"PASS pod 0 queries", "PASS pod 0 glibc", "PASS pod no gap over 20 ms"},
		},
		{
			name: "a stall handed back within 250 ms passes, one slower fails", scenario: "standby-stall", setups: []string{setupStandby}, clients: both,
			runs: []lab.LabRun{
				gapRun(run("standby-stall", setupStandby, clientPod, clean()), 250),
				gapRun(run("standby-stall", setupStandby, clientNode, lost(69, 0)), 1275),
			},
			want: []string{"PASS pod 0 queries", "PASS pod 0 glibc", "FAIL node 0 queries", "PASS node 0 glibc",
				"PASS pod no gap over 250 ms", "FAIL node no gap over 250 ms"},
		},
		{
			name: "a bad Corefile: lossless, fresh names answered, LocalDNS back, the fault as planned", scenario: "bad-corefile", setups: all, clients: both,
			runs: []lab.LabRun{
				run("bad-corefile", setupPR9439, clientPod, lost(50000, 200)),
				recoveredRun(freshRun(run("bad-corefile", setupStandby, clientPod, clean()), 0), 4990, 10),
				recoveredRun(freshRun(run("bad-corefile", setupStandby, clientNode, clean()), 0), 1250, 0),
			},
			want: []string{"PASS pod 0 queries", "PASS pod 0 glibc", "PASS node 0 queries", "PASS node 0 glibc",
				"PASS pod LocalDNS never ran on the refused Corefile", "PASS node LocalDNS never ran on the refused Corefile",
				"PASS pod names never asked before", "PASS pod LocalDNS (by NSID) gives ≥ 99%",
				"PASS node names never asked before", "PASS node LocalDNS (by NSID) gives ≥ 99%"},
		},
		{
			name: "a bad Corefile: fresh names lost, LocalDNS's traffic not back, LocalDNS ran on the refused file", scenario: "bad-corefile", setups: all, clients: both,
			runs: []lab.LabRun{
				faultRun(recoveredRun(freshRun(run("bad-corefile", setupStandby, clientPod, clean()), 3), 4900, 100), "bad Corefile: LocalDNS became active on the refused Corefile"),
				// No fresh names in the load, and no time counted after
				// LocalDNS came back: both fail.
				run("bad-corefile", setupStandby, clientNode, clean()),
			},
			want: []string{"PASS pod 0 queries", "PASS pod 0 glibc", "PASS node 0 queries", "PASS node 0 glibc",
				"FAIL pod LocalDNS never ran on the refused Corefile", "PASS node LocalDNS never ran on the refused Corefile",
				"FAIL pod names never asked before", "FAIL pod LocalDNS (by NSID) gives ≥ 99%",
				"FAIL node names never asked before", "FAIL node LocalDNS (by NSID) gives ≥ 99%"},
		},
		{
			name: "without the node's client only the pods are checked", scenario: "crash-storm", setups: all, clients: []string{clientPod},
			runs: []lab.LabRun{run("crash-storm", setupStandby, clientPod, clean())},
			want: []string{"PASS pod 0 queries", "PASS pod 0 glibc"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := checkRuns(tc.scenario, tc.setups, tc.clients, tc.runs, false)
			if len(got) != len(tc.want) {
				t.Fatalf("%d checks, want %d: %v", len(got), len(tc.want), got)
			}
			for i, c := range got {
				verdict := "FAIL"
				if c.Pass {
					verdict = "PASS"
				}
				f := strings.SplitN(tc.want[i], " ", 3)
				if verdict != f[0] || c.Client != f[1] || !strings.HasPrefix(c.Require, f[2]) || c.Listener != listenerOf(c.Client) ||
					c.Scenario != tc.scenario || c.Setup != setupStandby {
					t.Errorf("check %d: %s, want %s", i, c, tc.want[i])
				}
			}
		})
	}
}

// TestLosslessChecksFound: the verdict says what the run showed.
func TestLosslessChecksFound(t *testing.T) {
	// Failed lookups began before the fault (not listed), in the fault's
	// bin, and two in one later bin.
	fails := make([]int, 500)
	fails[50], fails[110], fails[400] = 1, 1, 2
	r := lab.LabRun{Scenario: "crash-storm", Setup: setupStandby, Client: clientNode, Listener: nodeDNS, Summary: lab.Summary{MaxLagMs: 12.3},
		AfterFault: &lab.AfterFault{AtMs: 11000.4, Sent: 60000, AfterRetry: 7, Unanswered: 2, GlibcOK: 290, GlibcFail: 3},
		Timeline:   lab.Timeline{Step: 100 * time.Millisecond, GlibcFail: fails}}
	got := losslessChecks(r)
	for i, want := range []string{
		"FAIL crash-storm dnsstandby node → 169.254.10.10: 0 queries unanswered from the fault on; found 2 unanswered of 60000 sent from 11000 ms on (7 after the retry; sender lag up to 12 ms)",
		"FAIL crash-storm dnsstandby node → 169.254.10.10: 0 glibc lookups failed from the fault on; found 3 failed, 290 ok; failed ones began at 11000 ms, 40000 ms (2)",
	} {
		if got[i].String() != want {
			t.Errorf("check %d:\n got %s\nwant %s", i, got[i], want)
		}
	}
}

// TestOutageRulesFound: the outage checks say what the run showed.
func TestOutageRulesFound(t *testing.T) {
	r := recoveredRun(freshRun(lab.LabRun{AfterFault: &lab.AfterFault{}}, 2), 9800, 200)
	pass, found := freshAnswered(r)
	if want := "2 unanswered of 200 sent (0 after the retry; answered by dnsstandby 198, LocalDNS 0)"; pass || found != want {
		t.Errorf("freshAnswered = %v, %q; want false, %q", pass, found, want)
	}
	pass, found = recoveredShare(0.99)(r)
	if want := "98.000% (9800 of 10000 answers from 60000 ms on; dnsstandby 200; 0 unanswered)"; pass || found != want {
		t.Errorf("recoveredShare = %v, %q; want false, %q", pass, found, want)
	}
}

// TestLosslessChecksWhileStopped: the glibc lookups started while
// dnsstandby was stopped for its cold start are shown, not counted; the
// queries are counted all the same.
func TestLosslessChecksWhileStopped(t *testing.T) {
	r := lab.LabRun{Scenario: "bad-corefile", Setup: setupStandby, Client: clientNode, Listener: nodeDNS,
		AfterFault: &lab.AfterFault{AtMs: 10000, Sent: 18000, AfterRetry: 160, GlibcOK: 348, GlibcFail: 4,
			GlibcWhileStopped: &lab.GlibcCounts{OK: 1, Fail: 4}}}
	got := losslessChecks(r)
	want := "PASS bad-corefile dnsstandby node → 169.254.10.10: 0 glibc lookups failed from the fault on but while dnsstandby was stopped for its cold start; found 0 failed, 347 ok; while stopped, 4 failed, 1 ok"
	if len(got) != 2 || !got[0].Pass || got[1].String() != want {
		t.Errorf("got %v\nwant the queries passed and %s", got, want)
	}
	r.AfterFault.GlibcFail = 5 // one more, outside the stop
	if got := losslessChecks(r); got[1].Pass {
		t.Errorf("a lookup failed outside the stop: %s", got[1])
	}
}

// TestFaultChecksFound: a failed upgrade says what went wrong.
func TestFaultChecksFound(t *testing.T) {
	r := lab.LabRun{Scenario: "standby-upgrade", Setup: setupStandby, Client: clientPod, Listener: localDNS,
		FaultError: `upgrade: /usr/local/bin/dnsstandby version says "dnsstandby (devel), go1.26.8", want "dnsstandby v0.0.0-lab-upgrade, go1.26.8"`}
	got := faultChecks("standby-upgrade", []lab.LabRun{r})
	want := `FAIL standby-upgrade dnsstandby pod → 169.254.10.11: the unit's binary and its running process are the new build after the upgrade (no fault error); found ` + r.FaultError
	if len(got) != 1 || got[0].String() != want {
		t.Errorf("got %v\nwant %s", got, want)
	}
}

// TestRuleScenarios: every scenario a rule names is one the lab runs, on
// a setup it runs there; a scenario that needs the next build runs only
// where dnsstandby does.
func TestRuleScenarios(t *testing.T) {
	var named []string
	for _, r := range losslessRules() {
		named = append(named, r.scenario)
	}
	named = append(named, slices.Collect(maps.Keys(maxGapRules()))...)
	named = append(named, slices.Collect(maps.Keys(faultRules()))...)
	for _, r := range append(hedgeRules(), outageRules()...) {
		named = append(named, r.scenario)
	}
	for _, name := range named {
		if _, ok := findScenario(name); !ok {
			t.Errorf("a rule names scenario %q, which the lab does not have", name)
		}
	}
	for _, sc := range scenarios {
		if sc.next && !sc.standbyOnly {
			t.Errorf("%s installs the next dnsstandby build but runs on setups without dnsstandby", sc.name)
		}
	}
}
