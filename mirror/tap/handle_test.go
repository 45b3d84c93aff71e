package tap

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"maps"
	"net/netip"
	"strings"
	"testing"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/dnsstandby/dnsstandby/cache"
	"github.com/dnsstandby/dnsstandby/wire"
)

// socketless returns a Tap with no socket, for driving handle directly.
func socketless(t testing.TB, sink Sink, addrs ...netip.Addr) *Tap {
	t.Helper()
	spec, err := newFilterSpec(addrs, 53, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	tp := &Tap{sink: sink, log: slog.New(slog.DiscardHandler), spec: spec, seed: maphash.MakeSeed(), fd: -1}
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
		tp.handle(s.pkt, arrival{trunc: s.trunc})
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
		tp.handle(pkts[i%len(pkts)], arrival{})
		tp.handle(bad, arrival{})
		i++
	})
	if allocs != 0 {
		t.Errorf("handle allocates %v times per packet pair", allocs)
	}
	rej := &cache.RejectError{Reason: cache.ReasonRcode}
	rejecting := socketless(t, func([]byte) error { return rej }, localDNS)
	if allocs := testing.AllocsPerRun(1000, func() { rejecting.handle(pkts[0], arrival{}); rejecting.recent = [dedupeWindow]uint64{} }); allocs != 0 {
		t.Errorf("a cache reject allocates %v times", allocs)
	}
}

// TestMetrics registers the tap with a pedantic registry (which checks
// Collect against Describe) beside a collector exporting the shared
// records metric as mirror/dnstap does, and compares every series: a
// rejected record for every reason, the tap's and the cache's, from zero.
func TestMetrics(t *testing.T) {
	tp := socketless(t, func([]byte) error { return nil }, localDNS)
	tp.spec.queries = true
	tp.handle(reply(netip.AddrPortFrom(localDNS, 53), dnsReply(t, "a.example")), arrival{})
	tp.handle([]byte{0x45}, arrival{})
	q := query(netip.AddrPortFrom(localDNS, 53), dnsQuery(t, "a.example"))
	tp.handle(q, arrival{query: true})
	tp.handle(q, arrival{query: true})
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
	const want = `
# HELP dnsstandby_mirror_records_total Mirrored LocalDNS replies handed to the cache, by source, result (accepted, rejected) and reason.
# TYPE dnsstandby_mirror_records_total counter
dnsstandby_mirror_records_total{reason="",result="accepted",source="dnstap"} 5
dnsstandby_mirror_records_total{reason="",result="accepted",source="tap"} 1
dnsstandby_mirror_records_total{reason="bad_ip_header",result="rejected",source="tap"} 0
dnsstandby_mirror_records_total{reason="bad_udp",result="rejected",source="tap"} 0
dnsstandby_mirror_records_total{reason="disabled",result="rejected",source="tap"} 0
dnsstandby_mirror_records_total{reason="duplicate",result="rejected",source="tap"} 0
dnsstandby_mirror_records_total{reason="empty",result="rejected",source="tap"} 0
dnsstandby_mirror_records_total{reason="fragment",result="rejected",source="tap"} 0
dnsstandby_mirror_records_total{reason="have_fresh",result="rejected",source="tap"} 0
dnsstandby_mirror_records_total{reason="ipv6_extension",result="rejected",source="tap"} 0
dnsstandby_mirror_records_total{reason="kept_answer",result="rejected",source="tap"} 0
dnsstandby_mirror_records_total{reason="malformed",result="rejected",source="tap"} 0
dnsstandby_mirror_records_total{reason="no_soa",result="rejected",source="tap"} 0
dnsstandby_mirror_records_total{reason="not_ipv4_ipv6",result="rejected",source="tap"} 0
dnsstandby_mirror_records_total{reason="not_response",result="rejected",source="tap"} 0
dnsstandby_mirror_records_total{reason="not_udp",result="rejected",source="tap"} 0
dnsstandby_mirror_records_total{reason="opcode",result="rejected",source="tap"} 0
dnsstandby_mirror_records_total{reason="oversize",result="rejected",source="tap"} 0
dnsstandby_mirror_records_total{reason="own_hedge",result="rejected",source="tap"} 0
dnsstandby_mirror_records_total{reason="question_count",result="rejected",source="tap"} 0
dnsstandby_mirror_records_total{reason="rcode",result="rejected",source="tap"} 0
dnsstandby_mirror_records_total{reason="short",result="rejected",source="tap"} 1
dnsstandby_mirror_records_total{reason="sink_error",result="rejected",source="tap"} 0
dnsstandby_mirror_records_total{reason="too_large",result="rejected",source="tap"} 0
dnsstandby_mirror_records_total{reason="truncated",result="rejected",source="tap"} 0
dnsstandby_mirror_records_total{reason="wrong_destination",result="rejected",source="tap"} 0
dnsstandby_mirror_records_total{reason="wrong_source",result="rejected",source="tap"} 0
# HELP dnsstandby_mirror_tap_drops_total Packets the kernel dropped because the packet tap's receive buffer (PACKET_STATISTICS tp_drops) or, in ring mode, its ring was full.
# TYPE dnsstandby_mirror_tap_drops_total counter
dnsstandby_mirror_tap_drops_total 7
# HELP dnsstandby_mirror_tap_enabled 1 while the packet tap inserts what it reads into the cache, 0 while paused.
# TYPE dnsstandby_mirror_tap_enabled gauge
dnsstandby_mirror_tap_enabled 0
# HELP dnsstandby_mirror_tap_local_only 1 if the packet tap's filter passes only replies this node sent; 0 if the kernel refused it and frames a bridge forwards from pods can pass too.
# TYPE dnsstandby_mirror_tap_local_only gauge
dnsstandby_mirror_tap_local_only 0
# HELP dnsstandby_mirror_tap_queries_at_localdns 1 while the packet tap reads the queries where LocalDNS's sockets receive them (ring mode, standing by); 0 while it reads them as the node receives them, before netfilter.
# TYPE dnsstandby_mirror_tap_queries_at_localdns gauge
dnsstandby_mirror_tap_queries_at_localdns 0
# HELP dnsstandby_mirror_tap_queries_matched_total Observed queries that the packet tap's eBPF programs matched to LocalDNS's reply in the kernel (ring mode, standing by), so that neither was matched in user space.
# TYPE dnsstandby_mirror_tap_queries_matched_total counter
dnsstandby_mirror_tap_queries_matched_total 0
# HELP dnsstandby_mirror_tap_queries_total Queries to LocalDNS the packet tap read, by result (observed, rejected) and reason.
# TYPE dnsstandby_mirror_tap_queries_total counter
dnsstandby_mirror_tap_queries_total{reason="",result="observed"} 1
dnsstandby_mirror_tap_queries_total{reason="duplicate",result="rejected"} 1
# HELP dnsstandby_mirror_tap_read_errors_total Failed reads of the packet tap's socket.
# TYPE dnsstandby_mirror_tap_read_errors_total counter
dnsstandby_mirror_tap_read_errors_total 0
# HELP dnsstandby_mirror_tap_ring 1 in ring mode: the packet tap reads the queries, and LocalDNS's replies at its cgroup's egress once LocalDNS is found, through a BPF ring buffer; 0 while its packet socket reads both.
# TYPE dnsstandby_mirror_tap_ring gauge
dnsstandby_mirror_tap_ring 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

// TestStats follows the numbers the daemon's status shows (enabled,
// records accepted and rejected) through pauses and rejects.
func TestStats(t *testing.T) {
	tp := socketless(t, func([]byte) error { return nil }, localDNS)
	good := reply(netip.AddrPortFrom(localDNS, 53), dnsReply(t, "a.example"))
	other := reply(netip.AddrPortFrom(localDNS, 53), dnsReply(t, "b.example"))
	// The paused tap remembered other for the duplicate check (a paused
	// tap still shows replies to the observer, once each).
	third := reply(netip.AddrPortFrom(localDNS, 53), dnsReply(t, "c.example"))
	steps := []struct {
		name               string
		enable             bool
		pkt                []byte
		enabled            bool
		accepted, rejected uint64
	}{
		{name: "a reply", enable: true, pkt: good, enabled: true, accepted: 1},
		{name: "a short packet", enable: true, pkt: []byte{0x45}, enabled: true, accepted: 1, rejected: 1},
		{name: "paused", enable: false, pkt: other, enabled: false, accepted: 1, rejected: 2},
		{name: "resumed", enable: true, pkt: third, enabled: true, accepted: 2, rejected: 2},
	}
	for _, s := range steps {
		tp.SetEnabled(s.enable)
		tp.handle(s.pkt, arrival{})
		st := tp.Stats()
		if st.Enabled != s.enabled || st.Accepted != s.accepted || st.RejectedTotal() != s.rejected || st.Seen != st.Accepted+st.RejectedTotal() {
			t.Errorf("after %s: enabled %v accepted %d rejected %d seen %d; want %v %d %d", s.name,
				st.Enabled, st.Accepted, st.RejectedTotal(), st.Seen, s.enabled, s.accepted, s.rejected)
		}
	}
}

// TestConfig: DefaultConfig with Addrs is valid, and Start refuses each
// invalid field by name before it opens anything.
func TestConfig(t *testing.T) {
	nop := func([]byte) error { return nil }
	tests := []struct {
		name    string
		set     func(c *Config)
		sink    Sink
		wantErr string // "" for valid
	}{
		{name: "defaults", set: func(*Config) {}, sink: nop},
		{name: "system buffer", set: func(c *Config) { c.RcvBuf = 0 }, sink: nop},
		{name: "largest batch", set: func(c *Config) { c.Batch = 1024 }, sink: nop},
		{name: "no addrs", set: func(c *Config) { c.Addrs = nil }, sink: nop, wantErr: "tap: Addrs is empty"},
		{name: "too many addrs", set: func(c *Config) { c.Addrs = many(maxFilterAddrs + 1) }, sink: nop, wantErr: "tap: Addrs has 17 addresses, at most 16"},
		{name: "invalid addr", set: func(c *Config) { c.Addrs = []netip.Addr{{}} }, sink: nop, wantErr: "tap: Addrs holds an invalid address"},
		{name: "zoned addr", set: func(c *Config) { c.Addrs = []netip.Addr{netip.MustParseAddr("fe80::1%eth0")} }, sink: nop, wantErr: "tap: Addrs: fe80::1%eth0: zones are not supported"},
		{name: "port 0", set: func(c *Config) { c.Port = 0 }, sink: nop, wantErr: "tap: Port must not be 0"},
		{name: "batch 0", set: func(c *Config) { c.Batch = 0 }, sink: nop, wantErr: "tap: Batch must be 1 to 1024, got 0"},
		{name: "batch too large", set: func(c *Config) { c.Batch = 1025 }, sink: nop, wantErr: "tap: Batch must be 1 to 1024, got 1025"},
		{name: "negative buffer", set: func(c *Config) { c.RcvBuf = -1 }, sink: nop, wantErr: "tap: RcvBuf must not be negative, got -1"},
		{name: "nil sink", set: func(*Config) {}, wantErr: "tap: nil sink"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Addrs = []netip.Addr{localDNS, localDNS6}
			tt.set(&cfg)
			if tt.wantErr == "" {
				// Valid: Start would open a packet socket here, in the
				// test's own namespace; validate is what it checks first.
				if _, err := cfg.validate(); err != nil {
					t.Errorf("validate: %v", err)
				}
				return
			}
			tp, err := Start(context.Background(), cfg, tt.sink)
			if err == nil {
				tp.Close()
				t.Fatalf("Start succeeded, want %q", tt.wantErr)
			}
			if err.Error() != tt.wantErr {
				t.Errorf("Start: %q, want %q", err, tt.wantErr)
			}
		})
	}
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
		tp.handle(pkts[i%len(pkts)], arrival{})
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
		tp.handle(pkts[i%len(pkts)], arrival{})
		i++
	}
}

// observed is one call the recording observer got.
type observed struct {
	kind           string // "query", "reply", or "sink"
	at             int64
	client, server netip.AddrPort
	dns            string
}

// recordingObserver records every call, with the sink's calls in the same
// log (to check the order), and says a reply is its own when own says so.
type recordingObserver struct {
	log []observed
	own func(p *Packet) bool
}

func (o *recordingObserver) Query(p *Packet) {
	o.log = append(o.log, observed{"query", p.At, p.Client, p.Server, string(p.DNS)})
}

func (o *recordingObserver) Reply(p *Packet) bool {
	o.log = append(o.log, observed{"reply", p.At, p.Client, p.Server, string(p.DNS)})
	return o.own != nil && o.own(p)
}

// TestHandleObserver drives queries and replies through handle with an
// observer: what it is shown (time, endpoints, payload) and when, what the
// sink gets, and how each is counted.
func TestHandleObserver(t *testing.T) {
	obs := &recordingObserver{}
	tp := socketless(t, func(resp []byte) error {
		obs.log = append(obs.log, observed{kind: "sink", dns: string(resp)})
		return nil
	}, localDNS, localDNS6)
	tp.spec.queries = true
	tp.obs = obs
	obs.own = func(p *Packet) bool { return string(p.DNS) == "hedge" }

	srv4, srv6 := netip.AddrPortFrom(localDNS, 53), netip.AddrPortFrom(localDNS6, 53)
	pod4, pod6 := netip.AddrPortFrom(podAddr, 40000), netip.AddrPortFrom(podAddr6, 40000)
	q4 := query(srv4, []byte("q4"))
	steps := []struct {
		name    string
		pkt     []byte
		a       arrival
		off     bool       // SetEnabled(false) before
		want    []observed // the calls it makes, in order
		counted string     // the counter it lands in: "query", "accepted", or a reason ("q:" for a query's)
	}{
		{name: "v4 query", pkt: q4, a: arrival{at: 100, query: true},
			want: []observed{{"query", 100, pod4, srv4, "q4"}}, counted: "query"},
		{name: "the same query again (a bridge and its port)", pkt: q4, a: arrival{at: 101, query: true}, counted: "q:duplicate"},
		{name: "v6 query", pkt: query(srv6, []byte("q6")), a: arrival{at: 102, query: true},
			want: []observed{{"query", 102, pod6, srv6, "q6"}}, counted: "query"},
		{name: "forged source", pkt: udpPacket(srv4, srv4, []byte("forged")), a: arrival{at: 103, query: true},
			want: []observed{{"query", 103, srv4, srv4, "forged"}}, counted: "query"},
		{name: "query to another address", pkt: query(netip.AddrPortFrom(otherAddr, 53), []byte("q")), a: arrival{query: true}, counted: "q:wrong_destination"},
		{name: "query to another port", pkt: query(netip.AddrPortFrom(localDNS, 54), []byte("q")), a: arrival{query: true}, counted: "q:wrong_destination"},
		{name: "query cut by the slot", pkt: query(srv4, []byte("cut")), a: arrival{query: true, trunc: true}, counted: "q:oversize"},
		{name: "query fragment", pkt: mutate(query(srv4, []byte("f")), func(p []byte) []byte { p[6] = 0x20; return p }), a: arrival{query: true}, counted: "q:fragment"},
		{name: "query without payload", pkt: query(srv4, nil), a: arrival{query: true}, counted: "q:empty"},
		{name: "v4 reply", pkt: reply(srv4, []byte("r4")), a: arrival{at: 200},
			want: []observed{{"reply", 200, pod4, srv4, "r4"}, {kind: "sink", dns: "r4"}}, counted: "accepted"},
		{name: "v6 reply", pkt: reply(srv6, []byte("r6")), a: arrival{at: 201},
			want: []observed{{"reply", 201, pod6, srv6, "r6"}, {kind: "sink", dns: "r6"}}, counted: "accepted"},
		{name: "our own hedge", pkt: reply(srv4, []byte("hedge")), a: arrival{at: 202},
			want: []observed{{"reply", 202, pod4, srv4, "hedge"}}, counted: "own_hedge"},
		{name: "paused: observed, not sunk", pkt: reply(srv4, []byte("paused")), a: arrival{at: 203}, off: true,
			want: []observed{{"reply", 203, pod4, srv4, "paused"}}, counted: "disabled"},
		{name: "paused, our own hedge", pkt: reply(srv6, []byte("hedge")), a: arrival{at: 204}, off: true,
			want: []observed{{"reply", 204, pod6, srv6, "hedge"}}, counted: "own_hedge"},
		{name: "duplicate reply: not observed twice", pkt: reply(srv4, []byte("r4")), a: arrival{at: 205}, counted: "duplicate"},
		{name: "reply from another address", pkt: reply(netip.AddrPortFrom(otherAddr, 53), []byte("r")), counted: "wrong_source"},
		{name: "short reply", pkt: []byte{0x45}, counted: "short"},
	}
	wantReplies, wantQueries := map[string]uint64{}, map[string]uint64{}
	var accepted, queries uint64
	for i, s := range steps {
		tp.SetEnabled(!s.off)
		obs.log = obs.log[:0]
		tp.handle(s.pkt, s.a)
		if fmt.Sprint(obs.log) != fmt.Sprint(s.want) {
			t.Errorf("%s: calls %v, want %v", s.name, obs.log, s.want)
		}
		switch r, isQuery := strings.CutPrefix(s.counted, "q:"); {
		case s.counted == "query":
			queries++
		case s.counted == "accepted":
			accepted++
		case isQuery:
			wantQueries[r]++
		default:
			wantReplies[r]++
		}
		st := tp.Stats()
		if st.Accepted != accepted || st.Queries != queries || !maps.Equal(st.Rejected, wantReplies) || !maps.Equal(st.QueriesRejected, wantQueries) {
			t.Fatalf("after %s: accepted %d queries %d rejected %v queries rejected %v; want %d %d %v %v", s.name,
				st.Accepted, st.Queries, st.Rejected, st.QueriesRejected, accepted, queries, wantReplies, wantQueries)
		}
		if st.Seen != uint64(i+1) || st.Seen != st.Accepted+st.RejectedTotal()+st.Queries+st.QueriesRejectedTotal() {
			t.Fatalf("after %s: seen %d, want %d = the sum of the others", s.name, st.Seen, i+1)
		}
		if tp.pkt.DNS != nil {
			t.Fatalf("after %s: the tap still holds the packet's payload", s.name)
		}
	}

	// Without Queries, a received packet is nothing the filter passes.
	off := socketless(t, func([]byte) error { return nil }, localDNS)
	off.obs = &recordingObserver{}
	off.handle(q4, arrival{query: true})
	if st := off.Stats(); st.Queries != 0 || st.QueriesRejected["wrong_destination"] != 1 || len(off.obs.(*recordingObserver).log) != 0 {
		t.Errorf("query without Queries: %+v", st)
	}
}

// nopObserver takes everything and owns nothing.
type nopObserver struct{}

func (nopObserver) Query(*Packet)      {}
func (nopObserver) Reply(*Packet) bool { return false }

// TestHandleObserverNoAllocs pins the per-packet path with an observer:
// queries and replies, nothing allocated.
func TestHandleObserverNoAllocs(t *testing.T) {
	tp := socketless(t, func([]byte) error { return nil }, localDNS, localDNS6)
	tp.spec.queries = true
	tp.obs = nopObserver{}
	var qs, rs [][]byte
	for i := range 64 {
		qs = append(qs, query(netip.AddrPortFrom(localDNS6, 53), dnsQuery(t, fmt.Sprintf("n%d.example", i))))
		rs = append(rs, reply(netip.AddrPortFrom(localDNS, 53), dnsReply(t, fmt.Sprintf("n%d.example", i))))
	}
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		tp.handle(qs[i%len(qs)], arrival{at: int64(i), query: true})
		tp.handle(rs[i%len(rs)], arrival{at: int64(i)})
		i++
	})
	if allocs != 0 {
		t.Errorf("handle with an observer allocates %v times per query and reply", allocs)
	}
}

// BenchmarkHandleQuery is the tap's user-space work per query, from the
// read slot to the observer (here a no-op).
func BenchmarkHandleQuery(b *testing.B) {
	benchObserved(b, true, func(name string) []byte {
		return query(netip.AddrPortFrom(localDNS, 53), dnsQuery(b, name))
	})
}

// BenchmarkHandleReplyObserved is BenchmarkHandle with an observer (a
// no-op): the reply is shown to it, then to the no-op sink.
func BenchmarkHandleReplyObserved(b *testing.B) {
	benchObserved(b, false, func(name string) []byte {
		return reply(netip.AddrPortFrom(localDNS, 53), dnsReply(b, name))
	})
}

// benchObserved runs handle over 64 packets made by packet, queries or
// replies, with a no-op observer and sink.
func benchObserved(b *testing.B, isQuery bool, packet func(name string) []byte) {
	tp := socketless(b, func([]byte) error { return nil }, localDNS, localDNS6)
	tp.spec.queries = true
	tp.obs = nopObserver{}
	pkts := make([][]byte, 64)
	for i := range pkts {
		pkts[i] = packet(fmt.Sprintf("svc-%d.default.svc.cluster.local", i))
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		tp.handle(pkts[i%len(pkts)], arrival{at: int64(i), query: isQuery})
		i++
	}
}
