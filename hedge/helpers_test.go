package hedge

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// t0 is the fake clock's start, unix ns.
const t0 = int64(1_700_000_000) * 1e9

const ms = int64(time.Millisecond)

// fakeAnswerer is the daemon's side: a cache holding some names, an
// upstream whose answers the test delivers, and a socket that records.
type fakeAnswerer struct {
	mu       sync.Mutex
	names    map[string]bool // lower-cased qnames the cache answers
	stale    bool
	sendErr  error
	sent     []sent
	resolves []resolveCall
	lookups  int
}

type sent struct {
	client netip.AddrPort
	msg    []byte
}

type resolveCall struct {
	client netip.AddrPort
	query  []byte
	send   func([]byte)
}

func newFakeAnswerer(names ...string) *fakeAnswerer {
	a := &fakeAnswerer{names: map[string]bool{}}
	for _, n := range names {
		a.names[dns.Fqdn(strings.ToLower(n))] = true
	}
	return a
}

func (a *fakeAnswerer) Cached(dst, query []byte) (int, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lookups++
	m := new(dns.Msg)
	if err := m.Unpack(query); err != nil || len(m.Question) != 1 {
		return 0, false
	}
	if !a.names[strings.ToLower(m.Question[0].Name)] {
		return 0, false
	}
	b := answer(query, "10.0.0.99")
	return copy(dst, b), a.stale
}

func (a *fakeAnswerer) Fresh(query []byte) bool {
	n, stale := a.Cached(make([]byte, 4096), query)
	return n > 0 && !stale
}

func (a *fakeAnswerer) Resolve(client netip.AddrPort, query []byte, send func([]byte)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.resolves = append(a.resolves, resolveCall{client, append([]byte(nil), query...), send})
}

func (a *fakeAnswerer) Send(client netip.AddrPort, reply []byte) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.sendErr != nil {
		return a.sendErr
	}
	a.sent = append(a.sent, sent{client, append([]byte(nil), reply...)})
	return nil
}

func (a *fakeAnswerer) sentCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.sent)
}

// harness is a Hedger on a fake clock.
type harness struct {
	t   testing.TB
	h   *Hedger
	ans *fakeAnswerer
	now int64
	// onSilent is what the ticks call on a silence, as Run's argument.
	onSilent func(int, time.Time)
}

func newHarness(t testing.TB, cfg Config, ans *fakeAnswerer) *harness {
	t.Helper()
	x := &harness{t: t, ans: ans, now: t0}
	h, err := New(cfg, ans)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.now = func() int64 { return x.now }
	x.h = h
	return x
}

// advance moves the clock to t0+d, ticking every 5 ms on the way.
func (x *harness) advanceTo(at int64) {
	for x.now+5*ms <= at {
		x.now += 5 * ms
		x.h.tick(x.now, x.onSilent)
	}
	if x.now < at {
		x.now = at
		x.h.tick(x.now, x.onSilent)
	}
}

func (x *harness) advance(d time.Duration) { x.advanceTo(x.now + int64(d)) }

// check fails the test if the table's invariants do not hold.
func (x *harness) check() {
	x.t.Helper()
	if err := x.h.check(); err != nil {
		x.t.Fatal(err)
	}
}

func (x *harness) stat(m func(Stats) map[string]uint64, k string) uint64 {
	return m(x.h.Stats())[k]
}

func queries(s Stats) map[string]uint64   { return s.Queries }
func replies(s Stats) map[string]uint64   { return s.Replies }
func hedges(s Stats) map[string]uint64    { return s.Hedges }
func outcomesM(s Stats) map[string]uint64 { return s.Outcomes }
func skippedM(s Stats) map[string]uint64  { return s.Skipped }

var (
	podA = netip.MustParseAddrPort("10.244.1.5:40000")
	podB = netip.MustParseAddrPort("10.244.1.5:40001")
	podC = netip.MustParseAddrPort("[fd00::5]:40000")
)

// query packs a query for name (case kept) with id.
func query(id uint16, name string) []byte {
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	m.Id = id
	b, err := m.Pack()
	if err != nil {
		panic(err)
	}
	return b
}

// answer packs a reply to q with one A record.
func answer(q []byte, ip string) []byte {
	m := new(dns.Msg)
	if err := m.Unpack(q); err != nil {
		panic(err)
	}
	r := new(dns.Msg)
	r.SetReply(m)
	r.Answer = append(r.Answer, &dns.A{
		Hdr: dns.RR_Header{Name: m.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30},
		A:   net.ParseIP(ip),
	})
	b, err := r.Pack()
	if err != nil {
		panic(err)
	}
	return b
}

// check verifies the table: every slot is free or in use exactly once,
// every entry in use is in the queue its state says and found by its key,
// queue links agree both ways.
func (h *Hedger) check() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	t := &h.tab
	free := 0
	seen := make([]bool, len(t.e))
	for i := t.free; i >= 0; i = t.e[i].next {
		if seen[i] || t.e[i].state != stFree {
			return fmt.Errorf("free list: slot %d repeated or in use (state %d)", i, t.e[i].state)
		}
		seen[i] = true
		free++
	}
	inQueue := 0
	for q := range t.q {
		prev := int32(-1)
		for i := t.q[q].head; i >= 0; i = t.e[i].next {
			e := &t.e[i]
			if seen[i] {
				return fmt.Errorf("queue %d: slot %d seen twice", q, i)
			}
			seen[i] = true
			if e.prev != prev || int(e.queue) != q {
				return fmt.Errorf("queue %d: slot %d links prev %d (want %d) queue %d", q, i, e.prev, prev, e.queue)
			}
			if q == qlCache && prev >= 0 && t.e[prev].at > e.at {
				return fmt.Errorf("queue %d: slot %d arrived at %d, before slot %d ahead of it (%d)", q, i, e.at, prev, t.e[prev].at)
			}
			want := [numQueues]uint8{stCache, stUpstream, stLate, stHedged}[q]
			if e.state != want {
				return fmt.Errorf("queue %d: slot %d in state %d", q, i, e.state)
			}
			if j := t.find(e.key, e.client, e.id, t.question(i)); j != i {
				return fmt.Errorf("slot %d not found by its key (got %d)", i, j)
			}
			if e.key != h.keyHash(e.client, e.id, t.question(i)) {
				return errors.New("key hash does not match the stored query")
			}
			prev = i
			inQueue++
		}
		if t.q[q].tail != prev {
			return fmt.Errorf("queue %d: tail %d, want %d", q, t.q[q].tail, prev)
		}
	}
	if free+inQueue != len(t.e) || inQueue != t.n {
		return fmt.Errorf("free %d + queued %d != size %d, or n = %d", free, inQueue, len(t.e), t.n)
	}
	indexed := 0
	for _, b := range t.buckets {
		for i := b; i >= 0; i = t.e[i].chain {
			indexed++
			if indexed > len(t.e) {
				return errors.New("index chain loops")
			}
		}
	}
	if indexed != t.n {
		return fmt.Errorf("index holds %d, table %d", indexed, t.n)
	}
	return nil
}
