package lab

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/bench/internal/stats"
)

// ReportDefaultStep is the timeline's bin width.
const ReportDefaultStep = 100 * time.Millisecond

// Interval is a stretch of a run, on the load's clock (Load.Start): a
// period when LocalDNS was down, for example.
type Interval struct {
	From, To time.Duration
	Label    string
}

// Event is a moment of a run, on the load's clock: "kill", "SIGSTOP", ...
type Event struct {
	At    time.Duration
	Label string
}

// AnsweredBy counts the answers that counted by who gave them (their NSID).
// The two first fields are always written; the others only when non-zero.
type AnsweredBy struct {
	LocalDNS     int            `json:"localdns-pod"`       // LocalDNS on the pods' listener
	Standby      int            `json:"dnsstandby"`         // dnsstandby, on either listener
	LocalDNSNode int            `json:"localdns,omitempty"` // LocalDNS on the node's listener
	NoNSID       int            `json:"no_nsid,omitempty"`  // acceptable answers without an NSID option
	Other        map[string]int `json:"other,omitempty"`    // any other NSID
}

// ByLocalDNS is what LocalDNS answered, on whichever listener.
func (a AnsweredBy) ByLocalDNS() int { return a.LocalDNS + a.LocalDNSNode }

// Total is every answer counted.
func (a AnsweredBy) Total() int {
	n := a.LocalDNS + a.Standby + a.LocalDNSNode + a.NoNSID
	for _, k := range a.Other {
		n += k
	}
	return n
}

// add counts one answer by the NSID it carried.
func (a *AnsweredBy) add(nsid string) {
	switch nsid {
	case LoadNSIDLocalDNS:
		a.LocalDNS++
	case LoadNSIDLocalDNSNode:
		a.LocalDNSNode++
	case LoadNSIDStandby:
		a.Standby++
	case "":
		a.NoNSID++
	default:
		if a.Other == nil {
			a.Other = map[string]int{}
		}
		a.Other[nsid]++
	}
}

// Summary is one run's numbers. The fields up to GlibcFail are the lab's
// output format (issue 4), in its order; the rest are extras.
type Summary struct {
	QPS                float64    `json:"qps"` // achieved: queries sent / time spent sending
	Sent               int        `json:"sent"`
	AnsweredFirstTry   int        `json:"answered_first_try"`
	AnsweredAfterRetry int        `json:"answered_after_retry"`
	Unanswered         int        `json:"unanswered"`
	MaxGapMs           float64    `json:"max_gap_ms"` // longest stretch of sends none of which was answered on its first try
	AnsweredBy         AnsweredBy `json:"answered_by"`
	P50Ms              float64    `json:"p50_ms"` // over answered queries, from the first send; 0 if none was answered
	P99Ms              float64    `json:"p99_ms"`
	GlibcOK            int        `json:"glibc_ok"`
	GlibcFail          int        `json:"glibc_fail"`

	ServFail        int            `json:"servfail"`                // SERVFAIL replies (each failed a try)
	BadRcodes       map[string]int `json:"bad_rcodes,omitempty"`    // every reply that failed a try by its rcode, by rcode
	EmptyAnswers    int            `json:"empty_answers,omitempty"` // NOERROR replies without an answer record, which failed a try of a fresh name
	TargetQPS       int            `json:"target_qps"`              // the rate asked for
	DurationS       float64        `json:"duration_s"`              // time spent sending
	MaxGapFromMs    float64        `json:"max_gap_from_ms"`         // where the longest gap began, on the run's clock
	GlibcUnfinished int            `json:"glibc_unfinished"`        // lookups still running when the probe ended
	GlibcSkipped    int            `json:"glibc_skipped"`           // lookups not started: too many running
	GlibcMaxMs      float64        `json:"glibc_max_ms"`            // slowest finished lookup
	Late            int            `json:"late,omitempty"`          // replies after their try timed out
	Duplicates      int            `json:"duplicates"`              // further replies to a try that had one: what a hedging server costs a client (glibc ignores them)
	Mismatched      int            `json:"mismatched"`              // replies with an ID or question no try was sent with
	Malformed       int            `json:"malformed,omitempty"`     // datagrams that are no DNS reply
	Truncated       int            `json:"truncated,omitempty"`     // replies with TC set
	SendErrors      int            `json:"send_errors,omitempty"`   // sends the kernel refused
	ICMPErrors      int            `json:"icmp_errors,omitempty"`   // unreachable errors reported to the sockets
	NoTimestamp     int            `json:"no_timestamp,omitempty"`  // replies timed when read, not by the kernel (none or implausible)
	MaxLagMs        float64        `json:"max_lag_ms,omitempty"`    // furthest the sender fell behind schedule
	Aborted         bool           `json:"aborted,omitempty"`       // the load was cut short
	ReceiverErr     string         `json:"receiver_err,omitempty"`  // the load's receiver failed
}

// Timeline is a run in bins of Step by send time (a query belongs to the
// bin it was first sent in, however it ended), with the glibc lookups by
// start time.
type Timeline struct {
	Step       time.Duration
	Sent       []int
	FirstTry   []int
	AfterRetry []int
	Lost       []int // never answered
	BadReply   []int // got a reply that failed a try (SERVFAIL, REFUSED, ...), however they ended
	GlibcOK    []int
	GlibcFail  []int
}

// LabRun is one scenario under one setup, as one client saw it through
// one of LocalDNS's listeners: the lab's unit of output. A node has two
// clients, so a scenario has two runs per setup: the pods through
// 169.254.10.11 and the node itself (kubelet, hostNetwork pods) through
// 169.254.10.10.
type LabRun struct {
	Scenario string `json:"scenario"`
	Setup    string `json:"setup"`
	Round    int    `json:"round,omitempty"` // with the lab's -rounds, which one (from 1); 0 without
	Summary
	Listener   string      `json:"listener,omitempty"`    // the address the client asked: 169.254.10.11, 169.254.10.10
	Client     string      `json:"client,omitempty"`      // who asked: "pod", "node"
	AfterFault *AfterFault `json:"after_fault,omitempty"` // the queries and lookups begun from the fault on
	// Recovered counts, in a scenario that brings LocalDNS back, what was
	// begun once LocalDNS had had time to take its traffic back: who
	// answers then says whether it did.
	Recovered  *AfterFault `json:"recovered,omitempty"`
	Note       string      `json:"note,omitempty"`
	FaultError string      `json:"fault_error,omitempty"` // what went wrong applying the fault (also in Note), "" when nothing did
	Hedges     *Hedges     `json:"hedges,omitempty"`      // dnsstandby's hedged answers on the run's listener; nil where it does not report them

	// Upstream is the node's upstream queries from the fault on; nil
	// where they were not counted.
	Upstream *UpstreamCounts `json:"upstream,omitempty"`
	// Fallback is what AKS's LocalDNS fallback did on the run's node, nil
	// where the node had none.
	Fallback *FallbackCounts `json:"fallback,omitempty"`
	Down     []Interval      `json:"down,omitempty"`   // LocalDNS down, shaded on the timeline
	Events   []Event         `json:"events,omitempty"` // marks on the timeline
	Timeline Timeline        `json:"timeline"`
}

// FallbackCounts are read from a node's journal at the end of a run.
type FallbackCounts struct {
	Design   string `json:"design"`
	Starts   int    `json:"starts"`   // takeovers by localdns-fallback.service
	Declines int    `json:"declines"` // starts it declined: localdns.service between restart attempts
	// Seen and Gone count dnsstandby's "AKS LocalDNS fallback seen" and
	// "... gone" log lines (0 on a node without dnsstandby).
	Seen int `json:"standby_seen"`
	Gone int `json:"standby_gone"`
}

// ListenerName names the run's client and listener for a person, "pod →
// 169.254.10.11", or "" for a run that does not say.
func (r LabRun) ListenerName() string {
	switch {
	case r.Client != "" && r.Listener != "":
		return r.Client + " → " + r.Listener
	case r.Listener != "":
		return r.Listener
	}
	return r.Client
}

// Hedges are dnsstandby's hedged answers on one listener over a run, from
// its /metrics (dnsstandby_hedge_sent_total, dnsstandby_hedge_outcomes_total):
// queries LocalDNS had not answered by dnsstandby's deadline, which it then
// answered itself from the same address, by where the answer came from,
// and whether LocalDNS answered later (the client then got two replies) or
// never.
type Hedges struct {
	Total    int `json:"total"`
	Cache    int `json:"cache"`
	Stale    int `json:"stale"`
	Upstream int `json:"upstream"`
	Later    int `json:"localdns_later"`
	Never    int `json:"localdns_never"`
}

// AfterFault is how the queries sent and the glibc lookups started from
// the fault on fared: the part of a run a verdict is about, the time
// before the fault being the baseline.
type AfterFault struct {
	AtMs       float64 `json:"at_ms"` // when the fault began, on the load's clock
	Sent       int     `json:"sent"`
	FirstTry   int     `json:"answered_first_try"`
	AfterRetry int     `json:"answered_after_retry"`
	Unanswered int     `json:"unanswered"`
	P99Ms      float64 `json:"p99_ms"`     // over the answered ones, from the first send
	MaxMs      float64 `json:"max_ms"`     // the slowest answered one, from the first send
	MaxGapMs   float64 `json:"max_gap_ms"` // as Summary's, over the queries from the fault on
	GlibcOK    int     `json:"glibc_ok"`   // finished lookups, by start time
	GlibcFail  int     `json:"glibc_fail"` //
	GlibcMaxMs float64 `json:"glibc_max_ms"`
	// AnsweredBy counts the answers from the fault on by the NSID they
	// carried; Hedges is how many dnsstandby hedged meanwhile (nil: not
	// reported).
	AnsweredBy AnsweredBy `json:"answered_by"`
	Hedges     *int       `json:"hedges,omitempty"`
	// Fresh counts, among these queries, those for names never asked
	// before (LoadName.Fresh): nil when the mix has none.
	Fresh *FreshCounts `json:"fresh,omitempty"`
	// GlibcWhileStopped counts, among these lookups, those started while
	// the scenario had dnsstandby stopped for a cold start, with nothing
	// listening: nil where it stops nothing.
	GlibcWhileStopped *GlibcCounts `json:"glibc_while_stopped,omitempty"`
	// Latencies are the answered queries' latencies (P99Ms's), in
	// ascending order: what CompareLatency pools over rounds. Not written.
	Latencies []time.Duration `json:"-"`
}

// GlibcCounts are finished glibc lookups by outcome.
type GlibcCounts struct {
	OK   int `json:"ok"`
	Fail int `json:"fail"`
}

// CountGlibc counts the probe's finished lookups started in [from, to)
// on the load's clock (which starts at loadStart).
func CountGlibc(probe ProbeResult, loadStart time.Time, from, to time.Duration) GlibcCounts {
	var c GlibcCounts
	offset := probe.Start.Sub(loadStart)
	for _, p := range probe.Records {
		if at := offset + p.Start; !p.Finished || at < from || at >= to {
			continue
		}
		if p.OK {
			c.OK++
		} else {
			c.Fail++
		}
	}
	return c
}

// FreshCounts are queries for names never asked before, by outcome and by
// who answered them: no cache held them, so each answer came through an
// upstream.
type FreshCounts struct {
	Sent       int        `json:"sent"`
	FirstTry   int        `json:"answered_first_try"`
	AfterRetry int        `json:"answered_after_retry"`
	Unanswered int        `json:"unanswered"`
	AnsweredBy AnsweredBy `json:"answered_by"`
	P99Ms      float64    `json:"p99_ms"` // over the answered ones, from the first send
	MaxMs      float64    `json:"max_ms"` // the slowest answered one
	// Slowest are the freshSlowest slowest of them, unanswered ones
	// first: when each was sent and who answered, to tell a stall of
	// the whole machine (the timeline's sent count drops then too) from
	// one server's tail.
	Slowest []SlowQuery `json:"slowest,omitempty"`
}

// SlowQuery is one query of FreshCounts.Slowest.
type SlowQuery struct {
	SentMs    float64 `json:"sent_ms"` // on the load's clock, from its start
	LatencyMs float64 `json:"latency_ms,omitempty"`
	By        string  `json:"by,omitempty"` // NSID of the answer, "" if unanswered
	Outcome   string  `json:"outcome"`
}

// freshSlowest is how many of the slowest fresh queries a run keeps.
const freshSlowest = 10

// FirstTryShare is the share of the queries sent from the fault on that
// were answered on their first try; 0 when none was sent.
func (a AfterFault) FirstTryShare() float64 {
	if a.Sent == 0 {
		return 0
	}
	return float64(a.FirstTry) / float64(a.Sent)
}

// CountAfterFault counts the queries sent at or after at (on the load's
// clock) by outcome, with their p99 latency and longest first-try gap, and
// the probe's finished lookups started then or later, with the slowest.
func CountAfterFault(load LoadResult, probe ProbeResult, at time.Duration) AfterFault {
	a := AfterFault{AtMs: reportMs(at)}
	if slices.ContainsFunc(load.Names, func(n LoadName) bool { return n.Fresh }) {
		a.Fresh = &FreshCounts{}
	}
	first := len(load.Records) // records are in send order
	var latencies, freshLatencies []time.Duration
	var freshRecords []LoadRecord
	for i, r := range load.Records {
		if r.Sent < at {
			continue
		}
		first = min(first, i)
		a.Sent++
		var fresh *FreshCounts
		if a.Fresh != nil && load.Names[r.Name].Fresh {
			fresh = a.Fresh
			fresh.Sent++
		}
		switch r.Outcome {
		case LoadFirstTry:
			a.FirstTry++
			if fresh != nil {
				fresh.FirstTry++
			}
		case LoadAfterRetry:
			a.AfterRetry++
			if fresh != nil {
				fresh.AfterRetry++
			}
		case LoadUnanswered:
			a.Unanswered++
			if fresh != nil {
				fresh.Unanswered++
				freshRecords = append(freshRecords, r)
			}
			continue
		}
		if fresh != nil {
			freshRecords = append(freshRecords, r)
		}
		latencies = append(latencies, r.Latency)
		a.AnsweredBy.add(r.By)
		if fresh != nil {
			fresh.AnsweredBy.add(r.By)
			freshLatencies = append(freshLatencies, r.Latency)
		}
	}
	slices.Sort(latencies)
	a.Latencies = latencies
	a.P99Ms = reportMs(stats.Percentile(latencies, 0.99))
	if len(latencies) > 0 {
		a.MaxMs = reportMs(latencies[len(latencies)-1])
	}
	if f := a.Fresh; f != nil && len(freshLatencies) > 0 {
		slices.Sort(freshLatencies)
		f.P99Ms = reportMs(stats.Percentile(freshLatencies, 0.99))
		f.MaxMs = reportMs(freshLatencies[len(freshLatencies)-1])
	}
	if f := a.Fresh; f != nil {
		f.Slowest = slowestFresh(freshRecords)
	}
	if a.Sent > 0 {
		_, gap := MaxGap(LoadResult{Records: load.Records[first:], Duration: load.Duration})
		a.MaxGapMs = reportMs(gap)
	}
	offset := probe.Start.Sub(load.Start)
	var slowest time.Duration
	for _, p := range probe.Records {
		if !p.Finished || offset+p.Start < at {
			continue
		}
		slowest = max(slowest, p.Duration)
		if p.OK {
			a.GlibcOK++
		} else {
			a.GlibcFail++
		}
	}
	a.GlibcMaxMs = reportMs(slowest)
	return a
}

// Check is one of the lab's pass/fail verdicts, on one run.
type Check struct {
	Scenario string `json:"scenario"`
	Setup    string `json:"setup"`
	Round    int    `json:"round,omitempty"` // as LabRun's
	Listener string `json:"listener"`
	Client   string `json:"client"`
	Require  string `json:"require"` // what the run must show
	Pass     bool   `json:"pass"`
	Found    string `json:"found"` // what it showed
}

func (c Check) String() string {
	verdict := "FAIL"
	if c.Pass {
		verdict = "PASS"
	}
	return fmt.Sprintf("%s %s %s %s → %s: %s; found %s", verdict, c.Scenario, roundSetup(c.Setup, c.Round), c.Client, c.Listener, c.Require, c.Found)
}

// roundSetup names a setup with its round, where there are rounds.
func roundSetup(setup string, round int) string {
	if round == 0 {
		return setup
	}
	return fmt.Sprintf("%s (round %d)", setup, round)
}

// NewLabRun summarizes a load and its glibc probe (the zero ProbeResult if
// there was none) and bins them on the load's clock at ReportDefaultStep.
// The caller adds Down, Events and Note.
func NewLabRun(scenario, setup string, load LoadResult, probe ProbeResult) LabRun {
	return LabRun{
		Scenario: scenario,
		Setup:    setup,
		Summary:  Summarize(load, probe),
		Timeline: BuildTimeline(load, probe, ReportDefaultStep),
	}
}

// Summarize computes a run's numbers; probe is the zero ProbeResult if there
// was none.
func Summarize(load LoadResult, probe ProbeResult) Summary {
	s := Summary{
		Sent:         len(load.Records),
		TargetQPS:    load.QPS,
		DurationS:    reportRound(load.Duration.Seconds(), 3),
		Late:         load.Late,
		Duplicates:   load.Duplicates,
		Mismatched:   load.Mismatched,
		EmptyAnswers: load.Empty,
		Malformed:    load.Malformed,
		Truncated:    load.Truncated,
		SendErrors:   load.SendErrors,
		ICMPErrors:   load.RecvErrors,
		NoTimestamp:  load.NoTimestamp,
		MaxLagMs:     reportMs(load.MaxLag),
		Aborted:      load.Aborted,
		ReceiverErr:  load.ReceiverErr,
	}
	if load.Duration > 0 {
		s.QPS = reportRound(float64(s.Sent)/load.Duration.Seconds(), 1)
	}
	latencies := make([]time.Duration, 0, len(load.Records))
	for _, r := range load.Records {
		switch r.Outcome {
		case LoadFirstTry:
			s.AnsweredFirstTry++
		case LoadAfterRetry:
			s.AnsweredAfterRetry++
		default:
			s.Unanswered++
			continue
		}
		latencies = append(latencies, r.Latency)
		s.AnsweredBy.add(r.By)
	}
	slices.Sort(latencies)
	s.P50Ms = reportMs(stats.Percentile(latencies, 0.50))
	s.P99Ms = reportMs(stats.Percentile(latencies, 0.99))
	from, gap := MaxGap(load)
	s.MaxGapMs, s.MaxGapFromMs = reportMs(gap), reportMs(from)
	for rcode, n := range load.BadRcodes {
		if s.BadRcodes == nil {
			s.BadRcodes = map[string]int{}
		}
		s.BadRcodes[reportRcode(rcode)] += n
	}
	s.ServFail = load.BadRcodes[dns.RcodeServerFailure]
	s.GlibcOK, s.GlibcFail = probe.Counts()
	s.GlibcSkipped = probe.Skipped
	var slowest time.Duration
	for _, p := range probe.Records {
		if !p.Finished {
			s.GlibcUnfinished++
			continue
		}
		slowest = max(slowest, p.Duration)
	}
	s.GlibcMaxMs = reportMs(slowest)
	return s
}

// MaxGap finds the longest stretch in which no query sent was answered on
// its first try: from the send time of the first query of a run of such
// queries to the send time of the next query answered on its first try, or
// to the end of sending. It returns where the stretch began and its length;
// both are 0 when every query was answered on its first try.
func MaxGap(load LoadResult) (from, gap time.Duration) {
	recs := load.Records
	run := -1 // first record of the current run, if any
	for i, r := range recs {
		if r.Outcome != LoadFirstTry {
			if run < 0 {
				run = i
			}
			continue
		}
		if run >= 0 {
			if g := r.Sent - recs[run].Sent; g > gap {
				from, gap = recs[run].Sent, g
			}
			run = -1
		}
	}
	if run >= 0 {
		end := max(load.Duration, recs[len(recs)-1].Sent)
		if g := end - recs[run].Sent; g > gap {
			from, gap = recs[run].Sent, g
		}
	}
	return from, gap
}

// BuildTimeline bins the load by send time and the probe's lookups (if
// any) by start time, on the load's clock. Bins cover the time spent
// sending.
func BuildTimeline(load LoadResult, probe ProbeResult, step time.Duration) Timeline {
	if step <= 0 {
		step = ReportDefaultStep
	}
	end := load.Duration
	if n := len(load.Records); n > 0 {
		end = max(end, load.Records[n-1].Sent+1)
	}
	bins := int((end + step - 1) / step)
	t := Timeline{
		Step:       step,
		Sent:       make([]int, bins),
		FirstTry:   make([]int, bins),
		AfterRetry: make([]int, bins),
		Lost:       make([]int, bins),
		BadReply:   make([]int, bins),
		GlibcOK:    make([]int, bins),
		GlibcFail:  make([]int, bins),
	}
	for _, r := range load.Records {
		b := min(int(r.Sent/step), bins-1)
		t.Sent[b]++
		if r.BadReplies > 0 {
			t.BadReply[b]++
		}
		switch r.Outcome {
		case LoadFirstTry:
			t.FirstTry[b]++
		case LoadAfterRetry:
			t.AfterRetry[b]++
		default:
			t.Lost[b]++
		}
	}
	offset := probe.Start.Sub(load.Start)
	for _, p := range probe.Records {
		at := offset + p.Start
		if !p.Finished || at < 0 || at >= time.Duration(bins)*step {
			continue
		}
		if b := int(at / step); p.OK {
			t.GlibcOK[b]++
		} else {
			t.GlibcFail[b]++
		}
	}
	return t
}

// reportMs is d in milliseconds at microsecond precision.
func reportMs(d time.Duration) float64 {
	return reportRound(float64(d)/float64(time.Millisecond), 3)
}

func reportRound(v float64, digits int) float64 {
	p := math.Pow10(digits)
	return math.Round(v*p) / p
}

func reportDuration(ms float64) time.Duration {
	return time.Duration(math.Round(ms * float64(time.Millisecond)))
}

func reportRcode(rcode int) string {
	if s, ok := dns.RcodeToString[rcode]; ok {
		return s
	}
	return fmt.Sprintf("RCODE%d", rcode)
}

type reportIntervalJSON struct {
	FromMs float64 `json:"from_ms"`
	ToMs   float64 `json:"to_ms"`
	Label  string  `json:"label"`
}

func (i Interval) MarshalJSON() ([]byte, error) {
	return json.Marshal(reportIntervalJSON{reportMs(i.From), reportMs(i.To), i.Label})
}

func (i *Interval) UnmarshalJSON(b []byte) error {
	var v reportIntervalJSON
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*i = Interval{From: reportDuration(v.FromMs), To: reportDuration(v.ToMs), Label: v.Label}
	return nil
}

type reportEventJSON struct {
	AtMs  float64 `json:"at_ms"`
	Label string  `json:"label"`
}

func (e Event) MarshalJSON() ([]byte, error) {
	return json.Marshal(reportEventJSON{reportMs(e.At), e.Label})
}

func (e *Event) UnmarshalJSON(b []byte) error {
	var v reportEventJSON
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*e = Event{At: reportDuration(v.AtMs), Label: v.Label}
	return nil
}

type reportTimelineJSON struct {
	StepMs     float64 `json:"step_ms"`
	Sent       []int   `json:"sent"`
	FirstTry   []int   `json:"first_try"`
	AfterRetry []int   `json:"after_retry"`
	Lost       []int   `json:"lost"`
	BadReply   []int   `json:"bad_reply"`
	GlibcOK    []int   `json:"glibc_ok"`
	GlibcFail  []int   `json:"glibc_fail"`
}

func (t Timeline) MarshalJSON() ([]byte, error) {
	orEmpty := func(v []int) []int {
		if v == nil {
			return []int{}
		}
		return v
	}
	return json.Marshal(reportTimelineJSON{
		StepMs: reportMs(t.Step), Sent: orEmpty(t.Sent), FirstTry: orEmpty(t.FirstTry),
		AfterRetry: orEmpty(t.AfterRetry), Lost: orEmpty(t.Lost), BadReply: orEmpty(t.BadReply),
		GlibcOK: orEmpty(t.GlibcOK), GlibcFail: orEmpty(t.GlibcFail),
	})
}

func (t *Timeline) UnmarshalJSON(b []byte) error {
	var v reportTimelineJSON
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*t = Timeline{
		Step: reportDuration(v.StepMs), Sent: v.Sent, FirstTry: v.FirstTry,
		AfterRetry: v.AfterRetry, Lost: v.Lost, BadReply: v.BadReply, GlibcOK: v.GlibcOK, GlibcFail: v.GlibcFail,
	}
	return nil
}

// slowestFresh is the freshSlowest slowest of records: the unanswered
// ones first, in send order, then the answered by latency.
func slowestFresh(records []LoadRecord) []SlowQuery {
	slices.SortStableFunc(records, func(a, b LoadRecord) int {
		if ua, ub := a.Outcome == LoadUnanswered, b.Outcome == LoadUnanswered; ua != ub {
			if ua {
				return -1
			}
			return 1
		}
		return cmp.Compare(b.Latency, a.Latency)
	})
	var out []SlowQuery
	for _, r := range records[:min(len(records), freshSlowest)] {
		q := SlowQuery{SentMs: reportMs(r.Sent), By: r.By, Outcome: r.Outcome.String()}
		if r.Outcome != LoadUnanswered {
			q.LatencyMs = reportMs(r.Latency)
		}
		out = append(out, q)
	}
	return out
}
