package lab

import (
	"math"
	"testing"
	"time"
)

// latencyRun is a run of round with n answered latencies spread evenly
// from lo to hi.
func latencyRun(setup string, round int, lo, hi time.Duration, n int) LabRun {
	lat := make([]time.Duration, n)
	for i := range lat {
		lat[i] = lo + (hi-lo)*time.Duration(i)/time.Duration(n-1)
	}
	return LabRun{Scenario: "healthy", Setup: setup, Round: round, Client: "pod", Listener: "169.254.10.11",
		AfterFault: &AfterFault{Latencies: lat}}
}

func TestCompareLatency(t *testing.T) {
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	// rounds whose own tails differ by milliseconds, as the host's other
	// tenants make them, with "b" a fixed 0.05 ms over "a" in each.
	var noisy []LabRun
	for round, hi := range []float64{2, 3.5, 1.2, 6, 2.4, 1.6} {
		noisy = append(noisy,
			latencyRun("a", round+1, ms(0.1), ms(hi), 1001),
			latencyRun("b", round+1, ms(0.15), ms(hi+0.05), 1001))
	}
	tests := []struct {
		name string
		runs []LabRun
		want int // comparisons
		// for the second setup of the first comparison
		diff, low, high, median float64
		tolerance               float64
	}{
		{name: "no rounds", runs: []LabRun{latencyRun("a", 0, 0, ms(1), 10), latencyRun("b", 0, 0, ms(2), 10)}},
		{name: "one round", runs: []LabRun{latencyRun("a", 1, 0, ms(1), 10), latencyRun("b", 1, 0, ms(2), 10)}},
		{
			name: "the same", want: 1,
			runs: []LabRun{latencyRun("a", 1, 0, ms(1), 101), latencyRun("b", 1, 0, ms(1), 101),
				latencyRun("a", 2, 0, ms(3), 101), latencyRun("b", 2, 0, ms(3), 101)},
			tolerance: 0.0001,
		},
		{
			name: "0.2 ms slower", want: 1,
			runs: []LabRun{latencyRun("a", 1, 0, ms(1), 101), latencyRun("b", 1, ms(0.2), ms(1.2), 101),
				latencyRun("a", 2, 0, ms(2), 101), latencyRun("b", 2, ms(0.2), ms(2.2), 101)},
			diff: 0.2, low: 0.2, high: 0.2, median: 0.2, tolerance: 0.011, // a histogram step, and the rounding
		},
		{
			// Resampling picks the same rounds for both setups, so the
			// rounds' spread of milliseconds leaves a narrow interval.
			name: "noisy rounds, paired", want: 1, runs: noisy,
			diff: 0.05, low: 0.05, high: 0.05, median: 0.05, tolerance: 0.011,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := CompareLatency(tt.runs)
			if len(got) != tt.want {
				t.Fatalf("%d comparisons, want %d: %+v", len(got), tt.want, got)
			}
			if tt.want == 0 {
				return
			}
			c := got[0]
			if c.Scenario != "healthy" || c.Client != "pod" || c.Listener != "169.254.10.11" || len(c.Setups) != 2 {
				t.Fatalf("comparison %+v", c)
			}
			if c.Setups[0].Setup != "a" || c.Setups[0].P99DiffMs != 0 {
				t.Errorf("first setup %+v: it is the reference", c.Setups[0])
			}
			b := c.Setups[1]
			for _, v := range []struct {
				what      string
				got, want float64
			}{
				{"pooled difference", b.P99DiffMs, tt.diff},
				{"interval's low end", b.P99DiffLowMs, tt.low},
				{"interval's high end", b.P99DiffHighMs, tt.high},
				{"rounds' median", b.RoundDiffMedianMs, tt.median},
			} {
				if math.Abs(v.got-v.want) > tt.tolerance {
					t.Errorf("%s %.4f ms, want %.4f", v.what, v.got, v.want)
				}
			}
			if len(b.RoundP99Ms) != len(tt.runs)/2 {
				t.Errorf("rounds' p99s %v, want one a round", b.RoundP99Ms)
			}
		})
	}
}

func TestCompareLatencyInterval(t *testing.T) {
	// "b" is slower than "a" in some rounds and faster in others: the
	// interval must span the rounds' disagreement, not collapse on the
	// pooled figure. (The pooled tail is the slowest rounds' tail, so
	// the pooled difference leans to their shifts.)
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	var runs []LabRun
	for round, shift := range []float64{0.4, -0.3, 0.5, -0.2, 0.1, -0.4, 0.3, 0} {
		runs = append(runs,
			latencyRun("a", round+1, ms(0.1), ms(2), 1001),
			latencyRun("b", round+1, ms(0.1), ms(2+shift), 1001))
	}
	b := CompareLatency(runs)[0].Setups[1]
	if !(b.P99DiffLowMs < b.P99DiffMs && b.P99DiffMs < b.P99DiffHighMs) {
		t.Errorf("interval %.3f to %.3f around %.3f: want it to contain the pooled difference strictly", b.P99DiffLowMs, b.P99DiffHighMs, b.P99DiffMs)
	}
	if b.P99DiffHighMs-b.P99DiffLowMs < 0.2 {
		t.Errorf("interval %.3f to %.3f: narrower than rounds that disagree by ±0.4 ms allow", b.P99DiffLowMs, b.P99DiffHighMs)
	}
}

func TestHistogramPercentile(t *testing.T) {
	tests := []struct {
		name string
		lat  []time.Duration
		p    float64
		want float64 // ms
	}{
		{"none", nil, 0.99, 0},
		{"one", []time.Duration{35 * time.Microsecond}, 0.99, 0.035},
		{"nearest rank", []time.Duration{5 * time.Microsecond, 15 * time.Microsecond, 25 * time.Microsecond, 35 * time.Microsecond}, 0.5, 0.015},
		{"beyond the reach counts at it", []time.Duration{time.Second}, 0.99, 20.005},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := histogramPercentileMs(latencyHistogram(tt.lat), tt.p); math.Abs(got-tt.want) > 1e-9 {
				t.Errorf("got %v ms, want %v", got, tt.want)
			}
		})
	}
}
