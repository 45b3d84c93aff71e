package daemon

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

// TestBuildOfLocalDNS checks that the directives come from LocalDNS's
// own binary: the project's CoreDNS has the lab's lossy plugin, which
// CoreDNS 1.13.1's standard build has not, and a Corefile using it is
// accepted for the one and refused for the other.
func TestBuildOfLocalDNS(t *testing.T) {
	bin := nstest.CoreDNSBinary(t)
	var b builds
	build, err := b.get(bin, "")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(build.Directives, "lossy") || !slices.Contains(build.Directives, "forward") || build.From != bin {
		t.Fatalf("build %v", build)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "Corefile")
	write(t, path, ".:53 {\n  bind 169.254.10.11\n  lossy 10\n  forward . 10.0.0.10\n}\n")
	base := DefaultConfig()
	base.Listen = []netip.AddrPort{netip.MustParseAddrPort("169.254.10.11:53")}
	base.StateDir = ""
	base.Fallback.Upstreams = []netip.AddrPort{netip.MustParseAddrPort("10.0.0.10:53")}
	for _, tt := range []struct {
		binary, want string
	}{
		{bin, SourceFile},
		{"", SourceFallback},
		{filepath.Join(dir, "absent"), SourceFallback},
	} {
		base.LocalDNSCoreDNS = tt.binary
		_, prov, err := (&Resolver{Layer: corefileLayer(base, path)}).Resolve()
		if err != nil {
			t.Fatal(err)
		}
		if prov.Source != tt.want {
			t.Errorf("LocalDNS's CoreDNS %q: source %s (refused %v, build %v %v), want %s", tt.binary, prov.Source, prov.Refused, prov.Build, prov.BuildErr, tt.want)
		}
		if tt.binary == filepath.Join(dir, "absent") && prov.BuildErr == nil {
			t.Error("a missing binary is not reported")
		}
	}
}

// TestBuildCached checks that the binary runs once while it stays the
// same file, again once it is replaced, and that what is not a CoreDNS
// gives the standard build and an error.
func TestBuildCached(t *testing.T) {
	dir := t.TempDir()
	runs := filepath.Join(dir, "runs")
	bin := filepath.Join(dir, "coredns")
	script := func(plugins string) {
		t.Helper()
		text := "#!/bin/sh\necho run >> " + runs + "\nprintf '" + plugins + "'\n"
		tmp := bin + ".new"
		if err := os.WriteFile(tmp, []byte(text), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, bin); err != nil {
			t.Fatal(err)
		}
	}
	count := func() int {
		b, _ := os.ReadFile(runs)
		return strings.Count(string(b), "run")
	}
	script(`bind\ncache\nforward\n\non\n`)
	var b builds
	for range 3 {
		build, err := b.get(bin, "")
		if err != nil || len(build.Directives) != 4 {
			t.Fatalf("build %v, %v", build, err)
		}
	}
	if n := count(); n != 1 {
		t.Errorf("ran %d times for one binary, want 1", n)
	}
	script(`bind\nforward\n`) // no cache: not a CoreDNS LocalDNS could run
	build, err := b.get(bin, "")
	if err == nil || build.Directives != nil {
		t.Errorf("a binary without cache: %v, %v; want the standard build and an error", build, err)
	}
	if n := count(); n != 2 {
		t.Errorf("ran %d times for two binaries, want 2", n)
	}
	script(`bind\ncache\nforward\nNot A Name\n`)
	if _, err := b.get(bin, ""); err == nil || !strings.Contains(err.Error(), "not a plugin name") {
		t.Errorf("odd output: %v", err)
	}
}

// TestBuildStored checks that a build kept in the state directory spares
// the next process (a restart, a cold start) the run of the binary, for
// that binary only, and that what is not such a copy is run past.
func TestBuildStored(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	runs := filepath.Join(dir, "runs")
	bin := filepath.Join(dir, "coredns")
	install := func(plugins string) {
		t.Helper()
		text := "#!/bin/sh\necho run >> " + runs + "\nprintf '" + plugins + "'\n"
		if err := os.WriteFile(bin+".new", []byte(text), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(bin+".new", bin); err != nil {
			t.Fatal(err)
		}
	}
	count := func() int {
		b, _ := os.ReadFile(runs)
		return strings.Count(string(b), "run")
	}
	stored := filepath.Join(state, buildFile)
	install(`bind\ncache\nforward\n`)
	for i, tt := range []struct {
		name     string
		before   func()
		stateDir string
		runs     int // the binary's runs so far
		want     int // directives
	}{
		{"first start runs it", func() {}, state, 1, 3},
		{"a restart reads it", func() {}, state, 1, 3},
		{"without a state directory it runs", func() {}, "", 2, 3},
		{"a copy for another binary is run past", func() { install(`bind\ncache\nforward\ntemplate\n`) }, state, 3, 4},
		{"then the new copy is read", func() {}, state, 3, 4},
		{"a damaged copy is run past", func() {
			b, _ := os.ReadFile(stored)
			first, _, _ := strings.Cut(string(b), "\n")
			if err := os.WriteFile(stored, []byte(first+"\nNot A Name\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, state, 4, 4},
		{"an empty copy is run past", func() {
			b, _ := os.ReadFile(stored)
			first, _, _ := strings.Cut(string(b), "\n")
			if err := os.WriteFile(stored, []byte(first+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, state, 5, 4},
	} {
		tt.before()
		var b builds // a new process
		build, err := b.get(bin, tt.stateDir)
		if err != nil || len(build.Directives) != tt.want || build.From != bin {
			t.Errorf("%d %s: build %v, %v; want %d directives from %s", i, tt.name, build, err, tt.want, bin)
		}
		if n := count(); n != tt.runs {
			t.Errorf("%d %s: the binary ran %d times in all, want %d", i, tt.name, n, tt.runs)
		}
	}
}
