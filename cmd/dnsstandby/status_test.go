package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/check"
	"github.com/dnsstandby/dnsstandby/daemon"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/status"
)

// startDaemon runs the daemon `dnsstandby run args` would, on loopback
// (the flags must keep it there), until the test ends, and waits until it
// is ready.
func startDaemon(t *testing.T, args ...string) {
	t.Helper()
	args = append([]string{"--lock-file", filepath.Join(t.TempDir(), "dnsstandby.lock")}, args...)
	cfg, _, err := runConfig(args, func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	d, err := daemon.New(cfg, slog.New(slog.NewTextHandler(t.Output(), nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Error("Run did not return")
		}
	})
	select {
	case <-d.Ready():
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-time.After(15 * time.Second):
		t.Fatal("not ready")
	}
}

// TestStatusForCheck runs the daemon on loopback, configured through
// runConfig as `dnsstandby run` is, with a dnstap mirror feed; checks
// that `dnsstandby status` and `dnsstandby check` both read what its
// admin socket answers, and runs the audit against it.
func TestStatusForCheck(t *testing.T) {
	dir := t.TempDir()
	up := nstest.StartAnswerer(t, "192.0.2.53")
	listen := nstest.FreeLoopbackAddr(t)
	tapPath := filepath.Join(dir, "dnstap.sock")
	sock := filepath.Join(dir, "admin.sock")
	startDaemon(t, "--listen", listen.String(), "--upstream", up.String(),
		"--mirror", "dnstap:"+tapPath, "--cache-max-entries", "500", "--steering", "auto",
		"--admin-socket", sock, "--anchor-link", "", "--metrics-addr", "", "--state-dir", "")
	// One answer from upstream, so that the cache holds an entry.
	m := new(dns.Msg)
	m.SetQuestion("svc.example.", dns.TypeA)
	if _, err := dns.Exchange(m, listen.String()); err != nil {
		t.Fatal(err)
	}

	var out, errb bytes.Buffer
	if code := dispatch([]string{"status", "--json", "--admin-socket", sock}, &out, &errb); code != exitOK {
		t.Fatalf("status --json: exit %d: %s", code, errb.String())
	}
	var ds status.Daemon
	if err := json.Unmarshal(out.Bytes(), &ds); err != nil {
		t.Fatal(err)
	}
	// Empty lists are [], not null.
	for _, want := range []string{`"sockets":[]`, `"events":[`, `"upstreams":[`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status --json lacks %s:\n%s", want, out.String())
		}
	}
	if ds.PID != os.Getpid() || ds.Mode != "takeover" || !strings.HasPrefix(ds.Version, "dnsstandby ") {
		t.Errorf("pid %d mode %s version %q", ds.PID, ds.Mode, ds.Version)
	}
	if ds.Config == nil || ds.Config.Steering != "auto" || ds.Config.Mirror != "dnstap:"+tapPath || strings.Join(ds.Config.Listen, ",") != listen.String() {
		t.Errorf("config %+v", ds.Config)
	}
	if len(ds.Upstreams) != 1 || ds.Upstreams[0] != (status.Upstream{Listener: listen.String(), Zone: ".", Server: up.String(), Healthy: true}) {
		t.Errorf("upstreams %+v", ds.Upstreams)
	}
	if m := ds.Mirror; m == nil || *m != (status.Mirror{Feed: "dnstap", Running: true, Enabled: true}) {
		t.Errorf("mirror %+v", m)
	}
	if len(ds.Hedging) != 0 {
		t.Errorf("hedging %+v with the dnstap feed, which does not see queries", ds.Hedging)
	}
	if cs := ds.Cache; cs == nil || cs.Entries != 1 || cs.Bytes == 0 || cs.MaxEntries != 500 || cs.MaxBytes != 64<<20 {
		t.Errorf("cache %+v", cs)
	}

	// `dnsstandby status` for a person.
	out.Reset()
	errb.Reset()
	if code := dispatch([]string{"status", "--admin-socket", sock}, &out, &errb); code != exitOK || !strings.Contains(out.String(), "mode:      takeover (start)") ||
		!strings.Contains(out.String(), "adopted=none") || !strings.Contains(out.String(), "config:    flags\n") || !strings.Contains(out.String(), "mirror:    dnstap running=true inserting=true") {
		t.Fatalf("status: exit %d\n%s%s", code, out.String(), errb.String())
	}

	// The audit. The daemon's own UDP socket on the listen address is
	// its side of the group, with no LocalDNS beside it.
	kubelet := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(kubelet, []byte("clusterDNS:\n- 127.0.0.1\nclusterDomain: example.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	errb.Reset()
	code := dispatch([]string{"check", "--json", "--admin-socket", sock, "--kubelet-config", kubelet,
		"--kubelet-flags", filepath.Join(dir, "absent"), "--localdns-unit", "dnsstandby-test-absent.service", "--mirror-window", "50ms"}, &out, &errb)
	t.Logf("dnsstandby check --json (exit %d):\n%s", code, out.String())
	var rep check.Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("exit %d, unreadable JSON: %v\n%s%s", code, err, out.String(), errb.String())
	}
	got := map[string]check.Result{}
	for _, r := range rep.Results {
		got[r.Name] = r
	}
	for name, want := range map[string]check.Status{
		"cluster-dns":                       check.Pass,
		"address " + listen.Addr().String(): check.Pass,
		// Only dnsstandby's socket: LocalDNS is down.
		"reuseport-group " + listen.String(): check.Warn,
		"dnsstandby":                         check.Warn, // takeover: LocalDNS needs looking at
		"steering":                           check.Pass,
		"upstreams":                          check.Pass,
		"mirror":                             check.Warn, // no CoreDNS streams dnstap here
		"cache":                              check.Pass,
		"config":                             check.Pass, // from the flags
		// No LocalDNS Corefile on this machine: not known what it serves.
		"localdns-listeners": check.Warn,
		// No AKS fallback unit here, no LOCALDNS-FALLBACK chain (or no
		// iptables to say), none seen by the daemon.
		"localdns-fallback": check.Pass,
	} {
		r, ok := got[name]
		if !ok {
			t.Errorf("no row %q in %s", name, out.String())
			continue
		}
		if r.Status != want {
			t.Errorf("%s: %s, want %s: %s (fix: %s)", name, r.Status, want, r.Found, r.Fix)
		}
	}
	// No systemd here, or no such unit: not known (WARN); or in a
	// container, not checkable from it (SKIP).
	if r := got["localdns-unit"]; r.Status != check.Warn && r.Status != check.Skip {
		t.Errorf("localdns-unit: %s, want WARN or SKIP: %s (fix: %s)", r.Status, r.Found, r.Fix)
	}
	if len(got) != 12 {
		t.Errorf("%d rows, want 12:\n%s", len(got), out.String())
	}
	if u := got["upstreams"]; !strings.Contains(u.Found, up.String()+" NOERROR for SOA example.") {
		t.Errorf("upstreams row (the cluster domain from kubelet's config): %s", u.Found)
	}
}

// TestHoldAfterHold: `dnsstandby hold` replaces the hold in force, timed
// or not, and its first line says what it was and what it is now.
func TestHoldAfterHold(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "admin.sock")
	startDaemon(t, "--listen", nstest.FreeLoopbackAddr(t).String(), "--upstream", nstest.StartAnswerer(t, "192.0.2.53").String(),
		"--admin-socket", sock, "--anchor-link", "", "--metrics-addr", "", "--state-dir", "", "--mirror", "none")
	run := func(args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		if code := dispatch(append(args, "--admin-socket", sock), &out, &errb); code != exitOK {
			t.Fatalf("%v: exit %d: %s", args, code, errb.String())
		}
		return out.String()
	}
	const timed = `until \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(timed\)`
	tests := []struct {
		first, second []string // first nil: no hold before
		line          string   // the second's first line, a regexp
	}{
		{nil, []string{"hold"}, `hold: now until released; was no hold`},
		{nil, []string{"hold", "--for", "30s"}, `hold: now ` + timed + `; was no hold`},
		{[]string{"hold", "--for", "30s"}, []string{"hold"}, `hold: now until released; was ` + timed},
		{[]string{"hold", "--for", "30s"}, []string{"hold", "--for", "10m"}, `hold: now ` + timed + `; was ` + timed},
		{[]string{"hold"}, []string{"hold", "--for", "30s"}, `hold: now ` + timed + `; was until released`},
		{[]string{"hold"}, []string{"hold"}, `hold: now until released; was until released`},
	}
	for _, tt := range tests {
		run("release")
		if tt.first != nil {
			run(tt.first...)
		}
		out := run(tt.second...)
		first, _, _ := strings.Cut(out, "\n")
		if !regexp.MustCompile(`^` + tt.line + `$`).MatchString(first) {
			t.Errorf("%v then %v: first line %q, want %s", tt.first, tt.second, first, tt.line)
		}
	}
	if out := run("release"); strings.HasPrefix(out, "hold:") {
		t.Errorf("release says %q", out)
	}
}

// TestStatusFallbackLine: the text status names AKS's LocalDNS fallback
// in one line, and the JSON carries the design at the top level.
func TestStatusFallbackLine(t *testing.T) {
	tests := []struct {
		design string
		pid    int
		line   string
	}{
		{"", 0, "AKS LocalDNS fallback: none\n"},
		{"coredns", 4242, "AKS LocalDNS fallback: coredns (pid 4242)\n"},
		{"coredns", 0, "AKS LocalDNS fallback: coredns\n"}, // its process not visible (no hostPID)
		{"nat", 0, "AKS LocalDNS fallback: nat\n"},
	}
	for _, tt := range tests {
		var st status.Daemon
		st.LocalDNSFallback, st.LocalDNSFallbackPID = tt.design, tt.pid
		var b bytes.Buffer
		printStatus(&b, &st)
		if !strings.Contains(b.String(), tt.line) {
			t.Errorf("status for %q:\n%s\nwant the line %q", tt.design, b.String(), tt.line)
		}
		js, err := json.Marshal(&st)
		if err != nil {
			t.Fatal(err)
		}
		var top map[string]any
		if err := json.Unmarshal(js, &top); err != nil {
			t.Fatal(err)
		}
		if got, ok := top["localdns_fallback"]; !ok || got != tt.design {
			t.Errorf("status --json localdns_fallback = %v (present %v), want %q", got, ok, tt.design)
		}
	}
}
