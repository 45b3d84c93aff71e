package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

func TestCommandLineErrors(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		env      map[string]string
		wantCode int
		wantErr  string
	}{
		{"no command", nil, nil, exitUsage, "usage"},
		{"unknown command", []string{"frobnicate"}, nil, exitUsage, `unknown command "frobnicate"`},
		{"unknown flag", []string{"run", "--bogus"}, nil, exitUsage, "flag provided but not defined: -bogus"},
		{"bad address", []string{"run", "--upstream", "kube-dns"}, nil, exitUsage, `"kube-dns" is not an IP address`},
		{"bad duration", []string{"run", "--upstream", "10.0.0.10", "--stale-budget", "soon"}, nil, exitUsage, "stale-budget"},
		{"bad stale mode from env", []string{"run", "--upstream", "10.0.0.10"}, map[string]string{"DNSSTANDBY_STALE_MODE": "never"}, exitUsage, `stale mode "never"`},
		{"bad env value", []string{"run"}, map[string]string{"DNSSTANDBY_MAX_INFLIGHT": "many"}, exitUsage, "DNSSTANDBY_MAX_INFLIGHT"},
		{"negative cap", []string{"run", "--upstream", "10.0.0.10", "--max-per-client", "0"}, nil, exitUsage, "--max-per-client must be positive"},
		{"no upstream", []string{"run"}, nil, exitUsage, "no upstream"},
		{"loop", []string{"run", "--listen", "169.254.10.11:53", "--upstream", "169.254.10.11"}, nil, exitUsage, "would loop"},
		{"missing corefile and no upstream", []string{"run", "--localdns-corefile", "/nonexistent/Corefile"}, nil, exitUsage, "/nonexistent/Corefile"},
		{"stray argument", []string{"run", "--upstream", "10.0.0.10", "extra"}, nil, exitUsage, `unexpected argument "extra"`},
		{"bad steering", []string{"run", "--upstream", "10.0.0.10", "--steering", "full"}, nil, exitUsage, "--steering"},
		{"bad mirror", []string{"run", "--upstream", "10.0.0.10", "--mirror", "dnstap:"}, nil, exitUsage, "--mirror"},
		{"validate finds a bad mirror", []string{"run", "--upstream", "10.0.0.10", "--mirror", "tapz", "--validate"}, nil, exitUsage, "--mirror"},
		{"validate finds a loop", []string{"run", "--upstream", "169.254.10.11", "--validate"}, nil, exitUsage, "would loop"},
		{"hold with a bad duration", []string{"hold", "--for", "soon"}, nil, exitUsage, "invalid value"},
		{"status without a daemon", []string{"status", "--admin-socket", "/nonexistent/admin.sock"}, nil, exitFail, "is dnsstandby running"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			var stdout, stderr bytes.Buffer
			code := dispatch(tt.args, &stdout, &stderr)
			if code != tt.wantCode {
				t.Fatalf("exit %d, want %d; stderr: %s", code, tt.wantCode, stderr.String())
			}
			out := stderr.String()
			if !strings.Contains(out, tt.wantErr) {
				t.Fatalf("stderr %q does not mention %q", out, tt.wantErr)
			}
			if tt.args != nil && tt.args[0] == "run" && strings.Count(strings.TrimSpace(out), "\n") != 0 {
				t.Fatalf("error is not one line: %q", out)
			}
		})
	}
}

// TestValidate: --validate checks everything that does not touch the
// node, says so, and exits 0 without serving.
func TestValidate(t *testing.T) {
	var stdout, stderr bytes.Buffer
	args := []string{"run", "--listen", "127.0.0.153:53", "--upstream", "10.0.0.10", "--steering", "adopt", "--mirror", "tap", "--validate"}
	if code := dispatch(args, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit %d; stderr: %s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "options valid") {
		t.Errorf("stdout %q does not say the options are valid", stdout.String())
	}
}

func TestHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := dispatch([]string{"run", "-h"}, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit %d", code)
	}
	for _, flag := range []string{"-listen", "-upstream", "-localdns-corefile", "-metrics-addr", "DNSSTANDBY_"} {
		if !strings.Contains(stdout.String(), flag) {
			t.Errorf("help does not mention %s", flag)
		}
	}
}

func TestEnvAndFlagPrecedence(t *testing.T) {
	t.Setenv("DNSSTANDBY_UPSTREAM", "10.0.0.10,10.0.0.11:5353")
	t.Setenv("DNSSTANDBY_MAX_INFLIGHT", "7")
	t.Setenv("DNSSTANDBY_MAX_PER_CLIENT", "3")
	o, err := parseRunFlags([]string{"--max-per-client", "5"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.AddrPort{netip.MustParseAddrPort("10.0.0.10:53"), netip.MustParseAddrPort("10.0.0.11:5353")}
	if fmt.Sprint(o.upstream) != fmt.Sprint(want) || o.maxInflight != 7 || o.maxPerClient != 5 {
		t.Fatalf("upstream %v inflight %d per-client %d", o.upstream, o.maxInflight, o.maxPerClient)
	}
	if fmt.Sprint(o.listen) != "[169.254.10.11:53]" {
		t.Fatalf("default listen %v", o.listen)
	}
}

func TestCorefileMerge(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "Corefile")
	corefile := `.:53 {
    bind 169.254.10.11
    forward . 10.0.0.10 {
        force_tcp
    }
    cache 600 {
        success 9984
        denial 9984
        serve_stale 3600s immediate
        servfail 0
    }
}
cluster.local:53 {
    bind 169.254.10.11
    forward . 10.0.0.20
}
`
	if err := os.WriteFile(path, []byte(corefile), 0o644); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)

	o, err := parseRunFlags([]string{"--localdns-corefile", path}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	pl, err := buildPlan(o, log)
	if err != nil {
		t.Fatal(err)
	}
	if pl.cache.MaxTTL != 600*time.Second || pl.cache.MaxStale != time.Hour || pl.pipeline.StaleMode.String() != "immediate" {
		t.Fatalf("cache from Corefile: max ttl %s stale %s mode %s", pl.cache.MaxTTL, pl.cache.MaxStale, pl.pipeline.StaleMode)
	}
	routes := map[string]string{}
	for _, r := range pl.routes {
		routes[r.zone] = fmt.Sprint(r.servers, r.forceTCP)
	}
	if routes["."] != "[10.0.0.10:53] true" || routes["cluster.local."] != "[10.0.0.20:53] false" {
		t.Fatalf("routes %v", routes)
	}

	// Flags win.
	o, _ = parseRunFlags([]string{"--localdns-corefile", path, "--upstream", "10.9.9.9", "--serve-stale", "10s", "--stale-mode", "verify"}, io.Discard)
	pl, err = buildPlan(o, log)
	if err != nil {
		t.Fatal(err)
	}
	if len(pl.routes) != 1 || pl.routes[0].servers[0].String() != "10.9.9.9:53" || pl.cache.MaxStale != 10*time.Second ||
		pl.pipeline.StaleMode.String() != "verify" || pl.cache.MaxTTL != 600*time.Second {
		t.Fatalf("flags did not override: routes %v stale %s mode %s maxttl %s", pl.routes, pl.cache.MaxStale, pl.pipeline.StaleMode, pl.cache.MaxTTL)
	}

	// A broken Corefile with --upstream given: start on flags.
	bad := filepath.Join(dir, "Broken")
	_ = os.WriteFile(bad, []byte(".:53 {\n  cache 3600 {\n    serve_stale notaduration\n  }\n}\n"), 0o644)
	o, _ = parseRunFlags([]string{"--localdns-corefile", bad, "--upstream", "10.0.0.10"}, io.Discard)
	if _, err := buildPlan(o, log); err != nil {
		t.Fatalf("broken Corefile with --upstream: %v", err)
	}
	o, _ = parseRunFlags([]string{"--localdns-corefile", bad}, io.Discard)
	if _, err := buildPlan(o, log); err == nil || !strings.Contains(err.Error(), "Broken:3") {
		t.Fatalf("broken Corefile alone: error %v, want one naming Broken:3", err)
	}
}

// startUpstream runs a miekg/dns server on loopback answering every A
// query with 192.0.2.53.
func startUpstream(t *testing.T) netip.AddrPort {
	t.Helper()
	ap := nstest.FreeLoopbackAddr(t)
	pc, err := net.ListenPacket("udp", ap.String())
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		m.RecursionAvailable = true
		rr, _ := dns.NewRR(r.Question[0].Name + " 60 IN A 192.0.2.53")
		m.Answer = []dns.RR{rr}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return ap
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

func TestRunServesAndStops(t *testing.T) {
	up := startUpstream(t)
	listen := nstest.FreeLoopbackAddr(t)
	metrics := nstest.FreeLoopbackAddr(t)
	adminSock := filepath.Join(t.TempDir(), "admin.sock")
	stateDir := t.TempDir()
	o, err := parseRunFlags([]string{
		"--listen", listen.String(), "--upstream", up.String(), "--metrics-addr", metrics.String(), "--udp-readers", "2",
		// On the host's loopback: no anchor link in the host's namespace.
		"--anchor-link", "", "--admin-socket", adminSock, "--state-dir", stateDir, "--mirror", "none",
	}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	pl, err := buildPlan(o, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, o, pl, log) }()
	defer func() {
		cancel()
		select { // run may have returned already
		case <-done:
		case <-time.After(10 * time.Second):
		}
	}()

	base := "http://" + metrics.String()
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, _ := func() (int, string) {
			resp, err := http.Get(base + "/readyz")
			if err != nil {
				return 0, ""
			}
			resp.Body.Close()
			return resp.StatusCode, ""
		}()
		if code == http.StatusOK {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("run returned before ready: %v; logs:\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("never ready; logs:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}

	c := &dns.Client{Timeout: 2 * time.Second}
	for i := range 2 {
		m := new(dns.Msg)
		m.SetQuestion("Pod-Name.example.", dns.TypeA)
		m.SetEdns0(1232, false)
		m.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_NSID{Code: dns.EDNS0NSID}}
		r, _, err := c.Exchange(m, listen.String())
		if err != nil {
			t.Fatalf("query %d: %v", i, err)
		}
		if len(r.Answer) != 1 || r.Question[0].Name != "Pod-Name.example." {
			t.Fatalf("query %d: %v", i, r)
		}
		nsid, _ := r.IsEdns0().Option[0].(*dns.EDNS0_NSID)
		if nsid == nil || nsid.Nsid != fmt.Sprintf("%x", "dnsstandby") {
			t.Fatalf("query %d: NSID %v", i, r.IsEdns0())
		}
	}
	if code, body := httpGet(t, base+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz %d %s", code, body)
	}
	_, body := httpGet(t, base+"/metrics")
	for _, want := range []string{
		`dnsstandby_queries_total{source="upstream"} 1`,
		`dnsstandby_queries_total{source="cache"} 1`,
		`dnsstandby_cache_entries 1`,
		`dnsstandby_upstream_requests_total{`,
		`dnsstandby_build_info{goversion="` + runtime.Version() + `",`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	// No LocalDNS shares this address: takeover, and the operator commands
	// move the mode.
	if !strings.Contains(body, `dnsstandby_mode{mode="takeover"} 1`) {
		t.Errorf("/metrics does not say takeover")
	}
	for _, step := range []struct {
		args []string
		want string
	}{
		{[]string{"status"}, "mode:      takeover (start)"},
		{[]string{"hold", "--for", "1m"}, "mode:      hold (operator)"},
		{[]string{"status", "--json"}, `"operator_hold":true`},
		{[]string{"release"}, "mode:      takeover (operator-release)"},
	} {
		var out, errb bytes.Buffer
		if code := dispatch(append(step.args, "--admin-socket", adminSock), &out, &errb); code != exitOK {
			t.Fatalf("%v: exit %d: %s", step.args, code, errb.String())
		}
		if !strings.Contains(out.String(), step.want) {
			t.Errorf("%v: output lacks %q:\n%s", step.args, step.want, out.String())
		}
	}
	if code, body := httpGet(t, base+"/debug/events"); code != http.StatusOK || !strings.Contains(body, `"reason":"operator-release"`) {
		t.Errorf("/debug/events %d %s", code, body)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("run did not stop")
	}
	done <- nil // for the deferred receive
	if !strings.Contains(logs.String(), `"msg":"stopped"`) {
		t.Fatalf("no stop line in logs:\n%s", logs.String())
	}
	// The snapshot written at stop holds the answer.
	if fi, err := os.Stat(filepath.Join(stateDir, snapshotName)); err != nil || fi.Size() == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("snapshot after stop: %v %v", fi, err)
	}
	if !strings.Contains(logs.String(), `"msg":"cache snapshot written","entries":1`) {
		t.Fatalf("snapshot line missing:\n%s", logs.String())
	}
}
