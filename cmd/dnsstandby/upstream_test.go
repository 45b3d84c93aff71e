package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// TestBlackholedUpstreamMarkedDown: a kube-dns that takes queries and
// never answers is counted as timing out and marked down after max_fails
// (2) failed attempts, with the default timeouts and one upstream, so that
// DNSStandbyUpstreamDown (dnsstandby_upstream_healthy == 0) can fire; and
// so it is with an --upstream-timeout below the least per-attempt timeout.
func TestBlackholedUpstreamMarkedDown(t *testing.T) {
	tests := []struct {
		name string
		args []string
	}{
		{"default timeouts", nil},
		{"upstream timeout under the least attempt", []string{"--upstream-timeout", "100ms"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Takes datagrams and never answers: no ICMP, no reply.
			hole, err := net.ListenPacket("udp", nstest.FreeLoopbackAddr(t).String())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { hole.Close() })
			listen, metrics := nstest.FreeLoopbackAddr(t), nstest.FreeLoopbackAddr(t)
			startDaemon(t, append([]string{"--listen", listen.String(), "--upstream", hole.LocalAddr().String(),
				"--metrics-addr", metrics.String(), "--steering", "off", "--mirror", "none",
				"--admin-socket", "", "--anchor-link", "", "--state-dir", ""}, tt.args...)...)

			c := &dns.Client{Timeout: 5 * time.Second}
			for _, name := range []string{"a.example.", "b.example."} {
				m := new(dns.Msg)
				m.SetQuestion(name, dns.TypeA)
				r, _, err := c.Exchange(m, listen.String())
				if err != nil || r.Rcode != dns.RcodeServerFailure {
					t.Fatalf("%s: %v %v, want SERVFAIL", name, r, err)
				}
			}
			// The pipeline answers at its deadline, which the attempt
			// shares: the attempt may count its failure a moment after.
			up := []string{"server", hole.LocalAddr().String()}
			var timeouts, healthy float64
			counted := func() bool {
				timeouts = metricValue(t, metrics.String(), "dnsstandby_upstream_errors_total", append(up, "reason", "timeout")...)
				healthy = metricValue(t, metrics.String(), "dnsstandby_upstream_healthy", up...)
				return timeouts >= 2 && healthy == 0
			}
			_ = testkit.Poll(context.Background(), 2*time.Second, func() (bool, error) { return counted(), nil })
			// At least one a query; more with the default timeouts, whose
			// speculative attempts from fresh sockets time out too.
			if timeouts < 2 || healthy != 0 {
				t.Errorf("timeouts counted %v, dnsstandby_upstream_healthy %v; want at least 2 and 0 (marked down)", timeouts, healthy)
			}
		})
	}
}

// metricValue scrapes addr's /metrics and returns the value of the
// gauge or counter name whose labels include the label pairs given.
func metricValue(t *testing.T, addr, name string, labels ...string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	for _, m := range fams[name].GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		match := true
		for i := 0; i+1 < len(labels); i += 2 {
			match = match && have[labels[i]] == labels[i+1]
		}
		if !match {
			continue
		}
		if g := m.GetGauge(); g != nil {
			return g.GetValue()
		}
		return m.GetCounter().GetValue()
	}
	t.Fatalf("/metrics has no %s with %v", name, labels)
	return 0
}
