package cache

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/clock"
	"github.com/dnsstandby/dnsstandby/wire"
)

// coarseClock runs the clock the daemon gives the cache for the length of
// the benchmark: reading it is part of a hit's cost.
func coarseClock(b *testing.B) func() time.Time {
	clk := clock.NewCoarse()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { clk.Run(ctx); close(done) }()
	b.Cleanup(func() { cancel(); <-done })
	return clk.Now
}

const benchName = "kubernetes.default.svc.cluster.local."

// benchSetup returns a cache holding one typical pod answer (a single A
// record for a cluster service), the query for it in 0x20 case with EDNS,
// and that answer as a message.
func benchSetup(b *testing.B) (*Cache, []byte, *dns.Msg) {
	c, _ := newTestCache(b, func(c *Config) { c.Now = coarseClock(b) })
	ans := reply(b, benchName, dns.TypeA, 0, []string{benchName + " 30 IN A 10.0.0.1"}, nil)
	ans.SetEdns0(1232, false)
	mustInsert(b, c, ans)
	q := pack(b, query(b, "KuBeRnEtEs.default.svc.cluster.local.", dns.TypeA, 1232, false))
	return c, q, ans
}

// BenchmarkServeHit is the whole hot path of a cache hit: parse the query's
// wire bytes, look up, write the answer.
func BenchmarkServeHit(b *testing.B) {
	c, raw, _ := benchSetup(b)
	buf := make([]byte, 65535)
	var q wire.Query
	b.ReportAllocs()
	for b.Loop() {
		if err := wire.ParseQuery(raw, &q); err != nil {
			b.Fatal(err)
		}
		if n, _ := c.Serve(buf, &q, q.PayloadLimit(), false); n == 0 {
			b.Fatal("miss")
		}
	}
}

// BenchmarkServeHitTruncated is a hit too large for the client: 40 A
// records (about 700 bytes) asked without EDNS, cut to the 30 that fit in
// 512 bytes by walking the stored records. It must not allocate either.
func BenchmarkServeHitTruncated(b *testing.B) {
	c, _ := newTestCache(b, func(c *Config) { c.Now = coarseClock(b) })
	big := truncationCases(b)[0]
	mustInsert(b, c, big)
	raw := pack(b, query(b, "BiG.example.", dns.TypeA, -1, false))
	buf := make([]byte, 65535)
	var q wire.Query
	b.ReportAllocs()
	for b.Loop() {
		if err := wire.ParseQuery(raw, &q); err != nil {
			b.Fatal(err)
		}
		if n, _ := c.Serve(buf, &q, q.PayloadLimit(), false); n == 0 || buf[2]&byte(wire.FlagTC>>8) == 0 {
			b.Fatal("not a truncated hit")
		}
	}
}

// BenchmarkBaselineMiekgRoundTrip is what a hit would cost with whole
// messages: miekg/dns Unpack of the same query and Pack of the same answer.
func BenchmarkBaselineMiekgRoundTrip(b *testing.B) {
	_, raw, ans := benchSetup(b)
	buf := make([]byte, 65535)
	b.ReportAllocs()
	for b.Loop() {
		var q dns.Msg
		if err := q.Unpack(raw); err != nil {
			b.Fatal(err)
		}
		ans.Id = q.Id
		if _, err := ans.PackBuffer(buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkServeHitParallel serves hits from every P over 1024 names, each
// P walking them from its own random start, so that shards, not one lock,
// decide contention.
func BenchmarkServeHitParallel(b *testing.B) {
	c, _ := newTestCache(b, func(c *Config) { c.Now = coarseClock(b) })
	const names = 1024
	queries := make([][]byte, names)
	for i := range names {
		name := fmt.Sprintf("svc-%d.default.svc.cluster.local.", i)
		mustInsert(b, c, reply(b, name, dns.TypeA, 0, []string{name + " 30 IN A 10.0.0.1"}, nil))
		queries[i] = pack(b, query(b, name, dns.TypeA, 1232, false))
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]byte, 65535)
		var q wire.Query
		i := rand.IntN(names)
		for pb.Next() {
			i++
			if err := wire.ParseQuery(queries[i%names], &q); err != nil {
				b.Fatal(err)
			}
			if n, _ := c.Serve(buf, &q, q.PayloadLimit(), false); n == 0 {
				b.Fatal("miss")
			}
		}
	})
}

// BenchmarkBytesPerEntry measures the heap the cache holds per entry for
// 100,000 single-A answers (the default entry bound).
func BenchmarkBytesPerEntry(b *testing.B) {
	const entries = 100_000
	msgs := make([][]byte, entries)
	for i := range entries {
		name := fmt.Sprintf("svc-%d.namespace-%d.svc.cluster.local.", i, i%50)
		msgs[i] = pack(b, reply(b, name, dns.TypeA, 0, []string{name + " 30 IN A 10.0.0.1"}, nil))
	}
	var perEntry float64
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		// Bounds are per shard, so a cache bounded at exactly 100,000 would
		// evict from its fullest shards before holding them all.
		c, _ := newTestCache(b, func(c *Config) { c.MaxEntries = 2 * entries; c.MaxBytes = 1 << 30 })
		for _, m := range msgs {
			if err := c.Insert(m); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		if c.Len() != entries {
			b.Fatalf("Len = %d, want %d", c.Len(), entries)
		}
		perEntry = float64(after.HeapAlloc-before.HeapAlloc) / entries
		runtime.KeepAlive(c)
	}
	b.ReportMetric(perEntry, "B/entry")
}
