package tap

import (
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/dnsstandby/dnsstandby/cache"
	"github.com/dnsstandby/dnsstandby/wire"
)

// socketless returns a Tap with no socket, for driving handle directly.
func socketless(t testing.TB, sink Sink, addrs ...netip.Addr) *Tap {
	t.Helper()
	spec, err := newFilterSpec(addrs, 53, 0)
	if err != nil {
		t.Fatal(err)
	}
	tp := &Tap{sink: sink, log: slog.New(slog.DiscardHandler), spec: spec, seed: maphash.MakeSeed(), fd: -1, wakeFD: -1}
	tp.enabled.Store(true)
	return tp
}

func newCache(t testing.TB) *cache.Cache {
	t.Helper()
	c, err := cache.New(cache.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestHandle feeds packets through the tap's per-packet path into a real
// cache and checks every counter: the tap's own reasons, the cache's
// passed through, duplicates, and pausing.
func TestHandle(t *testing.T) {
	c := newCache(t)
	var sinkErr error
	sink := func(resp []byte) error {
		if sinkErr != nil {
			return sinkErr
		}
		return c.Insert(resp)
	}
	tp := socketless(t, sink, localDNS, localDNS6)
	from4 := netip.AddrPortFrom(localDNS, 53)
	from6 := netip.AddrPortFrom(localDNS6, 53)

	query := new(dns.Msg)
	query.SetQuestion("q.example.", dns.TypeA)
	qwire, _ := query.Pack()
	tc := new(dns.Msg)
	tc.SetReply(query)
	tc.Truncated = true
	tcwire, _ := tc.Pack()

	aReply := reply(from4, dnsReply(t, "a.example"))
	steps := []struct {
		name  string
		pkt   []byte
		trunc bool
		off   bool  // SetEnabled(false) before
		err   error // the sink fails with it
		want  string
	}{
		{name: "v4 answer", pkt: aReply, want: "accepted"},
		{name: "v6 answer", pkt: reply(from6, dnsReply(t, "b.example")), want: "accepted"},
		{name: "the same packet again (a bridge and its port)", pkt: aReply, want: "duplicate"},
		{name: "same answer to another client", pkt: udpPacket(from4, netip.AddrPortFrom(podAddr, 40001), aReply[ipv4MinHeader+udpHeader:]), want: "accepted"},
		{name: "a query, not a reply", pkt: reply(from4, qwire), want: "not_response"},
		{name: "truncated reply", pkt: reply(from4, tcwire), want: "truncated"},
		{name: "not DNS", pkt: reply(from4, []byte("garbage")), want: "malformed"},
		{name: "from another address", pkt: reply(netip.AddrPortFrom(otherAddr, 53), dnsReply(t, "c.example")), want: "wrong_source"},
		{name: "from another port", pkt: reply(netip.AddrPortFrom(localDNS, 54), dnsReply(t, "c.example")), want: "wrong_source"},
		{name: "cut by the slot", pkt: reply(from4, dnsReply(t, "d.example")), trunc: true, want: "oversize"},
		{name: "fragment", pkt: mutate(reply(from4, dnsReply(t, "e.example")), func(p []byte) []byte { p[6] = 0x20; return p }), want: "fragment"},
		{name: "extension header", pkt: withIPv6NextHeader(reply(from6, dnsReply(t, "e.example")), 60), want: "ipv6_extension"},
		{name: "short", pkt: []byte{0x45, 0}, want: "short"},
		{name: "sink fails", pkt: reply(from4, dnsReply(t, "f.example")), err: errors.New("disk on fire"), want: "sink_error"},
		{name: "sink rejects, wrapped", pkt: reply(from4, dnsReply(t, "g.example")),
			err: fmt.Errorf("wrapped: %w", &cache.RejectError{Reason: cache.ReasonTooLarge}), want: "too_large"},
		{name: "paused", pkt: reply(from4, dnsReply(t, "h.example")), off: true, want: "disabled"},
		{name: "resumed", pkt: reply(from4, dnsReply(t, "h.example")), want: "accepted"},
	}
	want := map[string]uint64{}
	for i, s := range steps {
		tp.SetEnabled(!s.off)
		sinkErr = s.err
		tp.handle(s.pkt, s.trunc)
		want[s.want]++
		st := tp.Stats()
		got := maps.Clone(st.Rejected)
		got["accepted"] = st.Accepted
		if got["accepted"] == 0 {
			delete(got, "accepted")
		}
		if !maps.Equal(got, want) {
			t.Fatalf("after step %d (%s): counters %v, want %v", i, s.name, got, want)
		}
		if st.Seen != uint64(i+1) {
			t.Fatalf("after step %d (%s): seen %d", i, s.name, st.Seen)
		}
	}
	// Each accepted name is in the cache, and nothing else.
	for _, name := range []string{"a.example.", "b.example.", "h.example."} {
		if !inCache(t, c, name) {
			t.Errorf("%s not in the cache", name)
		}
	}
	if n := c.Len(); n != 3 {
		t.Errorf("cache holds %d entries, want 3", n)
	}
}

// inCache looks name (type A) up in c.
func inCache(t testing.TB, c *cache.Cache, name string) bool {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeA)
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	var q wire.Query
	if err := wire.ParseQuery(b, &q); err != nil {
		t.Fatal(err)
	}
	return c.Status(&q) != cache.Miss
}

// TestHandleNoAllocs pins the tap's own per-packet cost: nothing is
// allocated between the socket's buffer and the sink, rejects included.
func TestHandleNoAllocs(t *testing.T) {
	tp := socketless(t, func([]byte) error { return nil }, localDNS)
	pkts := make([][]byte, 64)
	for i := range pkts {
		pkts[i] = reply(netip.AddrPortFrom(localDNS, 53), dnsReply(t, fmt.Sprintf("n%d.example", i)))
	}
	bad := reply(netip.AddrPortFrom(otherAddr, 53), dnsReply(t, "x.example"))
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		tp.handle(pkts[i%len(pkts)], false)
		tp.handle(bad, false)
		i++
	})
	if allocs != 0 {
		t.Errorf("handle allocates %v times per packet pair", allocs)
	}
	rej := &cache.RejectError{Reason: cache.ReasonRcode}
	rejecting := socketless(t, func([]byte) error { return rej }, localDNS)
	if allocs := testing.AllocsPerRun(1000, func() { rejecting.handle(pkts[0], false); rejecting.recent = [dedupeWindow]uint64{} }); allocs != 0 {
		t.Errorf("a cache reject allocates %v times", allocs)
	}
}

// TestMetrics registers the tap with a pedantic registry (which checks
// Collect against Describe) beside a collector exporting the shared
// records metric as mirror/dnstap does, and reads the series back.
func TestMetrics(t *testing.T) {
	tp := socketless(t, func([]byte) error { return nil }, localDNS)
	tp.handle(reply(netip.AddrPortFrom(localDNS, 53), dnsReply(t, "a.example")), false)
	tp.handle([]byte{0x45}, false)
	tp.SetEnabled(false)
	tp.stats.kernelDrops.Add(7)

	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(tp); err != nil {
		t.Fatal(err)
	}
	other := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "dnsstandby_mirror_records_total", Help: recordsHelp,
		ConstLabels: prometheus.Labels{"source": "dnstap"},
	}, []string{"result", "reason"})
	other.WithLabelValues("accepted", "").Add(5)
	if err := reg.Register(other); err != nil {
		t.Fatalf("a second mirror source cannot register the shared metric: %v", err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			var labels []string
			for _, l := range m.Label {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			key := mf.GetName() + "{" + strings.Join(labels, ",") + "}"
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				got[key] = m.Counter.GetValue()
			case dto.MetricType_GAUGE:
				got[key] = m.Gauge.GetValue()
			}
		}
	}
	want := map[string]float64{
		`dnsstandby_mirror_records_total{reason=,result=accepted,source=tap}`:      1,
		`dnsstandby_mirror_records_total{reason=short,result=rejected,source=tap}`: 1,
		`dnsstandby_mirror_records_total{reason=,result=accepted,source=dnstap}`:   5,
		`dnsstandby_mirror_tap_drops_total{}`:                                      7,
		`dnsstandby_mirror_tap_read_errors_total{}`:                                0,
		`dnsstandby_mirror_tap_enabled{}`:                                          0,
	}
	if !maps.Equal(got, want) {
		t.Errorf("metrics:\n%s\nwant:\n%s", dump(got), dump(want))
	}
}

func dump(m map[string]float64) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(m)) {
		fmt.Fprintf(&b, "  %s %v\n", k, m[k])
	}
	return b.String()
}

// BenchmarkHandle is the tap's user-space work per reply, from the read
// slot to the sink (here a no-op): parse, source check, duplicate check.
func BenchmarkHandle(b *testing.B) {
	tp := socketless(b, func([]byte) error { return nil }, localDNS, localDNS6)
	pkts := make([][]byte, 64)
	for i := range pkts {
		pkts[i] = reply(netip.AddrPortFrom(localDNS, 53), dnsReply(b, fmt.Sprintf("svc-%d.default.svc.cluster.local", i)))
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		tp.handle(pkts[i%len(pkts)], false)
		i++
	}
}

// BenchmarkHandleCache is BenchmarkHandle with the real sink,
// (*cache.Cache).Insert, for comparison.
func BenchmarkHandleCache(b *testing.B) {
	c := newCache(b)
	tp := socketless(b, c.Insert, localDNS)
	pkts := make([][]byte, 1024)
	for i := range pkts {
		pkts[i] = reply(netip.AddrPortFrom(localDNS, 53), dnsReply(b, fmt.Sprintf("svc-%d.default.svc.cluster.local", i)))
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		tp.handle(pkts[i%len(pkts)], false)
		i++
	}
}
