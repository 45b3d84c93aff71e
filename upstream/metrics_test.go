package upstream

import (
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestMetrics registers the group with a pedantic registry (which checks
// Collect against Describe) and reads the metrics after one failed and
// one answered attempt.
func TestMetrics(t *testing.T) {
	bad := closedAddr(t)
	good := newServer(t)
	g, _ := newGroup(t, func(c *Config) { c.MaxFails = 1; c.HealthCheck = time.Hour }, bad, good.addr)
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(g); err != nil {
		t.Fatalf("Register: %v", err)
	}
	mustAnswer(t, g, newReq("m.example.", dns.TypeA), "192.0.2.1")

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	got := make(map[string]float64) // name{labels} -> value
	types := make(map[string]dto.MetricType)
	for _, mf := range mfs {
		types[mf.GetName()] = mf.GetType()
		for _, m := range mf.Metric {
			key := mf.GetName()
			for _, l := range m.Label {
				key += "," + l.GetName() + "=" + l.GetValue()
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				got[key] = m.Counter.GetValue()
			case dto.MetricType_GAUGE:
				got[key] = m.Gauge.GetValue()
			case dto.MetricType_HISTOGRAM:
				got[key] = float64(m.Histogram.GetSampleCount())
				if n := len(m.Histogram.Bucket); n != numBuckets {
					t.Errorf("%d buckets, want %d", n, numBuckets)
				}
			}
		}
	}
	wantTypes := map[string]dto.MetricType{
		"dnsstandby_upstream_requests_total":   dto.MetricType_COUNTER,
		"dnsstandby_upstream_errors_total":     dto.MetricType_COUNTER,
		"dnsstandby_upstream_duration_seconds": dto.MetricType_HISTOGRAM,
		"dnsstandby_upstream_healthy":          dto.MetricType_GAUGE,
	}
	for name, typ := range wantTypes {
		if types[name] != typ {
			t.Errorf("%s: type %v, want %v", name, types[name], typ)
		}
	}
	b, gd := bad.String(), good.addr.String()
	for key, want := range map[string]float64{
		"dnsstandby_upstream_requests_total,proto=udp,server=" + b:      1,
		"dnsstandby_upstream_requests_total,proto=tcp,server=" + b:      0,
		"dnsstandby_upstream_requests_total,proto=udp,server=" + gd:     1,
		"dnsstandby_upstream_errors_total,reason=refused,server=" + b:   1,
		"dnsstandby_upstream_errors_total,reason=timeout,server=" + b:   0,
		"dnsstandby_upstream_errors_total,reason=mismatch,server=" + gd: 0,
		"dnsstandby_upstream_duration_seconds,server=" + b:              0,
		"dnsstandby_upstream_duration_seconds,server=" + gd:             1,
		"dnsstandby_upstream_healthy,server=" + b:                       0,
		"dnsstandby_upstream_healthy,server=" + gd:                      1,
	} {
		if v, ok := got[key]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", key, v, ok, want)
		}
	}
}

func TestObserveBuckets(t *testing.T) {
	tests := []struct {
		d      time.Duration
		bucket int
	}{
		{0, 0},
		{250 * time.Microsecond, 0}, // upper bounds are inclusive
		{251 * time.Microsecond, 1},
		{3 * time.Millisecond, 4}, // 0.25, 0.5, 1, 2, 4 ms
		{8192 * time.Millisecond, numBuckets - 1},
		{10 * time.Second, numBuckets}, // +Inf
	}
	for _, tt := range tests {
		var m serverMetrics
		m.observe(tt.d)
		if m.buckets[tt.bucket].Load() != 1 {
			t.Errorf("%s not in bucket %d", tt.d, tt.bucket)
		}
		if m.sumNanos.Load() != int64(tt.d) {
			t.Errorf("sum %d, want %d", m.sumNanos.Load(), tt.d)
		}
	}
}

// TestObserveAllocs: recording a reply's latency must not allocate.
func TestObserveAllocs(t *testing.T) {
	var m serverMetrics
	if n := testing.AllocsPerRun(100, func() {
		m.sent(protoUDP)
		m.observe(time.Millisecond)
		m.count(reasonMismatch)
	}); n != 0 {
		t.Errorf("%v allocations", n)
	}
}
