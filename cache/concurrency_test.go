package cache

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/wire"
)

// TestConcurrentUse runs inserts, mirrored repeats, hits, snapshots and
// stats at once; run with -race it checks the locking (and the mirror
// memo's slots), and the bounds must hold throughout.
func TestConcurrentUse(t *testing.T) {
	c, clk := newTestCache(t, func(c *Config) { c.MaxEntries = 200; c.Shards = 4 })
	const names = 500
	resps := make([][]byte, names)
	mirrored := make([][]byte, names) // another answer: each replaces the other
	queries := make([][]byte, names)
	for i := range names {
		name := fmt.Sprintf("n%d.example.", i)
		resps[i] = pack(t, reply(t, name, dns.TypeA, 0, []string{name + " 60 IN A 192.0.2.1"}, nil))
		mirrored[i] = pack(t, reply(t, name, dns.TypeA, 0, []string{name + " 60 IN A 192.0.2.2"}, nil))
		queries[i] = pack(t, query(t, name, dns.TypeA, 1232, false))
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			buf := make([]byte, 4096)
			var q wire.Query
			for i := range 2000 {
				n := (i*7 + w*13) % names
				if err := c.Insert(resps[n]); err != nil {
					t.Errorf("insert: %v", err)
					return
				}
				if err := wire.ParseQuery(queries[(n+1)%names], &q); err != nil {
					t.Errorf("parse: %v", err)
					return
				}
				if k, st := c.Serve(buf, &q, 4096, true); st != Miss {
					var a dns.Msg
					if err := a.Unpack(buf[:k]); err != nil || a.Question[0].Name != fmt.Sprintf("n%d.example.", (n+1)%names) {
						t.Errorf("bad answer %v: %v", a.Question, err)
						return
					}
				}
				if i%500 == 0 {
					clk.Advance(1e9)
				}
			}
		})
	}
	for w := range 2 {
		wg.Go(func() {
			for i := range 4000 {
				err := c.InsertMirror(mirrored[(i*3+w)%(names/10)])
				if err != nil && !errors.Is(err, errHaveFresh) {
					t.Errorf("mirrored insert: %v", err)
					return
				}
			}
		})
	}
	wg.Go(func() {
		for range 20 {
			if _, err := c.Save(new(bytes.Buffer)); err != nil {
				t.Errorf("save: %v", err)
			}
			if st := c.Stats(); st.Entries > 200 {
				t.Errorf("entries %d over the bound", st.Entries)
			}
		}
	})
	wg.Wait()
	if st := c.Stats(); st.Entries > 200 || st.Evictions == 0 {
		t.Fatalf("entries %d evictions %d", st.Entries, st.Evictions)
	}
}
