package cache

import (
	"strings"
	"testing"
	"time"
)

// TestNew: New takes the Config as given, and its errors name the field.
func TestNew(t *testing.T) {
	tests := []struct {
		name    string
		mod     func(*Config)
		wantErr string // "" for success
	}{
		{"defaults", func(*Config) {}, ""},
		{"servfail never cached", func(c *Config) { c.ServfailTTL = 0 }, ""},
		{"no stale window", func(c *Config) { c.MaxStale = 0 }, ""},
		{"shards chosen", func(c *Config) { c.Shards = 0 }, ""},
		{"four shards", func(c *Config) { c.Shards = 4 }, ""},
		{"zero entries", func(c *Config) { c.MaxEntries = 0 }, "cache: MaxEntries must be positive, got 0"},
		{"zero bytes", func(c *Config) { c.MaxBytes = 0 }, "cache: MaxBytes must be positive, got 0"},
		{"max ttl under a second", func(c *Config) { c.MaxTTL = time.Millisecond }, "cache: MaxTTL must be at least 1s, got 1ms"},
		{"max negative ttl zero", func(c *Config) { c.MaxNegTTL = 0 }, "cache: MaxNegTTL must be at least 1s, got 0s"},
		{"negative min ttl", func(c *Config) { c.MinTTL = -time.Second }, "cache: MinTTL must not be negative, got -1s"},
		{"negative min negative ttl", func(c *Config) { c.MinNegTTL = -time.Second }, "cache: MinNegTTL must not be negative"},
		{"negative servfail ttl", func(c *Config) { c.ServfailTTL = -time.Second }, "cache: ServfailTTL must not be negative"},
		{"negative max stale", func(c *Config) { c.MaxStale = -time.Second }, "cache: MaxStale must not be negative"},
		{"negative stale ttl", func(c *Config) { c.StaleTTL = -time.Second }, "cache: StaleTTL must not be negative"},
		{"floor above cap", func(c *Config) { c.MinTTL = 2 * time.Hour }, "cache: MinTTL 2h0m0s is above MaxTTL 1h0m0s"},
		{"negative floor above cap", func(c *Config) { c.MinNegTTL = 2 * time.Hour }, "cache: MinNegTTL 2h0m0s is above MaxNegTTL"},
		{"stale ttl too large", func(c *Config) { c.StaleTTL = 1 << 62 }, "cache: StaleTTL"},
		{"small udp size", func(c *Config) { c.UDPSize = 511 }, "cache: UDPSize must be at least 512, got 511"},
		{"long nsid", func(c *Config) { c.NSID = strings.Repeat("x", 513) }, "cache: NSID must be at most 512 bytes, got 513"},
		{"mirror cap under a floor", func(c *Config) { c.MirrorMaxTTL = time.Second; c.MinTTL = time.Minute }, ""},
		{"whole cache on probation", func(c *Config) { c.ProbationPercent = 100 }, ""},
		{"mirror cap under a second", func(c *Config) { c.MirrorMaxTTL = 0 }, "cache: MirrorMaxTTL must be at least 1s, got 0s"},
		{"no probation share", func(c *Config) { c.ProbationPercent = 0 }, "cache: ProbationPercent must be 1 to 100, got 0"},
		{"probation share over 100", func(c *Config) { c.ProbationPercent = 101 }, "cache: ProbationPercent must be 1 to 100, got 101"},
		{"three shards", func(c *Config) { c.Shards = 3 }, "cache: Shards must be 0 or a power of two, got 3"},
		{"negative shards", func(c *Config) { c.Shards = -2 }, "cache: Shards must be 0 or a power of two, got -2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tt.mod(&cfg)
			c, err := New(cfg)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("New: %v, want error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			if c.cfg.ServfailTTL != cfg.ServfailTTL || c.cfg.MaxStale != cfg.MaxStale || c.cfg.Shards != cfg.Shards {
				t.Errorf("config changed by New: %+v", c.cfg)
			}
		})
	}
}
