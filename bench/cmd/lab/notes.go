package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/dnsstandby/dnsstandby/bench/lab"
)

// Notes the lab adds to a run's results where a scenario asks a question
// the summary's totals do not answer.

// Event labels the notes look for (scenarios.go marks them).
const (
	faultBackMark = "both back"
)

// coverage is how well the names pods resolved before a fault were
// answered during it.
type coverage struct {
	warmed        int // distinct names answered before the fault began
	asked         int // of those, asked in the window
	allAnswered   int // of those, answered every time they were asked in the window
	queries       int // queries in the window for warmed names
	answered      int // of those, answered
	coldQueries   int // queries in the window for names never answered before the fault
	coldAnswered  int
	standbyAnswer int // answers in the window by dnsstandby (NSID)
}

// warmCoverage measures, for the queries sent in [from, to), how the names
// answered before warmEnd fared: per name (answered every time) and per
// query. Names first seen in the window ("cold") are counted apart: with
// kube-dns unreachable nothing can answer them, and that says nothing
// about the mirror.
func warmCoverage(res lab.LoadResult, warmEnd, from, to time.Duration) coverage {
	var c coverage
	// The mix repeats names (weights): a name is its question.
	type question struct {
		name  string
		qtype uint16
	}
	q := func(r lab.LoadRecord) question {
		n := res.Names[r.Name]
		return question{strings.ToLower(n.FQDN), n.Type}
	}
	// A fresh entry's queries each ask a name of their own: never warm.
	fresh := func(r lab.LoadRecord) bool { return res.Names[r.Name].Fresh }
	warm := map[question]bool{}
	for _, r := range res.Records {
		if r.Sent < warmEnd && r.Outcome != lab.LoadUnanswered && !fresh(r) {
			warm[q(r)] = true
		}
	}
	c.warmed = len(warm)
	failed := map[question]bool{}
	asked := map[question]bool{}
	for _, r := range res.Records {
		if r.Sent < from || r.Sent >= to {
			continue
		}
		ok := r.Outcome != lab.LoadUnanswered
		if ok && r.By == lab.LoadNSIDStandby {
			c.standbyAnswer++
		}
		if fresh(r) || !warm[q(r)] {
			c.coldQueries++
			if ok {
				c.coldAnswered++
			}
			continue
		}
		asked[q(r)] = true
		c.queries++
		if ok {
			c.answered++
		} else {
			failed[q(r)] = true
		}
	}
	c.asked = len(asked)
	c.allAnswered = c.asked - len(failed)
	return c
}

func (c coverage) String() string {
	pct := func(a, b int) float64 { return 100 * float64(a) / float64(max(b, 1)) }
	return fmt.Sprintf("of %d names answered before the fault, %d were asked while LocalDNS was down and %d of them (%.2f%%) answered every time; "+
		"%d of %d queries for them answered (%.2f%%), %d by dnsstandby; names never answered before: %d of %d queries answered",
		c.warmed, c.asked, c.allAnswered, pct(c.allAnswered, c.asked),
		c.answered, c.queries, pct(c.answered, c.queries), c.standbyAnswer, c.coldAnswered, c.coldQueries)
}

// warmNote reports warmCoverage for scenarios with a warm-up before both
// LocalDNS and kube-dns go away (double-fault): the window is from when
// LocalDNS's unit was first seen not active after the fault began to
// "both back".
func warmNote(res lab.LoadResult, evs []lab.Event, down []lab.Interval) string {
	if len(evs) == 0 {
		return ""
	}
	faultAt, back := evs[0].At, time.Duration(-1)
	for _, e := range evs {
		if e.Label == faultBackMark {
			back = e.At
		}
	}
	if back < 0 || !strings.Contains(evs[0].Label, "kube-dns unreachable") {
		return ""
	}
	from := time.Duration(-1)
	for _, d := range down {
		if d.From >= faultAt {
			from = d.From
			break
		}
	}
	if from < 0 {
		return "warm names: LocalDNS was never seen down"
	}
	return "warm names: " + warmCoverage(res, faultAt, from, back).String()
}

// journalLine is one of dnsstandby's JSON log lines, with the PID that
// journald recorded for it.
type journalLine struct {
	pid  int
	time time.Time
	msg  string
}

var journalPrefix = regexp.MustCompile(`dnsstandby\[(\d+)\]: (\{.*\})\s*$`)

// parseJournal reads dnsstandby's JSON log lines out of `journalctl -o
// short-precise` output; other lines (systemd's own) are skipped.
func parseJournal(out string) []journalLine {
	var lines []journalLine
	for l := range strings.Lines(out) {
		m := journalPrefix.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		var rec struct {
			Time time.Time `json:"time"`
			Msg  string    `json:"msg"`
		}
		if json.Unmarshal([]byte(m[2]), &rec) != nil {
			continue
		}
		pid, _ := strconv.Atoi(m[1])
		lines = append(lines, journalLine{pid: pid, time: rec.Time, msg: rec.Msg})
	}
	return lines
}

// restartTimes are the moments of a dnsstandby restart, from its journal.
type restartTimes struct {
	sigterm, oldStopped, newReady time.Time // zero when not found
}

// findRestart finds the first restart after since: the old process's
// "shutting down" (logged as SIGTERM arrives) and "stopped" (its sockets
// closed, its snapshot written), and the new process's "dnsstandby ready".
func findRestart(lines []journalLine, since time.Time) restartTimes {
	var rt restartTimes
	oldPID := 0
	for _, l := range lines {
		switch {
		case l.time.Before(since):
		case oldPID == 0 && l.msg == "shutting down":
			oldPID, rt.sigterm = l.pid, l.time
		case oldPID != 0 && l.pid == oldPID && l.msg == "stopped":
			rt.oldStopped = l.time
		case oldPID != 0 && l.pid != oldPID && l.msg == "dnsstandby ready" && rt.newReady.IsZero():
			rt.newReady = l.time
		}
	}
	return rt
}

// firstAnswerAfter is when (on the load's clock) the first answer came
// that arrived after t, or -1 if none did.
func firstAnswerAfter(res lab.LoadResult, t time.Time) time.Duration {
	first := time.Duration(-1)
	for _, r := range res.Records {
		if r.Outcome == lab.LoadUnanswered {
			continue
		}
		if at := r.Sent + r.Latency; res.Start.Add(at).After(t) && (first < 0 || at < first) {
			first = at
		}
	}
	return first
}

// timing says how long one stop and start of dnsstandby after since took,
// from its journal lines: SIGTERM to the old process gone, to the new one
// ready, and to the first answer the load got after the old one stopped.
func timing(res lab.LoadResult, lines []journalLine, since time.Time) string {
	rt := findRestart(lines, since)
	if rt.sigterm.IsZero() || rt.oldStopped.IsZero() || rt.newReady.IsZero() {
		return fmt.Sprintf("not found in the journal (SIGTERM %v, old stopped %v, new ready %v)",
			!rt.sigterm.IsZero(), !rt.oldStopped.IsZero(), !rt.newReady.IsZero())
	}
	first := firstAnswerAfter(res, rt.oldStopped)
	if first < 0 {
		return "the new process never answered"
	}
	ms := func(d time.Duration) int64 { return d.Milliseconds() }
	return fmt.Sprintf("SIGTERM to old process gone %d ms, to new process ready %d ms, to the first answer after %d ms",
		ms(rt.oldStopped.Sub(rt.sigterm)), ms(rt.newReady.Sub(rt.sigterm)), ms(res.Start.Add(first).Sub(rt.sigterm)))
}

// badCorefileNote says, for bad-corefile on a node that runs dnsstandby,
// how dnsstandby's restart and cold start went (timing) and what it made
// of the refused Corefile: the Corefile changes it did not apply and the
// reloads it did (its log lines), and how often its unit failed.
func badCorefileNote(res lab.LoadResult, evs []lab.Event, t *topology) string {
	marks := map[string]time.Duration{}
	for _, e := range evs {
		if _, seen := marks[e.Label]; !seen {
			marks[e.Label] = e.At
		}
	}
	refused, ok := marks[refusedMark]
	if !ok || !isStandby(t.setup) {
		return ""
	}
	journal, err := t.guest.Journal(context.Background(), "dnsstandby.service")
	if err != nil {
		return "bad Corefile: journal unreadable: " + err.Error()
	}
	lines := parseJournal(journal)
	var parts []string
	for _, s := range []struct{ what, mark string }{{"restart", restartMark}, {"cold start", coldStartMark}} {
		if at, ok := marks[s.mark]; ok {
			parts = append(parts, s.what+": "+timing(res, lines, res.Start.Add(at)))
		}
	}
	notApplied, reloaded := 0, 0
	for _, l := range lines {
		switch {
		case l.time.Before(res.Start.Add(refused)):
		case strings.HasPrefix(l.msg, "Corefile change not applied"):
			notApplied++
		case l.msg == "Corefile reloaded":
			reloaded++
		}
	}
	parts = append(parts, fmt.Sprintf("from the refused Corefile on, dnsstandby logged %d Corefile changes not applied and %d reloads; its unit failed %d times",
		notApplied, reloaded, strings.Count(journal, "dnsstandby.service: Failed with result")))
	return "bad Corefile: " + strings.Join(parts, "; ")
}

// restartNote measures the standby-restart scenario's restart of
// dnsstandby, while it answers alone and only from its cache: from SIGTERM
// to the old process gone, to the new one ready, and to the new one's
// first answer (the first answer received after the old one closed its
// sockets), then how the warm names fared from that answer on.
func restartNote(res lab.LoadResult, evs []lab.Event, t *topology) string {
	mark, back := time.Duration(-1), time.Duration(-1)
	for _, e := range evs {
		switch e.Label {
		case restartMark:
			mark = e.At
		case faultBackMark:
			back = e.At
		}
	}
	if mark < 0 || back < 0 {
		return ""
	}
	journal, err := t.guest.Journal(context.Background(), "dnsstandby.service")
	if err != nil {
		return "restart: journal unreadable: " + err.Error()
	}
	rt := findRestart(parseJournal(journal), res.Start.Add(mark))
	if rt.sigterm.IsZero() || rt.oldStopped.IsZero() || rt.newReady.IsZero() {
		return fmt.Sprintf("restart: not found in the journal (SIGTERM %v, old stopped %v, new ready %v)",
			!rt.sigterm.IsZero(), !rt.oldStopped.IsZero(), !rt.newReady.IsZero())
	}
	first := firstAnswerAfter(res, rt.oldStopped)
	if first < 0 {
		return "restart: the new process never answered"
	}
	ms := func(d time.Duration) int64 { return d.Milliseconds() }
	c := warmCoverage(res, evs[0].At, first, back)
	return fmt.Sprintf("restart: SIGTERM to old process gone %d ms, to new process ready %d ms, to its first answer %d ms; after that answer, %s",
		ms(rt.oldStopped.Sub(rt.sigterm)), ms(rt.newReady.Sub(rt.sigterm)), ms(res.Start.Add(first).Sub(rt.sigterm)), c)
}
