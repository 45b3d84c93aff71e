package main

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
)

func TestBuildVersionString(t *testing.T) {
	tests := []struct {
		v    buildVersion
		want string
	}{
		{buildVersion{Version: "v1.2.3", GoVersion: "go1.26.8"}, "dnsstandby v1.2.3, go1.26.8"},
		{buildVersion{Version: "(devel)", Revision: "0123456789abcdef0123", Time: "2026-11-29T23:00:00Z", GoVersion: "go1.26.8"},
			"dnsstandby (devel) commit 0123456789ab (2026-11-29T23:00:00Z), go1.26.8"},
		{buildVersion{Version: "(devel)", Revision: "0123456789abcdef0123", Modified: true, GoVersion: "go1.26.8"},
			"dnsstandby (devel) commit 0123456789ab+dirty, go1.26.8"},
		{buildVersion{Version: "v0.0.0-20261129230000-0123456789ab+dirty", Revision: "0123456789abcdef0123", Modified: true, Time: "2026-11-29T23:00:00Z", GoVersion: "go1.26.8"},
			"dnsstandby v0.0.0-20261129230000-0123456789ab+dirty, go1.26.8"},
		// Modified without a revision says nothing of a commit.
		{buildVersion{Version: "(devel)", Modified: true, GoVersion: "go1.26.8"}, "dnsstandby (devel), go1.26.8"},
	}
	for _, tc := range tests {
		if got := tc.v.String(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.v, got, tc.want)
		}
	}
}

func TestVersionCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := dispatch([]string{"version"}, &out, &errOut); code != exitOK {
		t.Fatalf("version: exit %d, stderr %q", code, errOut.String())
	}
	// go test's binary has build information: its Go version at least.
	if got := out.String(); !strings.HasPrefix(got, "dnsstandby ") || !strings.HasSuffix(got, ", "+runtime.Version()+"\n") {
		t.Errorf("version printed %q", got)
	}
	out.Reset()
	if code := dispatch([]string{"version", "extra"}, &out, &errOut); code != exitUsage || out.Len() != 0 {
		t.Errorf("version with an argument: exit %d, stdout %q; want %d and nothing", code, out.String(), exitUsage)
	}
}
