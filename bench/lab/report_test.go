package lab

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// reportTestStep is the send interval of the synthetic loads: 2,000 qps.
const reportTestStep = 500 * time.Microsecond

// reportTestLoad builds a load from a pattern, one query per character sent
// reportTestStep apart: F answered on the first try, R after the retry, U
// never. Answers alternate between LocalDNS and dnsstandby; latency is 1 ms
// on the first try and 1,001 ms after a retry.
func reportTestLoad(pattern string) LoadResult {
	res := LoadResult{
		QPS:       int(time.Second / reportTestStep),
		Duration:  time.Duration(len(pattern)) * reportTestStep,
		Timeout:   time.Second,
		BadRcodes: map[int]int{},
	}
	for i, c := range pattern {
		r := LoadRecord{Sent: time.Duration(i) * reportTestStep, Rcode: -1}
		by := LoadNSIDLocalDNS
		if i%2 == 1 {
			by = LoadNSIDStandby
		}
		switch c {
		case 'F':
			r.Outcome, r.Latency, r.By, r.Rcode = LoadFirstTry, time.Millisecond, by, 0
		case 'R':
			r.Outcome, r.Latency, r.By, r.Rcode = LoadAfterRetry, 1001*time.Millisecond, by, 0
		case 'U':
			r.Outcome = LoadUnanswered
		}
		res.Records = append(res.Records, r)
	}
	return res
}

func TestMaxGap(t *testing.T) {
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	tests := []struct {
		name     string
		pattern  string
		from     time.Duration
		gap      time.Duration
		duration time.Duration // overrides the pattern's if non-zero
	}{
		{name: "no queries"},
		{name: "all first try", pattern: "FFFFFF"},
		{name: "one lost", pattern: "FFUFF", from: ms(1), gap: ms(0.5)},
		{name: "gap in the middle", pattern: "FFUUUFF", from: ms(1), gap: ms(1.5)},
		{name: "retry-answered queries are inside the gap", pattern: "FFRRURFF", from: ms(1), gap: ms(2)},
		{name: "gap at the start", pattern: "UUFF", from: 0, gap: ms(1)},
		{name: "gap at the end runs to the end of sending", pattern: "FFUUU", from: ms(1), gap: ms(1.5)},
		{name: "gap at the end, sending went on after the last query", pattern: "FFUUU", from: ms(1), gap: ms(9), duration: ms(10)},
		{name: "no answers at all", pattern: "UUUU", from: 0, gap: ms(2)},
		{name: "only retries", pattern: "RRRR", from: 0, gap: ms(2)},
		{name: "longest of two", pattern: "FUUFUUUUFUUUF", from: ms(2), gap: ms(2)},
		{name: "first of two equal", pattern: "FUUFUUF", from: ms(0.5), gap: ms(1)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			load := reportTestLoad(tc.pattern)
			if tc.duration != 0 {
				load.Duration = tc.duration
			}
			from, gap := MaxGap(load)
			if from != tc.from || gap != tc.gap {
				t.Errorf("MaxGap(%q) = from %v gap %v, want from %v gap %v", tc.pattern, from, gap, tc.from, tc.gap)
			}
		})
	}
}

func TestSummarize(t *testing.T) {
	tests := []struct {
		name    string
		pattern string
		probe   ProbeResult
		bad     map[int]int
		want    Summary
	}{
		{
			name:    "no queries",
			pattern: "",
			want:    Summary{TargetQPS: 2000},
		},
		{
			name:    "no answers at all",
			pattern: "UUUU",
			bad:     map[int]int{dns.RcodeServerFailure: 8},
			want: Summary{
				QPS: 2000, Sent: 4, Unanswered: 4, MaxGapMs: 2, ServFail: 8,
				BadRcodes: map[string]int{"SERVFAIL": 8}, TargetQPS: 2000, DurationS: 0.002,
			},
		},
		{
			name:    "mixed, with a glibc probe",
			pattern: "FFRRUUFFFF",
			probe: ProbeResult{Records: []ProbeRecord{
				{Duration: 5 * time.Millisecond, OK: true, Finished: true},
				{Duration: 2 * time.Second, OK: false, Finished: true},
				{Duration: 3 * time.Second, OK: true, Finished: true},
				{Duration: 10 * time.Second}, // unfinished
			}, Skipped: 2},
			bad: map[int]int{dns.RcodeServerFailure: 1, dns.RcodeRefused: 2},
			want: Summary{
				QPS: 2000, Sent: 10, AnsweredFirstTry: 6, AnsweredAfterRetry: 2, Unanswered: 2,
				MaxGapMs: 2, MaxGapFromMs: 1,
				AnsweredBy: AnsweredBy{LocalDNS: 4, Standby: 4},
				// 8 answered: six of 1 ms, two of 1,001 ms; nearest rank
				// p50 is the 4th, p99 the 8th.
				P50Ms: 1, P99Ms: 1001,
				GlibcOK: 2, GlibcFail: 1, GlibcUnfinished: 1, GlibcSkipped: 2, GlibcMaxMs: 3000,
				ServFail: 1, BadRcodes: map[string]int{"SERVFAIL": 1, "REFUSED": 2},
				TargetQPS: 2000, DurationS: 0.005,
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			load := reportTestLoad(tc.pattern)
			for k, v := range tc.bad {
				load.BadRcodes[k] = v
			}
			got := Summarize(load, tc.probe)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Summarize:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestSummarizeAnsweredBy(t *testing.T) {
	load := reportTestLoad("FFFFR")
	load.Records[2].By = ""
	load.Records[3].By = "some-other-server"
	got := Summarize(load, ProbeResult{}).AnsweredBy
	want := AnsweredBy{LocalDNS: 2, Standby: 1, NoNSID: 1, Other: map[string]int{"some-other-server": 1}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

func TestSummarizeNodeListener(t *testing.T) {
	load := reportTestLoad("FFFF")
	load.Records[0].By = LoadNSIDLocalDNSNode
	got := Summarize(load, ProbeResult{}).AnsweredBy
	want := AnsweredBy{LocalDNS: 1, Standby: 2, LocalDNSNode: 1}
	if !reflect.DeepEqual(got, want) || got.ByLocalDNS() != 2 {
		t.Errorf("got %+v (LocalDNS in all %d), want %+v and 2", got, got.ByLocalDNS(), want)
	}
}

// TestCountAfterFaultBy: the answers from the fault on are counted by
// their NSID, those before it not.
func TestCountAfterFaultBy(t *testing.T) {
	load := reportTestLoad("FFFF")
	for i, by := range []string{LoadNSIDStandby, LoadNSIDLocalDNS, LoadNSIDStandby, LoadNSIDLocalDNSNode} {
		load.Records[i].By = by
	}
	got := CountAfterFault(load, ProbeResult{}, time.Millisecond).AnsweredBy
	if want := (AnsweredBy{Standby: 1, LocalDNSNode: 1}); !reflect.DeepEqual(got, want) || got.Total() != 2 {
		t.Errorf("got %+v (%d in all), want %+v", got, got.Total(), want)
	}
}

// TestCountAfterFaultFresh: the queries for fresh names are counted apart
// too, from the fault on, and only when the mix has such names.
func TestCountAfterFaultFresh(t *testing.T) {
	load := reportTestLoad("FFURFUFR")
	if got := CountAfterFault(load, ProbeResult{}, 0).Fresh; got != nil {
		t.Errorf("a mix without fresh names: fresh counts %+v, want none", got)
	}
	load.Names = []LoadName{{FQDN: "a.example."}, {FQDN: "fresh.example.", Fresh: true}}
	for i := range load.Records {
		load.Records[i].Name = int32(i % 2) // odd queries fresh
	}
	got := CountAfterFault(load, ProbeResult{}, reportTestStep).Fresh
	// From the second query on, the fresh ones: F, R, U, R, each answer
	// dnsstandby's (odd queries).
	// Their p99 and slowest are theirs: the retried ones' 1001 ms.
	// The slowest: the unanswered one first, then by latency, ties in
	// send order.
	want := &FreshCounts{Sent: 4, FirstTry: 1, AfterRetry: 2, Unanswered: 1, AnsweredBy: AnsweredBy{Standby: 3}, P99Ms: 1001, MaxMs: 1001,
		Slowest: []SlowQuery{
			{SentMs: 2.5, Outcome: "unanswered"},
			{SentMs: 1.5, LatencyMs: 1001, By: LoadNSIDStandby, Outcome: "after-retry"},
			{SentMs: 3.5, LatencyMs: 1001, By: LoadNSIDStandby, Outcome: "after-retry"},
			{SentMs: 0.5, LatencyMs: 1, By: LoadNSIDStandby, Outcome: "first-try"},
		}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

func TestCountAfterFault(t *testing.T) {
	ms := time.Millisecond
	start := time.Unix(1000, 0)
	// Lookups started 100 ms after the load: at 100, 200, 300 ms on its
	// clock (one unfinished).
	probe := ProbeResult{Start: start.Add(100 * ms), Records: []ProbeRecord{
		{Start: 0, Duration: 300 * ms, Finished: true},
		{Start: 100 * ms, Duration: 20 * ms, OK: true, Finished: true},
		{Start: 200 * ms, Duration: 1200 * ms, Finished: true},
		{Start: 250 * ms, Duration: 5 * time.Second},
	}}
	tests := []struct {
		name    string
		pattern string // one query every 0.5 ms; F answered in 1 ms, R in 1001 ms
		at      time.Duration
		want    AfterFault
	}{
		{name: "nothing sent", at: 0, want: AfterFault{GlibcOK: 1, GlibcFail: 2, GlibcMaxMs: 1200}},
		{name: "fault at the start counts everything", pattern: "FRUF", at: 0,
			want: AfterFault{Sent: 4, FirstTry: 2, AfterRetry: 1, Unanswered: 1, P99Ms: 1001, MaxMs: 1001, MaxGapMs: 1, GlibcOK: 1, GlibcFail: 2, GlibcMaxMs: 1200}},
		{name: "losses before the fault do not count", pattern: "UUFFRF", at: ms,
			want: AfterFault{AtMs: 1, Sent: 4, FirstTry: 3, AfterRetry: 1, P99Ms: 1001, MaxMs: 1001, MaxGapMs: 0.5, GlibcOK: 1, GlibcFail: 2, GlibcMaxMs: 1200}},
		{name: "the query sent at the fault counts", pattern: "FFUF", at: ms,
			want: AfterFault{AtMs: 1, Sent: 2, FirstTry: 1, Unanswered: 1, P99Ms: 1, MaxMs: 1, MaxGapMs: 0.5, GlibcOK: 1, GlibcFail: 2, GlibcMaxMs: 1200}},
		{name: "lookups before the fault do not count", pattern: "FF", at: 150 * ms,
			want: AfterFault{AtMs: 150, GlibcOK: 1, GlibcFail: 1, GlibcMaxMs: 1200}},
		{name: "a gap running to the end of sending", pattern: "FFUU", at: 0,
			want: AfterFault{Sent: 4, FirstTry: 2, Unanswered: 2, P99Ms: 1, MaxMs: 1, MaxGapMs: 1, GlibcOK: 1, GlibcFail: 2, GlibcMaxMs: 1200}},
		{name: "fault after everything", pattern: "UU", at: time.Second, want: AfterFault{AtMs: 1000}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			load := reportTestLoad(tc.pattern)
			load.Start = start
			got := CountAfterFault(load, probe, tc.at)
			// The answers' NSIDs are TestCountAfterFaultBy's.
			if got.AnsweredBy.Total() != got.FirstTry+got.AfterRetry {
				t.Errorf("%d answers by NSID, %d answered", got.AnsweredBy.Total(), got.FirstTry+got.AfterRetry)
			}
			got.AnsweredBy = AnsweredBy{}
			// The latencies CompareLatency pools: one per answered query,
			// in order, the slowest the max.
			if len(got.Latencies) != got.FirstTry+got.AfterRetry || !slices.IsSorted(got.Latencies) ||
				len(got.Latencies) > 0 && reportMs(got.Latencies[len(got.Latencies)-1]) != got.MaxMs {
				t.Errorf("latencies %v for %d answered, max %v ms", got.Latencies, got.FirstTry+got.AfterRetry, got.MaxMs)
			}
			got.Latencies = nil
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestCountGlibc: the lookups started in a window, on the load's clock.
func TestCountGlibc(t *testing.T) {
	ms := time.Millisecond
	start := time.Unix(1000, 0)
	// Started at 100, 200, 300, 400 ms on the load's clock; the last one
	// unfinished.
	probe := ProbeResult{Start: start.Add(100 * ms), Records: []ProbeRecord{
		{Start: 0, OK: true, Finished: true},
		{Start: 100 * ms, Finished: true},
		{Start: 200 * ms, OK: true, Finished: true},
		{Start: 300 * ms},
	}}
	for _, tc := range []struct {
		from, to time.Duration
		want     GlibcCounts
	}{
		{0, time.Second, GlibcCounts{OK: 2, Fail: 1}},
		{200 * ms, 300 * ms, GlibcCounts{Fail: 1}},
		{150 * ms, 200 * ms, GlibcCounts{}},
		{300 * ms, time.Second, GlibcCounts{OK: 1}},
	} {
		if got := CountGlibc(probe, start, tc.from, tc.to); got != tc.want {
			t.Errorf("[%v, %v): %+v, want %+v", tc.from, tc.to, got, tc.want)
		}
	}
}

func TestListenerName(t *testing.T) {
	for _, tc := range []struct {
		listener, client, want string
	}{
		{"169.254.10.11", "pod", "pod → 169.254.10.11"},
		{"169.254.10.10", "", "169.254.10.10"},
		{"", "node", "node"},
		{"", "", ""},
	} {
		if got := (LabRun{Listener: tc.listener, Client: tc.client}).ListenerName(); got != tc.want {
			t.Errorf("listener %q client %q: %q, want %q", tc.listener, tc.client, got, tc.want)
		}
	}
}

func TestBuildTimeline(t *testing.T) {
	// 2,000 qps for 0.35 s: bins of 200, 200, 200 and 100 queries; the
	// second bin lost, the third answered after the retry.
	pattern := strings.Repeat("F", 200) + strings.Repeat("U", 200) + strings.Repeat("R", 200) + strings.Repeat("F", 100)
	load := reportTestLoad(pattern)
	load.Start = time.Unix(1000, 0)
	// SERVFAILs: 50 lost queries got one, and 10 answered by their retry.
	for i := 200; i < 250; i++ {
		load.Records[i].BadReplies = 2
	}
	for i := 400; i < 410; i++ {
		load.Records[i].BadReplies = 1
	}
	probe := ProbeResult{Start: load.Start.Add(50 * time.Millisecond), Records: []ProbeRecord{
		{Start: 0, OK: true, Finished: true},                       // at 50 ms: bin 0
		{Start: 100 * time.Millisecond, Finished: true},            // at 150 ms: bin 1, failed
		{Start: 200 * time.Millisecond},                            // unfinished: not shown
		{Start: 250 * time.Millisecond, OK: true, Finished: true},  // at 300 ms: bin 3
		{Start: 1000 * time.Millisecond, OK: true, Finished: true}, // past the end
	}}
	tl := BuildTimeline(load, probe, 0)
	want := Timeline{
		Step:       100 * time.Millisecond,
		Sent:       []int{200, 200, 200, 100},
		FirstTry:   []int{200, 0, 0, 100},
		AfterRetry: []int{0, 0, 200, 0},
		Lost:       []int{0, 200, 0, 0},
		BadReply:   []int{0, 50, 10, 0},
		GlibcOK:    []int{1, 0, 0, 1},
		GlibcFail:  []int{0, 1, 0, 0},
	}
	if !reflect.DeepEqual(tl, want) {
		t.Errorf("timeline:\n got %+v\nwant %+v", tl, want)
	}
	if empty := BuildTimeline(LoadResult{}, ProbeResult{}, 0); len(empty.Sent) != 0 {
		t.Errorf("empty load: %d bins", len(empty.Sent))
	}
}

// reportTestRuns are two scenarios' runs as the lab makes them.
func reportTestRuns() []LabRun {
	healthy := NewLabRun("healthy", "localdns-shipped", reportTestLoad(strings.Repeat("F", 4000)), ProbeResult{})
	storm := NewLabRun("crash-storm", "localdns-shipped",
		reportTestLoad(strings.Repeat("F", 1000)+strings.Repeat("U", 2000)+strings.Repeat("R", 200)+strings.Repeat("U", 800)), ProbeResult{})
	storm.Down = []Interval{{From: 500 * time.Millisecond, To: 2 * time.Second, Label: "LocalDNS down"}}
	for i := range 8 {
		storm.Events = append(storm.Events, Event{At: 500*time.Millisecond + time.Duration(i)*300*time.Millisecond, Label: "kill"})
	}
	storm.Note = "unit failed | start limit"
	standby := NewLabRun("crash-storm", "dnsstandby", reportTestLoad(strings.Repeat("F", 3000)+strings.Repeat("R", 5)+strings.Repeat("F", 995)), ProbeResult{})
	standby.Events = storm.Events
	standby.Listener, standby.Client = "169.254.10.11", "pod"
	standby.AfterFault = &AfterFault{AtMs: 500, Sent: 3000, FirstTry: 2995, AfterRetry: 5, P99Ms: 1.5,
		Fresh: &FreshCounts{Sent: 60, FirstTry: 59, AfterRetry: 1, AnsweredBy: AnsweredBy{Standby: 60}}}
	standby.Recovered = &AfterFault{AtMs: 3500, Sent: 500, FirstTry: 500, AnsweredBy: AnsweredBy{LocalDNS: 500}}
	standby.Hedges = &Hedges{Total: 7, Cache: 7, Later: 6, Never: 1}
	standby.Duplicates = 6
	// The node's client through the other listener: LocalDNS answers it
	// with its own NSID there.
	nodeLoad := reportTestLoad(strings.Repeat("F", 1000) + strings.Repeat("U", 2) + strings.Repeat("F", 998))
	for i := range nodeLoad.Records {
		if nodeLoad.Records[i].By == LoadNSIDLocalDNS {
			nodeLoad.Records[i].By = LoadNSIDLocalDNSNode
		}
	}
	node := NewLabRun("crash-storm", "dnsstandby", nodeLoad, ProbeResult{})
	node.Events = storm.Events
	node.Listener, node.Client = "169.254.10.10", "node"
	node.AfterFault = &AfterFault{AtMs: 500, Sent: 1000, FirstTry: 998, Unanswered: 2, GlibcFail: 1, P99Ms: 2}
	node.Hedges = &Hedges{}
	node.Mismatched = 1
	return []LabRun{healthy, storm, standby, node}
}

// reportTestChecks are checks on reportTestRuns' dnsstandby runs.
func reportTestChecks() []Check {
	return []Check{
		{Scenario: "crash-storm", Setup: "dnsstandby", Listener: "169.254.10.11", Client: "pod", Require: "0 unanswered after the fault", Pass: true, Found: "0 of 3000"},
		{Scenario: "crash-storm", Setup: "dnsstandby", Listener: "169.254.10.10", Client: "node", Require: "0 unanswered after the fault", Found: "2 of 1000"},
	}
}

func TestWriteLabJSON(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out", "lab.json")
	runs := reportTestRuns()
	skipped := []Skipped{{Scenario: "hang", Setup: "dnsstandby", Why: "needs takeover"}}
	file := LabFile{CoreDNSVersion: "1.13.1", Runs: runs, Checks: reportTestChecks(), Skipped: skipped}
	if err := WriteLabJSON(path, file); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}

	// The output format: top-level keys, then each run's keys in order.
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		t.Fatal(err)
	}
	if got := reportTestKeys(t, b); !reflect.DeepEqual(got, []string{"coredns_version", "runs", "checks", "skipped"}) {
		t.Errorf("top-level keys %v", got)
	}
	var rawRuns []json.RawMessage
	if err := json.Unmarshal(top["runs"], &rawRuns); err != nil || len(rawRuns) != len(runs) {
		t.Fatalf("runs: %v (%d)", err, len(rawRuns))
	}
	wantFirst := []string{"scenario", "setup", "qps", "sent", "answered_first_try", "answered_after_retry",
		"unanswered", "max_gap_ms", "answered_by", "p50_ms", "p99_ms", "glibc_ok", "glibc_fail"}
	for i, raw := range rawRuns {
		keys := reportTestKeys(t, raw)
		if len(keys) < len(wantFirst) || !reflect.DeepEqual(keys[:len(wantFirst)], wantFirst) {
			t.Errorf("run %d keys %v, want them to start %v", i, keys, wantFirst)
		}
		var run map[string]json.RawMessage
		json.Unmarshal(raw, &run)
		// The node's listener adds LocalDNS's answers there.
		wantBy := []string{"localdns-pod", "dnsstandby"}
		if runs[i].Client == "node" {
			wantBy = append(wantBy, "localdns")
		}
		if got := reportTestKeys(t, run["answered_by"]); !reflect.DeepEqual(got, wantBy) {
			t.Errorf("run %d answered_by keys %v, want %v", i, got, wantBy)
		}
		for _, k := range []string{"qps", "sent", "max_gap_ms", "p50_ms", "glibc_ok"} {
			var f float64
			if err := json.Unmarshal(run[k], &f); err != nil {
				t.Errorf("run %d %s = %s: not a number", i, k, run[k])
			}
		}
	}
	var storm struct {
		Scenario   string         `json:"scenario"`
		Sent       int            `json:"sent"`
		Unanswered int            `json:"unanswered"`
		MaxGapMs   float64        `json:"max_gap_ms"`
		AnsweredBy map[string]int `json:"answered_by"`
		Timeline   struct {
			StepMs float64 `json:"step_ms"`
			Lost   []int   `json:"lost"`
		} `json:"timeline"`
		Down []map[string]any `json:"down"`
	}
	if err := json.Unmarshal(rawRuns[1], &storm); err != nil {
		t.Fatal(err)
	}
	if storm.Scenario != "crash-storm" || storm.Sent != 4000 || storm.Unanswered != 2800 || storm.MaxGapMs != 1500 ||
		storm.AnsweredBy["localdns-pod"]+storm.AnsweredBy["dnsstandby"] != 1200 ||
		storm.Timeline.StepMs != 100 || len(storm.Timeline.Lost) != 20 ||
		len(storm.Down) != 1 || storm.Down[0]["from_ms"] != 500.0 || storm.Down[0]["to_ms"] != 2000.0 {
		t.Errorf("crash-storm run read back as %+v", storm)
	}
	// Arrays of numbers stay on one line; the rest is indented.
	if !bytes.Contains(b, []byte(`"lost": [0,0,0,0,0,200,200,200`)) || !bytes.Contains(b, []byte("\n    {\n      \"scenario\": \"healthy\"")) {
		t.Errorf("layout:\n%.1500s", b)
	}

	// Listener, client and the after-fault counts follow the summary.
	var node map[string]json.RawMessage
	json.Unmarshal(rawRuns[3], &node)
	if string(node["listener"]) != `"169.254.10.10"` || string(node["client"]) != `"node"` ||
		!bytes.Contains(node["after_fault"], []byte(`"unanswered": 2`)) {
		t.Errorf("node run: listener %s, client %s, after_fault %s", node["listener"], node["client"], node["after_fault"])
	}
	keys := reportTestKeys(t, rawRuns[3])
	if i := slices.Index(keys, "listener"); i <= slices.Index(keys, "glibc_fail") || !slices.Equal(keys[i:i+3], []string{"listener", "client", "after_fault"}) {
		t.Errorf("node run keys %v, want listener, client and after_fault after the summary's", keys)
	}

	back, err := ReadLabJSON(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, file) {
		t.Errorf("read back %+v\nwant %+v", back, file)
	}
	if failed := back.Failed(); len(failed) != 1 || failed[0].Client != "node" {
		t.Errorf("failed checks read back: %+v", failed)
	}

	// Without checks and skipped runs, exactly the two keys of the format.
	if err := WriteLabJSON(path, LabFile{CoreDNSVersion: "1.13.1", Runs: runs}); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(path)
	if got := reportTestKeys(t, b); !reflect.DeepEqual(got, []string{"coredns_version", "runs"}) {
		t.Errorf("top-level keys %v", got)
	}
}

// reportTestKeys lists a JSON object's keys in the order they appear.
func reportTestKeys(t *testing.T, b []byte) []string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("not an object: %.80s", b)
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, tok.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

func TestWriteLabMarkdown(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lab.md")
	skipped := []Skipped{
		{Scenario: "crash-storm", Setup: "localdns-pr9439", Why: "guest failed to boot"},
		{Scenario: "hang", Setup: "dnsstandby", Why: "needs takeover"},
	}
	if err := WriteLabMarkdown(path, LabFile{Runs: reportTestRuns(), Checks: reportTestChecks(), Skipped: skipped}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	md := string(b)
	healthy, storm := strings.Index(md, "\n## healthy\n"), strings.Index(md, "\n## crash-storm\n")
	hang := strings.Index(md, "\n## hang\n")
	checks := strings.Index(md, "\n## Checks: ")
	if checks < 0 || healthy < checks || storm < healthy || hang < storm || strings.Count(md, "\n## ") != 4 {
		t.Fatalf("sections out of order:\n%s", md)
	}
	for _, want := range []string{
		"\n## Checks: 1 of 2 passed\n\n- PASS crash-storm dnsstandby pod → 169.254.10.11: 0 unanswered after the fault; found 0 of 3000\n" +
			"- FAIL crash-storm dnsstandby node → 169.254.10.10: 0 unanswered after the fault; found 2 of 1000\n",
		"| setup | client → listener | qps | sent | answered first try | after retry | unanswered | unanswered after fault | max gap ms | localdns | dnsstandby | p50 ms | p99 ms | p99 ms after fault | glibc ok | glibc fail | glibc fail after fault | glibc max ms | hedges | duplicates | mismatched | servfail | note |",
		"| localdns-shipped |  | 2000 | 4000 | 1000 | 200 | 2800 | — | 1500 | 600 | 600 | 1.0 | 1001.0 | — | 0 | 0 | — | — | n/a | 0 | 0 | 0 | unit failed \\| start limit |",
		"| dnsstandby | pod → 169.254.10.11 | 2000 | 4000 | 3995 | 5 | 0 | 0 | 2 | 2000 | 2000 | 1.0 | 1.0 | 1.5 | 0 | 0 | 0 | — | 7 | 6 | 0 | 0 |  |",
		"| dnsstandby | node → 169.254.10.10 | 2000 | 2000 | 1998 | 0 | 2 | 2 | 1 | 999 | 999 | 1.0 | 1.0 | 2.0 | 0 | 0 | 1 | — | 0 | 0 | 1 | 0 |  |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("missing %q in\n%s", want, md)
		}
	}
	for _, want := range []string{
		"| 0 |  |\n\nNot run:\n\n- localdns-pr9439: guest failed to boot\n",
		"\n## hang\n\nNot run:\n\n- dnsstandby: needs takeover\n",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("skipped runs: missing %q in\n%s", want, md)
		}
	}
	// The storm's rows come under its heading, in run order.
	if i, j := strings.Index(md, "| localdns-shipped |  | 2000 | 4000 | 1000"), strings.Index(md, "\n| dnsstandby |"); i < storm || j < i {
		t.Errorf("rows misplaced:\n%s", md)
	}

	empty := filepath.Join(t.TempDir(), "empty.md")
	if err := WriteLabMarkdown(empty, LabFile{Runs: []LabRun{NewLabRun("x", "y", LoadResult{}, ProbeResult{})}}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(empty); !strings.Contains(string(b), "| y |  | 0 | 0 | 0 | 0 | 0 | — | 0 | 0 | 0 | — | — |") || strings.Contains(string(b), "Checks") {
		t.Errorf("no answers should show no percentiles:\n%s", b)
	}
}
