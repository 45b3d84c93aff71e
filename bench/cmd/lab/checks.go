package main

import (
	"fmt"
	"slices"

	"github.com/dnsstandby/dnsstandby/bench/lab"
)

// losslessRule says that under setup, in scenario, every client must lose
// nothing from the fault on: every query answered (the retry may answer
// it) and every glibc lookup successful. What comes before the fault is
// the baseline, where the machine's own hiccups show in every setup alike.
type losslessRule struct {
	scenario, setup string
}

// losslessRules are the lab's pass/fail checks: where LocalDNS's process
// dies or its link goes while kube-dns and the VNet DNS stay up, dnsstandby
// must answer for LocalDNS on both listeners without losing a query.
func losslessRules() []losslessRule {
	return []losslessRule{
		{"crash-storm", setupStandby},
		{"permanent-failure", setupStandby},
		{"interface-teardown", setupStandby},
	}
}

// maxGapRules are the scenarios where dnsstandby hands over to another
// process of its own, and the longest a client may go without an answer
// on its first try: a handover shares the sockets, so nothing waits for
// a bind or a program.
func maxGapRules() map[string]float64 {
	return map[string]float64{"standby-surge": 20}
}

// gapChecks checks each run of setupStandby in scenario against
// maxGapRules.
func gapChecks(scenario string, runs []lab.LabRun) []lab.Check {
	limit, ok := maxGapRules()[scenario]
	if !ok {
		return nil
	}
	var out []lab.Check
	for _, r := range runs {
		if r.Scenario != scenario || r.Setup != setupStandby {
			continue
		}
		out = append(out, lab.Check{Scenario: r.Scenario, Setup: r.Setup, Listener: r.Listener, Client: r.Client,
			Require: fmt.Sprintf("no gap over %.0f ms without an answer on the first try", limit),
			Pass:    r.MaxGapMs <= limit,
			Found:   fmt.Sprintf("longest %.1f ms, from %.0f ms", r.MaxGapMs, r.MaxGapFromMs)})
	}
	return out
}

// checkRuns checks the runs of one scenario against the rules that apply
// to it and to the setups that ran: for each such setup, each of clients
// must have a run, with nothing unanswered and no glibc lookup failed from
// the fault on.
func checkRuns(scenario string, setups, clients []string, runs []lab.LabRun) []lab.Check {
	var out []lab.Check
	for _, rule := range losslessRules() {
		if rule.scenario != scenario || !slices.Contains(setups, rule.setup) {
			continue
		}
		for _, client := range clients {
			i := slices.IndexFunc(runs, func(r lab.LabRun) bool {
				return r.Scenario == scenario && r.Setup == rule.setup && r.Client == client
			})
			if i < 0 || runs[i].AfterFault == nil {
				out = append(out, lab.Check{Scenario: scenario, Setup: rule.setup, Listener: listenerOf(client), Client: client,
					Require: "a run with counts from the fault on", Found: "none"})
				continue
			}
			out = append(out, losslessChecks(runs[i])...)
		}
	}
	return append(out, gapChecks(scenario, runs)...)
}

// losslessChecks are the two checks of one run: queries, glibc lookups.
func losslessChecks(r lab.LabRun) []lab.Check {
	a := r.AfterFault
	base := lab.Check{Scenario: r.Scenario, Setup: r.Setup, Listener: r.Listener, Client: r.Client}
	queries, lookups := base, base
	queries.Require = "0 queries unanswered from the fault on"
	queries.Pass = a.Unanswered == 0 && a.Sent > 0
	// The sender's lag says whether the machine could run the load at all:
	// seconds of it, and the losses are the machine's.
	queries.Found = fmt.Sprintf("%d unanswered of %d sent from %.0f ms on (%d after the retry; sender lag up to %.0f ms)",
		a.Unanswered, a.Sent, a.AtMs, a.AfterRetry, r.MaxLagMs)
	lookups.Require = "0 glibc lookups failed from the fault on"
	lookups.Pass = a.GlibcFail == 0 && a.GlibcOK > 0
	lookups.Found = fmt.Sprintf("%d failed, %d ok", a.GlibcFail, a.GlibcOK)
	return []lab.Check{queries, lookups}
}

// listenerOf is the listener a client asks.
func listenerOf(client string) string {
	if client == clientNode {
		return nodeDNS
	}
	return localDNS
}
