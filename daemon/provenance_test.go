package daemon

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dnsstandby/dnsstandby/corefile"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
	"github.com/dnsstandby/dnsstandby/lastgood"
)

// TestResolve checks the rule, the Corefile > the last known good > the
// fallback, for each way the Corefile can be missing or refused.
func TestResolve(t *testing.T) {
	listen := netip.MustParseAddrPort("169.254.10.11:53")
	good := ".:53 {\n  bind 169.254.10.11\n  forward . 10.0.0.1\n}\n"
	other := ".:53 {\n  bind 169.254.10.11\n  forward . 10.0.0.2\n}\n"
	tests := []struct {
		name     string
		corefile string // "" : no file
		lastGood string // "" : none; "damaged": not JSON
		wantFrom string
		wantUp   string // the root route's first server
		reason   string // corefile.Reason of the refusal, "" for none
	}{
		{"good Corefile", good, other, SourceFile, "10.0.0.1:53", ""},
		{"misspelt directive: last known good", strings.Replace(good, "forward", "froward", 1), other, SourceLastGood, "10.0.0.2:53", "unknown_directive"},
		{"bad address: last known good", strings.Replace(good, "10.0.0.1", "10.0.0.300", 1), other, SourceLastGood, "10.0.0.2:53", "plugin"},
		{"truncated: last known good", good[:20], other, SourceLastGood, "10.0.0.2:53", "syntax"},
		{"missing: last known good", "", other, SourceLastGood, "10.0.0.2:53", "missing"},
		{"no block for the listener: last known good", ".:53 {\n  bind 169.254.10.10\n  forward . 10.0.0.1\n}\n", other, SourceLastGood, "10.0.0.2:53", "no_server_block"},
		{"refused: no last known good", strings.Replace(good, "forward", "froward", 1), "", SourceFallback, "10.0.0.10:53", "unknown_directive"},
		{"refused: damaged last known good", strings.Replace(good, "forward", "froward", 1), "damaged", SourceFallback, "10.0.0.10:53", "unknown_directive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "Corefile")
			if tt.corefile != "" {
				write(t, path, tt.corefile)
			}
			base := DefaultConfig()
			base.Listen = []netip.AddrPort{listen}
			base.StateDir = filepath.Join(dir, "state")
			base.Fallback.Upstreams = []netip.AddrPort{netip.MustParseAddrPort("10.0.0.10:53")}
			if err := os.Mkdir(base.StateDir, 0o700); err != nil {
				t.Fatal(err)
			}
			switch tt.lastGood {
			case "":
			case "damaged":
				write(t, lastgood.Path(base.StateDir), "{not json")
			default:
				src, err := corefile.ReadFrom("/opt/old.corefile", strings.NewReader(tt.lastGood))
				if err != nil {
					t.Fatal(err)
				}
				if err := lastgood.Save(base.StateDir, lastgood.New(src, time.Now().Add(-time.Hour))); err != nil {
					t.Fatal(err)
				}
			}
			cfg, prov, err := (&Resolver{Layer: corefileLayer(base, path)}).Resolve()
			if err != nil {
				t.Fatal(err)
			}
			if prov.Source != tt.wantFrom {
				t.Fatalf("source %s, want %s (refused %v, last good %v)", prov.Source, tt.wantFrom, prov.Refused, prov.LastGood)
			}
			if got := corefile.Reason(prov.Refused); prov.Refused != nil && got != tt.reason || prov.Refused == nil && tt.reason != "" {
				t.Errorf("refused %v (%s), want reason %q", prov.Refused, got, tt.reason)
			}
			if tt.lastGood == "damaged" && prov.LastGood == nil {
				t.Error("a damaged last known good is not reported")
			}
			var root *Route
			for i := range cfg.Routes {
				if cfg.Routes[i].Zone == "." {
					root = &cfg.Routes[i]
				}
			}
			if root == nil || root.Upstream.Servers[0].String() != tt.wantUp {
				t.Errorf("routes %+v, want the root to %s", cfg.Routes, tt.wantUp)
			}
			if err := cfg.Validate(); err != nil {
				t.Errorf("resolved configuration invalid: %v", err)
			}
			if !slices.Contains(cfg.Watch, path) {
				t.Errorf("Watch %v lacks the Corefile: it must be watched whatever is in force", cfg.Watch)
			}
		})
	}
}

// TestFallbackRoutes checks the fallback's routes: kube-dns for the
// pods' listener, cluster.local to kube-dns and the rest to the node's
// resolvers (never loopback nor LocalDNS's own addresses) for the node's.
func TestFallbackRoutes(t *testing.T) {
	dir := t.TempDir()
	rc := filepath.Join(dir, "resolv.conf")
	write(t, rc, "# systemd-resolved\nnameserver 127.0.0.53\nnameserver 169.254.10.10\nnameserver 169.254.10.11\nnameserver 168.63.129.16\nnameserver 10.1.0.4\nnameserver 168.63.129.16\nsearch example.internal\n")
	cfg := DefaultConfig()
	cfg.Listen = []netip.AddrPort{netip.MustParseAddrPort("169.254.10.10:53"), netip.MustParseAddrPort("169.254.10.11:53")}
	cfg.Fallback.Upstreams = []netip.AddrPort{netip.MustParseAddrPort("10.0.0.10:53")}
	cfg.Fallback.ResolvConf = rc
	var got []string
	for _, r := range cfg.fallbackRoutes() {
		got = append(got, fmt.Sprintf("%s %s %v %s", r.Listen, r.Zone, r.Upstream.Servers, r.Upstream.Policy))
	}
	want := []string{
		"169.254.10.10:53 cluster.local. [10.0.0.10:53] sequential",
		"169.254.10.10:53 . [168.63.129.16:53 10.1.0.4:53] sequential",
		"169.254.10.11:53 . [10.0.0.10:53] sequential",
	}
	if !slices.Equal(got, want) {
		t.Errorf("fallback routes\n got %q\nwant %q", got, want)
	}
	// No resolv.conf: the node listener keeps cluster.local only.
	cfg.Fallback.ResolvConf = filepath.Join(dir, "absent")
	if rs := cfg.fallbackRoutes(); len(rs) != 2 || rs[0].Zone != clusterZone {
		t.Errorf("without resolvers: %+v", rs)
	}
}

// TestLastGoodServes runs the daemon through the rule's changes: from a
// good Corefile (written as the last known good), restarted on a refused
// one (serving the last known good, reported in status and metrics),
// then the Corefile fixed (applied at once, the source back to the file).
func TestLastGoodServes(t *testing.T) {
	upA, upB := nstest.StartAnswerer(t, "192.0.2.1"), nstest.StartAnswerer(t, "192.0.2.2")
	base := loopbackConfig(t, upA)
	listen := base.Listen[0]
	path := filepath.Join(t.TempDir(), "Corefile")
	forwardTo := func(up netip.AddrPort) string {
		return fmt.Sprintf(".:%d {\n    bind %s\n    forward . %s\n}\n", listen.Port(), listen.Addr(), up)
	}
	layer := corefileLayer(base, path)
	ask := func() string { return askFresh(listen) }

	rewrite(t, path, forwardTo(upA))
	r := start(t, resolved(t, layer))
	if got := ask(); got != "192.0.2.1" {
		t.Fatalf("from the Corefile: %s", got)
	}
	rec, err := lastgood.Load(base.StateDir, corefile.Build{})
	if err != nil || rec.Source.File != path {
		t.Fatalf("last known good after a start from the Corefile: %+v %v", rec, err)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}

	// Restarted on a refused Corefile that would send elsewhere.
	rewrite(t, path, strings.Replace(forwardTo(upB), "forward", "froward", 1))
	cfg := resolved(t, layer)
	cfg.ReloadInterval = 50 * time.Millisecond
	r = start(t, cfg)
	if got := ask(); got != "192.0.2.1" {
		t.Fatalf("from the last known good: %s, want 192.0.2.1", got)
	}
	if !strings.Contains(r.logs.String(), `"msg":"Corefile refused: serving the last known good configuration until it is good again"`) {
		t.Error("no warning at a start from the last known good")
	}
	st := r.d.Status().Config.Source
	if st.From != SourceLastGood || st.Reason != "unknown_directive" || st.Corefile != path || st.Applied == "" {
		t.Errorf("status source %+v", st)
	}
	body := metricsText(t, cfg.MetricsAddr)
	for _, want := range []string{
		`dnsstandby_config_source{source="last-good"} 1`,
		`dnsstandby_config_source{source="file"} 0`,
		`dnsstandby_corefile_refusals_total{reason="unknown_directive"} 1`,
		`dnsstandby_config_applied_timestamp_seconds `,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}

	// A refused change while on the last known good: still refused.
	rewrite(t, path, strings.Replace(forwardTo(upB), upB.String(), "10.0.0.300", 1))
	testkit.Eventually(t, 2*time.Second, "the second refusal counted", func() bool {
		return strings.Contains(metricsText(t, cfg.MetricsAddr), `dnsstandby_corefile_refusals_total{reason="plugin"} 1`)
	})
	if got := ask(); got != "192.0.2.1" {
		t.Fatalf("after a second refused Corefile: %s, want 192.0.2.1", got)
	}

	// Fixed: applied at once.
	rewrite(t, path, forwardTo(upB))
	testkit.Eventually(t, 2*time.Second, "the fixed Corefile in force", func() bool { return ask() == "192.0.2.2" })
	// The provenance follows the routes into force.
	testkit.Eventually(t, time.Second, "the status's source back to the file", func() bool {
		st := r.d.Status().Config.Source
		return st.From == SourceFile && st.Refused == ""
	})
	if rec, err := lastgood.Load(base.StateDir, corefile.Build{}); err != nil || !strings.Contains(rec.Source.SHA256, r.d.Status().Config.Source.SHA256) {
		t.Errorf("last known good after the fix: %v", err)
	}
}

// TestFallbackServes runs the daemon on a node that never had a good
// Corefile: refused, no last known good. It answers through the fallback,
// says so, and takes the Corefile once it is good.
func TestFallbackServes(t *testing.T) {
	kube, good := nstest.StartAnswerer(t, "192.0.2.10"), nstest.StartAnswerer(t, "192.0.2.20")
	base := loopbackConfig(t, kube)
	base.Routes = nil
	base.Fallback.Upstreams = []netip.AddrPort{kube}
	listen := base.Listen[0]
	path := filepath.Join(t.TempDir(), "Corefile")
	corefileText := fmt.Sprintf(".:%d {\n    bind %s\n    forward . %s\n}\n", listen.Port(), listen.Addr(), good)
	rewrite(t, path, strings.Replace(corefileText, "forward", "froward", 1))
	cfg := resolved(t, corefileLayer(base, path))
	cfg.ReloadInterval = 50 * time.Millisecond
	r := start(t, cfg)
	ask := func() string { return askFresh(listen) }
	if got := ask(); got != "192.0.2.10" {
		t.Fatalf("from the fallback: %s, want kube-dns's 192.0.2.10", got)
	}
	if st := r.d.Status().Config.Source; st.From != SourceFallback || st.Reason != "unknown_directive" {
		t.Errorf("status source %+v", st)
	}
	if !strings.Contains(r.logs.String(), `"msg":"Corefile refused and no last known good configuration: serving the fallback until the Corefile is good again"`) {
		t.Error("no warning at a start from the fallback")
	}
	rewrite(t, path, corefileText)
	testkit.Eventually(t, 2*time.Second, "the good Corefile in force", func() bool { return ask() == "192.0.2.20" })
	// The new routes answer before the reload writes the last known good
	// (a few milliseconds later).
	testkit.Eventually(t, 2*time.Second, "a last known good once the Corefile is good", func() bool {
		_, err := lastgood.Load(base.StateDir, corefile.Build{})
		return err == nil
	})
}

// TestHandedLastGood checks that a last known good handed over by the
// previous process replaces the fallback before anything is built, is
// kept in the state directory, and leaves the Corefile watched.
func TestHandedLastGood(t *testing.T) {
	up := nstest.StartAnswerer(t, "192.0.2.1")
	base := loopbackConfig(t, up)
	listen := base.Listen[0]
	path := filepath.Join(t.TempDir(), "Corefile") // never written: missing
	base.Fallback.Upstreams = []netip.AddrPort{netip.MustParseAddrPort("192.0.2.53:53")}
	base.Routes = nil
	cfg := resolved(t, corefileLayer(base, path))
	if cfg.Provenance.Source != SourceFallback {
		t.Fatalf("source %s, want fallback", cfg.Provenance.Source)
	}
	d, err := New(cfg, testkit.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	d.openStateDir()
	src, err := corefile.ReadFrom("/opt/handed.corefile", strings.NewReader(fmt.Sprintf(".:%d {\n  bind %s\n  forward . %s\n}\n", listen.Port(), listen.Addr(), up)))
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := lastgood.Encode(&b, lastgood.New(src, time.Now())); err != nil {
		t.Fatal(err)
	}
	d.takeHandedLastGood(b.Bytes())
	if p := d.config.provenance(); p.Source != SourceLastGood || p.Corefile != "/opt/handed.corefile" {
		t.Fatalf("provenance %+v", p)
	}
	if len(d.cfg.Routes) != 1 || d.cfg.Routes[0].Upstream.Servers[0] != up {
		t.Errorf("routes %+v, want the handed Corefile's", d.cfg.Routes)
	}
	// The Corefile is still watched: a reload (SIGHUP, the periodic
	// check) can replace what was handed.
	if d.cfg.Resolver != cfg.Resolver || !slices.Equal(d.cfg.Watch, cfg.Watch) {
		t.Errorf("after the handed last known good: Resolver %p, Watch %v; want %p, %v", d.cfg.Resolver, d.cfg.Watch, cfg.Resolver, cfg.Watch)
	}
	if _, err := lastgood.Load(base.StateDir, corefile.Build{}); err != nil {
		t.Errorf("the handed last known good is not kept: %v", err)
	}
}

// askFresh asks listen for a name never asked before and returns the
// answer's address, or what went wrong.
func askFresh(listen netip.AddrPort) string {
	a, err := askA(listen, freshName())
	if err != nil {
		return err.Error()
	}
	return a
}

func write(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

func metricsText(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
