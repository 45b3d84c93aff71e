package dnstap

import (
	"strings"
	"testing"

	tap "github.com/dnstap/golang-dnstap"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// TestMetrics gathers the collector through a pedantic registry, beside
// another mirror source's records metric (mirror/tap registers the same
// name with source="tap"), and compares every series: a rejected record
// for every reason, the receiver's and the cache's, from zero.
func TestMetrics(t *testing.T) {
	r := listen(t, testConfig(t), newCache(t).Insert)
	s := dialSender(t, r.Addr())
	s.send(t, tapFrame(t, tap.Message_CLIENT_RESPONSE, reply(t, "a.example.com")),
		tapFrame(t, tap.Message_CLIENT_QUERY, nil),
		tapFrame(t, tap.Message_CLIENT_RESPONSE, []byte{1, 2, 3}))
	testkit.Eventually(t, testTimeout, "three records", func() bool { st := r.Stats(); return st.Accepted+st.RejectedTotal() == 3 })

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
	const want = `
# HELP dnsstandby_mirror_dnstap_connections Open dnstap (Frame Streams) connections.
# TYPE dnsstandby_mirror_dnstap_connections gauge
dnsstandby_mirror_dnstap_connections 1
# HELP dnsstandby_mirror_dnstap_connections_total dnstap (Frame Streams) connections accepted.
# TYPE dnsstandby_mirror_dnstap_connections_total counter
dnsstandby_mirror_dnstap_connections_total 1
# HELP dnsstandby_mirror_dnstap_disconnects_total dnstap connections closed, by cause (stop, eof, handshake_timeout, content_type, protocol, oversize, truncated, read_error, evicted, shutdown).
# TYPE dnsstandby_mirror_dnstap_disconnects_total counter
dnsstandby_mirror_dnstap_disconnects_total{cause="content_type"} 0
dnsstandby_mirror_dnstap_disconnects_total{cause="eof"} 0
dnsstandby_mirror_dnstap_disconnects_total{cause="evicted"} 0
dnsstandby_mirror_dnstap_disconnects_total{cause="handshake_timeout"} 0
dnsstandby_mirror_dnstap_disconnects_total{cause="oversize"} 0
dnsstandby_mirror_dnstap_disconnects_total{cause="protocol"} 0
dnsstandby_mirror_dnstap_disconnects_total{cause="read_error"} 0
dnsstandby_mirror_dnstap_disconnects_total{cause="shutdown"} 0
dnsstandby_mirror_dnstap_disconnects_total{cause="stop"} 0
dnsstandby_mirror_dnstap_disconnects_total{cause="truncated"} 0
# HELP dnsstandby_mirror_dnstap_refused_total dnstap connections closed at accept because the peer was neither LocalDNS's user (PeerUID) nor root.
# TYPE dnsstandby_mirror_dnstap_refused_total counter
dnsstandby_mirror_dnstap_refused_total 0
# HELP dnsstandby_mirror_records_total Mirrored LocalDNS replies handed to the cache, by source, result (accepted, rejected) and reason.
# TYPE dnsstandby_mirror_records_total counter
dnsstandby_mirror_records_total{reason="",result="accepted",source="dnstap"} 1
dnsstandby_mirror_records_total{reason="",result="accepted",source="tap"} 5
dnsstandby_mirror_records_total{reason="bad_frame",result="rejected",source="dnstap"} 0
dnsstandby_mirror_records_total{reason="bad_protobuf",result="rejected",source="dnstap"} 0
dnsstandby_mirror_records_total{reason="have_fresh",result="rejected",source="dnstap"} 0
dnsstandby_mirror_records_total{reason="kept_answer",result="rejected",source="dnstap"} 0
dnsstandby_mirror_records_total{reason="malformed",result="rejected",source="dnstap"} 1
dnsstandby_mirror_records_total{reason="no_response_message",result="rejected",source="dnstap"} 0
dnsstandby_mirror_records_total{reason="no_soa",result="rejected",source="dnstap"} 0
dnsstandby_mirror_records_total{reason="not_client_response",result="rejected",source="dnstap"} 1
dnsstandby_mirror_records_total{reason="not_response",result="rejected",source="dnstap"} 0
dnsstandby_mirror_records_total{reason="opcode",result="rejected",source="dnstap"} 0
dnsstandby_mirror_records_total{reason="question_count",result="rejected",source="dnstap"} 0
dnsstandby_mirror_records_total{reason="rcode",result="rejected",source="dnstap"} 0
dnsstandby_mirror_records_total{reason="sink_error",result="rejected",source="dnstap"} 0
dnsstandby_mirror_records_total{reason="too_large",result="rejected",source="dnstap"} 0
dnsstandby_mirror_records_total{reason="truncated",result="rejected",source="dnstap"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

// TestStats follows the numbers the daemon's status shows (open
// connections, records accepted and rejected) through a receiver's life.
func TestStats(t *testing.T) {
	r := listen(t, testConfig(t), newCache(t).Insert)
	var first, second *sender
	steps := []struct {
		name               string
		do                 func(t *testing.T)
		conns              int
		accepted, rejected uint64
	}{
		{name: "listening", do: func(*testing.T) {}},
		{name: "one sender, three records", conns: 1, accepted: 1, rejected: 2, do: func(t *testing.T) {
			first = dialSender(t, r.Addr())
			first.send(t, tapFrame(t, tap.Message_CLIENT_RESPONSE, reply(t, "a.example.com")),
				tapFrame(t, tap.Message_CLIENT_QUERY, nil),
				tapFrame(t, tap.Message_CLIENT_RESPONSE, []byte{1, 2, 3}))
		}},
		{name: "a second sender", conns: 2, accepted: 2, rejected: 2, do: func(t *testing.T) {
			second = dialSender(t, r.Addr())
			second.send(t, tapFrame(t, tap.Message_CLIENT_RESPONSE, reply(t, "b.example.com")))
		}},
		{name: "the first stops", conns: 1, accepted: 2, rejected: 2, do: func(t *testing.T) { first.stop(t) }},
		{name: "the second stops", conns: 0, accepted: 2, rejected: 2, do: func(t *testing.T) { second.stop(t) }},
	}
	for _, s := range steps {
		s.do(t)
		testkit.Eventually(t, testTimeout, s.name, func() bool {
			st := r.Stats()
			return st.Connections == s.conns && st.Accepted == s.accepted && st.RejectedTotal() == s.rejected
		})
	}
}
