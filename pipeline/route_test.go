package pipeline

import (
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/cache"
)

// TestSetRoutes: new routes take effect for the next query; a bad set is
// refused and the routes in force stay.
func TestSetRoutes(t *testing.T) {
	before, after := newFake(), newFake()
	before.set("www.example.", "www.example. 30 IN A 192.0.2.1")
	after.set("new.example.", "new.example. 30 IN A 192.0.2.2")
	p, _ := newPipeline(t, nil, func(c *Config) { c.Routes = []Route{{Zone: ".", Upstream: before}} })
	w := p.NewWorker()
	wait(t, ask(t, w, q(t, "www.example.", dns.TypeA, false), "10.1.0.1"))

	c := newCache(t, nil, nil)
	if err := p.SetRoutes([]Route{{Zone: ".", Upstream: after, Cache: c}, {Zone: ".", Upstream: before, Cache: c}}); err == nil || !strings.Contains(err.Error(), "routed twice") {
		t.Fatalf("SetRoutes with a zone twice: %v", err)
	}
	if err := p.SetRoutes([]Route{{Zone: "Example.", Upstream: after, Cache: c}}); err != nil {
		t.Fatal(err)
	}
	a := wait(t, ask(t, w, q(t, "new.example.", dns.TypeA, false), "10.1.0.1"))
	if len(a.Answer) != 1 || after.count("new.example.") != 1 || before.count("new.example.") != 0 {
		t.Fatalf("after SetRoutes: answer %v, new upstream asked %d times, old %d", a.Answer, after.count("new.example."), before.count("new.example."))
	}
	// Outside the new routes' zones: no route.
	if a := wait(t, ask(t, w, q(t, "www.other.", dns.TypeA, false), "10.1.0.1")); a.Rcode != dns.RcodeRefused {
		t.Fatalf("a name no route covers: rcode %s, want REFUSED", dns.RcodeToString[a.Rcode])
	}
}

// TestInZone: zones match whole labels in any letter case; an escaped dot
// inside a label is not a label boundary.
func TestInZone(t *testing.T) {
	tests := []struct {
		name, zone string
		want       bool
	}{
		{"svc.cluster.local.", "cluster.local.", true},
		{"cluster.local.", "cluster.local.", true},
		{"SVC.Cluster.LOCAL.", "cluster.local.", true},
		{"xcluster.local.", "cluster.local.", false},
		{`a\.cluster.local.`, "cluster.local.", false},
		{`a\.cluster.local.`, "local.", true},
		{"local.", "cluster.local.", false},
		{"www.example.", ".", true},
		{".", ".", true},
		{"cluster.local.example.", "cluster.local.", false},
	}
	for _, tt := range tests {
		t.Run(tt.name+" in "+tt.zone, func(t *testing.T) {
			name := packName(t, tt.name)
			if got := inZone(name, packName(t, tt.zone)); got != tt.want {
				t.Fatalf("inZone(%s, %s) = %v, want %v", tt.name, tt.zone, got, tt.want)
			}
		})
	}
}

func packName(t *testing.T, s string) []byte {
	t.Helper()
	b := make([]byte, 256)
	n, err := dns.PackDomainName(s, b, 0, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	return b[:n]
}

// TestRouteCaches: each route answers from its own cache with its own
// stale mode, and mirrored replies are filed in the cache of the route
// their name falls under.
func TestRouteCaches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := newFake()
		up.set("svc.cluster.local.", "svc.cluster.local. 60 IN A 10.0.0.1")
		up.set("www.example.", "www.example. 60 IN A 192.0.2.1")
		var clusterCache, rootCache *cache.Cache
		p, clk := newPipeline(t, up, nil)
		clusterCache = newCache(t, clk, nil) // verify
		rootCache = newCache(t, clk, func(c *cache.Config) { c.StaleMode = cache.StaleImmediate })
		if err := p.SetRoutes([]Route{{Zone: ".", Upstream: up, Cache: rootCache}, {Zone: "cluster.local.", Upstream: up, Cache: clusterCache}}); err != nil {
			t.Fatal(err)
		}
		w := p.NewWorker()
		wait(t, ask(t, w, q(t, "svc.cluster.local.", dns.TypeA, false), "10.1.0.1"))
		wait(t, ask(t, w, q(t, "www.example.", dns.TypeA, false), "10.1.0.1"))
		if clusterCache.Len() != 1 || rootCache.Len() != 1 {
			t.Fatalf("entries: cluster.local cache %d, root cache %d; want 1 and 1", clusterCache.Len(), rootCache.Len())
		}

		clk.Advance(2 * time.Minute) // both stale
		buf := make([]byte, 512)
		if _, act := w.Answer(buf, q(t, "www.example.", dns.TypeA, false), true); act != Reply {
			t.Fatalf("root zone (immediate): action %d, want a stale reply on the hot path", act)
		}
		if _, act := w.Answer(buf, q(t, "svc.cluster.local.", dns.TypeA, false), true); act != Resolve {
			t.Fatalf("cluster.local (verify): action %d, want the miss path first", act)
		}

		// The mirror feed: a reply for a cluster.local name goes to that
		// route's cache only.
		m := new(dns.Msg)
		m.SetQuestion("mirrored.cluster.local.", dns.TypeA)
		m.Response, m.RecursionAvailable = true, true
		rr, _ := dns.NewRR("mirrored.cluster.local. 30 IN A 10.0.0.2")
		m.Answer = []dns.RR{rr}
		raw, _ := m.Pack()
		if err := p.InsertMirror(raw); err != nil {
			t.Fatalf("InsertMirror: %v", err)
		}
		if clusterCache.Len() != 2 || rootCache.Len() != 1 {
			t.Fatalf("after the mirrored reply: cluster.local cache %d, root cache %d; want 2 and 1", clusterCache.Len(), rootCache.Len())
		}
	})
}

// TestCacheCountsClientQueries: a query answered from upstream counts as
// one miss and no hit, though the reply goes out through the entry it
// filled; a second ask is one hit.
func TestCacheCountsClientQueries(t *testing.T) {
	up := newFake()
	c := newCache(t, nil, nil)
	p, _ := newPipeline(t, up, func(cfg *Config) { cfg.Routes[0].Cache = c })
	w := p.NewWorker()
	const n = 5
	for i := range n {
		name := fmt.Sprintf("u%d.example.", i)
		up.set(name, name+" 60 IN A 192.0.2.1")
		wait(t, ask(t, w, q(t, name, dns.TypeA, false), "10.1.0.1"))
	}
	if st := c.Stats(); st.Hits != 0 || st.Misses != n || st.Inserts != n {
		t.Fatalf("after %d unique queries: hits %d misses %d inserts %d; want 0, %d, %d", n, st.Hits, st.Misses, st.Inserts, n, n)
	}
	wait(t, ask(t, w, q(t, "u0.example.", dns.TypeA, false), "10.1.0.1"))
	if st := c.Stats(); st.Hits != 1 || st.Misses != n {
		t.Fatalf("after a repeat: hits %d misses %d; want 1, %d", st.Hits, st.Misses, n)
	}
}

// TestWorkerMirrorAhead: the tap's order (each reply shown to
// PrefetchMirror one reply before the one before it is filed) files every
// reply as Pipeline.InsertMirror would, each to its route's cache; and a
// parse is never taken for other bytes put in the same place once two
// more replies were shown.
func TestWorkerMirrorAhead(t *testing.T) {
	up := newFake()
	p, clk := newPipeline(t, up, nil)
	clusterCache, rootCache := newCache(t, clk, nil), newCache(t, clk, nil)
	if err := p.SetRoutes([]Route{{Zone: ".", Upstream: up, Cache: rootCache}, {Zone: "cluster.local.", Upstream: up, Cache: clusterCache}}); err != nil {
		t.Fatal(err)
	}
	reply := func(name, addr string) []byte {
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		m.Response, m.RecursionAvailable = true, true
		rr, err := dns.NewRR(name + " 30 IN A " + addr)
		if err != nil {
			t.Fatal(err)
		}
		m.Answer = []dns.RR{rr}
		raw, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	w := p.NewWorker()
	replies := [][]byte{reply("a.cluster.local.", "10.0.0.1"), reply("www.example.", "192.0.2.1"), reply("b.cluster.local.", "10.0.0.2")}
	for i := range replies {
		w.PrefetchMirror(replies[i])
		if i > 0 {
			if err := w.InsertMirror(replies[i-1]); err != nil {
				t.Fatalf("reply %d: %v", i-1, err)
			}
		}
	}
	if err := w.InsertMirror(replies[len(replies)-1]); err != nil {
		t.Fatalf("last reply: %v", err)
	}
	if clusterCache.Len() != 2 || rootCache.Len() != 1 {
		t.Fatalf("entries: cluster.local cache %d, root cache %d; want 2 and 1", clusterCache.Len(), rootCache.Len())
	}

	// A reply shown ahead and never filed (the tap rejected it), then,
	// two replies later, other bytes of its length in its place: they are
	// parsed as they are: c.cluster.local and abcdefg.example are as long.
	place := reply("c.cluster.local.", "10.0.0.3")
	w.PrefetchMirror(place)
	w.PrefetchMirror(replies[0])
	w.PrefetchMirror(replies[1])
	other := reply("abcdefg.example.", "192.0.2.3")
	if len(other) != len(place) {
		t.Fatalf("the two replies are %d and %d bytes: the test needs one length", len(other), len(place))
	}
	copy(place, other)
	if err := w.InsertMirror(place); err != nil {
		t.Fatalf("the bytes put in the place: %v", err)
	}
	if clusterCache.Len() != 2 || rootCache.Len() != 2 {
		t.Fatalf("after abcdefg.example: cluster.local cache %d, root cache %d; want 2 and 2 (filed by its own question)", clusterCache.Len(), rootCache.Len())
	}
	if allocs := testing.AllocsPerRun(100, func() { w.PrefetchMirror(replies[0]); w.InsertMirror(replies[2]) }); allocs != 0 {
		t.Errorf("a repeated reply, prefetched: %v allocations, want 0", allocs)
	}
}
