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

// TestWithLinked: what the Makefile passes the linker fills only what the
// go command left out.
func TestWithLinked(t *testing.T) {
	const rev = "68c978ace40c346620a422c6be40266db8e29de7"
	stamped := Info{Version: "v0.0.0-20261201162054-0123456789ab", Revision: "0123456789abcdef0123", Time: "2026-12-01T16:20:54Z", GoVersion: "go1.26.8"}
	tests := []struct {
		name                              string
		toolchain                         Info
		version, revision, time, modified string
		want                              Info
	}{
		{"worktree: nothing stamped, all linked",
			Info{Version: "(devel)", GoVersion: "go1.26.8"},
			"v0.0.0-20261201162054-68c978ace40c+dirty", rev, "2026-12-01T16:20:54Z", "true",
			Info{Version: "v0.0.0-20261201162054-68c978ace40c+dirty", Revision: rev, Time: "2026-12-01T16:20:54Z", Modified: true, GoVersion: "go1.26.8"}},
		{"clone: the toolchain's stamp wins",
			stamped, "v9.9.9", rev, "2020-01-01T00:00:00Z", "true", stamped},
		{"go build without the Makefile: nothing linked",
			Info{Version: "(devel)", GoVersion: "go1.26.8"}, "", "", "", "",
			Info{Version: "(devel)", GoVersion: "go1.26.8"}},
		{"tarball: a version, no commit",
			Info{Version: "(devel)", GoVersion: "go1.26.8"}, "v1.2.3", "", "", "",
			Info{Version: "v1.2.3", GoVersion: "go1.26.8"}},
	}
	for _, tc := range tests {
		if got := tc.toolchain.withLinked(tc.version, tc.revision, tc.time, tc.modified); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
