package steer

import (
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// metric returns the value of the sample of name whose labels include
// labels (name=value pairs), and whether there is one.
func metric(t *testing.T, c prometheus.Collector, name string, labels ...string) (float64, bool) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	sample:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue sample
				}
			}
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue(), true
			}
			return m.GetCounter().GetValue(), true
		}
	}
	return 0, false
}

func TestMetricsAtOff(t *testing.T) {
	s, err := New(Config{Want: "off", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.SetMode(ToUs); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"dnsstandby_steer_level", []string{"level", "off"}, 1},
		{"dnsstandby_steer_level", []string{"level", "adopt"}, 0},
		{"dnsstandby_steer_level_wanted", []string{"level", "off"}, 1},
		{"dnsstandby_steer_level_wanted", []string{"level", "adopt"}, 0},
		{"dnsstandby_steer_mode", []string{"mode", "hash"}, 1},
		{"dnsstandby_steer_mode", []string{"mode", "to-us"}, 0},
		{"dnsstandby_steer_map_update_errors_total", []string{"map", "config"}, 0},
		{"dnsstandby_steer_adoptions_total", nil, 0},
	} {
		got, ok := metric(t, s, tc.name, tc.labels...)
		if !ok || got != tc.want {
			t.Errorf("%s%v = %v (present %v), want %v", tc.name, tc.labels, got, ok, tc.want)
		}
	}
}
