package tap

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// seenPacket is one packet an nsObserver was shown.
type seenPacket struct {
	at             int64
	client, server netip.AddrPort
	queryAt        int64 // a reply's Packet.QueryAt
}

// nsObserver records, by question name, every query and reply a tap shows
// it, and claims as its own (a hedge) the replies for names starting with
// "hedge-".
type nsObserver struct {
	mu               sync.Mutex
	queries, replies map[string][]seenPacket
}

func newNSObserver() *nsObserver {
	return &nsObserver{queries: map[string][]seenPacket{}, replies: map[string][]seenPacket{}}
}

func (o *nsObserver) record(into map[string][]seenPacket, p *Packet) string {
	var m dns.Msg
	if m.Unpack(p.DNS) != nil || len(m.Question) != 1 {
		return ""
	}
	name := m.Question[0].Name
	o.mu.Lock()
	defer o.mu.Unlock()
	into[name] = append(into[name], seenPacket{p.At, p.Client, p.Server, p.QueryAt})
	return name
}

func (o *nsObserver) Query(p *Packet) { o.record(o.queries, p) }

func (o *nsObserver) Reply(p *Packet) bool {
	name := o.record(o.replies, p)
	if p.QueryAt != 0 {
		// Matched in the kernel: its query is shown only here.
		o.record(o.queries, &Packet{At: p.QueryAt, Client: p.Client, Server: p.Server, DNS: p.DNS})
	}
	return strings.HasPrefix(name, "hedge-")
}

func (o *nsObserver) get(name string) (queries, replies []seenPacket) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.queries[name], o.replies[name]
}

// TestTapQueries is the query side against a real CoreDNS: a tap with
// Queries shows each query to LocalDNS once and each reply once, with
// the client and server, kernel times within the exchange (the query's
// before its reply's), from a pod behind a veth (IPv4 and IPv6), a pod
// behind a bridge (where the bridge and its port may both show a query)
// and a client on the node itself (over lo, where the kernel shows each
// packet twice). A second tap without Queries, beside it, shows the
// replies only and counts as before. Replies the observer claims as its
// own hedges are neither inserted nor counted as accepted. In ring mode
// (CoreDNS in a cgroup of its own, named to both taps with SetLocalDNS)
// the same holds with every packet seen exactly once, the queries read at
// CoreDNS's cgroup's ingress, and the packet sockets read nothing.
func TestTapQueries(t *testing.T) {
	pod4, pod6 := netip.MustParseAddr("10.211.0.2"), netip.MustParseAddr("fd00:211::2")
	server4 := netip.MustParseAddrPort(bedAddr4 + ":53")
	server6 := netip.MustParseAddrPort("[" + bedAddr6 + "]:53")
	type flow struct {
		name   string
		client func(b *bed) *nstest.Namespace
		server netip.AddrPort
		from   netip.Addr // the client's address
		qtype  uint16
	}
	podV4 := flow{"pod-v4", func(b *bed) *nstest.Namespace { return b.pod }, server4, pod4, dns.TypeA}
	podV6 := flow{"pod-v6", func(b *bed) *nstest.Namespace { return b.pod }, server6, pod6, dns.TypeAAAA}
	// A node process's query to a local address leaves from that address.
	local := flow{"lo", func(b *bed) *nstest.Namespace { return b.node }, server4, server4.Addr(), dns.TypeA}
	tests := []struct {
		name          string
		bridged, ring bool
		flows         []flow
	}{
		{"veth", false, false, []flow{podV4, podV6, local}},
		{"bridge", true, false, []flow{podV4, podV6}},
		{"veth-ring", false, true, []flow{podV4, podV6, local}},
		{"bridge-ring", true, true, []flow{podV4, podV6}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			newB := newBed
			if tt.ring {
				newB = newRingBed
			}
			b := newB(t, tt.bridged)
			obs, obsOff := newNSObserver(), newNSObserver()
			recOn, recOff := newRecorder(t), newRecorder(t)
			cfg := bedConfig(t)
			if tt.ring {
				cfg = ringConfig(t)
			}
			cfg.Queries, cfg.Observer = true, obs
			on := startTap(t, b.node, cfg, recOn.sink)
			cfg.Queries, cfg.Observer = false, obsOff
			off := startTap(t, b.node, cfg, recOff.sink)
			if tt.ring {
				toRing(t, b, on, off)
				// Standing by: queries at LocalDNS's cgroup's ingress.
				if !on.Stats().QueriesAtLocalDNS {
					t.Fatal("ring mode, inserting: the queries are not read at LocalDNS's cgroup")
				}
			}
			if tt.ring {
				// From here on the packet sockets must pass nothing.
				_ = packetSocketStats(t, on, off)
			}

			const n, hedges = 30, 5
			var total uint64
			for _, f := range tt.flows {
				for i := range n + hedges {
					name := fmt.Sprintf("%s-%d.%s", f.name, i, bedZone)
					if i >= n {
						name = "hedge-" + name
					}
					before := time.Now().UnixNano()
					ask(t, f.client(b), f.server.String(), name, f.qtype)
					after := time.Now().UnixNano()
					total++
					checkExchange(t, obs, name, f.from, f.server, before, after, true)
					checkExchange(t, obsOff, name, f.from, f.server, before, after, false)
				}
			}
			var socketsPassed string
			if tt.ring {
				// Read before drained: its Stats read the sockets' counters,
				// which reset on each read.
				socketsPassed = packetSocketStats(t, on, off)
			}
			stOn, stOff := drained(t, on), drained(t, off)
			// Seen once more: the observer's view is settled now.
			for _, f := range tt.flows {
				for i := range n {
					name := fmt.Sprintf("%s-%d.%s", f.name, i, bedZone)
					if recOn.count(name) != 1 || recOff.count(name) != 1 {
						t.Errorf("%s inserted %d times with queries, %d without; want 1", name, recOn.count(name), recOff.count(name))
					}
					if recOn.count("hedge-"+name) != 0 {
						t.Errorf("own hedge hedge-%s inserted", name)
					}
				}
			}
			own := uint64(hedges * len(tt.flows))
			dupQueries := stOn.QueriesRejected["duplicate"]
			wantSeenOn := 2*total + dupQueries
			wantSeenOff := total
			if tt.ring && dupQueries != 0 {
				t.Errorf("ring mode: %d duplicate queries, want every query seen once", dupQueries)
			}
			if tt.ring && stOn.QueriesMatched == 0 {
				t.Errorf("ring mode: no query matched to its reply in the kernel, want most of %d", total)
			}
			if tt.ring {
				if got := socketsPassed; got != "[0 0][0 0]" {
					t.Errorf("ring mode: the packet sockets passed %s packets (passed, dropped), want none", got)
				}
			} else if tt.bridged {
				// Each reply leaves twice, on the bridge and its port.
				wantSeenOn += total
				wantSeenOff += total
			}
			if stOn.Queries != total || stOn.Accepted != total-own || stOn.Rejected["own_hedge"] != own ||
				stOn.Seen != wantSeenOn || stOn.KernelDrops != 0 || len(stOn.QueriesRejected) > 1 {
				t.Errorf("with queries: %+v; want %d queries, %d accepted, %d own, seen %d", stOn, total, total-own, own, wantSeenOn)
			}
			if stOff.Queries != 0 || len(stOff.QueriesRejected) != 0 || stOff.Accepted != total-own || stOff.Seen != wantSeenOff {
				t.Errorf("without queries: %+v; want no queries, %d accepted, seen %d", stOff, total-own, wantSeenOff)
			}
			t.Logf("%s: %d exchanges; with queries seen %d (queries %d, %d of them matched in the kernel, duplicate queries %d, accepted %d, own hedges %d); without, seen %d",
				tt.name, total, stOn.Seen, stOn.Queries, stOn.QueriesMatched, dupQueries, stOn.Accepted, stOn.Rejected["own_hedge"], stOff.Seen)
		})
	}
}

// checkExchange checks what obs saw of the exchange for name, between
// before and after: one reply and (withQueries) one query, from client
// to server, the query's time before the reply's and both inside the
// exchange. The kernel queued the reply's copy as it sent it, so the tap
// may not have read it yet: wait for it.
func checkExchange(t *testing.T, obs *nsObserver, name string, client netip.Addr, server netip.AddrPort, before, after int64, withQueries bool) {
	t.Helper()
	var qs, rs []seenPacket
	// Not seen in time: the checks below say what is missing.
	_ = testkit.Poll(context.Background(), 5*time.Second, func() (bool, error) {
		qs, rs = obs.get(name)
		return len(rs) > 0 && (len(qs) > 0 || !withQueries), nil
	})
	wantQ := 0
	if withQueries {
		wantQ = 1
	}
	if len(qs) != wantQ || len(rs) != 1 {
		t.Errorf("%s: observed %d queries and %d replies, want %d and 1", name, len(qs), len(rs), wantQ)
		return
	}
	r := rs[0]
	if r.client.Addr() != client || r.client.Port() == 0 || r.server != server {
		t.Errorf("%s: reply from %v to %v, want from %v to %v", name, r.server, r.client, server, client)
	}
	// Kernel times are CLOCK_REALTIME, as time.Now: the exchange brackets
	// them (a millisecond of slack for the clocks' granularity).
	const slack = int64(time.Millisecond)
	if r.at < before-slack || r.at > after+slack {
		t.Errorf("%s: reply at %d, outside the exchange [%d, %d]", name, r.at, before, after)
	}
	if now := time.Now().UnixNano(); now-r.at > int64(time.Second) {
		t.Errorf("%s: reply at %d, more than a second before now %d", name, r.at, now)
	}
	if !withQueries {
		return
	}
	q := qs[0]
	if q.client != r.client || q.server != r.server {
		t.Errorf("%s: query from %v to %v, reply from %v to %v", name, q.client, q.server, r.server, r.client)
	}
	if q.at < before-slack || q.at > r.at {
		t.Errorf("%s: query at %d, reply at %d, exchange from %d", name, q.at, r.at, before)
	}
}

// TestTapTimestamps reads the tap's socket by hand, well after the
// packets came, and checks that each one carries the kernel's time of
// the exchange (not the read's): queries received on a pod's veth and on
// lo, replies sent on both.
func TestTapTimestamps(t *testing.T) {
	b := newBed(t, false)
	spec, err := newFilterSpec([]netip.Addr{netip.MustParseAddr(bedAddr4)}, 53, 0, true)
	must(t, err)
	prog, err := spec.program(kernelLoads)
	must(t, err)
	var fd int
	must(t, b.node.Do(func() (err error) { fd, _, err = openSocket(prog, 0, loadLocal); return err }))
	defer unix.Close(fd)
	bt := newBatch(8, slotSize)
	// The kernel turns packet timestamps on for the whole stack from a
	// work item, a moment after the first socket asks for them; until
	// then a packet is stamped as it is read. Wait until an exchange is
	// stamped as it happens (when no other test holds such a socket, the
	// first may not be).
	testkit.Eventually(t, 5*time.Second, "packets stamped as they pass", func() bool {
		before := time.Now().UnixNano()
		ask(t, b.pod, bedAddr4+":53", "stamp-prime."+bedZone, dns.TypeA)
		after := time.Now().UnixNano()
		time.Sleep(10 * time.Millisecond)
		k, err := bt.recv(fd)
		must(t, err)
		for i := range k {
			if _, a := bt.packet(i, 0); a.at < before || a.at > after {
				return false
			}
		}
		return k == 2
	})
	before := time.Now().UnixNano()
	ask(t, b.pod, bedAddr4+":53", "stamp-pod."+bedZone, dns.TypeA)
	ask(t, b.node, bedAddr4+":53", "stamp-lo."+bedZone, dns.TypeA)
	after := time.Now().UnixNano()
	time.Sleep(50 * time.Millisecond)
	k, err := bt.recv(fd)
	must(t, err)
	if k != 4 {
		t.Fatalf("read %d packets, want 2 queries and 2 replies", k)
	}
	var kinds []bool
	for i := range k {
		_, a := bt.packet(i, 0) // 0: no timestamp
		kinds = append(kinds, a.query)
		if a.at < before || a.at > after {
			t.Errorf("packet %d (query %v): time %d outside the exchanges [%d, %d]", i, a.query, a.at, before, after)
		}
	}
	if fmt.Sprint(kinds) != "[true false true false]" {
		t.Errorf("packets read as queries: %v, want query, reply, query, reply", kinds)
	}
}
