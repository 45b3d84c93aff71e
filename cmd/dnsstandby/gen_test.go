package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/dnsstandby/dnsstandby/check"
	"github.com/dnsstandby/dnsstandby/daemon"
	"github.com/dnsstandby/dnsstandby/internal/buildinfo"
	"github.com/dnsstandby/dnsstandby/internal/gendoc"
)

// TestFlagsDocs: the flag table of `dnsstandby run` in docs/operating.md
// is the one the flag set makes.
func TestFlagsDocs(t *testing.T) {
	var b bytes.Buffer
	writeFlagTable(&b, commandDocs()[0])
	gendoc.Check(t, "../../docs/operating.md", "run-flags", b.String())
}

// TestCommandWalk: the walk finds every flag of every command, with the
// defaults the flag sets have (DefaultConfig's, for run), and no hidden
// command.
func TestCommandWalk(t *testing.T) {
	docs := commandDocs()
	var names []string
	for _, c := range docs {
		names = append(names, c.name)
	}
	if want := []string{"run", "status", "hold", "release", "check", "cleanup", "version"}; !slices.Equal(names, want) {
		t.Fatalf("commands %v, want %v", names, want)
	}
	cfg := daemon.DefaultConfig()
	fs, _ := runFlags(&cfg)
	var n int
	fs.VisitAll(func(*flag.Flag) { n++ })
	if len(docs[0].flags) != n {
		t.Errorf("run: %d flags documented, the flag set has %d", len(docs[0].flags), n)
	}
	find := func(cmd, name string) flagDoc {
		for _, c := range docs {
			if c.name != cmd {
				continue
			}
			for _, f := range c.flags {
				if f.name == name {
					return f
				}
			}
		}
		t.Fatalf("%s: no flag %s", cmd, name)
		return flagDoc{}
	}
	tests := []struct {
		cmd, name string
		want      flagDoc
	}{
		{"run", "listen", flagDoc{arg: "ADDR:PORT", def: (&addrList{p: &cfg.Listen}).String()}},
		{"run", "upstream-timeout", flagDoc{arg: "DURATION", def: cfg.Pipeline.UpstreamTimeout.String()}},
		{"run", "max-inflight", flagDoc{arg: "N", def: fmt.Sprint(cfg.Pipeline.MaxInflight)}},
		{"run", "state-dir", flagDoc{arg: "PATH", def: cfg.StateDir}},
		{"run", "steering", flagDoc{arg: "VALUE", def: cfg.Takeover.Steering}},
		{"run", "hedge", flagDoc{arg: "", def: map[bool]string{true: "true"}[cfg.Hedging]}},
		{"run", "validate", flagDoc{arg: "", def: ""}},
		{"run", "nsid", flagDoc{arg: "STRING", def: cfg.Pipeline.NSID}},
		{"hold", "for", flagDoc{arg: "DURATION", def: ""}},
		{"check", "timeout", flagDoc{arg: "DURATION", def: check.DefaultConfig().Timeout.String()}},
	}
	for _, tc := range tests {
		got := find(tc.cmd, tc.name)
		if got.arg != tc.want.arg || got.def != tc.want.def {
			t.Errorf("%s --%s: arg %q default %q, want %q and %q", tc.cmd, tc.name, got.arg, got.def, tc.want.arg, tc.want.def)
		}
	}
}

// TestManPage: dnsstandby(8) renders without a warning from groff and
// man, at the width man uses without a terminal and a narrow one, and
// names every flag of every command.
func TestManPage(t *testing.T) {
	var b bytes.Buffer
	docs := commandDocs()
	writeMan(&b, docs, buildinfo.Info{Version: "v1.2.3", Time: "2026-12-01T10:00:00Z"})
	page := b.String()
	if !strings.HasPrefix(page, `.TH DNSSTANDBY 8 "2026-12-01" "dnsstandby v1.2.3" "System Administration"`+"\n") {
		t.Errorf("title line: %q", strings.SplitN(page, "\n", 2)[0])
	}
	for _, c := range docs {
		if !strings.Contains(page, ".B "+c.name+"\n") {
			t.Errorf("no command %s", c.name)
		}
		for _, f := range c.flags {
			if !strings.Contains(page, `\fB`+roffOption("--"+f.name)+`\fR`) {
				t.Errorf("%s: no flag --%s", c.name, f.name)
			}
		}
	}
	path := filepath.Join(t.TempDir(), "dnsstandby.8")
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	runs := [][]string{{"groff", "-man", "-ww", "-z", path}}
	for _, width := range []string{"80", "60"} {
		runs = append(runs, []string{"env", "MANWIDTH=" + width, "MANPAGER=cat", "man", "--warnings", "-l", path})
	}
	for _, args := range runs {
		if _, err := exec.LookPath(args[0]); args[0] != "env" && err != nil {
			t.Fatalf("needs %s (Debian package groff-base; make test-deps)", args[0])
		}
		if _, err := exec.LookPath("man"); args[0] == "env" && err != nil {
			t.Fatal("needs man (Debian package man-db; make test-deps)")
		}
		cmd := exec.Command(args[0], args[1:]...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil || stderr.Len() > 0 {
			t.Errorf("%s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		if args[0] == "env" && !bytes.Contains(out, []byte("--steering")) {
			t.Errorf("%s: the rendered page has no --steering:\n%s", strings.Join(args, " "), out)
		}
	}
}

// TestBashCompletion: the completion script is valid bash and completes
// what a user types, driven as bash drives it (the function `complete -p`
// names, with COMP_WORDS and COMP_CWORD).
func TestBashCompletion(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Fatal("needs bash")
	}
	dir := t.TempDir()
	script := filepath.Join(dir, "dnsstandby")
	var b bytes.Buffer
	writeBashCompletion(&b, commandDocs())
	if err := os.WriteFile(script, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("bash", "-n", script).CombinedOutput(); err != nil {
		t.Fatalf("bash -n: %v\n%s", err, out)
	}
	for _, name := range []string{"Corefile", "Corefile.old", "other"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		line string // what is typed, the cursor at its end
		want []string
	}{
		{"dnsstandby ", []string{"run", "status", "hold", "release", "check", "cleanup", "version"}},
		{"dnsstandby re", []string{"release"}},
		{"dnsstandby run --ste", []string{"--steering"}},
		{"dnsstandby run -ste", nil}, // flags complete with two dashes
		{"dnsstandby run --hedge --hedge-r", []string{"--hedge-rate"}},
		{"dnsstandby run --steering ", nil}, // a value: nothing to offer
		{"dnsstandby run --localdns-corefile " + dir + "/Core", []string{dir + "/Corefile", dir + "/Corefile.old"}},
		{"dnsstandby run --localdns-corefile=" + dir + "/Core", []string{dir + "/Corefile", dir + "/Corefile.old"}},
		{"dnsstandby run -localdns-corefile " + dir + "/o", []string{dir + "/other"}},
		{"dnsstandby hold --f", []string{"--for"}},
		{"dnsstandby status --f", nil},
		{"dnsstandby check --kubelet-c", []string{"--kubelet-config"}},
		{"dnsstandby cleanup --", []string{"--anchor-link", "--lock-file"}},
		{"dnsstandby version --", nil},
	}
	for _, tc := range tests {
		// COMP_WORDS as bash splits the line (at blanks and at "=").
		words := strings.Fields(strings.ReplaceAll(tc.line, "=", " = "))
		if strings.HasSuffix(tc.line, " ") {
			words = append(words, "")
		}
		var quoted []string
		for _, w := range words {
			quoted = append(quoted, "'"+w+"'")
		}
		// Not under set -e: bash runs completion functions without it,
		// and compgen fails when nothing matches.
		drive := `source "$1"
fn=$(complete -p dnsstandby | sed -n 's/.*-F \([^ ]*\) .*/\1/p')
COMP_WORDS=(` + strings.Join(quoted, " ") + `)
COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
COMP_LINE=$2
COMP_POINT=${#COMP_LINE}
"$fn" dnsstandby "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
printf '%s\n' "${COMPREPLY[@]}"`
		out, err := exec.Command("bash", "-c", drive, "bash", script, tc.line).CombinedOutput()
		if err != nil {
			t.Errorf("%q: %v\n%s", tc.line, err, out)
			continue
		}
		got := strings.Fields(string(out))
		slices.Sort(got)
		want := slices.Sorted(slices.Values(tc.want))
		if !slices.Equal(got, want) {
			t.Errorf("%q completes to %q, want %q", tc.line, got, want)
		}
	}
}

// TestGenCommands: the hidden commands print the page and the script,
// refuse stray arguments, and are not in the usage.
func TestGenCommands(t *testing.T) {
	tests := []struct {
		args   []string
		code   int
		prefix string
	}{
		{[]string{"gen-man"}, exitOK, ".TH DNSSTANDBY 8 "},
		{[]string{"gen-man", "x"}, exitUsage, ""},
		{[]string{"gen-completion", "bash"}, exitOK, "# bash completion for dnsstandby(8)"},
		{[]string{"gen-completion", "zsh"}, exitUsage, ""},
		{[]string{"gen-completion"}, exitUsage, ""},
	}
	for _, tc := range tests {
		var stdout, stderr bytes.Buffer
		if code := dispatch(tc.args, &stdout, &stderr); code != tc.code || !strings.HasPrefix(stdout.String(), tc.prefix) {
			t.Errorf("%v: exit %d, stdout %.40q, want %d and %q", tc.args, code, stdout.String(), tc.code, tc.prefix)
		}
	}
	if strings.Contains(usage(), "gen-") {
		t.Errorf("the usage lists a hidden command:\n%s", usage())
	}
}
