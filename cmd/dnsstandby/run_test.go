package main

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dnsstandby/dnsstandby/daemon"
	"github.com/dnsstandby/dnsstandby/handover"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

func TestCommandLineErrors(t *testing.T) {
	corefile := filepath.Join(t.TempDir(), "Corefile")
	if err := os.WriteFile(corefile, []byte(".:53 {\n  bind 169.254.10.11\n  forward . 10.0.0.10\n  cache 600\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		args     []string
		env      map[string]string
		wantCode int
		wantErr  string
	}{
		{"no command", nil, nil, exitUsage, "usage"},
		{"unknown command", []string{"frobnicate"}, nil, exitUsage, `unknown command "frobnicate"`},
		{"unknown flag", []string{"run", "--bogus"}, nil, exitConfig, "flag provided but not defined: -bogus"},
		{"bad address", []string{"run", "--upstream", "kube-dns"}, nil, exitConfig, `"kube-dns" is not an IP address`},
		{"bad duration", []string{"run", "--upstream", "10.0.0.10", "--stale-budget", "soon"}, nil, exitConfig, "stale-budget"},
		{"bad stale mode from env", []string{"run", "--upstream", "10.0.0.10"}, map[string]string{"DNSSTANDBY_STALE_MODE": "never"}, exitConfig, `stale mode "never"`},
		{"bad env value", []string{"run"}, map[string]string{"DNSSTANDBY_MAX_INFLIGHT": "many"}, exitConfig, "DNSSTANDBY_MAX_INFLIGHT"},
		{"zero cap", []string{"run", "--upstream", "10.0.0.10", "--max-per-client", "0"}, nil, exitConfig, "-max-per-client: must be positive"},
		{"negative ttl", []string{"run", "--upstream", "10.0.0.10", "--servfail-ttl", "-1s"}, nil, exitConfig, "-servfail-ttl: must not be negative"},
		{"size overflow", []string{"run", "--upstream", "10.0.0.10", "--cache-max-bytes", "9999999999GiB"}, nil, exitConfig, "too large"},
		{"no upstream", []string{"run"}, nil, exitConfig, "no upstream"},
		{"loop", []string{"run", "--listen", "169.254.10.11:53", "--upstream", "169.254.10.11"}, nil, exitConfig, "would loop"},
		{"missing corefile and no upstream", []string{"run", "--localdns-corefile", "/nonexistent/Corefile"}, nil, exitConfig, "/nonexistent/Corefile"},
		{"stray argument", []string{"run", "--upstream", "10.0.0.10", "extra"}, nil, exitConfig, `unexpected argument "extra"`},
		{"bad steering", []string{"run", "--upstream", "10.0.0.10", "--steering", "full"}, nil, exitConfig, "flag -steering"},
		{"bad mirror", []string{"run", "--upstream", "10.0.0.10", "--mirror", "dnstap:"}, nil, exitConfig, "flag -mirror"},
		{"validate finds a bad mirror", []string{"run", "--upstream", "10.0.0.10", "--mirror", "tapz", "--validate"}, nil, exitConfig, "flag -mirror"},
		{"validate finds a loop", []string{"run", "--upstream", "169.254.10.11", "--validate"}, nil, exitConfig, "would loop"},
		{"hold with a bad duration", []string{"hold", "--for", "soon"}, nil, exitUsage, "invalid value"},
		{"hold for a negative time", []string{"hold", "--for", "-5s"}, nil, exitUsage, `invalid value "-5s" for flag -for: must be positive`},
		{"hold for no time", []string{"hold", "--for", "0s"}, nil, exitUsage, `invalid value "0s" for flag -for: must be positive`},
		{"hold with a stray argument", []string{"hold", "5m"}, nil, exitUsage, `unexpected argument "5m"`},
		{"unknown variable", []string{"run", "--upstream", "10.0.0.10"}, map[string]string{"DNSSTANDBY_UPSTREAMS": "10.0.0.11"}, exitConfig, "DNSSTANDBY_UPSTREAMS: no such setting"},
		{"unknown variable beside service links", []string{"run", "--upstream", "10.0.0.10"},
			map[string]string{"DNSSTANDBY_SERVICE_HOST": "10.1.2.3", "DNSSTANDBY_PORT_9355_TCP": "tcp://10.1.2.3:9355", "DNSSTANDBY_OPTS": "--listen x", "DNSSTANDBY_STATEDIR": "/tmp"},
			exitConfig, "DNSSTANDBY_STATEDIR: no such setting"},
		{"bad metrics address", []string{"run", "--upstream", "10.0.0.10", "--metrics-addr", "localhost", "--validate"}, nil, exitConfig, `--metrics-addr "localhost": want HOST:PORT`},
		// What a part refuses, start refuses before it touches the node,
		// and --validate says so too.
		{"min TTL above max", []string{"run", "--upstream", "10.0.0.10", "--cache-min-ttl", "2h", "--cache-max-ttl", "1h"}, nil, exitConfig, "--cache-min-ttl 2h0m0s is above --cache-max-ttl 1h0m0s"},
		{"validate: min TTL above max", []string{"run", "--upstream", "10.0.0.10", "--cache-min-ttl", "2h", "--cache-max-ttl", "1h", "--validate"}, nil, exitConfig, "--cache-min-ttl 2h0m0s is above --cache-max-ttl 1h0m0s"},
		{"validate: min TTL above a block's max", []string{"run", "--localdns-corefile", corefile, "--cache-min-ttl", "20m", "--validate"}, nil, exitConfig,
			"cache of zone . on 169.254.10.11:53: --cache-min-ttl 20m0s is above --cache-max-ttl 10m0s"},
		{"udp batch", []string{"run", "--upstream", "10.0.0.10", "--udp-batch", "5000"}, nil, exitConfig, "dnsstandby run: --udp-batch must be from 1 to 1024, got 5000"},
		{"validate: udp batch", []string{"run", "--upstream", "10.0.0.10", "--udp-batch", "5000", "--validate"}, nil, exitConfig, "dnsstandby run: --udp-batch must be from 1 to 1024, got 5000"},
		{"validate: long NSID", []string{"run", "--upstream", "10.0.0.10", "--nsid", strings.Repeat("n", 513), "--validate"}, nil, exitConfig, "--nsid must be at most 512 bytes"},
		{"no listen address", []string{"run", "--upstream", "10.0.0.10", "--listen", ""}, nil, exitConfig, "--listen names no address"},
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
// node and says, first, whether dnsstandby would start as LocalDNS's
// standby: exit 0 only when it would start from the Corefile (or the
// flags) on every listener LocalDNS serves; 1 when it would start with a
// problem to fix, which the first lines name.
func TestValidate(t *testing.T) {
	dir := t.TempDir()
	agentbaker, err := os.ReadFile("../../corefile/testdata/agentbaker.corefile")
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	full := write("localdns.corefile", agentbaker)
	// Cut inside the node listener's root block, as a write cut short
	// leaves it.
	truncated := write("truncated.corefile", agentbaker[:bytes.Index(agentbaker, []byte("ready 169.254.10.10:8181"))+10])
	unknown := write("unknown.corefile", []byte(".:53 {\n  bind 169.254.10.11\n  frobnicate\n  forward . 10.0.0.10\n}\n"))
	absent1, absent2 := filepath.Join(dir, "updated.localdns.corefile"), filepath.Join(dir, "absent.corefile")
	both := []string{"--listen", "169.254.10.10:53", "--listen", "169.254.10.11:53"}

	tests := []struct {
		name     string
		args     []string
		wantCode int
		want     []string // in stdout
		notWant  []string
	}{
		{"flags", []string{"--listen", "127.0.0.153:53", "--upstream", "10.0.0.10", "--steering", "adopt", "--mirror", "tap"}, exitOK,
			[]string{"dnsstandby run: valid: would start from the flags\n", "LISTENER", "127.0.0.153:53  .     -      10.0.0.10:53  sequential", "mirror feed: tap; steering: adopt"}, nil},
		{"AgentBaker's Corefile, both listeners", append([]string{"--localdns-corefile", full}, both...), exitOK,
			[]string{"dnsstandby run: valid: would start from the Corefile " + full + ", on every listener it has LocalDNS serve\n", "169.254.10.10:53  .  "}, nil},
		// CoreDNS refuses an unknown directive: the fallback (--upstream) serves.
		{"unknown directive", []string{"--localdns-corefile", unknown, "--upstream", "10.0.0.10"}, exitFail,
			[]string{"would start, with problems to fix:\n  - the Corefile is refused (unknown_directive): dnsstandby would start from the fallback, without a Corefile\n", "unknown directive 'frobnicate'"}, []string{"valid"}},
		{"truncated Corefile, upstream given", append([]string{"--localdns-corefile", truncated, "--upstream", "10.0.0.10"}, both...), exitFail,
			[]string{"  - the Corefile is refused (syntax): dnsstandby would start from the fallback", "truncated.corefile:37: syntax error"}, []string{"valid"}},
		// LocalDNS serves 169.254.10.10:53 too: unanswered when it fails.
		{"a listener of LocalDNS's not covered", []string{"--localdns-corefile", full}, exitFail,
			[]string{"  - LocalDNS's Corefile serves 169.254.10.10:53, which --listen does not name: dnsstandby will not answer there when LocalDNS fails (add --listen 169.254.10.10:53)\n"}, []string{"valid", "- LocalDNS's Corefile serves 169.254.10.11:53"}},
		{"neither Corefile exists", []string{"--localdns-corefile", absent1 + "," + absent2, "--upstream", "10.0.0.10"}, exitFail,
			[]string{"the Corefile is refused (missing)", "none of the Corefiles " + absent1 + ", " + absent2 + " exists"}, []string{"valid"}},
		// What dnsstandby does not imitate names flags, as errors do.
		{"not imitated, by flag", append([]string{"--localdns-corefile", full}, both...), exitOK,
			[]string{"answers NSID with its own (--nsid)", "within its share of --cache-max-entries and --cache-max-bytes"}, []string{"Pipeline.NSID", "Cache.Max"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"run", "--state-dir", "", "--localdns-coredns", "", "--fallback-resolv-conf", ""}, tt.args...)
			var stdout, stderr bytes.Buffer
			code := dispatch(append(args, "--validate"), &stdout, &stderr)
			if code != tt.wantCode || stderr.Len() > 0 {
				t.Fatalf("exit %d, want %d; stderr: %s\nstdout:\n%s", code, tt.wantCode, stderr.String(), stdout.String())
			}
			first, _, _ := strings.Cut(stdout.String(), "\n\n")
			for _, want := range tt.want {
				if !strings.Contains(stdout.String(), want) {
					t.Errorf("stdout lacks %q:\n%s", want, stdout.String())
				}
			}
			for _, no := range tt.notWant {
				if strings.Contains(first, no) || no != "valid" && strings.Contains(stdout.String(), no) {
					t.Errorf("stdout has %q:\n%s", no, stdout.String())
				}
			}
		})
	}
}

func TestHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := dispatch([]string{"run", "-h"}, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit %d", code)
	}
	help := stdout.String()
	for _, flag := range []string{"-listen", "-upstream", "-localdns-corefile", "-metrics-addr", "DNSSTANDBY_"} {
		if !strings.Contains(help, flag) {
			t.Errorf("help does not mention %s", flag)
		}
	}
	// Each placeholder names what the flag takes: --mirror takes a mode,
	// of which one has a PATH.
	for _, want := range []string{"-mirror MODE\n", "-upstream ADDR:PORT\n", "-cache-max-bytes BYTES\n", "-localdns-corefile PATH\n"} {
		if !strings.Contains(help, want) {
			t.Errorf("help lacks %q:\n%s", want, help)
		}
	}
	// Each default once, from the field the flag is bound to.
	for _, want := range []string{"(default 169.254.10.11:53)", "(default 64MiB)", "(default tap)", `(default "/run/dnsstandby/admin.sock")`} {
		if n := strings.Count(help, want); n != 1 {
			t.Errorf("help says %s %d times, want once:\n%s", want, n, help)
		}
	}
}

// TestHoldHelp: hold -h shows what leaving --for out means, and not a
// default of 0s that --for refuses.
func TestHoldHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := dispatch([]string{"hold", "-h"}, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit %d", code)
	}
	help := stdout.String()
	if !strings.Contains(help, "-for DURATION") || !strings.Contains(help, "without it: until dnsstandby release") {
		t.Errorf("help does not say what --for takes and what leaving it out means:\n%s", help)
	}
	if strings.Contains(help, "(default 0s)") {
		t.Errorf("help gives --for a default of 0s, which it refuses:\n%s", help)
	}
}

// TestLayering holds the precedence of `dnsstandby run`'s settings:
// defaults, then the LocalDNS Corefile, then the environment, then the
// command line.
func TestLayering(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "Corefile")
	corefile := `.:53 {
    bind 169.254.10.11
    forward . 10.0.0.10 {
        force_tcp
        max_concurrent 500
        max_fails 4
        health_check 2s
        expire 30s
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
	broken := filepath.Join(dir, "Broken")
	if err := os.WriteFile(broken, []byte(".:53 {\n  cache 3600 {\n    serve_stale notaduration\n  }\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	noForward := filepath.Join(dir, "NoForward")
	// A block that logs and answers nothing itself (whoami, templates or
	// hosts would answer).
	if err := os.WriteFile(noForward, []byte(".:53 {\n  bind 169.254.10.11\n  log\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// summary is what a case looks at: the routes, and the cache and
	// pipeline settings the layers may set.
	summary := func(c daemon.Config) string {
		var b strings.Builder
		for _, r := range c.Routes {
			u := r.Upstream
			cache := "-"
			if rc := r.Cache; rc != nil {
				cache = fmt.Sprintf("%d/%s/%s/%s", rc.MaxEntries, rc.MaxTTL, rc.MaxStale, rc.StaleMode)
			}
			fmt.Fprintf(&b, "%s%v tcp=%v conc=%d fails=%d hc=%s exp=%s cache=%s; ", r.Zone, u.Servers, u.ForceTCP, u.MaxConcurrent, u.MaxFails, u.HealthCheck, u.ExpireTCP, cache)
		}
		fmt.Fprintf(&b, "maxttl=%s stale=%s mode=%s inflight=%d perclient=%d", c.Cache.MaxTTL, c.Cache.MaxStale, c.Cache.StaleMode, c.Pipeline.MaxInflight, c.Pipeline.MaxPerClient)
		return b.String()
	}
	def := daemon.DefaultConfig()
	du := daemon.NewRoute(".").Upstream
	defaults := func(routes string) string {
		return fmt.Sprintf("%smaxttl=%s stale=%s mode=%s inflight=%d perclient=%d", routes, def.Cache.MaxTTL, def.Cache.MaxStale, def.Cache.StaleMode, def.Pipeline.MaxInflight, def.Pipeline.MaxPerClient)
	}
	flagRoute := func(servers, cache string) string {
		return fmt.Sprintf(".[%s] tcp=false conc=%d fails=%d hc=%s exp=%s cache=%s; ", servers, du.MaxConcurrent, du.MaxFails, du.HealthCheck, du.ExpireTCP, cache)
	}
	// Most specific zone first, as the Corefile reader orders them; the
	// root block's cache plugin is the root route's, cluster.local has
	// none.
	fromCorefile := func(rootCache string) string {
		return "cluster.local.[10.0.0.20:53] tcp=false conc=0 fails=2 hc=500ms exp=10s cache=-; .[10.0.0.10:53] tcp=true conc=500 fails=4 hc=2s exp=30s cache=" + rootCache + "; "
	}
	others := fmt.Sprintf("inflight=%d perclient=%d", def.Pipeline.MaxInflight, def.Pipeline.MaxPerClient)

	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    string // summary; "" when wantErr
		wantErr string
	}{
		{"defaults and a flag", []string{"--upstream", "10.0.0.10,10.0.0.11:5353"}, nil,
			defaults(flagRoute("10.0.0.10:53 10.0.0.11:5353", "-")), ""},
		{"environment", nil, map[string]string{"DNSSTANDBY_UPSTREAM": "10.0.0.10", "DNSSTANDBY_MAX_INFLIGHT": "7"},
			strings.Replace(defaults(flagRoute("10.0.0.10:53", "-")), "inflight=1000", "inflight=7", 1), ""},
		{"flag over environment", []string{"--max-inflight", "5"}, map[string]string{"DNSSTANDBY_UPSTREAM": "10.0.0.10", "DNSSTANDBY_MAX_INFLIGHT": "7"},
			strings.Replace(defaults(flagRoute("10.0.0.10:53", "-")), "inflight=1000", "inflight=5", 1), ""},
		{"Corefile over defaults", []string{"--localdns-corefile", path}, nil,
			defaults(fromCorefile("19968/10m0s/1h0m0s/immediate")), ""},
		{"environment over Corefile", nil, map[string]string{"DNSSTANDBY_LOCALDNS_COREFILE": path, "DNSSTANDBY_SERVE_STALE": "10s"},
			fromCorefile("19968/10m0s/10s/immediate") + "maxttl=1h0m0s stale=10s mode=verify " + others, ""},
		{"flags over Corefile", []string{"--localdns-corefile", path, "--upstream", "10.9.9.9", "--serve-stale", "10s", "--stale-mode", "immediate", "--cache-max-ttl", "5m"}, nil,
			flagRoute("10.9.9.9:53", "19968/5m0s/10s/immediate") + "maxttl=5m0s stale=10s mode=immediate " + others, ""},
		// A Corefile that cannot be used is no error of the flags: the
		// configuration is the fallback (summary and refusal after "|").
		{"broken Corefile, upstream given", []string{"--localdns-corefile", broken, "--upstream", "10.0.0.10"}, nil,
			defaults(flagRoute("10.0.0.10:53", "-")) + "|fallback Broken:3", ""},
		{"broken Corefile, fallback given", []string{"--localdns-corefile", broken, "--fallback-upstream", "10.0.0.10"}, nil,
			defaults(".[10.0.0.10:53] tcp=false conc=0 fails=2 hc=500ms exp=10s cache=-; ") + "|fallback Broken:3", ""},
		{"broken Corefile alone", []string{"--localdns-corefile", broken}, nil, defaults("") + "|fallback Broken:3", ""},
		{"the first Corefile that exists", []string{"--localdns-corefile", filepath.Join(dir, "absent") + "," + path}, nil,
			defaults(fromCorefile("19968/10m0s/1h0m0s/immediate")), ""},
		// Both named: either would have been read.
		{"no Corefile exists", []string{"--localdns-corefile", filepath.Join(dir, "absent") + "," + filepath.Join(dir, "absent2")}, nil,
			defaults("") + "|fallback none of the Corefiles " + filepath.Join(dir, "absent") + ", " + filepath.Join(dir, "absent2") + " exists", ""},
		{"Corefile without a block for the listen address", []string{"--localdns-corefile", path, "--listen", "169.254.10.10:53"}, nil, defaults("") + "|fallback no server block serves 169.254.10.10:53", ""},
		{"Corefile whose blocks forward nowhere", []string{"--localdns-corefile", noForward}, nil, defaults("") + "|fallback no Routes", ""},
		{"no upstream at all", nil, nil, "", "no upstream"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lookup := func(k string) (string, bool) { v, ok := tt.env[k]; return v, ok }
			// A state directory of the test's: no last known good.
			args := append(slices.Clone(tt.args), "--state-dir", filepath.Join(t.TempDir(), "state"))
			cfg, _, err := runConfig(args, lookup)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want, refused, fallback := strings.Cut(tt.want, "|fallback ")
			if got := summary(cfg); got != want {
				t.Errorf("\n got %s\nwant %s", got, want)
			}
			if strings.Contains(tt.name, "first Corefile") && cfg.Corefile != path {
				t.Errorf("Corefile %q, want the one read, %q", cfg.Corefile, path)
			}
			p := cfg.Provenance
			switch {
			case fallback && (p.Source != daemon.SourceFallback || p.Refused == nil || !strings.Contains(p.Refused.Error(), refused)):
				t.Errorf("provenance %s, refused %v; want fallback, refused with %q", p.Source, p.Refused, refused)
			case !fallback && p.Refused != nil:
				t.Errorf("provenance %s, refused %v; want no refusal", p.Source, p.Refused)
			}
			if !slices.Contains(tt.args, "--listen") && fmt.Sprint(cfg.Listen) != "[169.254.10.11:53]" {
				t.Errorf("listen %v", cfg.Listen)
			}
		})
	}
}

func TestSizes(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantErr bool
	}{
		{"1024", 1024, false},
		{"64MiB", 64 << 20, false},
		{"64Mi", 64 << 20, false},
		{"64M", 64e6, false},
		{"2Gi", 2 << 30, false},
		{"8KiB", 8 << 10, false},
		{"0", 0, true},
		{"-1Mi", 0, true},
		{"lots", 0, true},
		{"9999999999GiB", 0, true},
	}
	for _, tt := range tests {
		got, err := parseSize(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("parseSize(%q) = %d, %v; want %d, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
	if s := formatSize(64 << 20); s != "64MiB" {
		t.Errorf("formatSize(64 MiB) = %q", s)
	}
}

// TestRunExit: how `dnsstandby run` ends, as the unit reads it. Another
// dnsstandby serving the node (the lock held, or a surge handover given)
// is exitServed, in the unit's SuccessExitStatus= and
// RestartPreventExitStatus=, with one line that names the holder; any
// other error is exitFail, which the unit restarts; a configuration
// error is exitConfig (TestCommandLineErrors).
func TestRunExit(t *testing.T) {
	tests := []struct {
		name     string
		err      error
		wantCode int
		wantLog  string
	}{
		{"stopped", nil, exitOK, ""},
		{"lock held", fmt.Errorf("%w (pid 4242 holds /run/dnsstandby/dnsstandby.lock): stop it first; this one changed nothing", handover.ErrRunning),
			exitServed, `"level":"WARN","msg":"dnsstandby stopped: another dnsstandby serves this node","err":"another dnsstandby is running on this node (pid 4242 holds`},
		{"handed over", fmt.Errorf("%w: PID 4243", daemon.ErrHandedOver), exitServed, "another dnsstandby serves this node: PID 4243"},
		{"a part failed", errors.New("listen 169.254.10.11:53: address in use"), exitFail, `"level":"ERROR","msg":"dnsstandby stopped"`},
		{"a refused surge handover", fmt.Errorf("handover from PID 7: %w", errors.New("refused by the running process")), exitFail, "refused by the running process"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			code := runExit(tt.err, slog.New(slog.NewJSONHandler(&buf, nil)))
			if code != tt.wantCode {
				t.Errorf("exit %d, want %d", code, tt.wantCode)
			}
			if lines := strings.Count(buf.String(), "\n"); (tt.wantLog == "") != (lines == 0) || lines > 1 {
				t.Errorf("%d lines logged, want %d: %s", lines, min(len(tt.wantLog), 1), buf.String())
			}
			if !strings.Contains(buf.String(), tt.wantLog) {
				t.Errorf("log %q lacks %q", buf.String(), tt.wantLog)
			}
		})
	}
	// The codes systemd names, and none another path uses: Go's runtime
	// exits 2 on a panic, flag-style usage errors are 2.
	if exitServed != 75 || exitConfig != 78 || exitServed == exitConfig {
		t.Errorf("exitServed %d, exitConfig %d: want 75 (TEMPFAIL) and 78 (CONFIG), as the unit lists them", exitServed, exitConfig)
	}
}

// TestLoggerJournal: `dnsstandby run` prefixes its lines with their
// syslog priority when, and only when, its stderr is the stream
// JOURNAL_STREAM names, in both log formats.
func TestLoggerJournal(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	other, err := os.Create(filepath.Join(t.TempDir(), "other"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	t.Setenv("JOURNAL_STREAM", fmt.Sprintf("%d:%d", st.Dev, st.Ino))
	if !isJournal(f) || isJournal(other) || isJournal(&bytes.Buffer{}) {
		t.Errorf("isJournal: the stream %v, another file %v, a buffer %v; want true, false, false", isJournal(f), isJournal(other), isJournal(&bytes.Buffer{}))
	}
	for _, format := range []string{"json", "text"} {
		for _, journal := range []bool{true, false} {
			var b bytes.Buffer
			log := newLogger(runOptions{logFormat: format, logLevel: slog.LevelDebug}, &b, journal)
			log.Warn("w")
			log.Info("i")
			log.Debug("d")
			lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
			if len(lines) != 3 {
				t.Fatalf("%s: %q", format, b.String())
			}
			for i, prefix := range []string{"<4>", "<6>", "<7>"} {
				if strings.HasPrefix(lines[i], prefix) != journal || strings.HasPrefix(lines[i], "<") != journal {
					t.Errorf("%s, journal %v: line %q", format, journal, lines[i])
				}
			}
		}
	}
}

// TestSIGHUPReloads: `dnsstandby run` maps SIGHUP to a reload
// (daemon.Reload), and SIGHUP no longer kills the process (its default).
func TestSIGHUPReloads(t *testing.T) {
	var n atomic.Int32
	stop := onSignal(syscall.SIGHUP, func() { n.Add(1) })
	for i := int32(1); i <= 2; i++ {
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, 2*time.Second, fmt.Sprintf("reload %d", i), func() bool { return n.Load() == i })
	}
	stop()
	if n.Load() != 2 {
		t.Errorf("%d reloads, want 2", n.Load())
	}
}

// TestUnusableHint: the hint after a refused configuration names
// --fallback-upstream only when the fallback has no servers; an error of
// the fallback's configuration for another reason is not blamed on them.
func TestUnusableHint(t *testing.T) {
	refused := errors.New("unknown directive")
	kubeDNS := []netip.AddrPort{netip.MustParseAddrPort("10.0.0.10:53")}
	tests := []struct {
		name      string
		source    string
		upstreams []netip.AddrPort
		want      string
	}{
		{"from the Corefile", daemon.SourceFile, nil, ""},
		{"fallback without servers", daemon.SourceFallback, nil, "; it is the fallback's: the Corefile is refused (unknown directive), there is no last known good, and the fallback has no servers: give --fallback-upstream KUBE_DNS_CLUSTER_IP:53"},
		{"fallback with servers", daemon.SourceFallback, kubeDNS, "; it is the fallback's: the Corefile is refused (unknown directive), there is no last known good"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := daemon.DefaultConfig()
			cfg.Provenance = daemon.Provenance{Source: tt.source, Refused: refused}
			cfg.Fallback.Upstreams = tt.upstreams
			if got := unusableHint(cfg); got != tt.want {
				t.Errorf("got %q\nwant %q", got, tt.want)
			}
		})
	}
}
