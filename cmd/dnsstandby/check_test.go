package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/dnsstandby/dnsstandby/check"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

func TestCheckCommandLine(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		env      map[string]string
		wantCode int
		wantOut  string // in stdout, or stderr for usage errors
	}{
		{"help", []string{"check", "-h"}, nil, exitOK, "exit code: 0 no WARN or FAIL, 1 some WARN, 2 any FAIL"},
		{"unknown flag", []string{"check", "--bogus"}, nil, exitUsage, "flag provided but not defined"},
		{"bad listen", []string{"check", "--listen", "localdns"}, nil, exitUsage, `"localdns" is not an IP address`},
		{"zero timeout", []string{"check", "--timeout", "0s"}, nil, exitUsage, "--timeout must be positive"},
		{"stray argument", []string{"check", "now"}, nil, exitUsage, "unexpected arguments"},
		{"bad env", []string{"check"}, map[string]string{"DNSSTANDBY_TIMEOUT": "soon"}, exitUsage, "DNSSTANDBY_TIMEOUT"},
		{"help names the Corefile flag and its default", []string{"check", "-h"}, nil, exitOK, `(default "` + check.DefaultLocalDNSCorefile + `")`},
		{"empty Corefile path", []string{"check", "--localdns-corefile", ""}, nil, exitUsage, "--localdns-corefile must name a file"},
		{"empty Corefile path from the environment", []string{"check"}, map[string]string{"DNSSTANDBY_LOCALDNS_COREFILE": ""}, exitUsage, "--localdns-corefile must name a file"},
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
			if out := stdout.String() + stderr.String(); !strings.Contains(strings.ToLower(out), strings.ToLower(tt.wantOut)) {
				t.Fatalf("output %q does not mention %q", out, tt.wantOut)
			}
		})
	}
}

func TestPrintReport(t *testing.T) {
	rep := check.Report{Results: []check.Result{
		{Name: "localdns-unit", Status: check.Info, Found: "a crash loop spends the start limit in about 0.5s", Fix: "add a drop-in"},
		{Name: "cluster-dns", Status: check.Pass, Found: "clusterDNS = 169.254.10.11"},
		{Name: "mirror", Status: check.Warn, Found: "no mirror feed", Fix: "run with --mirror tap"},
		{Name: "upstreams", Status: check.Fail, Found: "no upstream answers", Fix: "check the route"},
		{Name: "cache", Status: check.Skip, Found: "not checkable from the container", Fix: "run on the node"},
	}}
	var b bytes.Buffer
	printReport(&b, rep)
	want := `STATUS  CHECK          FOUND
INFO    localdns-unit  a crash loop spends the start limit in about 0.5s
                       advice: add a drop-in
PASS    cluster-dns    clusterDNS = 169.254.10.11
WARN    mirror         no mirror feed
                       fix: run with --mirror tap
FAIL    upstreams      no upstream answers
                       fix: check the route
SKIP    cache          not checkable from the container
                       advice: run on the node

FAIL: 1 PASS, 1 SKIP, 1 INFO, 1 WARN, 1 FAIL
`
	if b.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", b.String(), want)
	}
}

// TestCheckLocalDNSListeners runs the daemon on loopback and `dnsstandby
// check` against it with LocalDNS's Corefile binding the daemon's listen
// address and, in a second Corefile, one more: the row compares what the
// Corefile has LocalDNS serve with the listen addresses the daemon reports
// on its admin socket.
func TestCheckLocalDNSListeners(t *testing.T) {
	dir := t.TempDir()
	up := nstest.StartAnswerer(t, "192.0.2.53")
	listen := nstest.FreeLoopbackAddr(t)
	sock := filepath.Join(dir, "admin.sock")
	startDaemon(t, "--listen", listen.String(), "--upstream", up.String(), "--mirror", "none", "--steering", "off",
		"--admin-socket", sock, "--anchor-link", "", "--metrics-addr", "", "--state-dir", "")

	other := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), listen.Port())
	for _, tc := range []struct {
		name      string
		bind      string
		want      check.Status
		wantFound string
		wantFix   string
	}{
		{"covered", listen.Addr().String(), check.Pass, "LocalDNS serves " + listen.String(), ""},
		{"one more listener", listen.Addr().String() + " " + other.Addr().String(), check.Warn, other.String() + " not covered", "add --listen " + other.String()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			corefile := filepath.Join(t.TempDir(), "updated.localdns.corefile")
			data := fmt.Sprintf(".:%d {\n    bind %s\n    forward . %s\n}\n", listen.Port(), tc.bind, up)
			if err := os.WriteFile(corefile, []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
			var out, errb bytes.Buffer
			code := dispatch([]string{"check", "--json", "--admin-socket", sock, "--localdns-corefile", filepath.Join(filepath.Dir(corefile), "absent") + "," + corefile,
				"--kubelet-flags", filepath.Join(dir, "absent"), "--localdns-unit", "dnsstandby-test-absent.service", "--mirror-window", "0s"}, &out, &errb)
			var rep check.Report
			if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
				t.Fatalf("exit %d, unreadable JSON: %v\n%s%s", code, err, out.String(), errb.String())
			}
			i := slices.IndexFunc(rep.Results, func(r check.Result) bool { return r.Name == "localdns-listeners" })
			if i < 0 {
				t.Fatalf("no localdns-listeners row:\n%s", out.String())
			}
			r := rep.Results[i]
			if r.Status != tc.want || !strings.Contains(r.Found, tc.wantFound) || !strings.Contains(r.Fix, tc.wantFix) {
				t.Errorf("%s: %s (fix: %s); want %s, %q, fix %q", r.Status, r.Found, r.Fix, tc.want, tc.wantFound, tc.wantFix)
			}
			if !strings.Contains(r.Found, corefile) {
				t.Errorf("found %q does not name %s, the Corefile read", r.Found, corefile)
			}
		})
	}
}
