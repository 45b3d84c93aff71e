package lab

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// LabFile is bench/out/lab.json (issue 4's output format, plus the lab's
// checks and the scenarios that were not run).
type LabFile struct {
	CoreDNSVersion string    `json:"coredns_version"`
	Runs           []LabRun  `json:"runs"`
	Checks         []Check   `json:"checks,omitempty"`
	Skipped        []Skipped `json:"skipped,omitempty"`
	// Latency compares the setups over the rounds, with -rounds.
	Latency []LatencyComparison `json:"latency,omitempty"`
}

// Skipped is a scenario and setup the lab did not run, and why: it is
// listed in the output rather than left out silently.
type Skipped struct {
	Scenario string `json:"scenario"`
	Setup    string `json:"setup"`
	Why      string `json:"why"`
}

// Failed lists the checks that failed.
func (f LabFile) Failed() []Check {
	var out []Check
	for _, c := range f.Checks {
		if !c.Pass {
			out = append(out, c)
		}
	}
	return out
}

// reportNumberArray matches a JSON array of numbers as json.MarshalIndent
// writes it, one number a line.
// (MarshalIndent escapes newlines inside strings, so only its own layout
// has a line break after '[').
var reportNumberArray = regexp.MustCompile(`\[\n\s*-?[0-9][-0-9.eE+]*(?:,\n\s*-?[0-9][-0-9.eE+]*)*\n\s*\]`)

// WriteLabJSON writes lab.json: {"coredns_version", "runs": [...],
// "checks": [...], "skipped": [...]}, one run per LabRun with the
// summary's fields first. It is indented, but arrays of numbers (the
// timeline) stay on one line each.
func WriteLabJSON(path string, f LabFile) error {
	if f.Runs == nil {
		f.Runs = []LabRun{}
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	b = reportNumberArray.ReplaceAllFunc(b, func(m []byte) []byte {
		return bytes.Join(bytes.Fields(m), nil)
	})
	return reportWriteFile(path, append(b, '\n'))
}

// ReadLabJSON reads a file WriteLabJSON wrote, to draw or tabulate it again.
func ReadLabJSON(path string) (LabFile, error) {
	var v LabFile
	b, err := os.ReadFile(path)
	if err != nil {
		return v, err
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return v, fmt.Errorf("read %s: %w", path, err)
	}
	return v, nil
}

// WriteLabMarkdown writes the checks, then the runs as Markdown tables, one
// per scenario in the order scenarios first appear, each followed by the
// setups of the scenario that were skipped.
func WriteLabMarkdown(path string, f LabFile) error {
	var b strings.Builder
	b.WriteString("# Lab results\n")
	reportChecks(&b, f.Checks)
	reportLatency(&b, f.Latency)
	scenarios := reportScenarios(f.Runs)
	for _, s := range f.Skipped {
		if !slices.Contains(scenarios, s.Scenario) {
			scenarios = append(scenarios, s.Scenario)
		}
	}
	for _, scenario := range scenarios {
		fmt.Fprintf(&b, "\n## %s\n", scenario)
		if slices.ContainsFunc(f.Runs, func(r LabRun) bool { return r.Scenario == scenario }) {
			reportTable(&b, scenario, f.Runs)
		}
		first := true
		for _, s := range f.Skipped {
			if s.Scenario != scenario {
				continue
			}
			if first {
				b.WriteString("\nNot run:\n\n")
				first = false
			}
			fmt.Fprintf(&b, "- %s: %s\n", reportCell(s.Setup), reportCell(s.Why))
		}
	}
	return reportWriteFile(path, []byte(b.String()))
}

// reportChecks writes the checks' verdicts, failures first counted.
func reportChecks(b *strings.Builder, checks []Check) {
	if len(checks) == 0 {
		return
	}
	failed := 0
	for _, c := range checks {
		if !c.Pass {
			failed++
		}
	}
	fmt.Fprintf(b, "\n## Checks: %d of %d passed\n\n", len(checks)-failed, len(checks))
	for _, c := range checks {
		fmt.Fprintf(b, "- %s\n", reportCell(c.String()))
	}
}

// reportLatency writes the comparisons over rounds, a table each.
func reportLatency(b *strings.Builder, comps []LatencyComparison) {
	for _, c := range comps {
		fmt.Fprintf(b, "\n## %s, %s → %s: latency from the fault on, every round pooled\n\n", reportCell(c.Scenario), reportCell(c.Client), reportCell(c.Listener))
		b.WriteString("| setup | answered | p50 ms | p99 ms | p99 against the first, ms | its 90% interval | median of the rounds' own | rounds' p99 ms |\n")
		b.WriteString("|---|--:|--:|--:|--:|---|--:|---|\n")
		for i, s := range c.Setups {
			diff, interval, median := "—", "—", "—"
			if i > 0 {
				diff = fmt.Sprintf("%+.3f", s.P99DiffMs)
				interval = fmt.Sprintf("%+.3f to %+.3f", s.P99DiffLowMs, s.P99DiffHighMs)
				median = fmt.Sprintf("%+.3f", s.RoundDiffMedianMs)
			}
			rounds := make([]string, len(s.RoundP99Ms))
			for j, v := range s.RoundP99Ms {
				rounds[j] = reportFloat(v, 2)
			}
			fmt.Fprintf(b, "| %s | %d | %.3f | %.3f | %s | %s | %s | %s |\n", reportCell(s.Setup), s.Answered, s.P50Ms, s.P99Ms, diff, interval, median, strings.Join(rounds, ", "))
		}
	}
}

// reportTable writes the scenario's runs as a table, a row per setup and
// listener.
func reportTable(b *strings.Builder, scenario string, runs []LabRun) {
	b.WriteString("\n| setup | client → listener | qps | sent | answered first try | after retry | unanswered | unanswered after fault | max gap ms | localdns | dnsstandby | p50 ms | p99 ms | p99 ms after fault | glibc ok | glibc fail | glibc fail after fault | glibc max ms | hedges | duplicates | mismatched | servfail | note |\n")
	b.WriteString("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	for _, r := range runs {
		if r.Scenario != scenario {
			continue
		}
		p50, p99 := "—", "—"
		if r.AnsweredFirstTry+r.AnsweredAfterRetry > 0 {
			p50, p99 = reportFloat(r.P50Ms, 1), reportFloat(r.P99Ms, 1)
		}
		lostAfter, p99After, glibcAfter := "—", "—", "—"
		if a := r.AfterFault; a != nil {
			lostAfter, glibcAfter = strconv.Itoa(a.Unanswered), strconv.Itoa(a.GlibcFail)
			if a.FirstTry+a.AfterRetry > 0 {
				p99After = reportFloat(a.P99Ms, 1)
			}
		}
		glibcMax := "—"
		if r.GlibcOK+r.GlibcFail > 0 {
			glibcMax = reportFloat(r.GlibcMaxMs, 0)
		}
		// n/a: the setup runs no dnsstandby, or one that does not
		// report hedges.
		hedges := "n/a"
		if h := r.Hedges; h != nil {
			hedges = strconv.Itoa(h.Total)
		}
		fmt.Fprintf(b, "| %s | %s | %s | %d | %d | %d | %d | %s | %s | %d | %d | %s | %s | %s | %d | %d | %s | %s | %s | %d | %d | %d | %s |\n",
			reportCell(roundSetup(r.Setup, r.Round)), reportCell(r.ListenerName()), reportFloat(r.QPS, 0), r.Sent, r.AnsweredFirstTry, r.AnsweredAfterRetry,
			r.Unanswered, lostAfter, reportFloat(r.MaxGapMs, 0), r.AnsweredBy.ByLocalDNS(), r.AnsweredBy.Standby,
			p50, p99, p99After, r.GlibcOK, r.GlibcFail, glibcAfter, glibcMax, hedges, r.Duplicates, r.Mismatched, r.ServFail, reportCell(r.Note))
	}
}

// reportScenarios lists the runs' scenarios in order of first appearance.
func reportScenarios(runs []LabRun) []string {
	var out []string
	seen := map[string]bool{}
	for _, r := range runs {
		if !seen[r.Scenario] {
			seen[r.Scenario] = true
			out = append(out, r.Scenario)
		}
	}
	return out
}

func reportFloat(v float64, digits int) string {
	return strconv.FormatFloat(v, 'f', digits, 64)
}

// reportCell keeps text from breaking a table row.
func reportCell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.Join(strings.Fields(s), " ")
}

// reportWriteFile writes b to path, creating its directory, through a
// temporary file so a reader never sees half a file.
func reportWriteFile(path string, b []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
