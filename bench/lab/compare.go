package lab

import (
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/dnsstandby/dnsstandby/bench/internal/stats"
)

// LatencyComparison is a scenario's latency from the fault on, for one
// client, over the lab's rounds (-rounds): each setup's answered queries
// of every round pooled, against the first setup's. One round's p99 at
// the lab's rates moves by a millisecond with the host's other tenants;
// the rounds, alternated, pooled and resampled, resolve a tenth of that.
type LatencyComparison struct {
	Scenario string         `json:"scenario"`
	Client   string         `json:"client"`
	Listener string         `json:"listener"`
	Setups   []SetupLatency `json:"setups"`
}

// SetupLatency is one setup's part of a LatencyComparison.
type SetupLatency struct {
	Setup      string    `json:"setup"`
	Answered   int       `json:"answered"` // pooled over its rounds
	P50Ms      float64   `json:"p50_ms"`
	P99Ms      float64   `json:"p99_ms"`
	RoundP99Ms []float64 `json:"round_p99_ms"` // each round's own, in round order
	// Against the first setup (zero for the first): the pooled p99's
	// difference; its 90% interval from resampling the rounds
	// (comparePrecision wide steps); and the median of the rounds' own
	// p99 differences.
	P99DiffMs         float64 `json:"p99_diff_ms,omitempty"`
	P99DiffLowMs      float64 `json:"p99_diff_low_ms,omitempty"`
	P99DiffHighMs     float64 `json:"p99_diff_high_ms,omitempty"`
	RoundDiffMedianMs float64 `json:"round_diff_median_ms,omitempty"`
}

const (
	// comparePrecision is the resampling's histogram step, and
	// compareBuckets its reach (latencies beyond it count as at it):
	// fine enough for a tenth of a millisecond, and cheap to add up a
	// thousand times.
	comparePrecision = 10 * time.Microsecond
	compareBuckets   = 2000
	compareResamples = 1000
)

// CompareLatency compares the setups' latency from the fault on in each
// scenario and client that has runs of more than one round, over the
// rounds every setup ran, setups in the order they first appear. Runs
// without AfterFault are left out.
func CompareLatency(runs []LabRun) []LatencyComparison {
	type key struct{ scenario, client string }
	type setupRuns struct {
		setup  string
		rounds map[int][]time.Duration // by round: sorted latencies
	}
	var keys []key
	bySetup := map[key][]*setupRuns{}
	listener := map[key]string{}
	for _, r := range runs {
		if r.Round == 0 || r.AfterFault == nil {
			continue
		}
		k := key{r.Scenario, r.Client}
		if _, ok := bySetup[k]; !ok {
			keys = append(keys, k)
			listener[k] = r.Listener
		}
		i := slices.IndexFunc(bySetup[k], func(s *setupRuns) bool { return s.setup == r.Setup })
		if i < 0 {
			bySetup[k] = append(bySetup[k], &setupRuns{setup: r.Setup, rounds: map[int][]time.Duration{}})
			i = len(bySetup[k]) - 1
		}
		bySetup[k][i].rounds[r.Round] = r.AfterFault.Latencies
	}
	var out []LatencyComparison
	for _, k := range keys {
		setups := bySetup[k]
		common := slices.DeleteFunc(slices.Sorted(maps.Keys(setups[0].rounds)), func(round int) bool {
			return slices.ContainsFunc(setups, func(s *setupRuns) bool { _, ok := s.rounds[round]; return !ok })
		})
		if len(common) < 2 {
			continue
		}
		c := LatencyComparison{Scenario: k.scenario, Client: k.client, Listener: listener[k]}
		hists := make([][][]int, len(setups)) // by setup, by common round
		for i, s := range setups {
			sl := SetupLatency{Setup: s.setup}
			var pooled []time.Duration
			for _, round := range common {
				lat := s.rounds[round]
				pooled = append(pooled, lat...)
				sl.RoundP99Ms = append(sl.RoundP99Ms, reportMs(stats.Percentile(lat, 0.99)))
				hists[i] = append(hists[i], latencyHistogram(lat))
			}
			slices.Sort(pooled)
			sl.Answered = len(pooled)
			sl.P50Ms = reportMs(stats.Percentile(pooled, 0.50))
			sl.P99Ms = reportMs(stats.Percentile(pooled, 0.99))
			if i > 0 {
				base := c.Setups[0]
				sl.P99DiffMs = sl.P99Ms - base.P99Ms
				sl.P99DiffLowMs, sl.P99DiffHighMs = resampleP99Diff(hists[0], hists[i])
				diffs := make([]float64, len(common))
				for j := range diffs {
					diffs[j] = sl.RoundP99Ms[j] - base.RoundP99Ms[j]
				}
				slices.Sort(diffs)
				sl.RoundDiffMedianMs = diffs[(len(diffs)-1)/2]
			}
			c.Setups = append(c.Setups, sl)
		}
		out = append(out, c)
	}
	return out
}

// resampleP99Diff is the 5th and 95th percentile of b's pooled p99 less
// a's, over resamples of the rounds (latencyHistograms, round by round,
// the same rounds for both; with replacement, and a fixed seed so that a
// report reads the same twice).
func resampleP99Diff(a, b [][]int) (low, high float64) {
	rng := rand.New(rand.NewPCG(1, 2))
	sa, sb := make([]int, compareBuckets+1), make([]int, compareBuckets+1)
	diffs := make([]float64, compareResamples)
	for n := range diffs {
		clear(sa)
		clear(sb)
		for range a {
			i := rng.IntN(len(a))
			for j := range sa {
				sa[j] += a[i][j]
				sb[j] += b[i][j]
			}
		}
		diffs[n] = histogramPercentileMs(sb, 0.99) - histogramPercentileMs(sa, 0.99)
	}
	slices.Sort(diffs)
	return stats.Percentile(diffs, 0.05), stats.Percentile(diffs, 0.95)
}

// latencyHistogram counts latencies in comparePrecision steps, the last
// bucket holding everything from compareBuckets steps on.
func latencyHistogram(lat []time.Duration) []int {
	h := make([]int, compareBuckets+1)
	for _, d := range lat {
		h[min(int(d/comparePrecision), compareBuckets)]++
	}
	return h
}

// histogramPercentileMs is the nearest-rank p-quantile of a
// latencyHistogram, as its bucket's middle, in ms; 0 for none.
func histogramPercentileMs(h []int, p float64) float64 {
	total := 0
	for _, n := range h {
		total += n
	}
	if total == 0 {
		return 0
	}
	rank := max(int(math.Ceil(p*float64(total))), 1)
	seen := 0
	for i, n := range h {
		if seen += n; seen >= rank {
			return reportMs(comparePrecision * time.Duration(2*i+1) / 2)
		}
	}
	return reportMs(comparePrecision * compareBuckets)
}
