package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/dnsstandby/dnsstandby/bench/internal/stats"
)

// schedStats is what perf sched timehist of the servers' CPU shows over a
// measurement (-sched): how long dnsstandby held that CPU each time it ran
// there, and how long LocalDNS's threads waited for it from wake-up to
// running. A query LocalDNS has to answer while dnsstandby runs waits for
// the rest of that run (unless the scheduler preempts it), so dnsstandby's
// longest runs bound what sharing the CPU adds to any answer.
type schedStats struct {
	StandbyRuns     int     `json:"standby_runs"`
	StandbyRunP99Us float64 `json:"standby_run_p99_us"`
	StandbyRunMaxUs float64 `json:"standby_run_max_us"`
	// StandbyCPUPct is dnsstandby's time on the CPU in the recording, % of
	// the recording's span.
	StandbyCPUPct       float64 `json:"standby_cpu_pct"`
	LocalDNSWakeups     int     `json:"localdns_wakeups"`
	LocalDNSDelayP99Us  float64 `json:"localdns_delay_p99_us"`
	LocalDNSDelayP999Us float64 `json:"localdns_delay_p999_us"`
}

// readSched runs perf sched timehist over file and sums it up for
// dnsstandby's and LocalDNS's processes.
func readSched(ctx context.Context, file string, standbyPid, localDNSPid int) (*schedStats, error) {
	cmd := exec.CommandContext(ctx, "perf", "sched", "timehist", "-i", file)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("perf sched timehist: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("perf sched timehist: %w", err)
	}
	s, perr := parseTimehist(out, standbyPid, localDNSPid)
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("perf sched timehist %s: %w", file, err)
	}
	if perr != nil {
		return nil, fmt.Errorf("perf sched timehist %s: %w", file, perr)
	}
	return s, nil
}

// timehistTask is a timehist line's task: comm[tid/pid], or comm[pid] for
// a process of one thread.
var timehistTask = regexp.MustCompile(`\[(\d+)(?:/(\d+))?\]$`)

// parseTimehist reads perf sched timehist's lines: the time a task was
// switched out, its CPU, the task, then its wait time, its scheduling
// delay (wake-up to running) and its run time, in ms.
func parseTimehist(r io.Reader, standbyPid, localDNSPid int) (*schedStats, error) {
	var runs, delays []float64
	var first, last, ran float64
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 || !strings.HasPrefix(f[1], "[") {
			continue
		}
		at, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue // the header
		}
		m := timehistTask.FindStringSubmatch(strings.Join(f[2:len(f)-3], " "))
		if m == nil {
			continue
		}
		pid, _ := strconv.Atoi(m[1])
		if m[2] != "" {
			pid, _ = strconv.Atoi(m[2])
		}
		var ms [3]float64
		for i := range ms {
			if ms[i], err = strconv.ParseFloat(f[len(f)-3+i], 64); err != nil {
				return nil, fmt.Errorf("line %q: %w", sc.Text(), err)
			}
		}
		if first == 0 {
			first = at
		}
		last = at
		switch pid {
		case standbyPid:
			runs = append(runs, 1000*ms[2])
			ran += ms[2] / 1000
		case localDNSPid:
			delays = append(delays, 1000*ms[1])
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(delays) == 0 {
		return nil, fmt.Errorf("no switch of LocalDNS's (pid %d) threads recorded", localDNSPid)
	}
	slices.Sort(runs)
	slices.Sort(delays)
	s := &schedStats{StandbyRuns: len(runs), LocalDNSWakeups: len(delays),
		LocalDNSDelayP99Us: stats.Percentile(delays, 0.99), LocalDNSDelayP999Us: stats.Percentile(delays, 0.999)}
	if len(runs) > 0 {
		s.StandbyRunP99Us, s.StandbyRunMaxUs = stats.Percentile(runs, 0.99), runs[len(runs)-1]
	}
	if last > first {
		s.StandbyCPUPct = 100 * ran / (last - first)
	}
	return s, nil
}

// schedNote describes r's scheduling on the servers' CPU, when recorded.
func schedNote(s *schedStats) string {
	if s == nil {
		return ""
	}
	ran := "dnsstandby did not run on LocalDNS's CPU"
	if s.StandbyRuns > 0 {
		ran = fmt.Sprintf("on LocalDNS's CPU dnsstandby ran %.2f%% of the time, %d times, at most %.0f µs at a time (p99 %.0f)",
			s.StandbyCPUPct, s.StandbyRuns, s.StandbyRunMaxUs, s.StandbyRunP99Us)
	}
	return fmt.Sprintf("; %s, and LocalDNS's threads waited p99 %.0f µs, p99.9 %.0f µs from wake-up to running",
		ran, s.LocalDNSDelayP99Us, s.LocalDNSDelayP999Us)
}
