package pipeline

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/cache"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
	"github.com/dnsstandby/dnsstandby/upstream"
	"github.com/dnsstandby/dnsstandby/wire"
)

// fakeUpstream answers from a table and counts exchanges. A name listed in
// block waits until released or until ctx ends; fail, when set, is
// returned by every exchange at once. The pipeline's upstream behaviour
// against real servers is covered by the integration tests; this one,
// with testing/synctest, makes timing deterministic.
type fakeUpstream struct {
	mu      sync.Mutex
	answers map[string][]string // name -> RRs
	calls   map[string]int
	fail    error
	block   map[string]chan struct{}
	noCD    bool // do not echo CD, as a careless upstream might
}

func newFake() *fakeUpstream {
	return &fakeUpstream{answers: map[string][]string{}, calls: map[string]int{}, block: map[string]chan struct{}{}}
}

func (f *fakeUpstream) Exchange(ctx context.Context, req *dns.Msg) (*dns.Msg, error) {
	name := dns.CanonicalName(req.Question[0].Name)
	f.mu.Lock()
	f.calls[name]++
	ch := f.block[name]
	fail := f.fail
	rrs, ok := f.answers[name]
	f.mu.Unlock()
	if ch != nil {
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if fail != nil {
		return nil, fail
	}
	resp := new(dns.Msg)
	resp.SetReply(req)
	resp.RecursionAvailable = true
	if f.noCD {
		resp.CheckingDisabled = false
	}
	if !ok {
		resp.Rcode = dns.RcodeNameError
		soa, _ := dns.NewRR("example. 30 IN SOA ns.example. h.example. 1 2 3 4 30")
		resp.Ns = []dns.RR{soa}
	}
	for _, s := range rrs {
		rr, err := dns.NewRR(s)
		if err != nil {
			return nil, err
		}
		resp.Answer = append(resp.Answer, rr)
	}
	if opt := req.IsEdns0(); opt != nil {
		resp.SetEdns0(1232, opt.Do())
	}
	return resp, nil
}

func (f *fakeUpstream) set(name string, rrs ...string) {
	f.mu.Lock()
	f.answers[name] = rrs
	f.mu.Unlock()
}

func (f *fakeUpstream) setFail(err error) { f.mu.Lock(); f.fail = err; f.mu.Unlock() }

// errUnreachable is an upstream failure other than the concurrency cap.
var errUnreachable = &upstream.Error{Failures: []error{errors.New("10.0.0.10:53 over udp: timeout")}}

// errLimit is what an upstream.Group over its MaxConcurrent returns.
var errLimit = &upstream.Error{Cause: upstream.ErrLimitExceeded}

func (f *fakeUpstream) hold(name string) chan struct{} {
	ch := make(chan struct{})
	f.mu.Lock()
	f.block[name] = ch
	f.mu.Unlock()
	return ch
}

func (f *fakeUpstream) count(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[name]
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }
func newPipeline(t *testing.T, up Exchanger, mod func(*Config)) (*Pipeline, *clock) {
	t.Helper()
	return newPipelineTB(t, up, mod)
}

// newPipelineF is newPipeline for fuzz targets.
func newPipelineF(f *testing.F, up Exchanger) (*Pipeline, *clock) {
	return newPipelineTB(f, up, nil)
}

// newPipelineTB makes a pipeline routing everything to up, on a test
// clock; mod may change the Config, and routes it leaves without a Cache
// share one with the cache defaults.
func newPipelineTB(t testing.TB, up Exchanger, mod func(*Config)) (*Pipeline, *clock) {
	t.Helper()
	return newPipelineCache(t, up, nil, mod)
}

// newPipelineCache is newPipelineTB with the shared cache's Config
// changed by cmod.
func newPipelineCache(t testing.TB, up Exchanger, cmod func(*cache.Config), mod func(*Config)) (*Pipeline, *clock) {
	t.Helper()
	clk := &clock{t: time.Unix(1_800_000_000, 0)}
	c := newCache(t, clk, cmod)
	cfg := DefaultConfig()
	cfg.Routes = []Route{{Zone: ".", Upstream: up}}
	cfg.StaleBudget = 50 * time.Millisecond
	cfg.UpstreamTimeout = 500 * time.Millisecond
	cfg.Logger = testkit.Logger(t)
	if mod != nil {
		mod(&cfg)
	}
	for i := range cfg.Routes {
		if r := &cfg.Routes[i]; r.Cache == nil && r.Direct == nil {
			r.Cache = c
		}
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		p.Drain(ctx)
	})
	return p, clk
}

// newCache returns a cache on clk (nil: the real clock) with the
// defaults, changed by mod.
func newCache(t testing.TB, clk *clock, mod func(*cache.Config)) *cache.Cache {
	t.Helper()
	ccfg := cache.DefaultConfig()
	if clk != nil {
		ccfg.Now = clk.Now
	}
	ccfg.NSID = "dnsstandby"
	if mod != nil {
		mod(&ccfg)
	}
	c, err := cache.New(ccfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// result is what a client got back.
type result struct {
	msg *dns.Msg
	err error
}

// ask runs msg through the pipeline as the responder would and returns the
// reply channel (buffered; nothing sent means dropped).
func ask(t *testing.T, w *Worker, raw []byte, client string) <-chan result {
	t.Helper()
	return askOver(t, w, raw, client, true)
}

// askOver is ask over UDP (udp) or TCP.
func askOver(t *testing.T, w *Worker, raw []byte, client string, udp bool) <-chan result {
	t.Helper()
	out := make(chan result, 1)
	deliver := func(b []byte) {
		m := new(dns.Msg)
		err := m.Unpack(b)
		out <- result{m, err}
	}
	buf := make([]byte, 65535)
	n, act := w.Answer(buf, raw, udp)
	switch act {
	case Reply:
		deliver(buf[:n])
	case Resolve:
		w.p.Resolve(append([]byte(nil), raw...), netip.AddrPortFrom(netip.MustParseAddr(client), 5353), udp, deliver)
	}
	return out
}

func wait(t *testing.T, ch <-chan result) *dns.Msg {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("reply does not unpack: %v", r.err)
		}
		return r.msg
	case <-time.After(3 * time.Second):
		t.Fatal("no reply")
	}
	return nil
}

func q(t *testing.T, name string, qtype uint16, edns bool) []byte {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	m.Id = 0x7777
	if edns {
		m.SetEdns0(1232, false)
	}
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestHotPathProtocolErrors: a query that is not a plain QUERY is turned
// away with LocalDNS's rcode and header, checked in CoreDNS's order
// (miekg/dns's header checks: QR, opcode, section counts; then the rest of
// the message; then EDNS).
func TestHotPathProtocolErrors(t *testing.T) {
	p, _ := newPipeline(t, newFake(), nil)
	w := p.NewWorker()
	valid := q(t, "a.example.", dns.TypeA, false)
	mod := func(f func(m *dns.Msg)) []byte {
		m := new(dns.Msg)
		_ = m.Unpack(valid)
		f(m)
		b, _ := m.Pack()
		return b
	}
	// raw sets the opcode and question count of valid's header as given,
	// RD and CD set, whatever the sections hold.
	raw := func(opcode int, qdcount uint16) []byte {
		b := append([]byte(nil), valid...)
		if qdcount == 0 {
			b = b[:wire.HeaderLen]
		}
		b[2] = b[2]&^0x78 | byte(opcode<<3)
		b[3] |= byte(wire.FlagCD)
		binary.BigEndian.PutUint16(b[4:], qdcount)
		return b
	}
	withQuestions := func(opcode int) []byte {
		return mod(func(m *dns.Msg) { m.Opcode = opcode; m.Question = append(m.Question, m.Question[0]) })
	}
	a, _ := dns.NewRR("a.example. 1 IN A 192.0.2.1")
	soa, _ := dns.NewRR("example. 1 IN SOA ns.example. h.example. 1 2 3 4 5")
	opt := func(padding int) *dns.OPT {
		o := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
		o.SetUDPSize(1232)
		if padding > 0 {
			o.Option = []dns.EDNS0{&dns.EDNS0_PADDING{Padding: make([]byte, padding)}}
		}
		return o
	}
	tsig := &dns.TSIG{Hdr: dns.RR_Header{Name: "key.", Rrtype: dns.TypeTSIG, Class: dns.ClassANY},
		Algorithm: dns.HmacSHA256, Fudge: 300, MACSize: 4, MAC: "01020304"}
	tests := []struct {
		name      string
		raw       []byte
		wantAct   Action
		wantRcode int
		wantOp    int
		wantQD    int  // questions echoed
		wantRDCD  bool // the query's RD and CD echoed
		tcp       bool // sent over TCP (else UDP)
	}{
		{"short", []byte{1, 2, 3}, Drop, 0, 0, 0, false, false},
		{"response", mod(func(m *dns.Msg) { m.Response = true }), Drop, 0, 0, 0, false, false},
		{"response with opcode update", mod(func(m *dns.Msg) { m.Response = true; m.Opcode = dns.OpcodeUpdate }), Drop, 0, 0, 0, false, false},
		{"malformed question", append(valid[:12:12], 0x05, 'a'), Reply, dns.RcodeFormatError, 0, 0, true, false},
		{"question read, then a record cut short", mod(func(m *dns.Msg) { m.SetEdns0(1232, false) })[:len(valid)+5], Reply, dns.RcodeFormatError, 0, 1, true, false},
		{"question count 1, header only: SERVFAIL", raw(dns.OpcodeQuery, 1)[:wire.HeaderLen], Reply, dns.RcodeServerFailure, 0, 0, true, false},
		{"no question", raw(dns.OpcodeQuery, 0), Reply, dns.RcodeFormatError, 0, 0, true, false},
		{"two questions", withQuestions(dns.OpcodeQuery), Reply, dns.RcodeFormatError, 0, 0, true, false},
		{"two answers", mod(func(m *dns.Msg) {
			rr, _ := dns.NewRR("a.example. 1 IN A 192.0.2.1")
			m.Answer = []dns.RR{rr, rr}
		}), Reply, dns.RcodeFormatError, 0, 0, true, false},
		{"notify without a question: FORMERR as QUERY", raw(dns.OpcodeNotify, 0), Reply, dns.RcodeFormatError, 0, 0, true, false},
		{"notify with two questions", withQuestions(dns.OpcodeNotify), Reply, dns.RcodeFormatError, 0, 0, true, false},
		{"notify", raw(dns.OpcodeNotify, 1), Reply, dns.RcodeNotImplemented, dns.OpcodeNotify, 1, false, false},
		{"iquery", raw(dns.OpcodeIQuery, 1), Reply, dns.RcodeNotImplemented, dns.OpcodeIQuery, 0, true, false},
		{"status", raw(dns.OpcodeStatus, 1), Reply, dns.RcodeNotImplemented, dns.OpcodeStatus, 0, true, false},
		{"update", raw(dns.OpcodeUpdate, 1), Reply, dns.RcodeNotImplemented, dns.OpcodeUpdate, 0, true, false},
		{"unassigned opcode 3", raw(3, 1), Reply, dns.RcodeNotImplemented, 3, 0, true, false},
		{"unassigned opcode 15", raw(15, 1), Reply, dns.RcodeNotImplemented, 15, 0, true, false},
		{"update without a question: NOTIMP first", raw(dns.OpcodeUpdate, 0), Reply, dns.RcodeNotImplemented, dns.OpcodeUpdate, 0, true, false},
		{"status with two questions: NOTIMP first", withQuestions(dns.OpcodeStatus), Reply, dns.RcodeNotImplemented, dns.OpcodeStatus, 0, true, false},
		{"EDNS version 1", mod(func(m *dns.Msg) { m.SetEdns0(1232, false); m.IsEdns0().SetVersion(1) }), Reply, dns.RcodeBadVers, 0, 1, true, false},
		{"AXFR", mod(func(m *dns.Msg) { m.Question[0].Qtype = dns.TypeAXFR }), Reply, dns.RcodeRefused, 0, 1, true, false},
		// Records a query has no use for: FORMERR, header only, as
		// miekg/dns's accept function rejects two answers.
		{"an answer record", mod(func(m *dns.Msg) { m.Answer = []dns.RR{a} }), Reply, dns.RcodeFormatError, 0, 0, true, false},
		{"an authority record", mod(func(m *dns.Msg) { m.Ns = []dns.RR{a} }), Reply, dns.RcodeFormatError, 0, 0, true, false},
		{"an additional A", mod(func(m *dns.Msg) { m.Extra = []dns.RR{a} }), Reply, dns.RcodeFormatError, 0, 0, true, false},
		{"OPT and an additional A", mod(func(m *dns.Msg) { m.Extra = []dns.RR{opt(0), a} }), Reply, dns.RcodeFormatError, 0, 0, true, false},
		{"TSIG before the OPT", mod(func(m *dns.Msg) { m.Extra = []dns.RR{tsig, opt(0)} }), Reply, dns.RcodeFormatError, 0, 0, true, false},
		{"an answer record over TCP", mod(func(m *dns.Msg) { m.Answer = []dns.RR{a} }), Reply, dns.RcodeFormatError, 0, 0, true, true},
		{"IXFR with its SOA: REFUSED first", mod(func(m *dns.Msg) { m.Question[0].Qtype = dns.TypeIXFR; m.Ns = []dns.RR{soa} }), Reply, dns.RcodeRefused, 0, 1, true, false},
		// Over UDP the first 512 bytes are read, as LocalDNS reads them.
		{"UDP query of 600 bytes, cut in the OPT: FORMERR", mod(func(m *dns.Msg) { m.Extra = []dns.RR{opt(560)} }), Reply, dns.RcodeFormatError, 0, 1, true, false},
		{"UDP query of 600 bytes, whole in the first 512: a miss", append(append([]byte(nil), valid...), make([]byte, 600)...), Resolve, 0, 0, 0, false, false},
		{"TCP query of 600 bytes: dropped", mod(func(m *dns.Msg) { m.Extra = []dns.RR{opt(560)} }), Drop, 0, 0, 0, false, true},
		{"OPT and a TSIG last: a miss", mod(func(m *dns.Msg) { m.Extra = []dns.RR{opt(0), tsig} }), Resolve, 0, 0, 0, false, false},
		{"OPT padded to 512 over TCP: a miss", mod(func(m *dns.Msg) { m.Extra = []dns.RR{opt(512 - len(valid) - 15)} }), Resolve, 0, 0, 0, false, true},
		{"miss", valid, Resolve, 0, 0, 0, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			buf := make([]byte, 512)
			n, act := w.Answer(buf, tt.raw, !tt.tcp)
			if act != tt.wantAct {
				t.Fatalf("action %d, want %d", act, tt.wantAct)
			}
			if act != Reply {
				return
			}
			m := new(dns.Msg)
			if err := m.Unpack(buf[:n]); err != nil {
				t.Fatalf("reply does not unpack: %v", err)
			}
			if m.Rcode != tt.wantRcode || m.Id != 0x7777 || !m.Response || m.Opcode != tt.wantOp {
				t.Fatalf("rcode %s opcode %d id %#x qr %v, want rcode %s opcode %d", dns.RcodeToString[m.Rcode], m.Opcode, m.Id, m.Response,
					dns.RcodeToString[tt.wantRcode], tt.wantOp)
			}
			if len(m.Question) != tt.wantQD || len(m.Answer)+len(m.Ns) != 0 {
				t.Errorf("%d questions and %d records, want %d questions and none", len(m.Question), len(m.Answer)+len(m.Ns), tt.wantQD)
			}
			if m.RecursionAvailable || m.Authoritative {
				t.Errorf("RA %v AA %v, want neither", m.RecursionAvailable, m.Authoritative)
			}
			if rd := m.RecursionDesired && (m.CheckingDisabled || tt.raw[3]&byte(wire.FlagCD) == 0); rd != tt.wantRDCD {
				t.Errorf("RD %v CD %v, want the query's: %v", m.RecursionDesired, m.CheckingDisabled, tt.wantRDCD)
			}
		})
	}
}

func TestMissThenHit(t *testing.T) {
	up := newFake()
	up.set("svc.ns.svc.cluster.local.", "svc.ns.svc.cluster.local. 30 IN A 10.0.0.5")
	p, _ := newPipeline(t, up, nil)
	w := p.NewWorker()

	a := wait(t, ask(t, w, q(t, "SvC.ns.svc.cluster.local.", dns.TypeA, true), "10.1.0.1"))
	if a.Id != 0x7777 || a.Question[0].Name != "SvC.ns.svc.cluster.local." || len(a.Answer) != 1 || a.Rcode != 0 {
		t.Fatalf("first answer %v", a)
	}
	if opt := a.IsEdns0(); opt == nil || opt.UDPSize() != 1232 {
		t.Fatalf("EDNS client got OPT %v", a.IsEdns0())
	}
	// Second time: from the cache, on the hot path, no upstream call.
	buf := make([]byte, 512)
	n, act := w.Answer(buf, q(t, "svc.NS.svc.cluster.local.", dns.TypeA, false), true)
	if act != Reply || n == 0 {
		t.Fatalf("second query not answered from cache: action %d", act)
	}
	if up.count("svc.ns.svc.cluster.local.") != 1 {
		t.Fatalf("upstream called %d times", up.count("svc.ns.svc.cluster.local."))
	}
	got := p.Answered()
	if got["upstream"] != 1 || got["cache"] != 1 {
		t.Fatalf("answers by source %v", got)
	}
}

func TestNegativeAnswerPassesThrough(t *testing.T) {
	p, _ := newPipeline(t, newFake(), nil)
	a := wait(t, ask(t, p.NewWorker(), q(t, "nx.example.", dns.TypeA, false), "10.1.0.1"))
	if a.Rcode != dns.RcodeNameError || len(a.Ns) != 1 || a.IsEdns0() != nil {
		t.Fatalf("answer %v", a)
	}
}

func TestCoalescing(t *testing.T) {
	up := newFake()
	const name = "hot.example."
	up.set(name, name+" 60 IN A 192.0.2.1")
	release := up.hold(name)
	p, _ := newPipeline(t, up, nil)
	w := p.NewWorker()
	var chans []<-chan result
	for i := range 20 {
		chans = append(chans, ask(t, w, q(t, name, dns.TypeA, false), fmt.Sprintf("10.1.0.%d", i+1)))
	}
	close(release)
	for _, ch := range chans {
		if a := wait(t, ch); len(a.Answer) != 1 {
			t.Fatalf("answer %v", a)
		}
	}
	if n := up.count(name); n != 1 {
		t.Fatalf("%d upstream exchanges for 20 identical misses, want 1", n)
	}
}

// TestStaleVerify runs in a synctest bubble, so the delays are exact: a
// stale answer goes out at once when the upstream fails, after exactly the
// stale budget when it is slow.
func TestStaleVerify(t *testing.T) {
	const name = "web.example."
	const budget = 300 * time.Millisecond
	tests := []struct {
		name      string
		upstream  func(up *fakeUpstream)
		wantTTL   uint32
		wantDelay time.Duration
	}{
		{"upstream fails: stale at once", func(up *fakeUpstream) { up.setFail(errUnreachable) }, 30, 0},
		{"upstream over max_concurrent: stale at once", func(up *fakeUpstream) { up.setFail(errLimit) }, 30, 0},
		{"upstream slow: stale after the budget", func(up *fakeUpstream) { up.hold(name) }, 30, budget},
		{"upstream answers: fresh answer", func(up *fakeUpstream) { up.set(name, name+" 300 IN A 192.0.2.2") }, 300, 0},
	}
	for _, tt := range tests {
		synctest.Test(t, func(t *testing.T) {
			up := newFake()
			up.set(name, name+" 60 IN A 192.0.2.1")
			p, clk := newPipeline(t, up, func(c *Config) { c.StaleBudget = budget })
			w := p.NewWorker()
			wait(t, ask(t, w, q(t, name, dns.TypeA, false), "10.1.0.1"))
			clk.Advance(2 * time.Minute) // stale now
			tt.upstream(up)
			start := time.Now()
			a := wait(t, ask(t, w, q(t, name, dns.TypeA, false), "10.1.0.1"))
			took := time.Since(start)
			if a.Rcode != dns.RcodeSuccess || len(a.Answer) != 1 || a.Answer[0].Header().Ttl != tt.wantTTL {
				t.Fatalf("%s: answer %v, want TTL %d", tt.name, a, tt.wantTTL)
			}
			if took != tt.wantDelay {
				t.Fatalf("%s: answered after %s, want %s", tt.name, took, tt.wantDelay)
			}
		})
	}
}

// TestFailureRcode: a failed resolution with nothing stale is answered as
// LocalDNS answers it — SERVFAIL, or REFUSED when the upstream group was
// over its max_concurrent — to every query waiting on it, with an OPT for
// EDNS clients.
func TestFailureRcode(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		wantRcode  int
		wantSource string
	}{
		{"upstream unreachable", errUnreachable, dns.RcodeServerFailure, "servfail"},
		{"context deadline", &upstream.Error{Cause: context.DeadlineExceeded}, dns.RcodeServerFailure, "servfail"},
		{"over max_concurrent", errLimit, dns.RcodeRefused, "error"},
		{"over max_concurrent, wrapped again", fmt.Errorf("zone .: %w", errLimit), dns.RcodeRefused, "error"},
	}
	for _, tt := range tests {
		synctest.Test(t, func(t *testing.T) {
			const name = "fail.example."
			up := newFake()
			release := up.hold(name)
			up.setFail(tt.err)
			p, _ := newPipeline(t, up, nil)
			w := p.NewWorker()
			// Two clients on one flight.
			first := ask(t, w, q(t, name, dns.TypeA, true), "10.1.0.1")
			second := ask(t, w, q(t, name, dns.TypeA, false), "10.1.0.2")
			close(release)
			for i, ch := range []<-chan result{first, second} {
				a := wait(t, ch)
				if a.Rcode != tt.wantRcode || len(a.Answer) != 0 || a.Question[0].Name != name {
					t.Errorf("%s: client %d: answer %v, want rcode %s", tt.name, i, a, dns.RcodeToString[tt.wantRcode])
				}
				if edns := a.IsEdns0() != nil; edns != (i == 0) {
					t.Errorf("%s: client %d: OPT present %v", tt.name, i, edns)
				}
			}
			if n := up.count(name); n != 1 {
				t.Errorf("%s: %d upstream exchanges, want 1", tt.name, n)
			}
			if got := p.Answered()[tt.wantSource]; got != 2 {
				t.Errorf("%s: %d answers from %s, want 2 (%v)", tt.name, got, tt.wantSource, p.Answered())
			}
			if got := p.stats.failures.Load(); got != 1 {
				t.Errorf("%s: resolve failures %d, want 1", tt.name, got)
			}
		})
	}
}

func TestUncachedServfailWithinBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = 100 * time.Millisecond
		up := newFake()
		up.hold("slow.example.")
		p, _ := newPipeline(t, up, func(c *Config) { c.UpstreamTimeout = timeout })
		start := time.Now()
		a := wait(t, ask(t, p.NewWorker(), q(t, "slow.example.", dns.TypeA, true), "10.1.0.1"))
		if a.Rcode != dns.RcodeServerFailure || time.Since(start) != timeout {
			t.Fatalf("rcode %d after %s, want SERVFAIL after the upstream timeout, %s", a.Rcode, time.Since(start), timeout)
		}
		if a.IsEdns0() == nil {
			t.Fatal("SERVFAIL to an EDNS client without OPT")
		}
	})
}

func TestStaleImmediate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const name = "imm.example."
		up := newFake()
		up.set(name, name+" 60 IN A 192.0.2.1")
		p, clk := newPipelineCache(t, up, func(c *cache.Config) { c.StaleMode = cache.StaleImmediate }, nil)
		w := p.NewWorker()
		wait(t, ask(t, w, q(t, name, dns.TypeA, false), "10.1.0.1"))
		clk.Advance(2 * time.Minute)
		up.set(name, name+" 60 IN A 192.0.2.9")

		buf := make([]byte, 512)
		n, act := w.Answer(buf, q(t, name, dns.TypeA, false), true)
		a := new(dns.Msg)
		if act != Reply || a.Unpack(buf[:n]) != nil || a.Answer[0].Header().Ttl != 30 {
			t.Fatalf("immediate mode did not serve stale on the hot path: action %d %v", act, a)
		}
		// The background refresh lands in the cache.
		synctest.Wait()
		n, act = w.Answer(buf, q(t, name, dns.TypeA, false), true)
		if act != Reply || a.Unpack(buf[:n]) != nil || a.Answer[0].(*dns.A).A.String() != "192.0.2.9" {
			t.Fatalf("refresh did not land: action %d %v; upstream calls %d", act, a, up.count(name))
		}
	})
}

func TestCaps(t *testing.T) {
	type step struct {
		name   string // under example. unless it says otherwise
		client string // 10.1.0.N
		tcp    bool
		want   string // waiting (on a flight), servfail, tc (empty, truncated) or stale
	}
	tests := []struct {
		name    string
		mod     func(*Config)
		steps   []step
		over    [numOver]uint64 // overload counters after the steps
		flights int             // upstream exchanges started
	}{
		{"per client, UDP: TC to ask again over TCP", func(c *Config) { c.MaxPerClient = 2 }, []step{
			{"a1", "1", false, "waiting"}, {"a2", "1", false, "waiting"}, {"a3", "1", false, "tc"},
			{"b1", "2", false, "waiting"},
		}, [numOver]uint64{overClient: 1}, 3},
		{"per client, TCP apart from UDP: SERVFAIL", func(c *Config) { c.MaxPerClient = 2 }, []step{
			{"a1", "1", false, "waiting"}, {"a2", "1", false, "waiting"},
			{"a3", "1", true, "waiting"}, {"a4", "1", true, "waiting"}, {"a5", "1", true, "servfail"},
		}, [numOver]uint64{overClient: 1}, 4},
		{"per client: joining a flight counts", func(c *Config) { c.MaxPerClient = 2 }, []step{
			{"a1", "1", false, "waiting"}, {"a1", "1", false, "waiting"}, {"a1", "1", false, "tc"},
		}, [numOver]uint64{overClient: 1}, 1},
		{"per zone: names under one registrable domain share it", func(c *Config) { c.MaxPerZone = 2 }, []step{
			{"x1.slow.test.", "1", false, "waiting"}, {"x2.y.slow.test.", "2", false, "waiting"},
			{"x3.slow.test.", "3", true, "servfail"},
			{"a1", "3", false, "waiting"}, {"x1.slow.test.", "4", false, "waiting"}, // another zone; joining a flight
		}, [numOver]uint64{overZone: 1}, 3},
		{"global: new names get three quarters", func(c *Config) { c.MaxInflight = 4 }, []step{
			{"a1", "1", false, "waiting"}, {"a2", "2", false, "waiting"}, {"a3", "3", false, "waiting"},
			{"a4", "4", false, "servfail"}, {"a4", "4", true, "servfail"},
			{"known1", "5", false, "waiting"}, // the cache knows it: the last quarter
			{"known2", "5", false, "stale"},   // over the whole cap
			{"a1", "6", false, "waiting"},     // joining a flight
		}, [numOver]uint64{overGlobal: 3}, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				up := newFake()
				p, clk := newPipeline(t, up, tt.mod)
				w := p.NewWorker()
				// known1 and known2 are in the cache, stale.
				for _, n := range []string{"known1.example.", "known2.example."} {
					up.set(n, n+" 30 IN A 192.0.2.1")
					wait(t, ask(t, w, q(t, n, dns.TypeA, false), "10.1.0.9"))
				}
				clk.Advance(time.Minute)
				for _, n := range []string{"known1.example.", "known2.example."} {
					up.hold(n)
				}
				names := map[string]bool{"known1.example.": true, "known2.example.": true}
				for i, st := range tt.steps {
					name := st.name
					if !strings.HasSuffix(name, ".") {
						name += ".example."
					}
					if !strings.HasPrefix(name, "known") {
						up.hold(name)
					}
					names[name] = true
					ch := askOver(t, w, q(t, name, dns.TypeA, false), "10.1.0."+st.client, !st.tcp)
					synctest.Wait()
					got := "waiting"
					select {
					case r := <-ch:
						switch {
						case r.err != nil:
							got = r.err.Error()
						case r.msg.Truncated && len(r.msg.Answer) == 0 && r.msg.Rcode == dns.RcodeSuccess:
							got = "tc"
						case r.msg.Rcode == dns.RcodeServerFailure:
							got = "servfail"
						case len(r.msg.Answer) == 1 && r.msg.Answer[0].Header().Ttl == 30:
							got = "stale"
						default:
							got = r.msg.String()
						}
					default:
					}
					if got != st.want {
						t.Errorf("step %d, %s from 10.1.0.%s (tcp %v): %s, want %s", i, name, st.client, st.tcp, got, st.want)
					}
				}
				started := 0
				for n := range names {
					started += up.count(n)
				}
				started -= 2 // the cache's warm-up
				if started != tt.flights {
					t.Errorf("%d upstream exchanges, want %d", started, tt.flights)
				}
				for i := range numOver {
					if got := p.stats.overload[i].Load(); got != tt.over[i] {
						t.Errorf("capped by %s: %d, want %d", overNames[i], got, tt.over[i])
					}
				}
				// Once the flights time out, nothing counts against a cap.
				time.Sleep(time.Second)
				synctest.Wait()
				p.mu.Lock()
				defer p.mu.Unlock()
				if len(p.flights)+len(p.perZone)+len(p.perClient)+p.waiting != 0 {
					t.Errorf("after the flights: %d flights, %d zones, %d clients, %d waiting", len(p.flights), len(p.perZone), len(p.perClient), p.waiting)
				}
			})
		})
	}
}

func TestWaitingBytesCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := newFake()
		release := up.hold("n0.example.")
		up.hold("n1.example.")
		// Room for two waiters of these names, not three.
		cost := waiterCost(&waiter{q: wire.Query{QName: make([]byte, len("\x02n0\x07example\x00"))}})
		p, _ := newPipeline(t, up, func(c *Config) { c.MaxWaitingBytes = 2*cost + cost/2 })
		w := p.NewWorker()
		first := ask(t, w, q(t, "n0.example.", dns.TypeA, false), "10.1.0.1")
		ask(t, w, q(t, "n1.example.", dns.TypeA, false), "10.1.0.2")
		over := wait(t, ask(t, w, q(t, "n0.example.", dns.TypeA, false), "10.1.0.3"))
		if over.Rcode != dns.RcodeServerFailure {
			t.Fatalf("over the byte cap: rcode %s, want SERVFAIL", dns.RcodeToString[over.Rcode])
		}
		if n := p.stats.overload[overGlobal].Load(); n != 1 {
			t.Fatalf("global overload counter %d, want 1", n)
		}
		close(release)
		wait(t, first)
		synctest.Wait()
		p.mu.Lock()
		waiting, bytes := p.waiting, p.waitingBytes
		p.mu.Unlock()
		if waiting != 1 || bytes != cost {
			t.Fatalf("after one flight ended: %d waiting, %d bytes; want 1 and %d", waiting, bytes, cost)
		}
	})
}

// TestResolveKeepsNoQueryBytes: Resolve reads msg during the call only —
// the caller reuses the buffer at once (the responder's read buffers) —
// and the answer still carries the client's ID, question in its 0x20
// case, RD, CD and EDNS facts.
func TestResolveKeepsNoQueryBytes(t *testing.T) {
	up := newFake()
	up.set("svc.example.", "svc.example. 30 IN A 192.0.2.7")
	release := up.hold("svc.example.")
	p, _ := newPipeline(t, up, nil)
	m := new(dns.Msg)
	m.SetQuestion("SvC.ExAmPlE.", dns.TypeA)
	m.Id = 0x1234
	m.CheckingDisabled = true
	m.SetEdns0(1232, true)
	m.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_NSID{Code: dns.EDNS0NSID}}
	raw, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	buf := append(make([]byte, 0, 512), raw...)
	got := make(chan *dns.Msg, 1)
	p.Resolve(buf, netip.MustParseAddrPort("10.1.0.1:5353"), true, func(b []byte) {
		r := new(dns.Msg)
		if err := r.Unpack(b); err != nil {
			t.Errorf("reply does not unpack: %v", err)
		}
		got <- r
	})
	for i := range buf {
		buf[i] = 0xff
	}
	close(release)
	var r *dns.Msg
	select {
	case r = <-got:
	case <-time.After(3 * time.Second):
		t.Fatal("no reply")
	}
	opt := r.IsEdns0()
	switch {
	case r.Id != 0x1234 || r.Question[0].Name != "SvC.ExAmPlE." || !r.RecursionDesired || !r.CheckingDisabled:
		t.Errorf("reply header or question not the client's: %v", r)
	case len(r.Answer) != 1 || opt == nil || !opt.Do() || len(opt.Option) != 1:
		t.Errorf("reply records or OPT: %v", r)
	}
}

// TestResolveRefuses: Resolve itself refuses what Worker.Answer refuses
// before a query waits — records a query has no use for, a TCP query
// longer than any — and asks no upstream for them.
func TestResolveRefuses(t *testing.T) {
	up := newFake()
	p, _ := newPipeline(t, up, nil)
	a, _ := dns.NewRR("a.example. 1 IN A 192.0.2.1")
	padded := func(mod func(*dns.Msg)) []byte {
		m := new(dns.Msg)
		m.SetQuestion("a.example.", dns.TypeA)
		m.Id = 0x7777
		mod(m)
		b, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	tests := []struct {
		name      string
		raw       []byte
		udp       bool
		wantReply bool
	}{
		{"an answer record", padded(func(m *dns.Msg) { m.Answer = []dns.RR{a} }), true, true},
		{"an additional A beside the OPT", padded(func(m *dns.Msg) { m.SetEdns0(1232, false); m.Extra = append(m.Extra, a) }), false, true},
		{"TCP query over 512 bytes", padded(func(m *dns.Msg) {
			m.SetEdns0(1232, false)
			m.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_PADDING{Padding: make([]byte, 600)}}
		}), false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := make(chan []byte, 1)
			p.Resolve(tt.raw, netip.MustParseAddrPort("10.1.0.1:5353"), tt.udp, func(b []byte) { got <- append([]byte(nil), b...) })
			select {
			case b := <-got:
				r := new(dns.Msg)
				if err := r.Unpack(b); err != nil {
					t.Fatalf("reply does not unpack: %v", err)
				}
				if !tt.wantReply || r.Rcode != dns.RcodeFormatError || r.Id != 0x7777 || len(r.Question) != 0 {
					t.Errorf("reply %v, want FORMERR with the header only", r)
				}
			default:
				if tt.wantReply {
					t.Errorf("no reply, want FORMERR at once")
				}
			}
			if n := up.count("a.example."); n != 0 {
				t.Errorf("%d upstream exchanges, want none", n)
			}
		})
	}
}

func TestRoutesAndCDKey(t *testing.T) {
	cluster, other := newFake(), newFake()
	cluster.set("svc.cluster.local.", "svc.cluster.local. 30 IN A 10.0.0.1")
	other.set("www.example.", "www.example. 30 IN A 192.0.2.1")
	other.noCD = true
	p, _ := newPipeline(t, nil, func(c *Config) {
		c.Routes = []Route{{Zone: ".", Upstream: other}, {Zone: "Cluster.Local", Upstream: cluster}}
	})
	w := p.NewWorker()
	wait(t, ask(t, w, q(t, "svc.cluster.local.", dns.TypeA, false), "10.1.0.1"))
	wait(t, ask(t, w, q(t, "www.example.", dns.TypeA, false), "10.1.0.1"))
	if cluster.count("svc.cluster.local.") != 1 || other.count("www.example.") != 1 || other.count("svc.cluster.local.") != 0 {
		t.Fatal("queries went to the wrong upstream")
	}
	// A CD=1 query answered by an upstream that drops CD must not be
	// cached under the CD=0 key.
	m := new(dns.Msg)
	m.SetQuestion("cd.example.", dns.TypeA)
	m.CheckingDisabled = true
	other.set("cd.example.", "cd.example. 30 IN A 192.0.2.3")
	raw, _ := m.Pack()
	wait(t, ask(t, w, raw, "10.1.0.1"))
	buf := make([]byte, 512)
	if _, act := w.Answer(buf, q(t, "cd.example.", dns.TypeA, false), true); act != Resolve {
		t.Fatal("a CD=1 answer was served to a CD=0 query")
	}
	if _, act := w.Answer(buf, raw, true); act != Reply {
		t.Fatal("the CD=1 answer was not cached under the CD=1 key")
	}
}

func TestNoRouteRefused(t *testing.T) {
	p, _ := newPipeline(t, nil, func(c *Config) { c.Routes = []Route{{Zone: "cluster.local.", Upstream: newFake()}} })
	a := wait(t, ask(t, p.NewWorker(), q(t, "www.example.", dns.TypeA, false), "10.1.0.1"))
	if a.Rcode != dns.RcodeRefused {
		t.Fatalf("rcode %d, want REFUSED", a.Rcode)
	}
}

// bigUncacheable answers with a large NXDOMAIN without SOA, which the
// cache refuses: its answers are rendered from the message. The answer
// has a CNAME chain, the authority many NS, the additional their glue.
type bigUncacheable struct{}

func (bigUncacheable) Exchange(ctx context.Context, req *dns.Msg) (*dns.Msg, error) {
	resp := new(dns.Msg)
	resp.SetReply(req)
	resp.Rcode = dns.RcodeNameError
	resp.RecursionAvailable = true
	name := req.Question[0].Name
	for i := range 10 {
		rr, _ := dns.NewRR(fmt.Sprintf("%s 60 IN CNAME c%d.example.", name, i))
		resp.Answer = append(resp.Answer, rr)
		name = fmt.Sprintf("c%d.example.", i)
	}
	for i := range 20 {
		ns, _ := dns.NewRR(fmt.Sprintf("example. 60 IN NS a-long-server-name-%02d.example.", i))
		glue, _ := dns.NewRR(fmt.Sprintf("a-long-server-name-%02d.example. 60 IN A 192.0.2.%d", i, i))
		resp.Ns = append(resp.Ns, ns)
		resp.Extra = append(resp.Extra, glue)
	}
	return resp, nil
}

// TestLargeUpstreamAnswerTruncated: an upstream answer too large for the
// client is cut as CoreDNS cuts it (miekg/dns's Truncate), whether it went
// through the cache or was rendered from the message: the same records,
// TC, and the OPT kept.
func TestLargeUpstreamAnswerTruncated(t *testing.T) {
	up := newFake()
	var rrs []string
	for i := range 100 {
		rrs = append(rrs, fmt.Sprintf("big.example. 30 IN A 10.0.0.%d", i))
	}
	up.set("big.example.", rrs...)
	tests := []struct {
		name     string
		upstream Exchanger
		qname    string
		edns     int // -1: none
		udp      bool
	}{
		{"cached, no EDNS", up, "big.example.", -1, true},
		{"cached, EDNS 1232", up, "big.example.", 1232, true},
		{"cached, EDNS 4096", up, "big.example.", 4096, true},
		{"cached, TCP", up, "big.example.", -1, false},
		{"rendered, no EDNS", bigUncacheable{}, "gone.example.", -1, true},
		{"rendered, EDNS 600", bigUncacheable{}, "gone.example.", 600, true},
		{"rendered, EDNS 1232", bigUncacheable{}, "gone.example.", 1232, true},
		{"rendered, TCP", bigUncacheable{}, "gone.example.", -1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, _ := newPipeline(t, tt.upstream, nil)
			w := p.NewWorker()
			m := new(dns.Msg)
			m.SetQuestion(tt.qname, dns.TypeA)
			if tt.edns >= 0 {
				m.SetEdns0(uint16(tt.edns), false)
			}
			raw, err := m.Pack()
			if err != nil {
				t.Fatal(err)
			}
			for _, pass := range []string{"miss", "again"} {
				got := make(chan []byte, 1)
				buf := make([]byte, 65535)
				n, act := w.Answer(buf, raw, tt.udp)
				switch act {
				case Reply:
					got <- buf[:n]
				case Resolve:
					p.Resolve(append([]byte(nil), raw...), netip.MustParseAddrPort("10.1.0.1:5353"), tt.udp, func(b []byte) { got <- b })
				}
				b := <-got
				limit := wire.MaxMsgLen
				if tt.udp {
					limit = max(tt.edns, 512)
				}
				if len(b) > limit {
					t.Fatalf("%s: %d bytes, limit %d", pass, len(b), limit)
				}
				a := new(dns.Msg)
				if err := a.Unpack(b); err != nil {
					t.Fatalf("%s: %v", pass, err)
				}
				// CoreDNS's cut of the whole upstream answer, with our OPT.
				full, _ := tt.upstream.Exchange(context.Background(), m)
				full.Extra = slices.DeleteFunc(full.Extra, func(r dns.RR) bool { return r.Header().Rrtype == dns.TypeOPT })
				if tt.edns >= 0 {
					full.SetEdns0(1232, false)
				}
				full.Truncate(limit)
				if a.Truncated != full.Truncated || len(a.Answer) != len(full.Answer) || len(a.Ns) != len(full.Ns) || len(a.Extra) != len(full.Extra) {
					t.Fatalf("%s: TC=%v with %d/%d/%d records, CoreDNS: TC=%v with %d/%d/%d", pass, a.Truncated,
						len(a.Answer), len(a.Ns), len(a.Extra), full.Truncated, len(full.Answer), len(full.Ns), len(full.Extra))
				}
				if (a.IsEdns0() != nil) != (tt.edns >= 0) {
					t.Fatalf("%s: OPT present %v", pass, a.IsEdns0() != nil)
				}
			}
		})
	}
}

// TestReplyFlags: AA and RA on each kind of answer are what LocalDNS
// (CoreDNS with forward and cache) sends: a cache hit or stale answer has
// AA set (CoreDNS's cache sets it) and the upstream's RA; the answer that
// fills the cache, and one rendered from an uncached reply, have the
// upstream's AA and RA; SERVFAIL and REFUSED made by dnsstandby have
// neither, as CoreDNS's own errors; FORMERR and NOTIMP echo the query's
// RA, as miekg/dns's rejections do.
func TestReplyFlags(t *testing.T) {
	const name = "flags.example."
	tests := []struct {
		name   string
		setup  func(up *fakeUpstream, clk *clock, w *Worker) // before the query
		mod    func(m *dns.Msg)
		route  string // "" routes everything to the fake
		wantAA bool
		wantRA bool
	}{
		{name: "upstream answer (not authoritative)", wantAA: false, wantRA: true},
		{name: "cache hit", setup: func(up *fakeUpstream, clk *clock, w *Worker) {
			wait(t, ask(t, w, q(t, name, dns.TypeA, false), "10.1.0.1"))
		}, wantAA: true, wantRA: true},
		{name: "stale", setup: func(up *fakeUpstream, clk *clock, w *Worker) {
			wait(t, ask(t, w, q(t, name, dns.TypeA, false), "10.1.0.1"))
			clk.Advance(2 * time.Minute)
			up.setFail(errUnreachable)
		}, wantAA: true, wantRA: true},
		{name: "SERVFAIL", setup: func(up *fakeUpstream, clk *clock, w *Worker) { up.setFail(errUnreachable) }},
		{name: "REFUSED over max_concurrent", setup: func(up *fakeUpstream, clk *clock, w *Worker) { up.setFail(errLimit) }},
		{name: "REFUSED, no route", route: "cluster.local."},
		{name: "FORMERR, RA in the query", mod: func(m *dns.Msg) { m.RecursionAvailable = true; m.Question = nil }, wantRA: true},
		{name: "NOTIMP", mod: func(m *dns.Msg) { m.Opcode = dns.OpcodeUpdate }},
		{name: "NOTIMP, RA in the query", mod: func(m *dns.Msg) { m.Opcode = dns.OpcodeStatus; m.RecursionAvailable = true }, wantRA: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := newFake()
			up.set(name, name+" 60 IN A 192.0.2.1")
			p, clk := newPipeline(t, up, func(c *Config) {
				if tt.route != "" {
					c.Routes = []Route{{Zone: tt.route, Upstream: up}}
				}
			})
			w := p.NewWorker()
			if tt.setup != nil {
				tt.setup(up, clk, w)
			}
			m := new(dns.Msg)
			m.SetQuestion(name, dns.TypeA)
			m.Id = 0x7777
			if tt.mod != nil {
				tt.mod(m)
			}
			raw, err := m.Pack()
			if err != nil {
				t.Fatal(err)
			}
			a := wait(t, ask(t, w, raw, "10.1.0.2"))
			if a.Authoritative != tt.wantAA || a.RecursionAvailable != tt.wantRA {
				t.Fatalf("%s: AA %v RA %v, want AA %v RA %v", dns.RcodeToString[a.Rcode], a.Authoritative, a.RecursionAvailable, tt.wantAA, tt.wantRA)
			}
		})
	}
}

func TestDrainWaitsForInflight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := newFake()
		release := up.hold("d.example.")
		up.set("d.example.", "d.example. 30 IN A 192.0.2.1")
		p, _ := newPipeline(t, up, nil)
		ch := ask(t, p.NewWorker(), q(t, "d.example.", dns.TypeA, false), "10.1.0.1")
		go func() {
			time.Sleep(30 * time.Millisecond)
			close(release)
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		p.Drain(ctx)
		select {
		case r := <-ch:
			if r.err != nil || len(r.msg.Answer) != 1 {
				t.Fatalf("in-flight query answered badly: %v %v", r.msg, r.err)
			}
		default:
			t.Fatal("Drain returned before the in-flight query was answered")
		}
	})
}

// deaf is an Exchanger that ignores its context: it returns only when
// released.
type deaf struct{ release chan struct{} }

func (d deaf) Exchange(context.Context, *dns.Msg) (*dns.Msg, error) {
	<-d.release
	return nil, errors.New("released")
}

// TestDrainBounded: Drain returns by its context's end and cancelGrace
// whatever the upstream does, and the waiting client gets SERVFAIL
// first; so does a query whose upstream outlives UpstreamTimeout.
func TestDrainBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := deaf{release: make(chan struct{})}
		defer close(up.release)
		p, _ := newPipeline(t, up, func(c *Config) { c.UpstreamTimeout = time.Hour })
		ch := ask(t, p.NewWorker(), q(t, "d.example.", dns.TypeA, false), "10.1.0.1")
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		p.Drain(ctx)
		if took := time.Since(start); took > 100*time.Millisecond+cancelGrace {
			t.Errorf("Drain took %s, want at most %s", took, 100*time.Millisecond+cancelGrace)
		}
		select {
		case r := <-ch:
			if r.err != nil || r.msg.Rcode != dns.RcodeServerFailure {
				t.Errorf("cancelled query: %v %v, want SERVFAIL", r.msg, r.err)
			}
		default:
			t.Error("Drain returned before the cancelled query was answered")
		}
	})
	synctest.Test(t, func(t *testing.T) {
		up := deaf{release: make(chan struct{})}
		defer close(up.release)
		p, _ := newPipeline(t, up, func(c *Config) { c.UpstreamTimeout = time.Second })
		start := time.Now()
		r := wait(t, ask(t, p.NewWorker(), q(t, "d.example.", dns.TypeA, false), "10.1.0.1"))
		if took := time.Since(start); r.Rcode != dns.RcodeServerFailure || took != time.Second {
			t.Errorf("upstream that ignores its timeout: %s after %s, want SERVFAIL after 1s", dns.RcodeToString[r.Rcode], took)
		}
	})
}

// TestUDPWaitersFirst: a flight answers its UDP waiters before its TCP
// ones, whatever order they joined in.
func TestUDPWaitersFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := newFake()
		up.set("o.example.", "o.example. 30 IN A 192.0.2.1")
		release := up.hold("o.example.")
		p, _ := newPipeline(t, up, nil)
		var mu sync.Mutex
		var order []string
		for i, udp := range []bool{false, false, true, false, true} {
			name := fmt.Sprintf("tcp%d", i)
			if udp {
				name = fmt.Sprintf("udp%d", i)
			}
			p.Resolve(q(t, "o.example.", dns.TypeA, false), netip.AddrPortFrom(netip.MustParseAddr("10.1.0.1"), uint16(5000+i)), udp,
				func([]byte) { mu.Lock(); order = append(order, name); mu.Unlock() })
		}
		close(release)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		if want := []string{"udp2", "udp4", "tcp0", "tcp1", "tcp3"}; !slices.Equal(order, want) {
			t.Errorf("answered in order %v, want %v", order, want)
		}
	})
}

// uncacheable answers an NXDOMAIN with a CNAME and no SOA, which the cache
// refuses (RFC 2308 §5).
type uncacheable struct{}

func (uncacheable) Exchange(ctx context.Context, req *dns.Msg) (*dns.Msg, error) {
	resp := new(dns.Msg)
	resp.SetReply(req)
	resp.Rcode = dns.RcodeNameError
	cname, _ := dns.NewRR(req.Question[0].Name + " 120 IN CNAME gone.example.")
	ns, _ := dns.NewRR("example. 300 IN NS ns.example.")
	resp.Answer, resp.Ns = []dns.RR{cname}, []dns.RR{ns}
	return resp, nil
}

func TestUncachedReplyTTLCapped(t *testing.T) {
	p, _ := newPipeline(t, uncacheable{}, nil)
	w := p.NewWorker()
	for range 2 { // not cached: both go upstream, both capped
		a := wait(t, ask(t, w, q(t, "dangling.example.", dns.TypeA, false), "10.1.0.1"))
		if a.Rcode != dns.RcodeNameError || len(a.Answer) != 1 || a.Answer[0].Header().Ttl != 5 || a.Ns[0].Header().Ttl != 5 {
			t.Fatalf("answer %v, want NXDOMAIN with TTLs capped at 5", a)
		}
	}
	if got := p.Answered()["upstream"]; got != 2 {
		t.Fatalf("%d upstream answers, want 2", got)
	}
}

func TestRefreshAhead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const name = "ahead.example."
		up := newFake()
		up.set(name, name+" 60 IN A 192.0.2.1")
		p, clk := newPipeline(t, up, nil)
		w := p.NewWorker()
		wait(t, ask(t, w, q(t, name, dns.TypeA, false), "10.1.0.1"))
		up.set(name, name+" 60 IN A 192.0.2.2")

		clk.Advance(30 * time.Second) // fresh, not yet expiring: no refresh
		buf := make([]byte, 512)
		if _, act := w.Answer(buf, q(t, name, dns.TypeA, false), true); act != Reply {
			t.Fatal("not a hit")
		}
		synctest.Wait() // a refresh, had one started, would be done
		if n := up.count(name); n != 1 {
			t.Fatalf("%d upstream calls at half life, want 1", n)
		}

		clk.Advance(25 * time.Second) // 5 s left of 60: the last tenth
		if _, act := w.Answer(buf, q(t, name, dns.TypeA, false), true); act != Reply {
			t.Fatal("expiring entry not served")
		}
		synctest.Wait()
		if n := up.count(name); n != 2 {
			t.Fatalf("%d upstream calls after an expiring hit, want 2", n)
		}
		// The refreshed answer is in the cache, fresh for another 60 s.
		n, _ := w.Answer(buf, q(t, name, dns.TypeA, false), true)
		a := new(dns.Msg)
		if a.Unpack(buf[:n]) != nil || len(a.Answer) != 1 || a.Answer[0].(*dns.A).A.String() != "192.0.2.2" || a.Answer[0].Header().Ttl != 60 {
			t.Fatalf("refreshed answer not served: %v", a)
		}
	})
}

// TestTokenBucket runs in a bubble, where time stands still until the
// test sleeps: the burst, then exactly the refill.
func TestTokenBucket(t *testing.T) {
	tests := []struct {
		name        string
		rate, burst float64
		sleep       time.Duration
		want        int // allowed of 100 tries after sleep
	}{
		{"burst", 10, 3, 0, 3},
		{"refill after 200ms at 10/s", 10, 3, 200 * time.Millisecond, 5},
		{"refill capped at the burst", 10, 3, time.Hour, 6},
		{"rate 0", 0, 0, 0, 0},
	}
	for _, tt := range tests {
		synctest.Test(t, func(t *testing.T) {
			b := newTokenBucket(tt.rate, tt.burst)
			got := 0
			try := func() {
				for range 100 {
					if b.allow() {
						got++
					}
				}
			}
			try()
			if tt.sleep > 0 {
				time.Sleep(tt.sleep)
				try()
			}
			if got != tt.want {
				t.Errorf("%s: %d allowed, want %d", tt.name, got, tt.want)
			}
		})
	}
}

// TestLimitExceededFromGroup runs the REFUSED path against a real
// upstream.Group with MaxConcurrent 1 whose server never answers: the
// first miss holds the group's one slot, the second is refused at once.
// Real sockets: no synctest bubble here.
func TestLimitExceededFromGroup(t *testing.T) {
	silent, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	ucfg := upstream.DefaultConfig()
	ucfg.Servers = []netip.AddrPort{silent.LocalAddr().(*net.UDPAddr).AddrPort()}
	ucfg.MaxConcurrent = 1
	ucfg.Logger = testkit.Logger(t)
	g, err := upstream.New(ucfg)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	p, _ := newPipeline(t, g, func(c *Config) { c.UpstreamTimeout = 200 * time.Millisecond })
	w := p.NewWorker()
	held := ask(t, w, q(t, "held.example.", dns.TypeA, false), "10.1.0.1")
	// Its query reaching the server shows it holds the slot.
	_ = silent.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := silent.Read(make([]byte, 512)); err != nil {
		t.Fatalf("the first miss did not reach the server: %v", err)
	}
	if a := wait(t, ask(t, w, q(t, "refused.example.", dns.TypeA, false), "10.1.0.2")); a.Rcode != dns.RcodeRefused {
		t.Errorf("miss over the group's max_concurrent: rcode %s, want REFUSED", dns.RcodeToString[a.Rcode])
	}
	if a := wait(t, held); a.Rcode != dns.RcodeServerFailure {
		t.Errorf("miss the server never answered: rcode %s, want SERVFAIL", dns.RcodeToString[a.Rcode])
	}
}

// TestNew: New takes the Config as given and names the field it rejects.
func TestNew(t *testing.T) {
	c := newCache(t, nil, nil)
	tests := []struct {
		name    string
		mod     func(*Config)
		wantErr string // "" for success
	}{
		{"defaults", func(*Config) {}, ""},
		{"refresh off", func(c *Config) { c.RefreshRate = 0 }, ""},
		{"no cache", func(c *Config) { c.Routes[0].Cache = nil }, "pipeline: Routes: route . has no cache"},
		{"direct, no cache", func(c *Config) {
			c.Routes[0] = Route{Zone: ".", Direct: func(*dns.Msg, netip.AddrPort, bool) *dns.Msg { return nil }}
		}, ""},
		{"no routes", func(c *Config) { c.Routes = nil }, "pipeline: Routes is empty"},
		{"route twice", func(c *Config) { c.Routes = append(c.Routes, c.Routes[0]) }, "pipeline: Routes: zone . routed twice"},
		{"zero stale budget", func(c *Config) { c.StaleBudget = 0 }, "pipeline: StaleBudget must be positive, got 0s"},
		{"zero upstream timeout", func(c *Config) { c.UpstreamTimeout = 0 }, "pipeline: UpstreamTimeout must be positive, got 0s"},
		{"zero max inflight", func(c *Config) { c.MaxInflight = 0 }, "pipeline: MaxInflight must be positive, got 0"},
		{"zero max per client", func(c *Config) { c.MaxPerClient = 0 }, "pipeline: MaxPerClient must be positive, got 0"},
		{"zero max waiting bytes", func(c *Config) { c.MaxWaitingBytes = 0 }, "pipeline: MaxWaitingBytes must be positive, got 0"},
		{"negative refresh rate", func(c *Config) { c.RefreshRate = -1 }, "pipeline: RefreshRate must not be negative, got -1"},
		{"small udp size", func(c *Config) { c.UDPSize = 511 }, "pipeline: UDPSize must be at least 512, got 511"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Routes = []Route{{Zone: ".", Upstream: newFake(), Cache: c}}
			tt.mod(&cfg)
			p, err := New(cfg)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				if p.cfg.RefreshRate != cfg.RefreshRate || p.cfg.MaxInflight != cfg.MaxInflight {
					t.Errorf("config changed by New: %+v", p.cfg)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("New: %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}

// TestCachedForHedge: Cached answers from the cache alone, fresh, or stale
// whatever the stale mode (LocalDNS has left the query unanswered), and
// never calls the upstreams, not even to refresh what it served stale
// (LocalDNS is fetching it).
// Fresh says only whether a fresh answer is there, counting nothing.
func TestCachedForHedge(t *testing.T) {
	const name = "web.example."
	tests := []struct {
		name      string
		fill      bool          // resolve the name once first
		age       time.Duration // then advance the clock by this much
		query     []byte
		wantN     bool
		wantStale bool
	}{
		{name: "fresh", fill: true, wantN: true},
		{name: "stale, verify mode", fill: true, age: 2 * time.Minute, wantN: true, wantStale: true},
		{name: "not cached", wantN: false},
		{name: "not a query", fill: true, query: []byte{0x77, 0x77, 0x81, 0, 0, 1, 0, 0, 0, 0, 0, 0}, wantN: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := newFake()
			up.set(name, name+" 60 IN A 192.0.2.1")
			p, clk := newPipeline(t, up, nil)
			w := p.NewWorker()
			if tt.fill {
				wait(t, ask(t, w, q(t, name, dns.TypeA, false), "10.1.0.1"))
			}
			clk.Advance(tt.age)
			msg := tt.query
			if msg == nil {
				msg = q(t, name, dns.TypeA, true)
			}
			calls := up.count(name)
			buf := make([]byte, MaxUDPAnswer)
			before := (*p.routes.Load())[0].Cache.Stats()
			if fresh := w.Fresh(msg); fresh != (tt.wantN && !tt.wantStale) {
				t.Fatalf("Fresh = %v, want %v", fresh, tt.wantN && !tt.wantStale)
			}
			if after := (*p.routes.Load())[0].Cache.Stats(); after.Hits != before.Hits || after.Misses != before.Misses || after.StaleHits != before.StaleHits {
				t.Fatalf("Fresh counted: cache stats %+v, were %+v", after, before)
			}
			n, stale := w.Cached(buf, msg)
			if (n > 0) != tt.wantN || stale != tt.wantStale {
				t.Fatalf("Cached = %d bytes, stale %v; want answer %v, stale %v", n, stale, tt.wantN, tt.wantStale)
			}
			if n > 0 {
				var m dns.Msg
				if err := m.Unpack(buf[:n]); err != nil || m.Id != 0x7777 || len(m.Answer) != 1 {
					t.Fatalf("answer %v, %v", &m, err)
				}
			}
			// A refresh is counted when started; its query goes out later.
			if got := up.count(name); got != calls || p.stats.refreshes.Load() != 0 {
				t.Fatalf("Cached called the upstream (%d calls, had %d; %d refreshes)", got, calls, p.stats.refreshes.Load())
			}
		})
	}
}
