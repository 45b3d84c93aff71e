package stats

import (
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	thousand := make([]float64, 1000) // 1 to 1000
	for i := range thousand {
		thousand[i] = float64(i + 1)
	}
	tests := []struct {
		name string
		vs   []float64
		p    float64
		want float64
	}{
		{"none", nil, 0.5, 0},
		{"one", []float64{7}, 0.01, 7},
		{"p0 is the least", thousand, 0, 1},
		{"p50", thousand, 0.5, 500},
		{"p99", thousand, 0.99, 990},
		{"p99.9", thousand, 0.999, 999},
		{"p100 is the most", thousand, 1, 1000},
		{"nearest rank rounds up", []float64{1, 2, 3}, 0.5, 2},
		{"a rank past a value takes the next", []float64{1, 2, 3, 4}, 0.51, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Percentile(tt.vs, tt.p); got != tt.want {
				t.Errorf("Percentile(%v) = %v, want %v", tt.p, got, tt.want)
			}
		})
	}
	// Any ordered type: the lab's durations, dnsperf's microseconds.
	if got := Percentile([]time.Duration{time.Millisecond, time.Second}, 0.99); got != time.Second {
		t.Errorf("durations: %v", got)
	}
	if got := Percentile([]uint32{3, 9}, 0.5); got != 3 {
		t.Errorf("uint32: %v", got)
	}
}
