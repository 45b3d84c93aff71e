package latency

import (
	"testing"
	"time"
)

// TestWindowQuantile checks the nearest-rank p99 read as a bucket's upper
// bound, and that a half older than the window is forgotten.
func TestWindowQuantile(t *testing.T) {
	ms := int64(time.Millisecond)
	for _, tt := range []struct {
		name    string
		samples []int64 // at time 0
		now     int64
		want    int64 // the p99 is at least this and under 1.25× it
	}{
		{"empty", nil, 0, 0},
		{"one sample is the p99", []int64{10 * ms}, 0, 10 * ms},
		{"98 fast and two slow: a slow one", append(make([]int64, 98), 200*ms, 200*ms), 0, 200 * ms},
		{"99 fast and one slow: a fast one", append(make([]int64, 99), 200*ms), 0, int64(50 * time.Microsecond)},
		{"forgotten after the window", []int64{10 * ms}, int64(11 * time.Second), 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var w Window
			w.Init(10 * time.Second)
			for _, d := range tt.samples {
				w.Add(1, d)
			}
			got := w.Quantile(tt.now+1, 0.99)
			if got < tt.want || float64(got) > 1.25*float64(tt.want) {
				t.Errorf("p99 %v, want %v (up to 25%% more)", time.Duration(got), time.Duration(tt.want))
			}
			if n := w.Samples(tt.now + 1); len(tt.samples) == 0 && n != 0 {
				t.Errorf("%d samples, want 0", n)
			}
		})
	}
}
