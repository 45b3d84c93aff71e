package testbed

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

func TestNewValidates(t *testing.T) {
	valid := DefaultConfig()
	valid.Name, valid.CoreDNS = "x", "/bin/coredns"
	tests := []struct {
		name  string
		edit  func(*Config)
		field string
	}{
		{"no name", func(c *Config) { c.Name = "" }, "Name"},
		{"no coredns", func(c *Config) { c.CoreDNS = "" }, "CoreDNS"},
		{"no names", func(c *Config) { c.Names = 0 }, "Names"},
		{"TTL not whole seconds", func(c *Config) { c.UpstreamTTL = 1500 * time.Millisecond }, "UpstreamTTL"},
	}
	for _, tt := range tests {
		cfg := valid
		tt.edit(&cfg)
		_, err := New(cfg)
		if err == nil || !strings.HasPrefix(err.Error(), "testbed: "+tt.field+" ") {
			t.Errorf("%s: %v, want an error about %s", tt.name, err, tt.field)
		}
	}
}

// TestBed builds a bed with the real CoreDNS, counts queries at the
// upstream and checks that Close leaves nothing.
func TestBed(t *testing.T) {
	nstest.RequireRoot(t)
	cfg := DefaultConfig()
	cfg.Name, cfg.CoreDNS, cfg.Names, cfg.UpstreamCPU = "testbed", nstest.CoreDNSBinary(t), 10, 0
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			b.Close()
		}
	})
	ctx := context.Background()
	if q, err := os.ReadFile(b.QueryFile); err != nil || strings.Count(string(q), " A\n") != 10 || len(b.Names) != 10 {
		t.Fatalf("query file %q (%v), names %v", q, err, b.Names)
	}
	count := func() uint64 {
		t.Helper()
		n, err := b.UpstreamQueries(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := count()
	m := new(dns.Msg)
	m.SetQuestion(b.Names[0], dns.TypeA)
	if r, err := b.NS.Exchange("udp", "", UpstreamAddr, m, 2*time.Second); err != nil || len(r.Answer) != 1 {
		t.Fatalf("ask the upstream: %v %v", r, err)
	}
	if got := count() - before; got != 1 {
		t.Errorf("one A query asked, %d counted", got)
	}
	if _, err := exec.LookPath("dnsperf"); err == nil {
		if up, err := b.WarmPass(ctx, UpstreamAddr, 0); err != nil || up != 10 {
			t.Errorf("WarmPass at the upstream itself: %d queries counted there, want 10 (%v)", up, err)
		}
	} else {
		t.Log("no dnsperf: WarmPass not tried")
	}

	scratch, netns := b.Scratch, b.NS.Path()
	closed = true
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{scratch, netns} {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s still there (%v)", p, err)
		}
	}
}
