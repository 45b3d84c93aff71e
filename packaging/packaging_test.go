package packaging_test

import (
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
)

// The tests run in packaging/; the Makefile is one up.
const repoRoot = ".."

// dist is where the tests have the Makefile write (DIST=): a directory of
// their own, removed at the end.
var dist string

func TestMain(m *testing.M) {
	d, err := os.MkdirTemp("", "dnsstandby-dist-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	dist = d
	code := m.Run()
	os.RemoveAll(d)
	os.Exit(code)
}

// testArches are the architectures the tests build: this machine's, or
// those in $DNSSTANDBY_TEST_ARCHES ("amd64 arm64"). Only this machine's by
// default: a cold cross build of the whole tree takes minutes on a 2-core
// machine, and `make release` builds both anyway.
func testArches() []string {
	if a := strings.Fields(os.Getenv("DNSSTANDBY_TEST_ARCHES")); len(a) > 0 {
		return a
	}
	return []string{runtime.GOARCH}
}

// build is what scripts/version says this tree is, the values the Makefile
// stamps and names packages with.
type build struct {
	version, debVersion, revision, time, modified string
}

var readBuild = sync.OnceValues(func() (build, error) {
	out, err := exec.Command(filepath.Join(repoRoot, "scripts/version")).Output()
	if err != nil {
		return build{}, fmt.Errorf("scripts/version: %w", err)
	}
	w := strings.Fields(string(out))
	if len(w) != 5 {
		return build{}, fmt.Errorf("scripts/version printed %q, want 5 words", out)
	}
	for i := range w {
		if w[i] == "-" {
			w[i] = ""
		}
	}
	return build{w[0], w[1], w[2], w[3], w[4]}, nil
})

func thisBuild(t *testing.T) build {
	t.Helper()
	b, err := readBuild()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// made remembers each make target run into dist, so that each runs once
// per test binary however many tests need it.
var (
	madeMu sync.Mutex
	made   = map[string]error{}
)

// mustMake runs `make TARGET DIST=dist ARCHES=testArches()` once, and fails
// t (every time it is asked) if that failed.
func mustMake(t *testing.T, target string) {
	t.Helper()
	madeMu.Lock()
	defer madeMu.Unlock()
	err, ok := made[target]
	if !ok {
		cmd := exec.Command("make", "-C", repoRoot, "--no-print-directory", target,
			"DIST="+dist, "ARCHES="+strings.Join(testArches(), " "))
		out, runErr := cmd.CombinedOutput()
		if runErr != nil {
			err = fmt.Errorf("make %s: %v\n%s", target, runErr, out)
		}
		made[target] = err
	}
	if err != nil {
		t.Fatal(err)
	}
}

func fileSHA256(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256Hex(b)
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestReleaseSHA256SUMS: `make release` writes one binary per architecture
// and a SHA256SUMS that lists exactly those, with their digests, and that
// `sha256sum -c` accepts as a user would run it.
func TestReleaseSHA256SUMS(t *testing.T) {
	mustMake(t, "release")
	sums, err := os.ReadFile(filepath.Join(dist, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]string{}
	for line := range strings.Lines(string(sums)) {
		sum, name, ok := strings.Cut(strings.TrimSuffix(line, "\n"), "  ")
		if !ok || len(sum) != 64 {
			t.Fatalf("SHA256SUMS line %q: want \"SHA256  NAME\"", line)
		}
		listed[name] = sum
	}
	var want []string
	for _, arch := range testArches() {
		want = append(want, "dnsstandby-linux-"+arch)
	}
	if got := slices.Sorted(func(yield func(string) bool) {
		for n := range listed {
			if !yield(n) {
				return
			}
		}
	}); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Errorf("SHA256SUMS lists %v, want %v", got, want)
	}
	for _, name := range want {
		if got := fileSHA256(t, filepath.Join(dist, name)); listed[name] != got {
			t.Errorf("%s: SHA256SUMS says %s, the file's is %s", name, listed[name], got)
		}
	}
	cmd := exec.Command("sha256sum", "--strict", "-c", "SHA256SUMS")
	cmd.Dir = dist
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("sha256sum -c SHA256SUMS: %v\n%s", err, out)
	}
	// The check itself catches a changed binary.
	tampered := t.TempDir()
	for _, name := range append([]string{"SHA256SUMS"}, want...) {
		b, err := os.ReadFile(filepath.Join(dist, name))
		if err != nil {
			t.Fatal(err)
		}
		if name == want[0] {
			b = append(b, 0)
		}
		if err := os.WriteFile(filepath.Join(tampered, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd = exec.Command("sha256sum", "--strict", "-c", "SHA256SUMS")
	cmd.Dir = tampered
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Errorf("sha256sum -c passed a changed %s:\n%s", want[0], out)
	}
}

// elfMachines is the ELF machine of each architecture released.
var elfMachines = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// dynamicParts lists what makes an ELF file dynamically linked: a program
// interpreter, a dynamic segment or section, needed libraries.
func dynamicParts(path string) ([]string, elf.Machine, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	var parts []string
	for _, p := range f.Progs {
		switch p.Type {
		case elf.PT_INTERP:
			parts = append(parts, "PT_INTERP")
		case elf.PT_DYNAMIC:
			parts = append(parts, "PT_DYNAMIC")
		}
	}
	for _, s := range []string{".interp", ".dynamic", ".dynsym"} {
		if f.Section(s) != nil {
			parts = append(parts, s)
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return nil, 0, err
	}
	for _, l := range libs {
		parts = append(parts, "NEEDED "+l)
	}
	return parts, f.Machine, nil
}

// TestReleaseStatic: every released binary is a static ELF executable for
// its architecture: no interpreter, no dynamic section, no library needed.
// A dynamically linked Debian binary is the control.
func TestReleaseStatic(t *testing.T) {
	mustMake(t, "release")
	type want struct {
		static  bool
		machine elf.Machine
	}
	tests := map[string]want{}
	for _, arch := range testArches() {
		m, ok := elfMachines[arch]
		if !ok {
			t.Fatalf("no ELF machine known for %s", arch)
		}
		tests[filepath.Join(dist, "dnsstandby-linux-"+arch)] = want{true, m}
	}
	control, err := exec.LookPath("dpkg-deb")
	if err != nil {
		t.Fatal("needs dpkg-deb (Debian package dpkg)")
	}
	tests[control] = want{false, elfMachines[runtime.GOARCH]}
	for path, w := range tests {
		parts, machine, err := dynamicParts(path)
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		if static := len(parts) == 0; static != w.static {
			t.Errorf("%s: static %v (dynamic parts %v), want %v", path, static, parts, w.static)
		}
		if machine != w.machine {
			t.Errorf("%s: ELF machine %v, want %v", path, machine, w.machine)
		}
	}
}

// TestReleaseVersion: the release binary of this machine's architecture
// says the version and commit scripts/version gives, for each way of
// asking.
func TestReleaseVersion(t *testing.T) {
	mustMake(t, "release")
	if !slices.Contains(testArches(), runtime.GOARCH) {
		t.Skipf("no %s binary built (DNSSTANDBY_TEST_ARCHES=%q)", runtime.GOARCH, os.Getenv("DNSSTANDBY_TEST_ARCHES"))
	}
	b := thisBuild(t)
	bin := filepath.Join(dist, "dnsstandby-linux-"+runtime.GOARCH)
	for _, arg := range []string{"version", "--version", "-version"} {
		out, err := exec.Command(bin, arg).CombinedOutput()
		if err != nil {
			t.Errorf("dnsstandby %s: %v\n%s", arg, err, out)
			continue
		}
		line := strings.TrimSpace(string(out))
		if !strings.HasPrefix(line, "dnsstandby "+b.version+",") && !strings.HasPrefix(line, "dnsstandby "+b.version+" ") {
			t.Errorf("dnsstandby %s: %q, want the version %s", arg, line, b.version)
		}
		if b.revision != "" && !strings.Contains(line, b.revision[:12]) {
			t.Errorf("dnsstandby %s: %q does not name the commit %.12s", arg, line, b.revision)
		}
		if !strings.HasSuffix(line, ", "+runtime.Version()) {
			t.Errorf("dnsstandby %s: %q, want the Go version %s last", arg, line, runtime.Version())
		}
	}
}

// TestInstall: `make install` with DESTDIR and PREFIX puts the binary, the
// unit (ExecStart at PREFIX's binary) and the options file in place, and a
// second install keeps an edited options file.
func TestInstall(t *testing.T) {
	tests := []struct {
		prefix, unitdir string
	}{
		{"/usr/local", "/etc/systemd/system"},
		{"/usr", "/usr/lib/systemd/system"},
	}
	for _, tc := range tests {
		dest := t.TempDir()
		install := func() {
			t.Helper()
			cmd := exec.Command("make", "-C", repoRoot, "--no-print-directory", "install",
				"DESTDIR="+dest, "PREFIX="+tc.prefix, "UNITDIR="+tc.unitdir)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("make install PREFIX=%s: %v\n%s", tc.prefix, err, out)
			}
		}
		install()
		files := []struct {
			path     string
			mode     os.FileMode
			contains string
		}{
			{tc.prefix + "/bin/dnsstandby", 0o755, "\x7fELF"},
			{tc.unitdir + "/dnsstandby.service", 0o644, "\nExecStart=" + tc.prefix + "/bin/dnsstandby run $DNSSTANDBY_OPTS\n"},
			{"/etc/default/dnsstandby", 0o644, "\nDNSSTANDBY_OPTS="},
		}
		for _, f := range files {
			p := filepath.Join(dest, f.path)
			st, err := os.Stat(p)
			if err != nil {
				t.Errorf("PREFIX=%s: %v", tc.prefix, err)
				continue
			}
			b, _ := os.ReadFile(p)
			if st.Mode().Perm() != f.mode || !strings.Contains(string(b), f.contains) {
				t.Errorf("PREFIX=%s: %s: mode %v, want %v and %q in it", tc.prefix, f.path, st.Mode().Perm(), f.mode, f.contains)
			}
		}
		parts, _, err := dynamicParts(filepath.Join(dest, tc.prefix, "bin/dnsstandby"))
		if err != nil || len(parts) > 0 {
			t.Errorf("PREFIX=%s: installed binary not static: %v %v", tc.prefix, parts, err)
		}
		defaults := filepath.Join(dest, "etc/default/dnsstandby")
		edited := []byte("DNSSTANDBY_OPTS=\"--upstream 10.0.0.10:53\"\n")
		if err := os.WriteFile(defaults, edited, 0o644); err != nil {
			t.Fatal(err)
		}
		install()
		if b, _ := os.ReadFile(defaults); !bytes.Equal(b, edited) {
			t.Errorf("PREFIX=%s: a second make install replaced the edited /etc/default/dnsstandby:\n%s", tc.prefix, b)
		}
	}
}

// TestReleaseCheck: `make release` ran scripts/release-check, which runs
// each binary (--version, run --validate), and the check fails for a
// binary that does not run.
func TestReleaseCheck(t *testing.T) {
	mustMake(t, "release")
	if !slices.Contains(testArches(), runtime.GOARCH) {
		t.Skipf("no %s binary built (DNSSTANDBY_TEST_ARCHES=%q)", runtime.GOARCH, os.Getenv("DNSSTANDBY_TEST_ARCHES"))
	}
	name := "dnsstandby-linux-" + runtime.GOARCH
	broken := t.TempDir()
	if err := os.WriteFile(filepath.Join(broken, name), []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		dist string
		ok   bool
	}{
		{dist, true},
		{broken, false},
	}
	for _, tc := range tests {
		out, err := exec.Command(filepath.Join(repoRoot, "scripts/release-check"), tc.dist, runtime.GOARCH).CombinedOutput()
		if (err == nil) != tc.ok {
			t.Errorf("release-check %s: %v, want ok %v\n%s", tc.dist, err, tc.ok, out)
		}
		if tc.ok {
			for _, want := range []string{runtime.GOARCH + " --version: ok", runtime.GOARCH + " run --validate: ok"} {
				if !strings.Contains(string(out), want) {
					t.Errorf("release-check %s: no %q in\n%s", tc.dist, want, out)
				}
			}
		}
	}
}
