package dnstap

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	tap "github.com/dnstap/golang-dnstap"
	"github.com/prometheus/client_golang/prometheus"
)

// TestMetrics gathers the collector through a pedantic registry, beside
// another mirror source's records metric (mirror/tap registers the same
// name with source="tap").
func TestMetrics(t *testing.T) {
	r := listen(t, Config{}, newCache(t).Insert)
	s := dialSender(t, r.Addr())
	s.send(t, tapFrame(t, tap.Message_CLIENT_RESPONSE, reply(t, "a.example.com")),
		tapFrame(t, tap.Message_CLIENT_QUERY, nil),
		tapFrame(t, tap.Message_CLIENT_RESPONSE, []byte{1, 2, 3}))
	waitFor(t, "three records", func() bool { st := r.Stats(); return st.Accepted+st.RejectedTotal() == 3 })

	reg := prometheus.NewPedanticRegistry()
	other := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dnsstandby_mirror_records_total", Help: recordsHelp,
		ConstLabels: prometheus.Labels{"source": "tap"},
	}, []string{"result", "reason"})
	other.WithLabelValues("accepted", "").Add(5)
	for _, c := range []prometheus.Collector{r, other} {
		if err := reg.Register(c); err != nil {
			t.Fatal(err)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			sort.Strings(labels)
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			got[fmt.Sprintf("%s{%s}", mf.GetName(), strings.Join(labels, ","))] = v
		}
	}
	want := map[string]float64{
		`dnsstandby_mirror_records_total{reason=,result=accepted,source=dnstap}`:                    1,
		`dnsstandby_mirror_records_total{reason=,result=accepted,source=tap}`:                       5,
		`dnsstandby_mirror_records_total{reason=not_client_response,result=rejected,source=dnstap}`: 1,
		`dnsstandby_mirror_records_total{reason=malformed,result=rejected,source=dnstap}`:           1,
		`dnsstandby_mirror_records_total{reason=bad_frame,result=rejected,source=dnstap}`:           0,
		`dnsstandby_mirror_dnstap_connections{}`:                                                    1,
		`dnsstandby_mirror_dnstap_connections_total{}`:                                              1,
		`dnsstandby_mirror_dnstap_disconnects_total{cause=evicted}`:                                 0,
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
	if t.Failed() {
		t.Logf("gathered: %v", got)
	}
}
