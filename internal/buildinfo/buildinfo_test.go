package buildinfo

import (
	"testing"
)

func TestBuildVersionString(t *testing.T) {
	tests := []struct {
		v    Info
		want string
	}{
		{Info{Version: "v1.2.3", GoVersion: "go1.26.8"}, "dnsstandby v1.2.3, go1.26.8"},
		{Info{Version: "(devel)", Revision: "0123456789abcdef0123", Time: "2026-11-29T23:00:00Z", GoVersion: "go1.26.8"},
			"dnsstandby (devel) commit 0123456789ab (2026-11-29T23:00:00Z), go1.26.8"},
		{Info{Version: "(devel)", Revision: "0123456789abcdef0123", Modified: true, GoVersion: "go1.26.8"},
			"dnsstandby (devel) commit 0123456789ab+dirty, go1.26.8"},
		{Info{Version: "v0.0.0-20261129230000-0123456789ab+dirty", Revision: "0123456789abcdef0123", Modified: true, Time: "2026-11-29T23:00:00Z", GoVersion: "go1.26.8"},
			"dnsstandby v0.0.0-20261129230000-0123456789ab+dirty, go1.26.8"},
		// Modified without a revision says nothing of a commit.
		{Info{Version: "(devel)", Modified: true, GoVersion: "go1.26.8"}, "dnsstandby (devel), go1.26.8"},
	}
	for _, tc := range tests {
		if got := tc.v.String(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.v, got, tc.want)
		}
	}
}
