package cache

import "github.com/prometheus/client_golang/prometheus"

// Stats is a point-in-time copy of the cache's counters.
type Stats struct {
	Entries   int
	Bytes     int64
	Hits      uint64 // fresh answers served
	StaleHits uint64 // stale answers served
	Misses    uint64 // queries the cache did not answer
	Inserts   uint64
	Evictions uint64 // entries pushed out by the entry or byte bound
	// Probation is how many entries are mirrored ones no client has been
	// seen to use yet (Config.ProbationPercent), of Entries.
	Probation int
	Rejects   map[string]uint64
}

// Stats sums the shards' counters.
func (c *Cache) Stats() Stats {
	st := Stats{Rejects: make(map[string]uint64, numReasons)}
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		st.Entries += s.lru.Len()
		st.Bytes += s.bytes
		st.Probation += s.probEntries
		s.mu.Unlock()
		st.Hits += s.hits.Load()
		st.StaleHits += s.staleHits.Load()
		st.Misses += s.misses.Load()
		st.Inserts += s.inserts.Load()
		st.Evictions += s.evictions.Load()
	}
	for r := Reason(0); r < numReasons; r++ {
		st.Rejects[r.String()] = c.rejects[r].Load()
	}
	return st
}

// Metric descriptions. The hot path only bumps atomic counters in its
// shard; Prometheus reads them at scrape time through Collect.
var (
	descEntries   = prometheus.NewDesc("dnsstandby_cache_entries", "Entries in the cache, expired ones included until evicted.", nil, nil)
	descBytes     = prometheus.NewDesc("dnsstandby_cache_bytes", "Bytes the cache accounts for its entries, estimated overhead included.", nil, nil)
	descHits      = prometheus.NewDesc("dnsstandby_cache_hits_total", "Fresh answers served from the cache.", nil, nil)
	descStaleHits = prometheus.NewDesc("dnsstandby_cache_stale_hits_total", "Stale answers served from the cache (RFC 8767).", nil, nil)
	descMisses    = prometheus.NewDesc("dnsstandby_cache_misses_total", "Queries the cache did not answer: nothing servable, or a stale entry held back while upstreams are asked first.", nil, nil)
	descInserts   = prometheus.NewDesc("dnsstandby_cache_inserts_total", "Responses stored in the cache.", nil, nil)
	descEvictions = prometheus.NewDesc("dnsstandby_cache_evictions_total", "Entries evicted to stay within the entry and byte bounds.", nil, nil)
	descRejects   = prometheus.NewDesc("dnsstandby_cache_rejects_total", "Responses not cached, by reason.", []string{"reason"}, nil)
	descProbation = prometheus.NewDesc("dnsstandby_cache_probation_entries", "Entries mirrored from LocalDNS that no client has been seen to use yet: they make room among themselves first.", nil, nil)
)

// Describe implements prometheus.Collector.
func (c *Cache) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descEntries, descBytes, descHits, descStaleHits, descMisses, descInserts, descEvictions, descRejects, descProbation} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Cache) Collect(ch chan<- prometheus.Metric) {
	st := c.Stats()
	ch <- prometheus.MustNewConstMetric(descEntries, prometheus.GaugeValue, float64(st.Entries))
	ch <- prometheus.MustNewConstMetric(descBytes, prometheus.GaugeValue, float64(st.Bytes))
	ch <- prometheus.MustNewConstMetric(descHits, prometheus.CounterValue, float64(st.Hits))
	ch <- prometheus.MustNewConstMetric(descStaleHits, prometheus.CounterValue, float64(st.StaleHits))
	ch <- prometheus.MustNewConstMetric(descMisses, prometheus.CounterValue, float64(st.Misses))
	ch <- prometheus.MustNewConstMetric(descInserts, prometheus.CounterValue, float64(st.Inserts))
	ch <- prometheus.MustNewConstMetric(descEvictions, prometheus.CounterValue, float64(st.Evictions))
	ch <- prometheus.MustNewConstMetric(descProbation, prometheus.GaugeValue, float64(st.Probation))
	for reason, n := range st.Rejects {
		ch <- prometheus.MustNewConstMetric(descRejects, prometheus.CounterValue, float64(n), reason)
	}
}
