package cache

import (
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/internal/testkit"
	"github.com/dnsstandby/dnsstandby/wire"
)

// clock is a settable time source for tests.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *testClock { return &testClock{t: time.Unix(1_800_000_000, 0)} }

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// newTestCache returns a cache on a test clock, after applying mod to the
// default config.
func newTestCache(t testing.TB, mod func(*Config)) (*Cache, *testClock) {
	t.Helper()
	clk := newClock()
	cfg := DefaultConfig()
	cfg.Now = clk.Now
	cfg.Logger = testkit.Logger(t)
	if mod != nil {
		mod(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c, clk
}

func rr(t testing.TB, s string) dns.RR {
	t.Helper()
	r, err := dns.NewRR(s)
	if err != nil {
		t.Fatalf("NewRR(%q): %v", s, err)
	}
	return r
}

// reply builds a response to (name, qtype) with the given records.
func reply(t testing.TB, name string, qtype uint16, rcode int, answer, ns []string) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	m.Response = true
	m.RecursionAvailable = true
	m.Rcode = rcode
	for _, s := range answer {
		m.Answer = append(m.Answer, rr(t, s))
	}
	for _, s := range ns {
		m.Ns = append(m.Ns, rr(t, s))
	}
	return m
}

func pack(t testing.TB, m *dns.Msg) []byte {
	t.Helper()
	b, err := m.Pack()
	if err != nil {
		t.Fatalf("Pack: %v", err)
	}
	return b
}

func mustInsert(t testing.TB, c *Cache, m *dns.Msg) {
	t.Helper()
	if err := c.Insert(pack(t, m)); err != nil {
		t.Fatalf("Insert %s: %v", m.Question[0].Name, err)
	}
}

// query builds a query; edns < 0 means no OPT record.
func query(t testing.TB, name string, qtype uint16, edns int, do bool) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	m.Id = 0x1234
	if edns >= 0 {
		m.SetEdns0(uint16(edns), do)
	}
	return m
}

// wireQuery packs q and parses it as the hot path does.
func wireQuery(t testing.TB, q *dns.Msg) *wire.Query {
	t.Helper()
	var wq wire.Query
	if err := wire.ParseQuery(pack(t, q), &wq); err != nil {
		t.Fatalf("ParseQuery: %v", err)
	}
	return &wq
}

// serve runs a packed query through the cache's hot path and unpacks the
// answer. It returns nil for a miss.
func serve(t testing.TB, c *Cache, q *dns.Msg, limit int, allowStale bool) (*dns.Msg, Status) {
	t.Helper()
	var wq wire.Query
	raw := pack(t, q)
	if err := wire.ParseQuery(raw, &wq); err != nil {
		t.Fatalf("ParseQuery: %v", err)
	}
	if limit == 0 {
		limit = wq.PayloadLimit()
	}
	buf := make([]byte, 65535)
	n, st := c.Serve(buf, &wq, limit, allowStale)
	if n == 0 {
		return nil, st
	}
	if n > limit {
		t.Fatalf("answer of %d bytes exceeds limit %d", n, limit)
	}
	a := new(dns.Msg)
	if err := a.Unpack(buf[:n]); err != nil {
		t.Fatalf("answer does not unpack: %v", err)
	}
	return a, st
}

// ttls lists the TTL of every record but OPT.
func ttls(m *dns.Msg) []uint32 {
	var out []uint32
	for _, sec := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, r := range sec {
			if r.Header().Rrtype != dns.TypeOPT {
				out = append(out, r.Header().Ttl)
			}
		}
	}
	return out
}
