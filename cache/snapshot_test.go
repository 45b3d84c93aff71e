package cache

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// snapshotFixture fills a cache with positive, negative, DO and stale
// entries and returns it with its snapshot.
func snapshotFixture(t *testing.T) (*Cache, *testClock, []byte) {
	t.Helper()
	c, clk := newTestCache(t, nil)
	for i := range 50 {
		name := fmt.Sprintf("svc-%d.ns.svc.cluster.local.", i)
		mustInsert(t, c, reply(t, name, dns.TypeA, 0, []string{name + " 300 IN A 10.0.0.1"}, nil))
	}
	mustInsert(t, c, reply(t, "nx.cluster.local.", dns.TypeA, dns.RcodeNameError, nil,
		[]string{"cluster.local. 30 IN SOA ns.dns.cluster.local. h.cluster.local. 1 7200 1800 86400 30"}))
	do := reply(t, "do.example.", dns.TypeA, 0, []string{"do.example. 300 IN A 192.0.2.9"}, nil)
	do.SetEdns0(1232, true)
	mustInsert(t, c, do)
	clk.Advance(100 * time.Second) // nx is stale now, the rest fresh with 200 s left
	var buf bytes.Buffer
	n, err := c.Save(&buf)
	if err != nil {
		t.Fatalf("Save: %v", err)
	}
	if n != 52 {
		t.Fatalf("Save wrote %d entries, want 52", n)
	}
	return c, clk, buf.Bytes()
}

func TestSnapshotRoundTrip(t *testing.T) {
	_, clk, snap := snapshotFixture(t)

	// A new process, 50 s later: absolute expiry times must carry over.
	clk.Advance(50 * time.Second)
	c2, err := New(func() Config { cfg := DefaultConfig(); cfg.Now = clk.Now; return cfg }())
	if err != nil {
		t.Fatal(err)
	}
	n, err := c2.Load(bytes.NewReader(snap))
	if err != nil || n != 52 {
		t.Fatalf("Load = %d, %v; want 52 entries", n, err)
	}

	a, st := serve(t, c2, query(t, "SVC-7.ns.svc.cluster.local.", dns.TypeA, -1, false), 0, false)
	if st != Fresh || a.Answer[0].Header().Ttl != 150 {
		t.Fatalf("svc-7: status %s answer %v, want fresh with TTL 150", st, a)
	}
	if _, st := serve(t, c2, query(t, "nx.cluster.local.", dns.TypeA, -1, false), 0, false); st != Stale {
		t.Fatalf("nx: status %s, want stale", st)
	}
	a, st = serve(t, c2, query(t, "do.example.", dns.TypeA, 1232, true), 0, false)
	if st != Fresh || a.Answer[0].(*dns.A).A.String() != "192.0.2.9" {
		t.Fatalf("DO entry: status %s answer %v", st, a)
	}
	if _, st := serve(t, c2, query(t, "do.example.", dns.TypeA, -1, false), 0, false); st != Miss {
		t.Fatalf("DO entry answered a non-DO query: %s", st)
	}

	// Entries past the stale window are not loaded.
	clk.Advance(80000 * time.Second)
	c3, _ := New(func() Config { cfg := DefaultConfig(); cfg.Now = clk.Now; return cfg }())
	if n, err := c3.Load(bytes.NewReader(snap)); err != nil || n != 0 {
		t.Fatalf("Load long after: %d entries, %v; want 0, nil", n, err)
	}
}

func TestSnapshotCorrupt(t *testing.T) {
	_, clk, snap := snapshotFixture(t)
	flip := func(i int) []byte {
		b := bytes.Clone(snap)
		b[i] ^= 0x40
		return b
	}
	tests := []struct {
		name string
		data []byte
	}{
		{"empty", nil},
		{"bad magic", append([]byte("NOTSNAP!"), snap[8:]...)},
		{"future version", func() []byte { b := bytes.Clone(snap); b[9] = 2; return b }()},
		{"flipped header byte", flip(10)},
		{"flipped key byte", flip(12 + recordFixedLen + 3)},
		{"flipped message byte", flip(len(snap) / 2)},
		{"flipped checksum", flip(len(snap) - 1)},
		{"trailing garbage", append(bytes.Clone(snap), 0)},
		{"huge key length", func() []byte { b := bytes.Clone(snap); b[12], b[13] = 0xff, 0xff; return b }()},
	}
	// Every truncation point.
	for cut := 0; cut < len(snap); cut += max(1, len(snap)/97) {
		tests = append(tests, struct {
			name string
			data []byte
		}{fmt.Sprintf("truncated at %d", cut), snap[:cut]})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := newTestCache(t, func(cfg *Config) { cfg.Now = clk.Now })
			n, err := c.Load(bytes.NewReader(tt.data))
			if err == nil || !errors.Is(err, ErrSnapshot) {
				t.Fatalf("Load = %d, %v; want an ErrSnapshot", n, err)
			}
			if n != 0 || c.Len() != 0 {
				t.Fatalf("half-loaded: n=%d len=%d", n, c.Len())
			}
			// And the cache still works.
			const name = "after.example."
			mustInsert(t, c, reply(t, name, dns.TypeA, 0, []string{name + " 60 IN A 192.0.2.1"}, nil))
			if _, st := serve(t, c, query(t, name, dns.TypeA, -1, false), 0, false); st != Fresh {
				t.Fatalf("cache not working after bad snapshot: %s", st)
			}
		})
	}
}

func TestSnapshotRespectsBounds(t *testing.T) {
	_, clk, snap := snapshotFixture(t)
	c, _ := newTestCache(t, func(cfg *Config) { cfg.Now = clk.Now; cfg.MaxEntries = 10; cfg.Shards = 1 })
	if _, err := c.Load(bytes.NewReader(snap)); err != nil {
		t.Fatal(err)
	}
	if c.Len() != 10 {
		t.Fatalf("Len = %d after loading 52 entries into a 10-entry cache", c.Len())
	}
}
