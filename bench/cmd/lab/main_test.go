package main

import (
	"context"
	"testing"
	"time"

	"github.com/dnsstandby/dnsstandby/bench/lab"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

// TestLabSmoke runs the healthy scenario for a few seconds, so that every
// `make test` drives the lab's real parts: systemd guests running LocalDNS
// (CoreDNS 1.13.1) on both listeners, kube-dns and the VNet DNS, pods and
// the node's own client, the loads and the glibc probes.
func TestLabSmoke(t *testing.T) {
	bins := testBinaries(t)
	sc, _ := findScenario("healthy")
	o := &options{qps: 500, nodeQPS: 250, scale: 0.1, bins: bins}
	zones := nstest.KubeDNSZones(nstest.ZoneOptions{Services: 20})
	runs, err := runScenario(context.Background(), sc, defaultSetups, o, zones, nameMixes{pod: nameMix(zones), node: nodeNameMix(zones)})
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2*len(defaultSetups) {
		t.Fatalf("%d runs, want %d: pods and node for each setup", len(runs), 2*len(defaultSetups))
	}
	for _, r := range runs {
		s := r.Summary
		if s.Sent < 500 || s.AnsweredFirstTry != s.Sent || s.GlibcOK == 0 || s.GlibcFail != 0 {
			t.Errorf("%s %s: sent %d, first try %d (after a retry %d, unanswered %d, bad rcodes %v, longest gap %.0f ms from %.0f ms, sender up to %.0f ms behind), glibc ok %d fail %d: a healthy node answers everything at once",
				r.Setup, r.ListenerName(), s.Sent, s.AnsweredFirstTry, s.AnsweredAfterRetry, s.Unanswered, s.BadRcodes,
				s.MaxGapMs, s.MaxGapFromMs, s.MaxLagMs, s.GlibcOK, s.GlibcFail)
		}
		if r.AfterFault == nil || r.AfterFault.Sent == 0 || r.AfterFault.Unanswered != 0 {
			t.Errorf("%s %s: after the (empty) fault %+v", r.Setup, r.ListenerName(), r.AfterFault)
			continue
		}
		// With full steering a healthy LocalDNS answers everything once it
		// has warmed its cache (the baseline), also beside dnsstandby (at
		// most 0.1% from dnsstandby, its hedges), on each listener with
		// its own NSID.
		by := r.AfterFault.AnsweredBy
		byLocalDNS := by.LocalDNS
		if r.Client == clientNode {
			byLocalDNS = by.LocalDNSNode
		}
		if sent := r.AfterFault.Sent; by.Standby*1000 > sent || byLocalDNS+by.Standby != sent {
			t.Errorf("%s %s: from the (empty) fault on, answered by LocalDNS %d, dnsstandby %d of %d", r.Setup, r.ListenerName(), byLocalDNS, by.Standby, sent)
		}
	}
}

// TestRecovered: the recovery is counted from recoverySettle after
// LocalDNS came back, and not at all where it did not or the run ended
// first.
func TestRecovered(t *testing.T) {
	s := time.Second
	res := lab.LoadResult{Duration: 40 * s, Records: []lab.LoadRecord{
		{Sent: 20 * s, Outcome: lab.LoadFirstTry, By: lab.LoadNSIDStandby},
		{Sent: 31 * s, Outcome: lab.LoadFirstTry, By: lab.LoadNSIDLocalDNS},
		{Sent: 32 * s, Outcome: lab.LoadFirstTry, By: lab.LoadNSIDLocalDNS},
	}}
	back := []lab.Event{{At: 5 * s, Label: refusedMark}, {At: 20 * s, Label: localDNSBackMark}}
	got := recovered(res, lab.ProbeResult{}, back)
	if got == nil || got.AtMs != 30000 || got.Sent != 2 || got.AnsweredBy.LocalDNS != 2 || got.AnsweredBy.Standby != 0 {
		t.Errorf("recovered = %+v, want the 2 queries from 30 s on, both LocalDNS's", got)
	}
	if got := recovered(res, lab.ProbeResult{}, back[:1]); got != nil {
		t.Errorf("LocalDNS never back: recovered = %+v, want nil", got)
	}
	late := []lab.Event{{At: 35 * s, Label: localDNSBackMark}}
	if got := recovered(res, lab.ProbeResult{}, late); got != nil {
		t.Errorf("back 5 s before the end: recovered = %+v, want nil", got)
	}
}

// TestStoppedSpan: from the cold start's mark to its READY's, when both
// were marked.
func TestStoppedSpan(t *testing.T) {
	s := time.Second
	evs := []lab.Event{{At: 10 * s, Label: refusedMark}, {At: 42 * s, Label: coldStartMark}, {At: 43 * s, Label: coldStartedMark}}
	if from, to, ok := stoppedSpan(evs); !ok || from != 42*s || to != 43*s {
		t.Errorf("stoppedSpan = %v, %v, %v; want 42s, 43s, true", from, to, ok)
	}
	// The start failed (no READY mark): no span, every lookup counts.
	if _, _, ok := stoppedSpan(evs[:2]); ok {
		t.Error("a cold start without its READY mark: a span")
	}
	if _, _, ok := stoppedSpan(nil); ok {
		t.Error("no marks: a span")
	}
}

// TestScenarioFileName: with -rounds each round's evidence has a name of
// its own; without, the names are as they always were.
func TestScenarioFileName(t *testing.T) {
	tests := []struct {
		round        int
		prefix, rest string
		want         string
	}{
		{0, "timeline", ".svg", "timeline-healthy.svg"},
		{0, "journal", "-dnsstandby.log", "journal-healthy-dnsstandby.log"},
		{3, "timeline", ".svg", "timeline-healthy-round3.svg"},
		{12, "metrics", "-dnsstandby.txt", "metrics-healthy-round12-dnsstandby.txt"},
	}
	for _, tt := range tests {
		sc := scenario{name: "healthy", round: tt.round}
		if got := sc.fileName(tt.prefix, tt.rest); got != tt.want {
			t.Errorf("round %d: %q, want %q", tt.round, got, tt.want)
		}
	}
}
