package pipeline

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestMetricsByTypeRcodeProto: every answer is counted once by transport
// and type, by rcode and by source, and timed: misses always, hot-path
// answers one in sampleEvery.
func TestMetricsByTypeRcodeProto(t *testing.T) {
	up := newFake()
	up.set("a.example.", "a.example. 60 IN A 192.0.2.1")
	p, _ := newPipeline(t, up, nil)
	w := p.NewWorker()
	askTCP := func(raw []byte) {
		t.Helper()
		buf := make([]byte, 65535)
		if _, act := w.Answer(buf, raw, false); act == Resolve {
			done := make(chan struct{})
			w.p.Resolve(append([]byte(nil), raw...), netip.MustParseAddrPort("10.1.0.1:5353"), false, func([]byte) { close(done) })
			<-done
		}
	}
	wait(t, ask(t, w, q(t, "a.example.", dns.TypeA, false), "10.1.0.1"))   // udp A, upstream NOERROR
	askTCP(q(t, "nx.example.", dns.TypeAAAA, false))                       // tcp AAAA, upstream NXDOMAIN
	wait(t, ask(t, w, q(t, "a.example.", dns.TypeSRV, false), "10.1.0.1")) // udp SRV, upstream NOERROR (the fake answers by name)
	wait(t, ask(t, w, q(t, "a.example.", dns.TypeCAA, false), "10.1.0.1")) // udp other, upstream NOERROR
	wait(t, ask(t, w, q(t, "example.", dns.TypeAXFR, false), "10.1.0.1"))  // udp other, REFUSED
	badvers := new(dns.Msg)
	badvers.SetQuestion("a.example.", dns.TypeA)
	badvers.SetEdns0(1232, false)
	badvers.IsEdns0().SetVersion(1)
	raw, _ := badvers.Pack()
	wait(t, ask(t, w, raw, "10.1.0.1")) // udp A, BADVERS
	for range 2 * sampleEvery {
		wait(t, ask(t, w, q(t, "a.example.", dns.TypeA, false), "10.1.0.1")) // udp A, cache NOERROR
	}

	got := gather(t, p)
	hits := 2 * sampleEvery
	want := map[string]float64{
		`dnsstandby_requests_total{proto="udp",type="A"}`:               float64(2 + hits),
		`dnsstandby_requests_total{proto="tcp",type="AAAA"}`:            1,
		`dnsstandby_requests_total{proto="udp",type="SRV"}`:             1,
		`dnsstandby_requests_total{proto="udp",type="other"}`:           2,
		`dnsstandby_requests_total{proto="tcp",type="A"}`:               0,
		`dnsstandby_responses_total{rcode="NOERROR"}`:                   float64(3 + hits),
		`dnsstandby_responses_total{rcode="NXDOMAIN"}`:                  1,
		`dnsstandby_responses_total{rcode="REFUSED"}`:                   1,
		`dnsstandby_responses_total{rcode="BADVERS"}`:                   1,
		`dnsstandby_responses_total{rcode="SERVFAIL"}`:                  0,
		`dnsstandby_queries_total{source="upstream"}`:                   4,
		`dnsstandby_queries_total{source="cache"}`:                      float64(hits),
		`dnsstandby_queries_total{source="error"}`:                      2,
		`dnsstandby_response_duration_seconds_count{source="upstream"}`: 4,
		`dnsstandby_response_duration_seconds_count{source="servfail"}`: 0,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	// Timed one in sampleEvery: of the hot path's 2+hits answers (error
	// and cache), between 2 and 3 samples, all under the cache source or
	// the error one.
	if n := got[`dnsstandby_response_duration_seconds_count{source="cache"}`] + got[`dnsstandby_response_duration_seconds_count{source="error"}`]; n < 2 || n > 3 {
		t.Errorf("%v hot-path answers timed, want 2 or 3 (one in %d)", n, sampleEvery)
	}
}

// gather collects p's metrics as name{labels} = value; a histogram gives
// its _count.
func gather(t *testing.T, p *Pipeline) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(p); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			key := "{" + strings.Join(labels, ",") + "}"
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				out[mf.GetName()+key] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[mf.GetName()+key] = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				out[mf.GetName()+"_count"+key] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}
