// Package buildinfo says which dnsstandby build is running, from what the
// Go toolchain embeds in every binary: for `dnsstandby version`, the start
// log line, the status and dnsstandby_build_info.
package buildinfo

import (
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Info says which dnsstandby this is, from what the Go toolchain
// embeds in every binary: the module version (v1.2.3 for `go install
// ...@v1.2.3`, "(devel)" for a build from a checkout) and, from a checkout,
// the commit, its time and whether the tree had changes.
type Info struct {
	Version   string
	Revision  string // "" when built outside a git checkout
	Time      string // commit time, RFC 3339
	Modified  bool   // built from a tree with uncommitted changes
	GoVersion string
}

// What the Makefile tells the linker (-ldflags -X, from scripts/version),
// for builds the go command cannot stamp itself: in a git worktree (it
// looks for a .git directory; a worktree has a .git file), with
// -buildvcs=false, or from a tree without git (VERSION=v1.2.3 make build).
// Set at link time and never written after: constants, not state.
var (
	linkedVersion  string // v1.2.3, or a pseudo-version as the go command makes
	linkedRevision string // the full commit hash
	linkedTime     string // commit time, RFC 3339
	linkedModified string // "true" or "false"
)

// Read reads the embedded build information; a binary without
// it (go test's, or one stripped of it) reports "unknown".
func Read() Info {
	return read().withLinked(linkedVersion, linkedRevision, linkedTime, linkedModified)
}

func read() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Version: "unknown", GoVersion: "unknown"}
	}
	v := Info{Version: bi.Main.Version, GoVersion: bi.GoVersion}
	if v.Version == "" {
		v.Version = "unknown"
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.time":
			v.Time = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

// withLinked fills in what the toolchain left out from what the linker was
// told: the version where the go command stamped none ("(devel)"), the
// commit where it found no repository. What the toolchain stamped wins: it
// read the very tree it compiled.
func (v Info) withLinked(version, revision, time, modified string) Info {
	if version != "" && (v.Version == "(devel)" || v.Version == "unknown") {
		v.Version = version
	}
	if revision != "" && v.Revision == "" {
		v.Revision, v.Time, v.Modified = revision, time, modified == "true"
	}
	return v
}

// revision is the commit, shortened to 12 characters, with "+dirty" when
// the tree had changes; "" when unknown.
func (v Info) ShortRevision() string {
	r := v.Revision
	if len(r) > 12 {
		r = r[:12]
	}
	if r != "" && v.Modified {
		r += "+dirty"
	}
	return r
}

// String is one line: "dnsstandby (devel) commit 0123456789ab+dirty
// (2026-11-29T23:00:00Z), go1.26.8". Go 1.24 and later put the commit in
// the version of a build from a checkout (v0.0.0-20261129230000-0123456789ab),
// which is then not repeated.
func (v Info) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "dnsstandby %s", v.Version)
	if r := v.ShortRevision(); r != "" && !strings.Contains(v.Version, strings.TrimSuffix(r, "+dirty")) {
		fmt.Fprintf(&b, " commit %s", r)
		if v.Time != "" {
			fmt.Fprintf(&b, " (%s)", v.Time)
		}
	}
	fmt.Fprintf(&b, ", %s", v.GoVersion)
	return b.String()
}

// collector exports dnsstandby_build_info, constant 1 with the version in
// its labels, for joins such as "which nodes run which commit".
func (v Info) Collector() prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "dnsstandby_build_info",
		Help: "Always 1; the labels say which dnsstandby build this is.",
		ConstLabels: prometheus.Labels{
			"version":   v.Version,
			"revision":  v.ShortRevision(),
			"goversion": v.GoVersion,
		},
	})
	g.Set(1)
	return g
}
