package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

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
// must answer for LocalDNS on both listeners without losing a query;
// where dnsstandby itself is restarted, upgraded or handed over while it
// answers alone, from its cache, nothing may be lost either; nor where
// LocalDNS is given a Corefile it refuses, which dnsstandby must not apply;
// and a dnsstandby that stalls while it holds the traffic must give it
// back to LocalDNS before a client's retry (1 s) falls in the stall too.
func losslessRules() []losslessRule {
	return []losslessRule{
		{"crash-storm", setupStandby},
		{"permanent-failure", setupStandby},
		{"interface-teardown", setupStandby},
		{"standby-restart", setupStandby},
		{"standby-upgrade", setupStandby},
		{"standby-surge", setupStandby},
		{"standby-stall", setupStandby},
		{"bad-corefile", setupStandby},
		{"aks-fallback-coredns", setupStandby},
		{"aks-fallback-kubelet", setupStandby},
		{"aks-fallback-nat", setupStandby},
	}
}

// faultRules are the scenarios whose fault checks its own outcome, and
// what it checks: there an error from the fault fails the dnsstandby
// setup's runs (elsewhere it is a note on them).
func faultRules() map[string]string {
	return map[string]string{
		"standby-upgrade": "the unit's binary and its running process are the new build after the upgrade (no fault error)",
		"bad-corefile":    "LocalDNS never ran on the refused Corefile and ran again on the good one; dnsstandby's restart and cold start succeeded (no fault error)",
	}
}

// faultChecks checks each client's run of setupStandby in scenario
// against faultRules.
func faultChecks(scenario string, runs []lab.LabRun) []lab.Check {
	require, ok := faultRules()[scenario]
	if !ok {
		return nil
	}
	var out []lab.Check
	for _, r := range runs {
		if r.Scenario != scenario || r.Setup != setupStandby {
			continue
		}
		c := lab.Check{Scenario: r.Scenario, Setup: r.Setup, Listener: r.Listener, Client: r.Client,
			Require: require, Pass: r.FaultError == "", Found: "no error"}
		if !c.Pass {
			c.Found = r.FaultError
		}
		out = append(out, c)
	}
	return out
}

// runRule is one requirement on the dnsstandby setup's run of a
// scenario, on each client: check says whether the run meets it and what
// it found.
type runRule struct {
	scenario, require string
	check             func(r lab.LabRun) (pass bool, found string)
}

// hedgeRules are what a dnsstandby that hedges (answers itself, from the
// same address, the queries LocalDNS leaves unanswered past a short
// deadline) must show, over what was sent from the fault on: in a hang,
// nearly nothing waits for the retry; with loss and in a brownout, nearly
// nothing is late; when all is well, LocalDNS keeps answering and
// dnsstandby stays out of the way. A dnsstandby that does not hedge fails
// hang, lossy and brownout: -hedge-checks=false leaves them out.
func hedgeRules() []runRule {
	return []runRule{
		{"hang", "0 queries unanswered from the fault on", unanswered},
		{"hang", "≥ 99.9% answered on the first try from the fault on", firstTry(0.999)},
		{"hang", "longest first-try gap ≤ 250 ms from the fault on", maxGap(250)},
		{"hang", "no glibc lookup failed or over 1 s from the fault on", glibcWithin(1000)},
		{"lossy", "≥ 99.99% answered on the first try from the fault on", firstTry(0.9999)},
		{"lossy", "p99 ≤ 200 ms from the fault on", p99Within(200)},
		{"brownout", "0 queries unanswered from the fault on", unanswered},
		{"brownout", "≥ 99.9% answered on the first try from the fault on", firstTry(0.999)},
		{"healthy", "hedges ≤ 0.1% of queries from the fault on", hedgeShare(0.001)},
		{"healthy", "LocalDNS (by NSID) gives ≥ 99.9% of the answers from the fault on", localDNSShare(0.999)},
		{"healthy", "0 mismatched replies", noMismatched},
	}
}

// outageRules are what the dnsstandby setup must show where LocalDNS is
// down for good until someone repairs it, beyond losing nothing: names no
// cache can hold still resolve (dnsstandby reaches the upstreams, with the
// configuration it applied last), and once LocalDNS runs again it gets its
// traffic back.
func outageRules() []runRule {
	return []runRule{
		{"bad-corefile", "names never asked before: 0 unanswered from the fault on", freshAnswered},
		{"bad-corefile", "LocalDNS (by NSID) gives ≥ 99% of the answers once back", recoveredShare(0.99)},
	}
}

// fallbackRules are what the dnsstandby setup must show beside AKS's
// LocalDNS fallback (AgentBaker PR 9486): during a crash storm, while
// dnsstandby answers, neither the probe nor OnFailure= starts it; where
// LocalDNS fails for good and the fallback starts anyway, dnsstandby says
// so once per start, and says it is gone once LocalDNS took over again.
func fallbackRules() []runRule {
	var rules []runRule
	rules = append(rules, runRule{"crash-storm", "AKS's LocalDNS fallback started 0 times (probe every 5 s, OnFailure=)", fallbackStarts(0)})
	for _, d := range lab.FallbackDesigns {
		rules = append(rules, runRule{"aks-fallback-" + d,
			`dnsstandby logged "` + standbyFallbackSeen + `" once per fallback start and "` + standbyFallbackGone + `" after each hand-back`, fallbackReported})
	}
	return rules
}

// fallbackStarts: the node's fallback took over exactly want times.
func fallbackStarts(want int) func(lab.LabRun) (bool, string) {
	return func(r lab.LabRun) (bool, string) {
		f := r.Fallback
		if f == nil || f.Starts < 0 {
			return false, "no fallback counts (its journal could not be read)"
		}
		return f.Starts == want, fmt.Sprintf("%d starts (%d declined: localdns.service between restart attempts)", f.Starts, f.Declines)
	}
}

// fallbackReported: the fallback started, and dnsstandby logged it seen and
// gone as many times.
func fallbackReported(r lab.LabRun) (bool, string) {
	f := r.Fallback
	if f == nil || f.Starts < 0 {
		return false, "no fallback counts (its journal could not be read)"
	}
	return f.Starts > 0 && f.Seen == f.Starts && f.Gone == f.Starts,
		fmt.Sprintf("fallback started %d times; dnsstandby logged seen %d, gone %d", f.Starts, f.Seen, f.Gone)
}

// freshAnswered: every query for a name never asked before was answered,
// from the fault on.
func freshAnswered(r lab.LabRun) (bool, string) {
	f := r.AfterFault.Fresh
	if f == nil {
		return false, "no names never asked before in the load"
	}
	return f.Sent > 0 && f.Unanswered == 0,
		fmt.Sprintf("%d unanswered of %d sent (%d after the retry; answered by dnsstandby %d, LocalDNS %d)",
			f.Unanswered, f.Sent, f.AfterRetry, f.AnsweredBy.Standby, f.AnsweredBy.ByLocalDNS())
}

// recoveredShare: over what was sent once LocalDNS had had time to take
// its traffic back (LabRun.Recovered), LocalDNS gave at least share of
// the answers.
func recoveredShare(share float64) func(lab.LabRun) (bool, string) {
	return func(r lab.LabRun) (bool, string) {
		a := r.Recovered
		if a == nil {
			return false, "no time counted after LocalDNS came back (it did not, or the run ended first)"
		}
		by := a.AnsweredBy
		got := float64(by.ByLocalDNS()) / float64(max(by.Total(), 1))
		return by.Total() > 0 && got >= share,
			fmt.Sprintf("%.3f%% (%d of %d answers from %.0f ms on; dnsstandby %d; %d unanswered)",
				100*got, by.ByLocalDNS(), by.Total(), a.AtMs, by.Standby, a.Unanswered)
	}
}

func unanswered(r lab.LabRun) (bool, string) {
	a := r.AfterFault
	return a.Sent > 0 && a.Unanswered == 0, fmt.Sprintf("%d unanswered of %d sent", a.Unanswered, a.Sent)
}

func firstTry(share float64) func(lab.LabRun) (bool, string) {
	return func(r lab.LabRun) (bool, string) {
		a := r.AfterFault
		return a.Sent > 0 && a.FirstTryShare() >= share,
			fmt.Sprintf("%.3f%% (%d of %d)", 100*a.FirstTryShare(), a.FirstTry, a.Sent)
	}
}

func maxGap(ms float64) func(lab.LabRun) (bool, string) {
	return func(r lab.LabRun) (bool, string) {
		a := r.AfterFault
		return a.Sent > 0 && a.MaxGapMs <= ms, fmt.Sprintf("%.0f ms", a.MaxGapMs)
	}
}

func glibcWithin(ms float64) func(lab.LabRun) (bool, string) {
	return func(r lab.LabRun) (bool, string) {
		a := r.AfterFault
		return a.GlibcOK > 0 && a.GlibcFail == 0 && a.GlibcMaxMs <= ms,
			fmt.Sprintf("%d failed, %d ok, slowest %.0f ms", a.GlibcFail, a.GlibcOK, a.GlibcMaxMs)
	}
}

func p99Within(ms float64) func(lab.LabRun) (bool, string) {
	return func(r lab.LabRun) (bool, string) {
		a := r.AfterFault
		return a.FirstTry+a.AfterRetry > 0 && a.P99Ms <= ms, fmt.Sprintf("p99 %.1f ms", a.P99Ms)
	}
}

// hedgeShare counts a dnsstandby that reports no hedges as hedging none:
// one without hedging cannot have hedged, and one that has not hedged yet
// shows no series. Both count from the fault on (healthy's is its end of
// LocalDNS's warm-up).
func hedgeShare(share float64) func(lab.LabRun) (bool, string) {
	return func(r lab.LabRun) (bool, string) {
		a := r.AfterFault
		if a.Hedges == nil {
			return a.Sent > 0, fmt.Sprintf("no hedges reported, %d sent", a.Sent)
		}
		got := float64(*a.Hedges) / float64(max(a.Sent, 1))
		return a.Sent > 0 && got <= share, fmt.Sprintf("%d hedges for %d sent (%.3f%%)", *a.Hedges, a.Sent, 100*got)
	}
}

func localDNSShare(share float64) func(lab.LabRun) (bool, string) {
	return func(r lab.LabRun) (bool, string) {
		by := r.AfterFault.AnsweredBy
		answered := by.Total()
		got := float64(by.ByLocalDNS()) / float64(max(answered, 1))
		return answered > 0 && got >= share,
			fmt.Sprintf("%.3f%% (%d of %d answers; dnsstandby %d)", 100*got, by.ByLocalDNS(), answered, by.Standby)
	}
}

func noMismatched(r lab.LabRun) (bool, string) {
	return r.Sent > 0 && r.Mismatched == 0, fmt.Sprintf("%d mismatched, %d duplicates, of %d sent", r.Mismatched, r.Duplicates, r.Sent)
}

// maxGapRules are the scenarios with a bound on the longest a client may
// go without an answer on its first try. Where dnsstandby hands over to
// another process of its own, 20 ms: a handover shares the sockets, so
// nothing waits for a bind or a program. Where it stalls while it holds
// the traffic (standby-stall), 250 ms: the steering program's read test
// must hand the traffic back to LocalDNS within that of dnsstandby going
// silent, whatever systemd's watchdog does seconds later (issue 20).
func maxGapRules() map[string]float64 {
	return map[string]float64{"standby-restart": 20, "standby-upgrade": 20, "standby-surge": 20, "standby-stall": 250}
}

// gapChecks checks each run of setupStandby in scenario against
// maxGapRules, from the fault on (before it, LocalDNS's warm-up is every
// setup's).
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
		c := lab.Check{Scenario: r.Scenario, Setup: r.Setup, Listener: r.Listener, Client: r.Client,
			Require: fmt.Sprintf("no gap over %.0f ms without an answer on the first try from the fault on", limit)}
		if a := r.AfterFault; a != nil && a.Sent > 0 {
			c.Pass, c.Found = a.MaxGapMs <= limit, fmt.Sprintf("longest %.1f ms", a.MaxGapMs)
		} else {
			c.Found = "nothing sent from the fault on"
		}
		out = append(out, c)
	}
	return out
}

// checkRuns checks the runs of one scenario against the rules that apply
// to it and to the setups that ran (the hedge rules only with hedges set):
// for each such setup, each of clients must have a run, with nothing
// unanswered and no glibc lookup failed from the fault on where the
// lossless rules apply, and each outage and hedge rule met.
func checkRuns(scenario string, setups, clients []string, runs []lab.LabRun, hedges bool) []lab.Check {
	var out []lab.Check
	// find returns the setup's run for client, or appends a failed check
	// saying it is missing.
	missing := map[[2]string]bool{} // said once per setup and client
	find := func(setup, client string) (lab.LabRun, bool) {
		i := slices.IndexFunc(runs, func(r lab.LabRun) bool {
			return r.Scenario == scenario && r.Setup == setup && r.Client == client
		})
		if i < 0 || runs[i].AfterFault == nil {
			if missing[[2]string{setup, client}] {
				return lab.LabRun{}, false
			}
			missing[[2]string{setup, client}] = true
			out = append(out, lab.Check{Scenario: scenario, Setup: setup, Listener: listenerOf(client), Client: client,
				Require: "a run with counts from the fault on", Found: "none"})
			return lab.LabRun{}, false
		}
		return runs[i], true
	}
	for _, rule := range losslessRules() {
		if rule.scenario != scenario || !slices.Contains(setups, rule.setup) {
			continue
		}
		for _, client := range clients {
			if r, ok := find(rule.setup, client); ok {
				out = append(out, losslessChecks(r)...)
			}
		}
	}
	out = append(out, gapChecks(scenario, runs)...)
	out = append(out, faultChecks(scenario, runs)...)
	out = append(out, upstreamChecks(scenario, setups, clients, runs)...)
	if !slices.Contains(setups, setupStandby) {
		return out
	}
	all := append(outageRules(), fallbackRules()...)
	if hedges {
		all = append(all, hedgeRules()...)
	}
	var rules []runRule
	for _, rule := range all {
		if rule.scenario == scenario {
			rules = append(rules, rule)
		}
	}
	if len(rules) == 0 {
		return out
	}
	for _, client := range clients {
		r, ok := find(setupStandby, client)
		if !ok {
			continue
		}
		for _, rule := range rules {
			if r.Fallback == nil && strings.Contains(rule.require, "fallback") {
				continue // the node had no AKS fallback (runScenario sets counts on every node that had one)
			}
			pass, found := rule.check(r)
			out = append(out, lab.Check{Scenario: r.Scenario, Setup: r.Setup, Listener: r.Listener, Client: r.Client,
				Require: rule.require, Pass: pass, Found: found})
		}
	}
	return out
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
	if at := failedLookups(r, a.AtMs); at != "" {
		// Where they began, to set beside the scenario's events.
		lookups.Found += "; failed ones began at " + at
	}
	if w := a.GlibcWhileStopped; w != nil {
		// With dnsstandby stopped for its cold start, LocalDNS down,
		// nothing listens: glibc is refused at once (it waits for no
		// timeout), whoever stands by. A reboot, which the cold start
		// stands for, runs no client then: those lookups are shown,
		// not counted.
		lookups.Require = "0 glibc lookups failed from the fault on but while dnsstandby was stopped for its cold start"
		fail, ok := a.GlibcFail-w.Fail, a.GlibcOK-w.OK
		lookups.Pass = fail == 0 && ok > 0
		lookups.Found = fmt.Sprintf("%d failed, %d ok; while stopped, %d failed, %d ok", fail, ok, w.Fail, w.OK)
	}
	return []lab.Check{queries, lookups}
}

// failedLookups lists the timeline bins, from fromMs on, in which failed
// glibc lookups began ("105800 ms", or "105800 ms (2)" for two), at most
// five; "" for none.
func failedLookups(r lab.LabRun, fromMs float64) string {
	tl := r.Timeline
	if tl.Step <= 0 {
		return ""
	}
	var out []string
	for i, n := range tl.GlibcFail {
		at := float64(time.Duration(i)*tl.Step) / float64(time.Millisecond)
		if n == 0 || at+float64(tl.Step/time.Millisecond) <= fromMs {
			continue
		}
		s := fmt.Sprintf("%.0f ms", at)
		if n > 1 {
			s += fmt.Sprintf(" (%d)", n)
		}
		if out = append(out, s); len(out) == 5 {
			break
		}
	}
	return strings.Join(out, ", ")
}

// listenerOf is the listener a client asks.
func listenerOf(client string) string {
	if client == clientNode {
		return nodeDNS
	}
	return localDNS
}
