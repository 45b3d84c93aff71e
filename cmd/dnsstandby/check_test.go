package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/dnsstandby/dnsstandby/check"
)

func TestCheckCommandLine(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		env      map[string]string
		wantCode int
		wantOut  string // in stdout, or stderr for usage errors
	}{
		{"help", []string{"check", "-h"}, nil, exitOK, "exit code: 0 all PASS, 1 some WARN, 2 any FAIL"},
		{"unknown flag", []string{"check", "--bogus"}, nil, exitUsage, "flag provided but not defined"},
		{"bad listen", []string{"check", "--listen", "localdns"}, nil, exitUsage, `"localdns" is not an IP address`},
		{"zero timeout", []string{"check", "--timeout", "0s"}, nil, exitUsage, "--timeout must be positive"},
		{"stray argument", []string{"check", "now"}, nil, exitUsage, "unexpected arguments"},
		{"bad env", []string{"check"}, map[string]string{"DNSSTANDBY_TIMEOUT": "soon"}, exitUsage, "DNSSTANDBY_TIMEOUT"},
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
		{Name: "localdns-unit", Status: check.Fail, Found: "a crash loop spends the start limit in about 0.5s", Fix: "add a drop-in"},
		{Name: "cluster-dns", Status: check.Pass, Found: "clusterDNS = 169.254.10.11"},
		{Name: "mirror", Status: check.Warn, Found: "no mirror feed", Fix: "run with --mirror tap"},
	}}
	var b bytes.Buffer
	printReport(&b, rep)
	want := `STATUS  CHECK          FOUND
FAIL    localdns-unit  a crash loop spends the start limit in about 0.5s
                       fix: add a drop-in
PASS    cluster-dns    clusterDNS = 169.254.10.11
WARN    mirror         no mirror feed
                       fix: run with --mirror tap

FAIL: 1 PASS, 1 WARN, 1 FAIL
`
	if b.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", b.String(), want)
	}
}
