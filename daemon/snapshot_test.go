package daemon

import (
	"bytes"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/cache"
)

func TestSnapshotRoundTripThroughFiles(t *testing.T) {
	dir := t.TempDir()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	c1, _ := cache.New(cache.DefaultConfig())
	m := new(dns.Msg)
	m.SetQuestion("warm.example.", dns.TypeA)
	m.Response = true
	rr, _ := dns.NewRR("warm.example. 300 IN A 192.0.2.7")
	m.Answer = []dns.RR{rr}
	b, _ := m.Pack()
	if err := c1.Insert(b); err != nil {
		t.Fatal(err)
	}
	ap := netip.MustParseAddrPort("169.254.10.11:53")
	for zone, want := range map[string]string{
		".":              "cache-169.254.10.11-53-root.snapshot",
		"Cluster.Local.": "cache-169.254.10.11-53-cluster.local.snapshot",
		`a/b\\c.`:        "cache-169.254.10.11-53-a_b__c.snapshot",
	} {
		if got := filepath.Base(snapshotPath(dir, ap, zone)); got != want {
			t.Errorf("snapshot file of zone %s: %s, want %s", zone, got, want)
		}
	}
	path := snapshotPath(dir, ap, ".")
	snap := snapshots{path: path, log: log}
	if err := snap.save(c1, slog.LevelInfo); err != nil {
		t.Fatal(err)
	}

	c2, _ := cache.New(cache.DefaultConfig())
	snap.load(c2)
	if c2.Len() != 1 {
		t.Fatalf("loaded %d entries, want 1; logs:\n%s", c2.Len(), logs.String())
	}

	// A corrupt snapshot is logged and ignored.
	os.WriteFile(path, []byte("DSBYSNAP garbage"), 0o600)
	c3, _ := cache.New(cache.DefaultConfig())
	logs.Reset()
	snap.load(c3)
	if c3.Len() != 0 || !strings.Contains(logs.String(), "cache snapshot ignored") {
		t.Fatalf("corrupt snapshot: %d entries; logs:\n%s", c3.Len(), logs.String())
	}
	// None at all: a note, nothing else.
	logs.Reset()
	snapshots{path: filepath.Join(t.TempDir(), "none"), log: log}.load(c3)
	if !strings.Contains(logs.String(), "no cache snapshot") {
		t.Fatalf("logs:\n%s", logs.String())
	}
}
