package corefile

import (
	"reflect"
	"testing"
	"time"
)

// TestCache checks cache parsing against CoreDNS 1.13.1's cacheParse and
// its defaults.
func TestCache(t *testing.T) {
	tests := []struct {
		name string
		body string // the cache directive, on line 2 of the block
		want func(c *Cache)
	}{
		{"bare cache has CoreDNS defaults", "cache", func(c *Cache) {}},
		{"TTL sets both maxima", "cache 300", func(c *Cache) {
			c.MaxTTL, c.MaxNegTTL = 300*time.Second, 300*time.Second
		}},
		{"zones without TTL", "cache example.org Example.COM:53", func(c *Cache) {
			c.Zones = []string{"example.org.", "example.com."}
		}},
		{"TTL and zones", "cache 30 cluster.local", func(c *Cache) {
			c.MaxTTL, c.MaxNegTTL = 30*time.Second, 30*time.Second
			c.Zones = []string{"cluster.local."}
		}},
		{"AgentBaker block", "cache 3600 {\n success 9984\n denial 9984\n serve_stale 72000s verify\n servfail 0\n}", func(c *Cache) {
			c.MaxTTL, c.MaxNegTTL = time.Hour, time.Hour
			c.ServeStale, c.StaleVerify = 72000*time.Second, true
			c.ServfailTTL = 0
		}},
		{"success with TTL and min TTL", "cache {\n success 5000 600 10\n}", func(c *Cache) {
			c.SuccessCapacity = 4864 // 19 per shard
			c.MaxTTL, c.MinTTL = 600*time.Second, 10*time.Second
		}},
		{"denial with TTL and zero min TTL", "cache {\n denial 2500 60 0\n}", func(c *Cache) {
			c.DenialCapacity = 2304 // 9 per shard
			c.MaxNegTTL, c.MinNegTTL = time.Minute, 0
		}},
		{"capacity never below 1024", "cache {\n success 10\n denial -5\n}", func(c *Cache) {
			c.SuccessCapacity, c.DenialCapacity = 1024, 1024
		}},
		{"serve_stale default duration and mode", "cache {\n serve_stale\n}", func(c *Cache) {
			c.ServeStale = time.Hour
		}},
		{"serve_stale immediate", "cache {\n serve_stale 3600s immediate\n}", func(c *Cache) {
			c.ServeStale = time.Hour
		}},
		{"serve_stale mode is case-insensitive", "cache {\n serve_stale 10m VERIFY\n}", func(c *Cache) {
			c.ServeStale, c.StaleVerify = 10*time.Minute, true
		}},
		{"serve_stale zero", "cache {\n serve_stale 0s\n}", func(c *Cache) {}},
		{"servfail", "cache {\n servfail 30s\n}", func(c *Cache) {
			c.ServfailTTL = 30 * time.Second
		}},
		{"servfail at the 5m limit", "cache {\n servfail 5m\n}", func(c *Cache) {
			c.ServfailTTL = 5 * time.Minute
		}},
		{"prefetch", "cache {\n prefetch 10 1m 20%\n}", func(c *Cache) { c.Prefetch = 10 }},
		{"keepttl", "cache {\n keepttl\n}", func(c *Cache) { c.KeepTTL = true }},
		{"disable success for all", "cache {\n disable success\n}", func(c *Cache) {
			c.DisabledSuccess = []string{"."}
		}},
		{"disable denial for zones", "cache {\n disable denial example.org sub.example.com\n}", func(c *Cache) {
			c.DisabledDenial = []string{"example.org.", "sub.example.com."}
		}},
		{"success reads three arguments and ignores more", "cache {\n success 2048 60 10 extra\n}", func(c *Cache) {
			c.SuccessCapacity, c.MaxTTL, c.MinTTL = 2048, 60*time.Second, 10*time.Second
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := parseText(t, ".:53 {\n"+tt.body+"\n}\n")
			want := defaultCache(2)
			tt.want(want)
			got := s.Zones[0].Cache
			if got == nil || !reflect.DeepEqual(*got, *want) {
				t.Errorf("cache:\n got %+v\nwant %+v", deref(got), *want)
			}
		})
	}
}

func TestNoCache(t *testing.T) {
	s := parseText(t, ".:53 {\n  forward . 10.0.0.10\n}\n")
	if s.Zones[0].Cache != nil {
		t.Errorf("Cache = %+v, want nil", *s.Zones[0].Cache)
	}
}

// TestCacheCopiedPerZone checks that zones of one block do not share a
// Cache the caller could change through another zone.
func TestCacheCopiedPerZone(t *testing.T) {
	s := parseText(t, "cluster.local example.org {\n  cache 30 example.org\n}\n")
	a, b := s.Zones[0].Cache, s.Zones[1].Cache
	if a == b {
		t.Fatal("zones share one *Cache")
	}
	a.Zones[0] = "changed."
	if b.Zones[0] != "example.org." {
		t.Errorf("zones share Cache.Zones")
	}
}

func TestCapacity(t *testing.T) {
	for n, want := range map[int]int{0: 1024, 1024: 1024, 1279: 1024, 1280: 1280, 9984: 9984, 10000: 9984, 100000: 99840} {
		if got := capacity(n); got != want {
			t.Errorf("capacity(%d) = %d, want %d", n, got, want)
		}
	}
}
