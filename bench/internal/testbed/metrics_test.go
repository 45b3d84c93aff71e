package testbed

import (
	"strings"
	"testing"
)

const page = `# HELP dnsstandby_mirror_records_total Mirror records.
# TYPE dnsstandby_mirror_records_total counter
dnsstandby_mirror_records_total{source="tap",result="accepted",reason=""} 5000
dnsstandby_mirror_records_total{source="tap",result="rejected",reason="have_fresh"} 4.1e+06
dnsstandby_mirror_records_total{reason="duplicate",result="rejected",source="tap"} 7
# TYPE dnsstandby_mode gauge
dnsstandby_mode{mode="mirror"} 1
dnsstandby_mode{mode="takeover"} 0
# TYPE dnsstandby_peer_probe_duration_seconds histogram
dnsstandby_peer_probe_duration_seconds_bucket{le="0.001"} 2
dnsstandby_peer_probe_duration_seconds_bucket{le="+Inf"} 3
dnsstandby_peer_probe_duration_seconds_sum 0.004
dnsstandby_peer_probe_duration_seconds_count 3
odd{a="x\"y\\z,}",b="line\nbreak"} 3 1700000000000
dnsstandby_cache_entries 4999
`

func TestMetrics(t *testing.T) {
	m, err := ParseMetrics(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	rec := "dnsstandby_mirror_records_total"
	by := m.By(rec, "reason", map[string]string{"result": "rejected"})
	tests := []struct {
		name      string
		got, want float64
	}{
		{"accepted", m.Sum(rec, map[string]string{"result": "accepted"}), 5000},
		{"all records", m.Sum(rec, nil), 5000 + 4.1e6 + 7},
		{"rejected have_fresh", by["have_fresh"], 4.1e6},
		{"rejected duplicate", by["duplicate"], 7},
		{"rejected reasons", float64(len(by)), 2},
		{"gauge by label", m.Sum("dnsstandby_mode", map[string]string{"mode": "mirror"}), 1},
		{"gauge without labels", m.Sum("dnsstandby_cache_entries", nil), 4999},
		{"histogram count", m.Sum("dnsstandby_peer_probe_duration_seconds_count", nil), 3},
		{"escaped labels", m.Sum("odd", map[string]string{"a": `x"y\z,}`, "b": "line\nbreak"}), 3},
		{"no such metric", m.Sum("nope", nil), 0},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, tt.got, tt.want)
		}
	}
	if !m.Has("odd") || m.Has("nope") {
		t.Error("Has")
	}
}

func TestParseMetricsErrors(t *testing.T) {
	for _, bad := range []string{"x", `x{a="b} 1`, `x{a=b} 1`, "x 1 2 3", "x one"} {
		if _, err := ParseMetrics(strings.NewReader(bad + "\n")); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
