package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/dnsstandby/dnsstandby/admin"
	"github.com/dnsstandby/dnsstandby/corefile"
	"github.com/dnsstandby/dnsstandby/handover"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

// loopbackConfig is a daemon on a free loopback address of the host's
// namespace, forwarding to up: no anchor link (the host's namespace is
// not ours to change), no mirror, an admin socket and a state directory
// of the test's own.
func loopbackConfig(t *testing.T, up netip.AddrPort) Config {
	cfg := DefaultConfig()
	cfg.Listen = []netip.AddrPort{nstest.FreeLoopbackAddr(t)}
	cfg.Routes = []Route{NewRoute(".", up)}
	cfg.MetricsAddr = nstest.FreeLoopbackAddr(t).String()
	cfg.AdminSocket = filepath.Join(t.TempDir(), "admin.sock")
	cfg.StateDir = t.TempDir()
	cfg.LockFile = filepath.Join(t.TempDir(), "dnsstandby.lock")
	cfg.Anchor.Link = ""
	cfg.Mirror = Mirror{Kind: MirrorNone}
	cfg.Responder.ReadersPerSocket = 2
	cfg.LocalDNSCoreDNS = "" // the standard build, whatever this machine has
	return cfg
}

// running is a daemon started by start, its logs, and how to stop it.
type running struct {
	d    *Daemon
	logs *syncBuffer
	stop func() error // cancels Run's context and returns what Run returned
}

// syncBuffer is a bytes.Buffer the daemon's goroutines may log into while
// the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// start runs a daemon with cfg until the test ends or stop is called,
// and waits until it is ready.
func start(t *testing.T, cfg Config) *running {
	t.Helper()
	logs := &syncBuffer{}
	d, err := New(cfg, slog.New(slog.NewJSONHandler(io.MultiWriter(logs, t.Output()), &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(15 * time.Second):
				runErr = fmt.Errorf("Run did not return within 15s")
			}
		})
		return runErr
	}
	t.Cleanup(func() { _ = stop() })
	select {
	case <-d.Ready():
	case err := <-done:
		t.Fatalf("Run returned before ready: %v", err)
	case <-time.After(15 * time.Second):
		t.Fatal("not ready within 15s")
	}
	return &running{d: d, logs: logs, stop: stop}
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestRunServesAndStops runs the whole daemon on loopback: it answers
// from upstream and then from cache, serves its HTTP endpoints and admin
// socket, and at stop drains, closes and writes its snapshot.
func TestRunServesAndStops(t *testing.T) {
	up := nstest.StartAnswerer(t, "192.0.2.53")
	cfg := loopbackConfig(t, up)
	r := start(t, cfg)
	base := "http://" + cfg.MetricsAddr
	if code, _ := httpGet(t, base+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz %d once Ready is closed", code)
	}

	c := &dns.Client{Timeout: 2 * time.Second}
	for i := range 2 {
		m := new(dns.Msg)
		m.SetQuestion("Pod-Name.example.", dns.TypeA)
		m.SetEdns0(1232, false)
		m.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_NSID{Code: dns.EDNS0NSID}}
		resp, _, err := c.Exchange(m, cfg.Listen[0].String())
		if err != nil {
			t.Fatalf("query %d: %v", i, err)
		}
		if len(resp.Answer) != 1 || resp.Question[0].Name != "Pod-Name.example." {
			t.Fatalf("query %d: %v", i, resp)
		}
		nsid, _ := resp.IsEdns0().Option[0].(*dns.EDNS0_NSID)
		if nsid == nil || nsid.Nsid != fmt.Sprintf("%x", "dnsstandby") {
			t.Fatalf("query %d: NSID %v", i, resp.IsEdns0())
		}
	}
	if code, body := httpGet(t, base+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz %d %s", code, body)
	}
	_, body := httpGet(t, base+"/metrics")
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	value := func(name string, labels ...string) float64 {
		for _, m := range fams[name].GetMetric() {
			ok := true
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, l := range m.GetLabel() {
					found = found || (l.GetName() == labels[i] && l.GetValue() == labels[i+1])
				}
				ok = ok && found
			}
			if ok {
				if g := m.GetGauge(); g != nil {
					return g.GetValue()
				}
				return m.GetCounter().GetValue()
			}
		}
		return -1
	}
	for _, tt := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"dnsstandby_queries_total", []string{"source", "upstream"}, 1},
		{"dnsstandby_queries_total", []string{"source", "cache"}, 1},
		{"dnsstandby_cache_entries", nil, 1},
		{"dnsstandby_upstream_healthy", []string{"zone", ".", "server", up.String()}, 1},
		{"dnsstandby_build_info", []string{"goversion", runtime.Version()}, 1},
		// No LocalDNS shares this address: takeover.
		{"dnsstandby_mode", []string{"mode", "takeover"}, 1},
	} {
		if got := value(tt.name, tt.labels...); got != tt.want {
			t.Errorf("%s%v = %v, want %v", tt.name, tt.labels, got, tt.want)
		}
	}

	// The admin socket: status from the parts, hold and release to
	// takeover.
	ctx := context.Background()
	for _, step := range []struct {
		req        admin.Request
		wantMode   string
		wantReason string
	}{
		{admin.Request{Cmd: "status"}, "takeover", "start"},
		{admin.Request{Cmd: "hold", For: "1m"}, "hold", "operator"},
		{admin.Request{Cmd: "release"}, "takeover", "operator-release"},
	} {
		resp, err := admin.Do(ctx, cfg.AdminSocket, step.req)
		if err != nil {
			t.Fatalf("%s: %v", step.req.Cmd, err)
		}
		st := r.d.Status()
		if st.Mode != step.wantMode || st.Reason != step.wantReason || !strings.Contains(string(resp.Status), `"mode":"`+step.wantMode+`"`) {
			t.Errorf("%s: mode %s (%s), want %s (%s); answered %s", step.req.Cmd, st.Mode, st.Reason, step.wantMode, step.wantReason, resp.Status)
		}
	}
	if code, body := httpGet(t, base+"/debug/events"); code != http.StatusOK || !strings.Contains(body, `"reason":"operator-release"`) {
		t.Errorf("/debug/events %d %s", code, body)
	}

	if err := r.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	logs := r.logs.String()
	for _, want := range []string{`"msg":"shutting down"`, `"msg":"cache snapshot written","component":"snapshot","listener":"` + cfg.Listen[0].String() + `","zone":".","entries":1`, `"msg":"stopped"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("no %s in the logs", want)
		}
	}
	// Stopped in reverse order of start: shutting down (first closer)
	// before the snapshot (near last) before stopped.
	if i, j := strings.Index(logs, `"shutting down"`), strings.Index(logs, `"cache snapshot written"`); i < 0 || j < i {
		t.Errorf("snapshot written before shutting down:\n%s", logs)
	}
	if fi, err := os.Stat(snapshotPath(cfg.StateDir, cfg.Listen[0], ".")); err != nil || fi.Size() == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("snapshot after stop: %v %v", fi, err)
	}
	// Everything is closed: the addresses can be bound again.
	for _, addr := range []string{cfg.Listen[0].String(), cfg.MetricsAddr} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("%s still in use after stop: %v", addr, err)
			continue
		}
		ln.Close()
	}
	if _, err := os.Stat(cfg.AdminSocket); err == nil {
		t.Errorf("admin socket %s left behind", cfg.AdminSocket)
	}
}

// TestStartFailureStopsWhatStarted: a part that cannot start (here the
// admin socket, whose path is a regular file) makes Run return its error
// with every part started before it stopped.
func TestStartFailureStopsWhatStarted(t *testing.T) {
	cfg := loopbackConfig(t, nstest.StartAnswerer(t, "192.0.2.53"))
	if err := os.WriteFile(cfg.AdminSocket, []byte("not a socket"), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := New(cfg, slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- d.Run(context.Background()) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "not a socket") {
			t.Fatalf("Run: %v, want the admin socket's error", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return")
	}
	select {
	case <-d.Ready():
		t.Error("Ready closed for a daemon that did not start")
	default:
	}
	// The listeners, started before the admin socket, are closed.
	ln, err := net.Listen("tcp", cfg.Listen[0].String())
	if err != nil {
		t.Fatalf("listen address still in use: %v", err)
	}
	ln.Close()
	// The snapshot closer ran too (the state directory was usable).
	if _, err := os.Stat(snapshotPath(cfg.StateDir, cfg.Listen[0], ".")); err != nil {
		t.Errorf("no snapshot after a failed start: %v", err)
	}
}

func TestValidate(t *testing.T) {
	up := netip.MustParseAddrPort("10.0.0.10:53")
	tests := []struct {
		name    string
		edit    func(*Config)
		wantErr string
	}{
		{"valid", func(c *Config) {}, ""},
		{"no listen", func(c *Config) { c.Listen = nil }, "no Listen"},
		{"no routes", func(c *Config) { c.Routes = nil }, "no Routes"},
		{"route without servers", func(c *Config) { c.Routes = []Route{NewRoute("cluster.local.")} }, "route cluster.local. has no servers and no answers of its own"},
		{"loop", func(c *Config) { c.Routes = []Route{NewRoute(".", c.Listen[0])} }, "would loop"},
		{"route for another address", func(c *Config) { c.Routes[0].Listen = netip.MustParseAddrPort("169.254.10.10:53") }, "not a listen address"},
		{"listener without routes", func(c *Config) {
			c.Listen = append(c.Listen, netip.MustParseAddrPort("169.254.10.10:53"))
			c.Routes[0].Listen = c.Listen[0]
		}, "no Routes for listen address 169.254.10.10:53"},
		{"zone twice on one listener", func(c *Config) { c.Routes = append(c.Routes, NewRoute(".", up)) }, "zone . routed twice on 169.254.10.11:53"},
		{"dnstap with two listeners", func(c *Config) {
			c.Listen = append(c.Listen, netip.MustParseAddrPort("169.254.10.10:53"))
			c.Mirror = Mirror{Kind: MirrorDnstap, DnstapPath: "/run/x.sock"}
		}, "does not say which listener"},
		{"steering", func(c *Config) { c.Takeover.Steering = "full" }, "Takeover: takeover: Steering"},
		{"mirror kind", func(c *Config) { c.Mirror.Kind = "tapz" }, `Mirror.Kind "tapz"`},
		{"dnstap without path", func(c *Config) { c.Mirror = Mirror{Kind: MirrorDnstap} }, "Mirror.DnstapPath"},
		{"snapshot interval", func(c *Config) { c.SnapshotInterval = 0 }, "SnapshotInterval"},
		{"no state dir, no interval needed", func(c *Config) { c.StateDir, c.SnapshotInterval = "", 0 }, ""},
		{"shutdown timeout", func(c *Config) { c.ShutdownTimeout = -time.Second }, "ShutdownTimeout"},
		{"metrics address without port", func(c *Config) { c.MetricsAddr = "localhost" }, `MetricsAddr "localhost": want HOST:PORT`},
		{"metrics address with port 0", func(c *Config) { c.MetricsAddr = "127.0.0.1:0" }, "is not a port number"},
		{"metrics off", func(c *Config) { c.MetricsAddr = "" }, ""},
		{"HTTP idle timeout", func(c *Config) { c.HTTP.IdleTimeout = 0 }, "HTTP.IdleTimeout must be positive"},
		{"HTTP header bytes", func(c *Config) { c.HTTP.MaxHeaderBytes = 100 }, "HTTP.MaxHeaderBytes"},
		{"HTTP no connections", func(c *Config) { c.HTTP.MaxConns = 0 }, "HTTP.MaxConns must be positive"},
		{"HTTP per address over the total", func(c *Config) { c.HTTP.MaxConnsPerAddr = c.HTTP.MaxConns + 1 }, "HTTP.MaxConnsPerAddr"},
		{"HTTP limits unchecked with metrics off", func(c *Config) { c.MetricsAddr, c.HTTP = "", HTTPLimits{} }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Routes = []Route{NewRoute(".", up)}
			tt.edit(&cfg)
			_, err := New(cfg, nil)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.HasPrefix(err.Error(), "daemon: ") {
				t.Fatalf("error %v, want daemon: ...%s", err, tt.wantErr)
			}
		})
	}
}

// TestListenersKeepTheirOwnAnswers: two listen addresses, each with its
// own upstream for the same zone, as LocalDNS's node and pod listeners
// have. A name asked on one is answered from its own upstream and cache,
// never from the other's.
func TestListenersKeepTheirOwnAnswers(t *testing.T) {
	upNode, upPod := nstest.StartAnswerer(t, "192.0.2.10"), nstest.StartAnswerer(t, "192.0.2.11")
	cfg := loopbackConfig(t, upNode)
	node, pod := cfg.Listen[0], nstest.FreeLoopbackAddr(t)
	cfg.Listen = append(cfg.Listen, pod)
	rn, rp := NewRoute(".", upNode), NewRoute(".", upPod)
	rn.Listen, rp.Listen = node, pod
	cfg.Routes = []Route{rn, rp}
	r := start(t, cfg)

	ask := func(listen netip.AddrPort) string {
		t.Helper()
		m := new(dns.Msg)
		m.SetQuestion("shared.example.", dns.TypeA)
		resp, err := dns.Exchange(m, listen.String())
		if err != nil || len(resp.Answer) != 1 {
			t.Fatalf("%s: %v %v", listen, resp, err)
		}
		return resp.Answer[0].(*dns.A).A.String()
	}
	// Twice each: the second from each listener's own cache.
	for range 2 {
		if got := ask(node); got != "192.0.2.10" {
			t.Errorf("node listener answered %s, want its upstream's 192.0.2.10", got)
		}
		if got := ask(pod); got != "192.0.2.11" {
			t.Errorf("pod listener answered %s, want its upstream's 192.0.2.11", got)
		}
	}
	st := r.d.Status()
	if len(st.Upstreams) != 2 || st.Upstreams[0].Listener == st.Upstreams[1].Listener || st.Cache.Entries != 2 {
		t.Errorf("status upstreams %+v cache %+v", st.Upstreams, st.Cache)
	}
	_, body := httpGet(t, "http://"+cfg.MetricsAddr+"/metrics")
	for _, ap := range cfg.Listen {
		for _, want := range []string{
			`dnsstandby_cache_entries{listener="` + ap.String() + `",zone="."} 1`,
			`dnsstandby_queries_total{listener="` + ap.String() + `",source="cache"} 1`,
		} {
			if !strings.Contains(body, want) {
				t.Errorf("/metrics lacks %s", want)
			}
		}
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	for _, ap := range cfg.Listen {
		if _, err := os.Stat(snapshotPath(cfg.StateDir, ap, ".")); err != nil {
			t.Errorf("no snapshot for %s: %v", ap, err)
		}
	}
}

// TestValidateRefusesWhatRunRefuses: for settings a part's constructor
// refuses, Validate (what New and `dnsstandby run --validate` run)
// refuses them too, naming the same field: each case is run both ways,
// Validate, and Run without Validate in front of it. The anchor and the
// mirror feed are parts Run starts without (it logs why, as it does when
// the node refuses them); there, Validate is the stricter.
func TestValidateRefusesWhatRunRefuses(t *testing.T) {
	tests := []struct {
		name     string
		edit     func(*Config)
		want     string // in both errors
		degraded bool   // Run logs the error and serves without the part
	}{
		{"cache min TTL above max", func(c *Config) { c.Cache.MinTTL, c.Cache.MaxTTL = 2*time.Hour, time.Hour }, "MinTTL 2h0m0s is above MaxTTL 1h0m0s", false},
		{"block cache stale TTL", func(c *Config) {
			cc := c.Cache
			cc.StaleTTL = 1 << 62
			c.Routes[0].Cache = &cc
		}, "StaleTTL", false},
		{"NSID too long", func(c *Config) { c.Pipeline.NSID = strings.Repeat("n", 600) }, "NSID must be at most 512 bytes", false},
		{"responder batch", func(c *Config) { c.Responder.Batch = 5000 }, "Batch must be from 1 to 1024", false},
		{"upstream policy", func(c *Config) { c.Routes[0].Upstream.Policy = "fastest" }, `Policy must be sequential, round_robin or random, got "fastest"`, false},
		{"pipeline stale budget", func(c *Config) { c.Pipeline.StaleBudget = 0 }, "StaleBudget must be positive", false},
		{"takeover probe interval", func(c *Config) { c.Takeover.ProbeInterval = 0 }, "ProbeInterval must be positive", false},
		{"takeover machine", func(c *Config) { c.Takeover.Machine.HungAfter = 0 }, "Machine.HungAfter must be at least 1", false},
		{"anchor link name", func(c *Config) { c.Anchor.Link, c.Anchor.Kind = "a/b", "bridge" }, `Link "a/b"`, true},
		{"dnstap path", func(c *Config) { c.Mirror = Mirror{Kind: MirrorDnstap, DnstapPath: "/run/" + strings.Repeat("x", 120)} }, "longer than a unix socket address holds", true},
		{"hosts TTL", func(c *Config) {
			c.Routes[0].Hosts = &corefile.Hosts{File: "/nonexistent/hosts", TTL: 0}
		}, "Hosts.TTL must be 1 to 65535 seconds", false},
	}
	up := nstest.StartAnswerer(t, "192.0.2.1")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := loopbackConfig(t, up)
			tt.edit(&cfg)
			verr := cfg.Validate()
			if verr == nil || !strings.Contains(verr.Error(), tt.want) {
				t.Fatalf("Validate: %v, want an error containing %q", verr, tt.want)
			}
			logs := &syncBuffer{}
			d := newUnchecked(cfg, slog.New(slog.NewJSONHandler(io.MultiWriter(logs, t.Output()), nil)))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- d.Run(ctx) }()
			var rerr error
			select {
			case rerr = <-done:
			case <-d.Ready():
				cancel()
				rerr = <-done
			case <-time.After(10 * time.Second):
				t.Fatal("Run neither failed nor became ready")
			}
			if tt.degraded {
				inJSON := strings.Trim(strconv.Quote(tt.want), `"`)
				if rerr != nil || !strings.Contains(logs.String(), inJSON) {
					t.Fatalf("Run without Validate: %v, want it to serve and log %q:\n%s", rerr, tt.want, logs.String())
				}
				return
			}
			if rerr == nil || !strings.Contains(rerr.Error(), tt.want) {
				t.Fatalf("Run without Validate: %v, want an error containing %q", rerr, tt.want)
			}
		})
	}
}

// TestOneInstance: a second daemon with the same lock file returns
// ErrRunning, naming the first's PID, before it changes anything (its
// listen address stays free); the first keeps serving, and once it stops
// the lock is free again.
func TestOneInstance(t *testing.T) {
	up := nstest.StartAnswerer(t, "192.0.2.1")
	first := loopbackConfig(t, up)
	r := start(t, first)

	second := loopbackConfig(t, up)
	second.LockFile = first.LockFile
	d, err := New(second, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = d.Run(ctx)
	if !errors.Is(err, handover.ErrRunning) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d holds %s", os.Getpid(), first.LockFile)) {
		t.Fatalf("second Run: %v, want ErrRunning naming pid %d", err, os.Getpid())
	}
	for _, addr := range []string{second.Listen[0].String(), second.MetricsAddr} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("%s in use: the second daemon started something: %v", addr, err)
			continue
		}
		ln.Close()
	}
	m := new(dns.Msg)
	m.SetQuestion("still.example.", dns.TypeA)
	if resp, _, err := (&dns.Client{Timeout: time.Second}).Exchange(m, first.Listen[0].String()); err != nil || len(resp.Answer) != 1 {
		t.Fatalf("the first daemon after the second's attempt: %v %v", resp, err)
	}

	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	r2 := start(t, second)
	if err := r2.stop(); err != nil {
		t.Fatalf("after the first stopped, the lock was not free: %v", err)
	}
}
