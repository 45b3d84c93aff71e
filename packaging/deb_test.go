package packaging_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/buildinfo"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dnsstandby/dnsstandby/deploy"
)

// debPath is the package `make deb` writes for arch.
func debPath(t *testing.T, arch string) string {
	return filepath.Join(dist, fmt.Sprintf("dnsstandby_%s-1_%s.deb", thisBuild(t).debVersion, arch))
}

// dpkgDeb runs dpkg-deb, which every Debian system has (package dpkg).
func dpkgDeb(t *testing.T, args ...string) []byte {
	t.Helper()
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Fatal("needs dpkg-deb (Debian package dpkg)")
	}
	cmd := exec.Command("dpkg-deb", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("dpkg-deb %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// debFile is one entry of a package's data archive.
type debFile struct {
	typ        byte
	mode       int64
	uname      string
	gname      string
	data       []byte
	linkTarget string
}

// debFiles reads the files a package installs (dpkg-deb --fsys-tarfile),
// by absolute path.
func debFiles(t *testing.T, deb string) map[string]debFile {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(dpkgDeb(t, "--fsys-tarfile", deb)))
	files := map[string]debFile{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		p := "/" + strings.TrimSuffix(strings.TrimPrefix(h.Name, "./"), "/")
		files[p] = debFile{h.Typeflag, h.Mode & 0o7777, h.Uname, h.Gname, data, h.Linkname}
	}
	return files
}

// debUnit is the unit the package installs: deploy/systemd's, with the
// binary at /usr/bin, where the package puts it.
func debUnit() string {
	return strings.Replace(deploy.SystemdUnit, "\nExecStart=/usr/local/bin/dnsstandby ", "\nExecStart=/usr/bin/dnsstandby ", 1)
}

// TestDebControl: the control fields (dpkg-deb -f) of each package.
func TestDebControl(t *testing.T) {
	mustMake(t, "deb")
	b := thisBuild(t)
	for _, arch := range testArches() {
		deb := debPath(t, arch)
		tests := []struct {
			field, want string
		}{
			{"Package", "dnsstandby"},
			{"Version", b.debVersion + "-1"},
			{"Architecture", arch},
			{"Section", "net"},
			{"Priority", "optional"},
			{"Homepage", "https://github.com/dnsstandby/dnsstandby"},
			{"Maintainer", "dnsstandby maintainers <dnsstandby@users.noreply.github.com>"},
			// A static binary: nothing to depend on.
			{"Depends", ""},
			{"Pre-Depends", ""},
		}
		for _, tc := range tests {
			if got := strings.TrimSpace(string(dpkgDeb(t, "-f", deb, tc.field))); got != tc.want {
				t.Errorf("%s: %s %q, want %q", filepath.Base(deb), tc.field, got, tc.want)
			}
		}
		desc := string(dpkgDeb(t, "-f", deb, "Description"))
		for _, want := range []string{"LocalDNS", "installed disabled", "/etc/default/dnsstandby", "systemctl enable --now dnsstandby"} {
			if !strings.Contains(desc, want) {
				t.Errorf("%s: Description lacks %q:\n%s", filepath.Base(deb), want, desc)
			}
		}
	}
}

// TestDebFiles: what each package installs, with owner and mode, and that
// it is what the tree holds: the release binary, deploy/systemd's unit
// (ExecStart at /usr/bin), its options file, the DEP-5 copyright, the
// lintian overrides, CHANGELOG.md as the upstream changelog, and the man
// page and bash completion the binary writes from its own flags
// (gen-man, gen-completion), gzip'd without a name or time.
func TestDebFiles(t *testing.T) {
	mustMake(t, "deb")
	tree := func(path string) []byte {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(repoRoot, path))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if got := debUnit(); got == deploy.SystemdUnit || !strings.Contains(got, "\nExecStart=/usr/bin/dnsstandby run $DNSSTANDBY_OPTS\n") {
		t.Fatalf("deploy/systemd's unit has no ExecStart=/usr/local/bin/dnsstandby line to move")
	}
	// This machine's binary writes the man page and completion of every
	// architecture's package: the flags are the same.
	native := filepath.Join(dist, "dnsstandby-linux-"+runtime.GOARCH)
	generated := func(args ...string) []byte {
		t.Helper()
		out, err := exec.Command(native, args...).Output()
		if err != nil {
			t.Fatalf("dnsstandby %s: %v", strings.Join(args, " "), err)
		}
		return out
	}
	if !slices.Contains(testArches(), runtime.GOARCH) {
		t.Skipf("no %s binary built to compare the man page with (DNSSTANDBY_TEST_ARCHES=%q)", runtime.GOARCH, os.Getenv("DNSSTANDBY_TEST_ARCHES"))
	}
	man, completion := generated("gen-man"), generated("gen-completion", "bash")
	for _, arch := range testArches() {
		binary, err := os.ReadFile(filepath.Join(dist, "dnsstandby-linux-"+arch))
		if err != nil {
			t.Fatal(err)
		}
		files := debFiles(t, debPath(t, arch))
		tests := []struct {
			path string
			mode int64
			data []byte // for a .gz, what it holds
		}{
			{"/usr/bin/dnsstandby", 0o755, binary},
			{"/usr/lib/systemd/system/dnsstandby.service", 0o644, []byte(debUnit())},
			{"/etc/default/dnsstandby", 0o644, []byte(deploy.SystemdDefaults)},
			{"/usr/share/doc/dnsstandby/copyright", 0o644, nil}, // TestDebCopyright
			{"/usr/share/doc/dnsstandby/changelog.gz", 0o644, tree("CHANGELOG.md")},
			{"/usr/share/doc/dnsstandby/changelog.Debian.gz", 0o644, nil}, // TestDebChangelog
			{"/usr/share/man/man8/dnsstandby.8.gz", 0o644, man},
			{"/usr/share/bash-completion/completions/dnsstandby", 0o644, completion},
			{"/usr/share/lintian/overrides/dnsstandby", 0o644, tree("packaging/deb/lintian-overrides")},
		}
		var want []string
		for _, tc := range tests {
			want = append(want, tc.path)
			f, ok := files[tc.path]
			if !ok {
				t.Errorf("%s: no %s", arch, tc.path)
				continue
			}
			if f.typ != tar.TypeReg || f.mode != tc.mode || f.uname != "root" || f.gname != "root" {
				t.Errorf("%s: %s: type %c mode %o owner %s:%s, want a regular file, mode %o, root:root",
					arch, tc.path, f.typ, f.mode, f.uname, f.gname, tc.mode)
			}
			data := f.data
			if strings.HasSuffix(tc.path, ".gz") {
				data = gunzipPlain(t, tc.path, data)
			}
			if tc.data != nil && !bytes.Equal(data, tc.data) {
				t.Errorf("%s: %s (%d bytes) differs from the tree's (%d bytes)", arch, tc.path, len(data), len(tc.data))
			}
		}
		var got []string
		for p, f := range files {
			if f.typ != tar.TypeDir {
				got = append(got, p)
			}
		}
		if slices.Sort(got); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
			t.Errorf("%s: the package installs %v, want exactly %v", arch, got, want)
		}
	}
}

// gunzipPlain returns what a .gz holds, and fails t unless it was made as
// Debian wants (gzip -9n): no file name and no time in its header.
func gunzipPlain(t *testing.T, name string, data []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if zr.Name != "" || !zr.ModTime.IsZero() {
		t.Errorf("%s: gzip header has name %q and time %v, want neither (gzip -n)", name, zr.Name, zr.ModTime)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return out
}

// TestDebChangelog: the Debian changelog is made at build time for the
// package's version, signed by the Maintainer on the commit's date.
func TestDebChangelog(t *testing.T) {
	mustMake(t, "deb")
	b := thisBuild(t)
	for _, arch := range testArches() {
		deb := debPath(t, arch)
		f, ok := debFiles(t, deb)["/usr/share/doc/dnsstandby/changelog.Debian.gz"]
		if !ok {
			t.Fatalf("%s: no changelog.Debian.gz", arch)
		}
		text := string(gunzipPlain(t, "changelog.Debian.gz", f.data))
		maintainer := strings.TrimSpace(string(dpkgDeb(t, "-f", deb, "Maintainer")))
		first := fmt.Sprintf("dnsstandby (%s-1) unstable; urgency=medium\n", b.debVersion)
		if !strings.HasPrefix(text, first) {
			t.Errorf("%s: changelog starts %q, want %q", arch, strings.SplitN(text, "\n", 2)[0], first)
		}
		trailer := "\n -- " + maintainer + "  "
		if b.time != "" {
			when, err := time.Parse(time.RFC3339, b.time)
			if err != nil {
				t.Fatal(err)
			}
			trailer += when.UTC().Format(time.RFC1123Z) + "\n"
		}
		if !strings.Contains(text, trailer) || !strings.HasSuffix(text, "\n") {
			t.Errorf("%s: changelog has no trailer %q:\n%s", arch, trailer, text)
		}
	}
}

// TestDebCopyright: the copyright file is packaging/deb/copyright, then
// one Files paragraph for each module linked into the package's binary and
// one for Go's standard library.
func TestDebCopyright(t *testing.T) {
	mustMake(t, "deb")
	head, err := os.ReadFile(filepath.Join(repoRoot, "packaging/deb/copyright"))
	if err != nil {
		t.Fatal(err)
	}
	for _, arch := range testArches() {
		text := string(debFiles(t, debPath(t, arch))["/usr/share/doc/dnsstandby/copyright"].data)
		if !strings.HasPrefix(text, string(head)) {
			t.Errorf("%s: copyright does not start with packaging/deb/copyright:\n%.400s", arch, text)
		}
		bi, err := buildinfo.ReadFile(filepath.Join(dist, "dnsstandby-linux-"+arch))
		if err != nil {
			t.Fatal(err)
		}
		if len(bi.Deps) == 0 {
			t.Fatalf("%s: the binary names no modules", arch)
		}
		want := []string{"go/src/*"}
		for _, m := range bi.Deps {
			want = append(want, m.Path+"/*")
		}
		for _, files := range want {
			if !strings.Contains(text, "\nFiles: "+files+"\nCopyright: ") {
				t.Errorf("%s: copyright has no paragraph for %s", arch, files)
			}
		}
	}
}

// TestDebLintian: lintian, Debian's package checker, finds no error in the
// package. Its warnings are listed in the log: the two it gives are the
// maintainer scripts calling systemctl, on purpose (TestDebMaintainerScripts).
func TestDebLintian(t *testing.T) {
	if _, err := exec.LookPath("lintian"); err != nil {
		if os.Geteuid() != 0 {
			t.Skip("needs lintian (Debian package lintian), which make test-deps installs as root: run the tests as root")
		}
		t.Fatal("needs lintian (Debian package lintian): make test-deps installs it")
	}
	mustMake(t, "deb")
	for _, arch := range testArches() {
		out, err := exec.Command("lintian", "--no-cfg", "--fail-on", "error", debPath(t, arch)).CombinedOutput()
		var errs []string
		for line := range strings.Lines(string(out)) {
			if strings.HasPrefix(line, "E: ") {
				errs = append(errs, strings.TrimSpace(line))
			}
		}
		if err != nil || len(errs) > 0 {
			t.Errorf("%s: lintian: %v\n%s", arch, err, out)
		}
		t.Logf("%s: lintian:\n%s", arch, out)
	}
}

// TestDebConffiles: /etc/default/dnsstandby is the one conffile, so dpkg
// keeps an operator's edits across upgrades.
func TestDebConffiles(t *testing.T) {
	mustMake(t, "deb")
	for _, arch := range testArches() {
		if got := string(dpkgDeb(t, "-I", debPath(t, arch), "conffiles")); got != "/etc/default/dnsstandby\n" {
			t.Errorf("%s: conffiles %q, want /etc/default/dnsstandby alone", arch, got)
		}
	}
}

// maintainerScripts extracts a package's control area (dpkg-deb -e) and
// returns the directory.
func maintainerScripts(t *testing.T, deb string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "DEBIAN")
	dpkgDeb(t, "-e", deb, dir)
	return dir
}

// shellCode is a shell script without its comments (a "#" that starts a
// word; the scripts have none inside quotes).
func shellCode(script string) string {
	var b strings.Builder
	for line := range strings.Lines(script) {
		if i := strings.Index(" "+line, " #"); i >= 0 {
			line = line[:i] + "\n"
		}
		if i := strings.Index(line, "\t#"); i >= 0 {
			line = line[:i] + "\n"
		}
		b.WriteString(line)
	}
	return b.String()
}

// systemctlVerbs returns the verb of each systemctl command in a shell
// script, with its unit: "daemon-reload", "stop dnsstandby.service".
func systemctlVerbs(script string) []string {
	var verbs []string
	for line := range strings.Lines(shellCode(script)) {
		w := strings.Fields(line)
		for i := 0; i < len(w); i++ {
			if w[i] != "systemctl" {
				continue
			}
			var args []string
			for _, a := range w[i+1:] {
				if a == "||" || a == "&&" || a == ";" || a == "|" {
					break
				}
				args = append(args, a)
			}
			verbs = append(verbs, strings.Join(args, " "))
		}
	}
	return verbs
}

// TestDebMaintainerScripts: the package's maintainer scripts are the
// tree's, POSIX shell that parses, stop at the first error, and never
// start, enable or restart the service: installing it leaves it to the
// operator, an upgrade only restarts one that runs (try-restart), removal
// stops it.
func TestDebMaintainerScripts(t *testing.T) {
	mustMake(t, "deb")
	dir := maintainerScripts(t, debPath(t, testArches()[0]))
	tests := []struct {
		script string
		verbs  []string // the systemctl commands it may run, in order
	}{
		{"postinst", []string{"daemon-reload", "try-restart dnsstandby.service"}},
		{"prerm", []string{"stop dnsstandby.service"}},
		{"postrm", []string{"daemon-reload"}},
	}
	var want []string
	for _, tc := range tests {
		want = append(want, tc.script)
		b, err := os.ReadFile(filepath.Join(dir, tc.script))
		if err != nil {
			t.Errorf("%s: %v", tc.script, err)
			continue
		}
		tree, err := os.ReadFile(filepath.Join(repoRoot, "packaging/deb", tc.script))
		if err != nil || !bytes.Equal(b, tree) {
			t.Errorf("%s differs from packaging/deb/%s (%v)", tc.script, tc.script, err)
		}
		s := string(b)
		if !strings.HasPrefix(s, "#!/bin/sh\n") || !strings.Contains(s, "\nset -eu\n") {
			t.Errorf("%s: want #!/bin/sh and set -eu", tc.script)
		}
		if out, err := exec.Command("sh", "-n", filepath.Join(dir, tc.script)).CombinedOutput(); err != nil {
			t.Errorf("sh -n %s: %v\n%s", tc.script, err, out)
		}
		if st, err := os.Stat(filepath.Join(dir, tc.script)); err != nil || st.Mode().Perm()&0o111 == 0 {
			t.Errorf("%s not executable (%v)", tc.script, err)
		}
		if got := systemctlVerbs(s); !slices.Equal(got, tc.verbs) {
			t.Errorf("%s runs systemctl %q, want %q", tc.script, got, tc.verbs)
		}
		for _, never := range []string{"deb-systemd-invoke", "deb-systemd-helper", "invoke-rc.d", "service dnsstandby", "--now"} {
			if strings.Contains(shellCode(s), never) {
				t.Errorf("%s uses %q: only daemon-reload, try-restart and stop are allowed", tc.script, never)
			}
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if n := e.Name(); !slices.Contains(want, n) && !slices.Contains([]string{"control", "md5sums", "conffiles"}, n) {
			t.Errorf("unexpected control file %s", n)
		}
	}
	// The parser sees what it should.
	if got := systemctlVerbs("if x; then systemctl start foo || true; fi # systemctl enable\n"); !slices.Equal(got, []string{"start foo"}) {
		t.Errorf("systemctlVerbs: %q", got)
	}
}

// TestDebMaintainerScriptsRun runs each maintainer script as dpkg would,
// with a stand-in systemctl that records what it is asked, on a machine
// that looks booted with systemd (/run/systemd/system, in a mount namespace
// of the test's own, over tmpfs /run, /var/lib and /etc/systemd/system):
// install, upgrade, remove and purge, and what each asks of systemd.
func TestDebMaintainerScriptsRun(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the scripts in a mount namespace of their own (unshare --mount): run the tests as root")
	}
	mustMake(t, "deb")
	dir := maintainerScripts(t, debPath(t, testArches()[0]))
	stub := t.TempDir()
	if err := os.WriteFile(filepath.Join(stub, "systemctl"), []byte("#!/bin/sh\necho \"$*\" >>\"$SYSTEMCTL_LOG\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		args  []string // as dpkg calls the script
		calls []string
	}{
		{"install", []string{"postinst", "configure"}, []string{"daemon-reload"}},
		{"upgrade", []string{"postinst", "configure", "0.0.0~20261101000000.0123456789ab-1"}, []string{"daemon-reload", "try-restart dnsstandby.service"}},
		{"remove: stop", []string{"prerm", "remove"}, []string{"stop dnsstandby.service"}},
		{"upgrade: no stop", []string{"prerm", "upgrade", "1.0.0-1"}, nil},
		{"remove: reload", []string{"postrm", "remove"}, []string{"daemon-reload"}},
		{"purge", []string{"postrm", "purge"}, []string{"daemon-reload"}},
		{"upgrade: no reload before", []string{"postrm", "upgrade", "1.0.0-1"}, nil},
	}
	for _, tc := range tests {
		log := filepath.Join(t.TempDir(), "systemctl.log")
		script := `set -eu
mount -t tmpfs none /run
mount -t tmpfs none /var/lib
mount -t tmpfs none /etc/systemd/system
mkdir -p /run/systemd/system
script=$1; shift
exec sh "$script" "$@"`
		args := append([]string{"--mount", "--propagation", "private", "sh", "-c", script, "sh", filepath.Join(dir, tc.args[0])}, tc.args[1:]...)
		cmd := exec.Command("unshare", args...)
		cmd.Env = []string{"PATH=" + stub + ":/usr/sbin:/usr/bin:/sbin:/bin", "SYSTEMCTL_LOG=" + log}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s: %s: %v\n%s", tc.name, strings.Join(tc.args, " "), err, out)
			continue
		}
		var calls []string
		if b, err := os.ReadFile(log); err == nil {
			calls = strings.Split(strings.TrimSpace(string(b)), "\n")
		}
		if !slices.Equal(calls, tc.calls) {
			t.Errorf("%s: %s asked systemctl %q, want %q", tc.name, strings.Join(tc.args, " "), calls, tc.calls)
		}
	}
}
