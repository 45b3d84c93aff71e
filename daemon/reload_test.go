package daemon

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/corefile"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// TestCorefileReload: a Corefile rewritten while the daemon serves takes
// effect within 2 s, with no query lost on the way; a broken one is
// logged and the routes in force stay.
func TestCorefileReload(t *testing.T) {
	upA, upB := nstest.StartAnswerer(t, "192.0.2.1"), nstest.StartAnswerer(t, "192.0.2.2")
	base := loopbackConfig(t, upA)
	listen := base.Listen[0]
	path := filepath.Join(t.TempDir(), "Corefile")
	write := func(text string) { t.Helper(); rewrite(t, path, text) }
	forwardTo := func(up netip.AddrPort) string {
		return fmt.Sprintf(".:%d {\n    bind %s\n    forward . %s\n}\n", listen.Port(), listen.Addr(), up)
	}
	write(forwardTo(upA))
	cfg := resolved(t, corefileLayer(base, path))
	cfg.ReloadInterval = 100 * time.Millisecond
	r := start(t, cfg)

	var n atomic.Int64
	ask := func(name string) (string, error) { return askA(listen, name) }
	fresh := func() string { return fmt.Sprintf("q%d.example.", n.Add(1)) }
	if got, err := ask(fresh()); err != nil || got != "192.0.2.1" {
		t.Fatalf("before the reload: %s %v, want 192.0.2.1", got, err)
	}

	// Queries all through the reload: none may go unanswered.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var sent, failed atomic.Int64
	var firstErr atomic.Value
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				sent.Add(1)
				if _, err := ask(fresh()); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
			}
		})
	}
	write(forwardTo(upB))
	start := time.Now()
	testkit.Eventually(t, 2*time.Second, "the rewritten Corefile in force", func() bool {
		got, err := ask(fresh())
		return err == nil && got == "192.0.2.2"
	})
	took := time.Since(start)
	// The load goes on until the replaced upstream group is stopped, once
	// the resolutions that started with it are done.
	testkit.Eventually(t, 10*time.Second, "the replaced routes stopped", func() bool {
		return strings.Contains(r.logs.String(), `"msg":"replaced routes stopped"`)
	})
	close(stop)
	wg.Wait()
	t.Logf("reload in force after %s; %d queries during it, %d unanswered", took.Round(time.Millisecond), sent.Load(), failed.Load())
	if failed.Load() != 0 {
		t.Errorf("%d of %d queries failed during the reload, first: %v", failed.Load(), sent.Load(), firstErr.Load())
	}

	// A broken Corefile: logged, and the routes in force stay.
	write(".:53 {\n  cache 3600 {\n    serve_stale notaduration\n  }\n}\n")
	testkit.Eventually(t, 2*time.Second, "the broken Corefile reported", func() bool {
		return strings.Contains(r.logs.String(), `"msg":"Corefile change not applied: the configuration in force stays"`)
	})
	if got, err := ask(fresh()); err != nil || got != "192.0.2.2" {
		t.Fatalf("after a broken Corefile: %s %v, want 192.0.2.2 from the routes in force", got, err)
	}
	st := r.d.Status()
	if len(st.Upstreams) != 1 || st.Upstreams[0].Server != upB.String() {
		t.Errorf("status upstreams %+v, want only %s", st.Upstreams, upB)
	}
	// What stays in force is the Corefile's last good content: the last
	// known good, the refusal said.
	if src := st.Config.Source; src.From != SourceLastGood || src.Reason != "plugin" {
		t.Errorf("status source after a refused change %+v, want last-good, refused for plugin", src)
	}
}

// TestReloadCaches: each zone of a listener has a cache of its own; a
// reload keeps the cache of a zone whose policy stays, carries the
// entries of one whose policy changed over to its new cache, and drops
// the cache of a zone no longer routed.
func TestReloadCaches(t *testing.T) {
	upA, upB := nstest.StartAnswerer(t, "192.0.2.1"), nstest.StartAnswerer(t, "192.0.2.2")
	base := loopbackConfig(t, upA)
	listen := base.Listen[0]
	path := filepath.Join(t.TempDir(), "Corefile")
	corefileText := func(rootUp netip.AddrPort, rootTTL int, extraZone string) string {
		text := fmt.Sprintf(".:%d {\n    bind %s\n    forward . %s\n    cache %d {\n        serve_stale 3600s verify\n    }\n}\n", listen.Port(), listen.Addr(), rootUp, rootTTL)
		if extraZone != "" {
			text += fmt.Sprintf("%s:%d {\n    bind %s\n    forward . %s\n}\n", extraZone, listen.Port(), listen.Addr(), upA)
		}
		return text
	}
	write := func(text string) { t.Helper(); rewrite(t, path, text) }
	write(corefileText(upA, 3600, "cluster.local"))
	cfg := resolved(t, corefileLayer(base, path))
	cfg.ReloadInterval = 50 * time.Millisecond
	r := start(t, cfg)
	caches := func() map[string]*zoneCache {
		v := r.d.views[0]
		v.mu.Lock()
		defer v.mu.Unlock()
		return v.set.caches
	}
	ask := func(name string) string {
		t.Helper()
		a, err := askA(listen, name)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}

	first := caches()
	if len(first) != 2 || first["."] == first["cluster.local."] {
		t.Fatalf("caches %v, want two: one for . and one for cluster.local.", first)
	}
	if got := ask("www.example."); got != "192.0.2.1" {
		t.Fatalf("first answer %s", got)
	}
	if first["."].c.Len() != 1 || first["cluster.local."].c.Len() != 0 {
		t.Fatalf("entries: . %d, cluster.local. %d; want 1 and 0", first["."].c.Len(), first["cluster.local."].c.Len())
	}

	// The root's forward changes, its cache policy does not: same cache,
	// so the cached answer stays.
	write(corefileText(upB, 3600, "cluster.local"))
	testkit.Eventually(t, 2*time.Second, "the new forward in force", func() bool {
		for _, u := range r.d.Status().Upstreams {
			if u.Zone == "." && u.Server == upB.String() {
				return true
			}
		}
		return false
	})
	if c := caches(); c["."] != first["."] || c["cluster.local."] != first["cluster.local."] {
		t.Fatal("a reload that keeps the cache policy replaced a cache")
	}
	if got := ask("www.example."); got != "192.0.2.1" {
		t.Fatalf("after a forward change: %s, want the cached 192.0.2.1", got)
	}

	// The root's cache policy changes and cluster.local goes: a new root
	// cache with the old one's entry, and no cluster.local cache.
	write(corefileText(upB, 600, ""))
	testkit.Eventually(t, 2*time.Second, "the new cache policy in force", func() bool { return caches()["."] != first["."] })
	c := caches()
	if len(c) != 1 || c["."].cfg.MaxTTL != 600*time.Second || c["."].c.Len() != 1 {
		t.Fatalf("after a policy change: %d caches, root max TTL %s with %d entries; want 1, 10m0s, 1", len(c), c["."].cfg.MaxTTL, c["."].c.Len())
	}
	if got := ask("www.example."); got != "192.0.2.1" {
		t.Fatalf("after a policy change: %s, want the carried-over 192.0.2.1", got)
	}
	// The new cache's metrics are registered just after it is in force.
	var body string
	testkit.Eventually(t, time.Second, "the new cache's metrics, and none of cluster.local's", func() bool {
		body = metricsText(t, cfg.MetricsAddr)
		return strings.Contains(body, `dnsstandby_cache_entries{listener="`+listen.String()+`",zone="."} 1`) && !strings.Contains(body, `zone="cluster.local."`)
	})
}

// TestReloadNow: Reload (what SIGHUP maps to) applies a rewritten
// Corefile at once, by the reload of the periodic check, with the
// periodic check off; it brackets the reload with RELOADING=1 and READY=1
// for systemd, logs one line per reload with its outcome, and the daemon
// serves on. A daemon without a Corefile says it has nothing to reload.
func TestReloadNow(t *testing.T) {
	sd := notifySocket(t)
	upA, upB := nstest.StartAnswerer(t, "192.0.2.1"), nstest.StartAnswerer(t, "192.0.2.2")
	base := loopbackConfig(t, upA)
	listen := base.Listen[0]
	path := filepath.Join(t.TempDir(), "Corefile")
	forwardTo := func(up netip.AddrPort) string {
		return fmt.Sprintf(".:%d {\n    bind %s\n    forward . %s\n}\n", listen.Port(), listen.Addr(), up)
	}
	rewrite(t, path, forwardTo(upA))
	cfg := resolved(t, corefileLayer(base, path))
	cfg.ReloadInterval = 0 // only Reload reloads
	r := start(t, cfg)
	notified := func(want string) {
		t.Helper()
		for end := time.After(2 * time.Second); ; {
			select {
			case m := <-sd:
				if strings.HasPrefix(m, want) {
					return
				}
			case <-end:
				t.Fatalf("no %q notified", want)
			}
		}
	}
	notified("READY=1\nSTATUS=serving")
	lines := func(msg string) int { return strings.Count(r.logs.String(), `"msg":"`+msg+`"`) }

	rewrite(t, path, forwardTo(upB))
	time.Sleep(300 * time.Millisecond)
	if got, err := askA(listen, freshName()); err != nil || got != "192.0.2.1" {
		t.Fatalf("rewritten, not reloaded: %s %v, want 192.0.2.1 still", got, err)
	}
	asked := time.Now()
	r.d.Reload()
	testkit.Eventually(t, time.Second, "the rewritten Corefile in force", func() bool {
		got, err := askA(listen, freshName())
		return err == nil && got == "192.0.2.2"
	})
	t.Logf("in force %s after Reload", time.Since(asked).Round(time.Millisecond))
	notified("RELOADING=1\nMONOTONIC_USEC=")
	notified("READY=1")
	if n := lines("Corefile reloaded"); n != 1 || !strings.Contains(r.logs.String(), `"trigger":"reload"`) {
		t.Errorf("%d \"Corefile reloaded\" lines, want 1, with trigger reload", n)
	}

	// Asked again with nothing changed: said so, routes kept.
	r.d.Reload()
	testkit.Eventually(t, time.Second, "the unchanged reload logged", func() bool {
		return lines("reload: nothing changed: the configuration in force stays") == 1
	})
	// A refused Corefile: the routes in force stay.
	rewrite(t, path, ".:53 {\n  cache 3600 {\n    serve_stale notaduration\n  }\n}\n")
	r.d.Reload()
	testkit.Eventually(t, time.Second, "the refused Corefile logged", func() bool {
		return lines("Corefile change not applied: the configuration in force stays") == 1
	})
	if got, err := askA(listen, freshName()); err != nil || got != "192.0.2.2" {
		t.Errorf("after a refused reload: %s %v, want 192.0.2.2 from the routes in force", got, err)
	}
	if n := lines("Corefile reloaded"); n != 1 {
		t.Errorf("%d \"Corefile reloaded\" lines after three reloads, one applied, want 1", n)
	}
	if err := r.stop(); err != nil {
		t.Errorf("Run after the reloads: %v", err)
	}

	// Without a Corefile: nothing to reload, said so.
	flags := start(t, loopbackConfig(t, upA))
	flags.d.Reload()
	if !strings.Contains(flags.logs.String(), `"msg":"reload: nothing to reload`) {
		t.Errorf("Reload without a Corefile did not say there is nothing to reload")
	}
}

// askA asks listen for name's A record and returns its one address.
func askA(listen netip.AddrPort, name string) (string, error) {
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	resp, _, err := (&dns.Client{Timeout: time.Second}).Exchange(m, listen.String())
	if err != nil {
		return "", err
	}
	if len(resp.Answer) != 1 {
		return "", fmt.Errorf("%s: %s %v", name, dns.RcodeToString[resp.Rcode], resp.Answer)
	}
	return resp.Answer[0].(*dns.A).A.String(), nil
}

// freshName is a name no test has asked before.
func freshName() string { return fmt.Sprintf("q%d.example.", time.Now().UnixNano()) }

// rewrite replaces the file at path by text as localdns.sh and editors
// do: a new file renamed over the old.
func rewrite(t *testing.T, path, text string) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// corefileLayer returns what Config.Layer is given in these tests: base
// with the routes of a Corefile, as the command line layers it, and path
// as the Corefile to read.
func corefileLayer(base Config, path string) Layer {
	return func(src *corefile.Source) (Config, error) {
		cfg := base
		cfg.Corefile = path
		if src == nil {
			return cfg, nil
		}
		cfg.Routes = nil
		s, err := src.Settings(cfg.Listen)
		if err != nil {
			return Config{}, err
		}
		ApplyCorefile(&cfg, s)
		return cfg, nil
	}
}

// resolved is Resolve of layer, ready to run: its Resolver and Provenance
// set as the command line sets them.
func resolved(t *testing.T, layer Layer) Config {
	t.Helper()
	res := &Resolver{Layer: layer}
	cfg, prov, err := res.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Resolver, cfg.Provenance = res, prov
	return cfg
}
