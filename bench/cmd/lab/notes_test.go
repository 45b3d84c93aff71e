package main

import (
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/bench/lab"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

func TestWarmCoverage(t *testing.T) {
	s := time.Second
	rec := func(at time.Duration, name int32, ok bool, by string) lab.LoadRecord {
		r := lab.LoadRecord{Sent: at, Name: name, By: by, Outcome: lab.LoadFirstTry}
		if !ok {
			r.Outcome = lab.LoadUnanswered
		}
		return r
	}
	// Names 0 and 5 are the same question (the mix weighs names up).
	names := []lab.LoadName{{FQDN: "a."}, {FQDN: "b."}, {FQDN: "c."}, {FQDN: "d."}, {FQDN: "e."}, {FQDN: "A."}}
	res := lab.LoadResult{Names: names, Records: []lab.LoadRecord{
		// Warm-up (before 10 s): names 0, 1, 2 answered; 3 asked, never answered.
		rec(1*s, 0, true, lab.LoadNSIDLocalDNS), rec(2*s, 1, true, lab.LoadNSIDLocalDNS),
		rec(3*s, 2, true, lab.LoadNSIDLocalDNS), rec(4*s, 3, false, ""),
		// Before the window: not counted.
		rec(11*s, 0, false, ""),
		// Window [12 s, 20 s): 0 always answered, 1 once not, 2 not asked,
		// 3 and 4 cold.
		rec(12*s, 0, true, lab.LoadNSIDStandby), rec(13*s, 5, true, lab.LoadNSIDStandby),
		rec(14*s, 1, true, lab.LoadNSIDStandby), rec(15*s, 1, false, ""),
		rec(16*s, 3, false, ""), rec(17*s, 4, true, lab.LoadNSIDStandby),
		// After: not counted.
		rec(21*s, 2, false, ""),
	}}
	got := warmCoverage(res, 10*s, 12*s, 20*s)
	want := coverage{warmed: 3, asked: 2, allAnswered: 1, queries: 4, answered: 3, coldQueries: 2, coldAnswered: 1, standbyAnswer: 4}
	if got != want {
		t.Errorf("warmCoverage = %+v, want %+v", got, want)
	}
	if str := got.String(); !strings.Contains(str, "1 of them (50.00%)") || !strings.Contains(str, "3 of 4 queries") {
		t.Errorf("String: %s", str)
	}
}

// TestWarmCoverageFresh: a fresh entry's queries each ask a name of their
// own, so an answer to one before the fault warms none of the others.
func TestWarmCoverageFresh(t *testing.T) {
	s := time.Second
	names := []lab.LoadName{{FQDN: "a."}, {FQDN: lab.FreshZone, Fresh: true}}
	ok := lab.LoadFirstTry
	res := lab.LoadResult{Names: names, Records: []lab.LoadRecord{
		{Sent: 1 * s, Name: 0, Outcome: ok}, {Sent: 2 * s, Name: 1, Outcome: ok},
		{Sent: 12 * s, Name: 0, Outcome: ok}, {Sent: 13 * s, Name: 1, Outcome: ok, By: lab.LoadNSIDStandby},
	}}
	got := warmCoverage(res, 10*s, 11*s, 20*s)
	want := coverage{warmed: 1, asked: 1, allAnswered: 1, queries: 1, answered: 1, coldQueries: 1, coldAnswered: 1, standbyAnswer: 1}
	if got != want {
		t.Errorf("warmCoverage = %+v, want %+v", got, want)
	}
}

func TestFindRestart(t *testing.T) {
	journal := `Nov 29 22:16:41.571561 lab-x systemd[1]: Starting dnsstandby.service
Nov 29 22:16:41.571561 lab-x dnsstandby[110]: {"time":"2026-11-29T22:16:41.5Z","level":"INFO","msg":"dnsstandby ready"}
Nov 29 22:16:50.000000 lab-x dnsstandby[110]: {"time":"2026-11-29T22:16:50.000Z","level":"INFO","msg":"shutting down"}
Nov 29 22:16:50.100000 lab-x dnsstandby[110]: {"time":"2026-11-29T22:16:50.100Z","level":"INFO","msg":"stopped"}
Nov 29 22:16:50.200000 lab-x dnsstandby[150]: {"time":"2026-11-29T22:16:50.180Z","level":"INFO","msg":"listening"}
Nov 29 22:16:50.200000 lab-x dnsstandby[150]: {"time":"2026-11-29T22:16:50.190Z","level":"INFO","msg":"dnsstandby ready"}
Nov 29 22:16:50.200000 lab-x dnsstandby[150]: not json
`
	lines := parseJournal(journal)
	if len(lines) != 5 {
		t.Fatalf("parsed %d lines, want 5: %+v", len(lines), lines)
	}
	at := func(s string) time.Time { v, _ := time.Parse(time.RFC3339Nano, s); return v }
	rt := findRestart(lines, at("2026-11-29T22:16:45Z"))
	want := restartTimes{sigterm: at("2026-11-29T22:16:50Z"), oldStopped: at("2026-11-29T22:16:50.1Z"), newReady: at("2026-11-29T22:16:50.19Z")}
	if !rt.sigterm.Equal(want.sigterm) || !rt.oldStopped.Equal(want.oldStopped) || !rt.newReady.Equal(want.newReady) {
		t.Errorf("findRestart = %+v, want %+v", rt, want)
	}
	// The first process's ready line (before since) is not the new one's.
	if rt := findRestart(lines, at("2026-11-29T22:16:51Z")); !rt.sigterm.IsZero() {
		t.Errorf("restart found after the last line: %+v", rt)
	}
}

// TestTiming: a stop and start of dnsstandby measured from its journal,
// to the first answer the load got after the old process stopped.
func TestTiming(t *testing.T) {
	journal := `Nov 29 22:16:50.000000 lab-x dnsstandby[110]: {"time":"2026-11-29T22:16:50.000Z","level":"INFO","msg":"shutting down"}
Nov 29 22:16:50.100000 lab-x dnsstandby[110]: {"time":"2026-11-29T22:16:50.100Z","level":"INFO","msg":"stopped"}
Nov 29 22:16:50.400000 lab-x dnsstandby[150]: {"time":"2026-11-29T22:16:50.400Z","level":"INFO","msg":"dnsstandby ready"}
`
	at := func(s string) time.Time { v, _ := time.Parse(time.RFC3339Nano, s); return v }
	ms := time.Millisecond
	start := at("2026-11-29T22:16:40Z")
	res := lab.LoadResult{Start: start, Records: []lab.LoadRecord{
		{Sent: 10000 * ms, Latency: 50 * ms, Outcome: lab.LoadFirstTry},     // answered at 50.05: the old process
		{Sent: 10200 * ms, Outcome: lab.LoadUnanswered},                     //
		{Sent: 10300 * ms, Latency: 1150 * ms, Outcome: lab.LoadAfterRetry}, // at 51.45
		{Sent: 10350 * ms, Latency: 100 * ms, Outcome: lab.LoadFirstTry},    // at 50.45: the first after
	}}
	if got := firstAnswerAfter(res, at("2026-11-29T22:16:50.1Z")); got != 10450*ms {
		t.Errorf("firstAnswerAfter = %v, want 10.45s", got)
	}
	want := "SIGTERM to old process gone 100 ms, to new process ready 400 ms, to the first answer after 450 ms"
	if got := timing(res, parseJournal(journal), start); got != want {
		t.Errorf("timing:\n got %s\nwant %s", got, want)
	}
	if got := timing(res, parseJournal(journal), at("2026-11-29T22:16:51Z")); !strings.HasPrefix(got, "not found") {
		t.Errorf("timing after the last line: %s", got)
	}
}

// TestNameMix: the mix holds every service once and is short enough that
// the warm-ups of double-fault and standby-restart (10 s at 2,000 qps)
// ask every name at least twice.
func TestNameMix(t *testing.T) {
	zones := nstest.KubeDNSZones(nstest.ZoneOptions{Services: 5000})
	mix := nameMix(zones)
	seen := map[string]int{}
	for _, n := range mix {
		seen[n.FQDN+"/"+dns.TypeToString[n.Type]]++
	}
	for _, s := range zones.Services {
		if seen[s.FQDN+"/A"] != 1 {
			t.Fatalf("%s A appears %d times, want once", s.FQDN, seen[s.FQDN+"/A"])
		}
	}
	if warmup := 10 * 2000; len(mix) > warmup/2 {
		t.Errorf("mix of %d names: a 10 s warm-up at 2,000 qps asks each less than twice", len(mix))
	}
	if len(seen) < 5000+20 {
		t.Errorf("only %d distinct questions", len(seen))
	}
}
