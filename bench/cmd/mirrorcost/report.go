package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/dnsstandby/dnsstandby/bench/internal/dnsperf"
	"github.com/dnsstandby/dnsstandby/bench/internal/procstat"
)

// result is one mirror feed measured: an object of mirror.json.
type result struct {
	Mirror          string            `json:"mirror"`                    // tap, dnstap or none
	Round           int               `json:"round"`                     // which pass over the feeds (-rounds), from 1
	SharedLocalDNS  bool              `json:"shared_localdns"`           // LocalDNS was the round's, kept across its feeds (all but dnstap)
	QPS             float64           `json:"qps"`                       // answers per second (dnsperf's "Queries per second")
	LocalDNSCPUUs   float64           `json:"localdns_cpu_us_per_query"` // LocalDNS utime+stime over the window ÷ answers
	StandbyCPUUs    float64           `json:"standby_cpu_us_per_query"`  // dnsstandby's, ÷ the same answers
	Ratio           float64           `json:"ratio"`                     // StandbyCPUUs ÷ LocalDNSCPUUs
	RecordsAccepted uint64            `json:"records_accepted"`          // mirror records taken into the cache in the window
	RecordsRejected map[string]uint64 `json:"records_rejected"`          // the rest, by reason (have_fresh: already held fresh)
	StandbyAnswered uint64            `json:"standby_answered"`          // queries dnsstandby answered from mirror mode on (warm-up and window)

	Target                float64 `json:"target"`           // the most Ratio may be
	Met                   bool    `json:"target_met"`       // Ratio ≤ Target (never for none, the baseline)
	TargetQPS             int     `json:"target_qps"`       // dnsperf -Q
	RateShort             bool    `json:"rate_not_reached"` // QPS < 98% of TargetQPS: see the CPU % for why
	Sent                  uint64  `json:"sent"`
	Answered              uint64  `json:"answered"`
	Lost                  uint64  `json:"lost"`
	NotNoerror            uint64  `json:"answers_not_noerror"`
	Seconds               float64 `json:"seconds"`                 // dnsperf's run time
	LocalDNSCPUPct        float64 `json:"localdns_cpu_pct"`        // LocalDNS's CPU over the window, % of one core
	StandbyCPUPct         float64 `json:"standby_cpu_pct"`         // dnsstandby's
	StandbyAnsweredWindow uint64  `json:"standby_answered_window"` // queries dnsstandby answered in the window alone
	UpstreamQueries       uint64  `json:"upstream_queries"`        // A queries that reached the upstream in the window (LocalDNS misses)
	ListenDrops           uint64  `json:"listen_socket_drops"`     // queries dropped at full sockets on 169.254.10.11:53
	TapDrops              uint64  `json:"tap_kernel_drops"`        // replies the kernel dropped at the tap's full buffer
	// ProgramUs is the time the tap's eBPF programs ran in the kernel per
	// query, in ring mode, when kernel.bpf_stats_enabled is 1 (set it by
	// hand: counting costs two clock reads a run, more than a run on this
	// project's VMs, and inflates both this and LocalDNS's CPU; 0
	// otherwise). BenchmarkRingPrograms in mirror/tap measures the
	// programs without that.
	ProgramUs float64 `json:"tap_program_us_per_query"`
	// LocalDNSFeedShare, with -perf, is the share of LocalDNS's samples
	// in the window whose call chain passes through code that runs only
	// because a feed watches it (attribute.go): times LocalDNSCPUUs, the
	// feed's cost to LocalDNS measured within the window.
	LocalDNSFeedShare float64 `json:"localdns_feed_share,omitempty"`
	// P50Us and P99Us, with -latency, are the answers' latencies as
	// dnsperf saw them (-v), over LatencySamples answers.
	P50Us          uint32 `json:"p50_us,omitempty"`
	P99Us          uint32 `json:"p99_us,omitempty"`
	LatencySamples int    `json:"latency_samples,omitempty"`
	// Sched, with -sched, is the servers' CPU's scheduling over the
	// window.
	Sched          *schedStats `json:"sched,omitempty"`
	Warmup         warmup      `json:"warmup"`
	Profiled       bool        `json:"profiled,omitempty"` // perf record ran beside the servers: numbers perturbed
	Dnsperf        string      `json:"dnsperf"`            // the measurement's command line
	StandbyCommand string      `json:"dnsstandby"`         // dnsstandby's command line
}

// warmup is what the warm-up showed.
type warmup struct {
	Passes               int    `json:"passes"`                     // dnsperf passes over every name
	UpstreamLastPass     uint64 `json:"upstream_queries_last_pass"` // 0: LocalDNS's cache held every name
	LocalDNSCacheEntries uint64 `json:"localdns_cache_entries"`     // coredns_cache_entries{type="success"}
	StandbyCacheEntries  uint64 `json:"standby_cache_entries"`      // dnsstandby_cache_entries
	RecordsAccepted      uint64 `json:"records_accepted"`           // mirror records taken during the warm-up
	// Filled: dnsstandby's cache held at least 99% of the names after the
	// warm-up (for the feed none: less than 1%, since nothing fills it).
	Filled bool `json:"standby_filled"`
}

// snapshot is what is sampled before and after the measurement.
type snapshot struct {
	at            time.Time
	localDNSTicks uint64 // LocalDNS utime+stime, USER_HZ ticks
	standbyTicks  uint64 // dnsstandby's
	listenDrops   uint64
	upstream      uint64
	answered      uint64            // dnsstandby_queries_total
	accepted      uint64            // dnsstandby_mirror_records_total{result="accepted"}
	rejected      map[string]uint64 // ... {result="rejected"} by reason
	tapDrops      uint64
	programNs     float64 // dnsstandby_mirror_tap_program_seconds_total, in ns: the ring's eBPF programs
}

// newResult computes a feed's result from dnsperf's report and the
// snapshots: start (mirror mode reached), before and after the window.
func newResult(feed string, r *dnsperf.Result, start, before, after snapshot) result {
	res := result{
		Mirror:                feed,
		QPS:                   r.QPS,
		Sent:                  r.Sent,
		Answered:              r.Completed,
		Lost:                  r.Lost,
		NotNoerror:            r.Completed - r.Rcodes["NOERROR"],
		Seconds:               r.RunTime.Seconds(),
		RecordsAccepted:       after.accepted - before.accepted,
		RecordsRejected:       map[string]uint64{},
		StandbyAnswered:       after.answered - start.answered,
		StandbyAnsweredWindow: after.answered - before.answered,
		UpstreamQueries:       after.upstream - before.upstream,
		ListenDrops:           after.listenDrops - before.listenDrops,
		TapDrops:              after.tapDrops - before.tapDrops,
	}
	if r.Completed > 0 {
		res.ProgramUs = (after.programNs - before.programNs) / 1e3 / float64(r.Completed)
	}
	for reason, v := range after.rejected {
		if d := v - before.rejected[reason]; d > 0 {
			res.RecordsRejected[reason] = d
		}
	}
	ld := float64(after.localDNSTicks-before.localDNSTicks) * procstat.UsPerTick
	sb := float64(after.standbyTicks-before.standbyTicks) * procstat.UsPerTick
	if r.Completed > 0 {
		res.LocalDNSCPUUs = ld / float64(r.Completed)
		res.StandbyCPUUs = sb / float64(r.Completed)
	}
	if res.LocalDNSCPUUs > 0 {
		res.Ratio = res.StandbyCPUUs / res.LocalDNSCPUUs
	}
	if window := after.at.Sub(before.at); window > 0 {
		res.LocalDNSCPUPct = 100 * ld / float64(window.Microseconds())
		res.StandbyCPUPct = 100 * sb / float64(window.Microseconds())
	}
	return res
}

// printTable writes the results as a Markdown table, then the verdicts and,
// with the baseline measured, what each feed costs in all.
func printTable(w io.Writer, results []result, target float64) {
	fmt.Fprintln(w, "| mirror | qps | LocalDNS µs/query | dnsstandby µs/query | ratio | target | LocalDNS CPU % | dnsstandby CPU % | records accepted | records rejected | dnsstandby answered | warm-up: LocalDNS / dnsstandby cache entries |")
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|---|--:|--:|--:|---|--:|--:|")
	for _, r := range results {
		verdict := fmt.Sprintf("≤ %.0f%%: ", 100*target)
		switch {
		case r.Mirror == "none":
			verdict = "baseline (no feed)"
		case r.Met:
			verdict += "met"
		default:
			verdict += "**MISSED**"
		}
		fill := ""
		if !r.Warmup.Filled {
			fill = " (not filled)"
		}
		fmt.Fprintf(w, "| %s | %.0f | %.2f | %.2f | %.1f%% | %s | %.1f | %.1f | %d | %s | %d | %d / %d%s |\n",
			r.Mirror, r.QPS, r.LocalDNSCPUUs, r.StandbyCPUUs, 100*r.Ratio, verdict,
			r.LocalDNSCPUPct, r.StandbyCPUPct, r.RecordsAccepted, reasons(r.RecordsRejected), r.StandbyAnswered,
			r.Warmup.LocalDNSCacheEntries, r.Warmup.StandbyCacheEntries, fill)
	}
	for _, r := range results {
		if r.RateShort {
			fmt.Fprintf(w, "\n%s: only %.0f of %d qps answered; the servers' shared CPU was %.0f%% busy (LocalDNS %.0f%%, dnsstandby %.0f%%)",
				r.Mirror, r.QPS, r.TargetQPS, r.LocalDNSCPUPct+r.StandbyCPUPct, r.LocalDNSCPUPct, r.StandbyCPUPct)
			if r.LocalDNSCPUPct+r.StandbyCPUPct >= 95 {
				fmt.Fprint(w, ": that core was the limit, so this row is not at the target rate")
			}
			fmt.Fprintln(w)
		}
	}
	byRound := costs(results)
	if len(byRound) == 0 {
		return
	}
	rounds := slices.Sorted(maps.Keys(byRound))
	for _, round := range rounds {
		rc := byRound[round]
		fmt.Fprintln(w)
		label := "Against"
		if len(rounds) > 1 {
			label = fmt.Sprintf("Round %d: against", round)
		}
		fmt.Fprintf(w, "%s the baseline (--mirror none: dnsstandby idle at %.2f µs/query, LocalDNS %.2f µs/query%s):\n",
			label, rc.base.StandbyCPUUs, rc.base.LocalDNSCPUUs, latencies(rc.base)+schedNote(rc.base.Sched))
		for _, c := range rc.feeds {
			fmt.Fprintf(w, "- %s: the feed adds %.2f µs/query to dnsstandby (%.1f%% of LocalDNS's baseline) and %+.2f µs/query to LocalDNS; all in, %.1f%% of LocalDNS's baseline CPU%s%s%s%s\n",
				c.mirror, c.feedUs, 100*c.feedUs/rc.base.LocalDNSCPUUs, c.localDNSUs, 100*c.allIn,
				programs(c.programUs, c.allInPrograms), profiled(c.profiled, c.attributedUs, c.allInAttributed),
				p99Over(c.latency, c.p99Us), schedNote(c.sched))
		}
	}
	if len(rounds) < 2 {
		return
	}
	fmt.Fprintf(w, "\nMedians over %d rounds (each against its own round's baseline):\n", len(rounds))
	for _, mirror := range feedOrder(results) {
		var feed, ld, all, prog, allProg, attr, allAttr, p99 []float64
		everyProfiled, everyLatency := true, true
		for _, round := range rounds {
			for _, c := range byRound[round].feeds {
				if c.mirror == mirror {
					feed, ld, all = append(feed, c.feedUs), append(ld, c.localDNSUs), append(all, 100*c.allIn)
					prog, allProg = append(prog, c.programUs), append(allProg, c.allInPrograms)
					attr, allAttr = append(attr, c.attributedUs), append(allAttr, 100*c.allInAttributed)
					everyProfiled = everyProfiled && c.profiled
					p99, everyLatency = append(p99, c.p99Us), everyLatency && c.latency
				}
			}
		}
		if len(all) == 0 {
			continue
		}
		fmt.Fprintf(w, "- %s: the feed adds %.2f µs/query to dnsstandby and %+.2f µs/query to LocalDNS; all in, %.1f%% of LocalDNS's baseline CPU (rounds: %s)%s%s\n",
			mirror, median(feed), median(ld), median(all), spell("%.1f%%", all), programs(median(prog), median(allProg)),
			profiled(everyProfiled, median(attr), median(allAttr)/100))
		if everyProfiled {
			fmt.Fprintf(w, "  (all in with LocalDNS's profiled share, rounds: %s)\n", spell("%.1f%%", allAttr))
		}
		if everyLatency {
			fmt.Fprintf(w, "  (p99 over the baseline's: %+.0f µs, rounds: %s)\n", median(p99), spell("%+.0f", p99))
		}
	}
}

// feedCost is what one feed cost in one round, against that round's
// baseline (--mirror none).
type feedCost struct {
	mirror     string
	feedUs     float64 // dnsstandby's CPU per query over its baseline
	localDNSUs float64 // LocalDNS's CPU per query over its baseline
	allIn      float64 // dnsstandby's whole CPU and LocalDNS's extra, as a share of LocalDNS's baseline
	// programUs is the ring's eBPF programs' time per query, and
	// allInPrograms allIn with it for LocalDNS's extra; 0 unless
	// kernel.bpf_stats_enabled was 1 (see result.ProgramUs, and its
	// cost).
	programUs, allInPrograms float64
	// profiled: the feed and its baseline ran under perf (-perf), and
	// attributedUs is LocalDNS's CPU per query in the feed's code less
	// the baseline's (result.LocalDNSFeedShare), allInAttributed allIn
	// with it for LocalDNS's extra.
	profiled                      bool
	attributedUs, allInAttributed float64
	// latency: both ran with -latency, and p99Us is the feed's p99 less
	// the baseline's (µs).
	latency bool
	p99Us   float64
	sched   *schedStats // the feed's window's, with -sched
}

// roundCosts are a round's baseline and its feeds' costs.
type roundCosts struct {
	base  result
	feeds []feedCost
}

// costs are the feeds' costs by round, for the rounds with a baseline.
func costs(results []result) map[int]roundCosts {
	out := map[int]roundCosts{}
	for _, r := range results {
		if r.Mirror == "none" && r.LocalDNSCPUUs > 0 {
			out[r.Round] = roundCosts{base: r}
		}
	}
	for _, r := range results {
		rc, ok := out[r.Round]
		if !ok || r.Mirror == "none" {
			continue
		}
		ld := r.LocalDNSCPUUs - rc.base.LocalDNSCPUUs
		c := feedCost{mirror: r.Mirror, feedUs: r.StandbyCPUUs - rc.base.StandbyCPUUs, localDNSUs: ld,
			allIn: (r.StandbyCPUUs + ld) / rc.base.LocalDNSCPUUs, programUs: r.ProgramUs,
			allInPrograms: (r.StandbyCPUUs + r.ProgramUs) / rc.base.LocalDNSCPUUs, sched: r.Sched}
		if r.LatencySamples > 0 && rc.base.LatencySamples > 0 {
			c.latency, c.p99Us = true, float64(r.P99Us)-float64(rc.base.P99Us)
		}
		if r.Profiled && rc.base.Profiled {
			c.profiled = true
			c.attributedUs = r.LocalDNSFeedShare*r.LocalDNSCPUUs - rc.base.LocalDNSFeedShare*rc.base.LocalDNSCPUUs
			c.allInAttributed = (r.StandbyCPUUs + c.attributedUs) / rc.base.LocalDNSCPUUs
		}
		rc.feeds = append(rc.feeds, c)
		out[r.Round] = rc
	}
	return out
}

// programs describes the ring's eBPF programs' share, when they ran.
func programs(us, allIn float64) string {
	if us == 0 {
		return ""
	}
	return fmt.Sprintf("; its eBPF programs ran %.2f µs/query in the kernel: with that as LocalDNS's extra, all in %.1f%%", us, 100*allIn)
}

// profiled describes LocalDNS's profiled share of a feed, when perf ran.
func profiled(on bool, us, allIn float64) string {
	if !on {
		return ""
	}
	return fmt.Sprintf("; LocalDNS's samples in the feed's code (perf) make %+.2f µs/query: with that as LocalDNS's extra, all in %.1f%%", us, 100*allIn)
}

// latencies describes a result's p50 and p99, when dnsperf reported them.
func latencies(r result) string {
	if r.LatencySamples == 0 {
		return ""
	}
	return fmt.Sprintf("; answers p50 %d µs, p99 %d µs", r.P50Us, r.P99Us)
}

// p99Over describes a feed's p99 over its baseline's, when both are known.
func p99Over(on bool, us float64) string {
	if !on {
		return ""
	}
	return fmt.Sprintf("; p99 %+.0f µs over the baseline's", us)
}

// feedOrder is the feeds of results in the order first measured.
func feedOrder(results []result) []string {
	var out []string
	for _, r := range results {
		if r.Mirror != "none" && !slices.Contains(out, r.Mirror) {
			out = append(out, r.Mirror)
		}
	}
	return out
}

// median of vs (not empty); the mean of the middle two for an even count.
func median(vs []float64) float64 {
	s := slices.Sorted(slices.Values(vs))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// spell writes each of vs with format and joins them with commas:
// "%.1f%%" gives "6.4%, 9.4%".
func spell(format string, vs []float64) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = fmt.Sprintf(format, v)
	}
	return strings.Join(parts, ", ")
}

// reasons spells rejected records as "have_fresh 399000, duplicate 3",
// largest first.
func reasons(m map[string]uint64) string {
	if len(m) == 0 {
		return "–"
	}
	keys := slices.SortedFunc(maps.Keys(m), func(a, b string) int {
		if m[a] != m[b] {
			if m[a] > m[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}
