package corefile

import (
	"encoding/json"
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

// TestSourceRoundTrip checks that a Source kept as JSON gives the same
// Settings as the Corefile it came from, for every AgentBaker rendering
// and both listeners, imports included: what a last known good
// configuration needs.
func TestSourceRoundTrip(t *testing.T) {
	files, err := filepath.Glob("testdata/*.corefile")
	if err != nil || len(files) == 0 {
		t.Fatalf("testdata: %v %v", files, err)
	}
	dir := t.TempDir()
	imported := filepath.Join(dir, "main.corefile")
	if err := os.WriteFile(filepath.Join(dir, "cache.conf"), []byte("cache 30\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(imported, []byte(".:53 {\n  bind 169.254.10.11\n  import cache.conf\n  forward . 10.0.0.10\n}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	listen := []netip.AddrPort{podListener, nodeListener}
	for _, path := range append(files, imported) {
		t.Run(filepath.Base(path), func(t *testing.T) {
			src, err := Read(path)
			if err != nil {
				t.Fatal(err)
			}
			want, err := src.Settings(listen)
			if err != nil {
				t.Fatal(err)
			}
			b, err := json.Marshal(src)
			if err != nil {
				t.Fatal(err)
			}
			var back Source
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatal(err)
			}
			if err := back.Check(); err != nil {
				t.Fatalf("Check of the decoded source: %v", err)
			}
			got, err := back.Settings(listen)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("Settings differ after a JSON round trip:\n got %+v\nwant %+v", got, want)
			}
			data, _ := os.ReadFile(path)
			if src.SHA256 == "" || len(src.SHA256) != 64 || strings.Contains(string(data), src.SHA256) {
				t.Errorf("SHA256 = %q", src.SHA256)
			}
		})
	}
}

// TestCheckDecoded checks that a Source decoded from storage is checked
// as a Corefile is: an edited file is refused for the same reasons.
func TestCheckDecoded(t *testing.T) {
	src, err := Read("testdata/agentbaker.corefile")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		edit   func(s *Source)
		reason string
	}{
		{"unknown directive", func(s *Source) { s.Blocks[1].Directives["froward"] = []Token{{Line: 9, Text: "froward"}} }, "unknown_directive"},
		{"bad argument", func(s *Source) {
			toks := s.Blocks[1].Directives["forward"]
			for i := range toks {
				if toks[i].Text == "168.63.129.16" {
					toks[i].Text = "10.0.0.300"
				}
			}
		}, "plugin"},
		{"no keys", func(s *Source) { s.Blocks[0].Keys = nil }, "server_block"},
		{"zone twice", func(s *Source) { s.Blocks[2].Keys = []string{".:53"} }, "server_block"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, _ := json.Marshal(src)
			var s Source
			if err := json.Unmarshal(b, &s); err != nil {
				t.Fatal(err)
			}
			tt.edit(&s)
			err := s.Check()
			if err == nil {
				t.Fatal("Check accepted an edited source")
			}
			if got := Reason(err); got != tt.reason {
				t.Errorf("Reason(%v) = %q, want %q", err, got, tt.reason)
			}
		})
	}
	var nilSource *Source
	if nilSource.Check() == nil {
		t.Error("Check of a nil Source passed")
	}
}

func TestReason(t *testing.T) {
	dir := t.TempDir()
	unreadable := filepath.Join(dir, "dir.corefile")
	if err := os.Mkdir(unreadable, 0o700); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		err  func() error
		want string
	}{
		{"missing", func() error { _, err := Read(filepath.Join(dir, "none")); return err }, "missing"},
		{"a directory", func() error { _, err := Read(unreadable); return err }, "unreadable"},
		{"syntax", func() error { _, err := ReadFrom("f", strings.NewReader(".:53 {\n")); return err }, "syntax"},
		{"unknown directive", func() error {
			_, err := ReadFrom("f", strings.NewReader(".:53 {\n froward . 1.1.1.1\n}\n"))
			return err
		}, "unknown_directive"},
		{"key", func() error { _, err := ReadFrom("f", strings.NewReader("a..b {\n}\n")); return err }, "server_block"},
		{"plugin", func() error { _, err := ReadFrom("f", strings.NewReader(".:53 {\n loop x\n}\n")); return err }, "plugin"},
		{"no server block", func() error {
			_, err := Parse("f", strings.NewReader(".:54 {\n}\n"), []netip.AddrPort{podListener})
			return err
		}, "no_server_block"},
		{"other", func() error { return errors.New("x") }, "other"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.err()
			if got := Reason(err); got != tt.want {
				t.Errorf("Reason(%v) = %q, want %q", err, got, tt.want)
			}
			if !slices.Contains(Reasons(), tt.want) {
				t.Errorf("Reasons() lacks %q", tt.want)
			}
		})
	}
	if _, err := Read(filepath.Join(dir, "none")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing file's error %v is not fs.ErrNotExist", err)
	}
}

// TestShapes checks the plugins read only for their arguments, as
// CoreDNS 1.13.1's setup of each accepts or refuses them.
func TestShapes(t *testing.T) {
	tests := []struct {
		body string
		ok   bool
	}{
		{"log", true},
		{"log . {combined}", true},
		{"log {\n class denial error\n}", true},
		{"log {\n class sometimes\n}", false},
		{"log {\n format x\n}", false},
		{"errors", true},
		{"errors stdout", true},
		{"errors stderr", false},
		{"errors\n errors", false},
		{"errors {\n consolidate 5m \".* timeout\" warning\n}", true},
		{"errors {\n consolidate 5m\n}", false},
		{"errors {\n stacktrace\n}", true},
		{"errors {\n stacktrace now\n}", false},
		{"ready", true},
		{"ready 169.254.10.11:8181", true},
		{"ready 169.254.10.11", false},
		{"ready :8181 :8182", false},
		{"ready\n ready", false},
		{"ready {\n monitor continuously\n}", true},
		{"ready {\n monitor sometimes\n}", false},
		{"health :8080 {\n lameduck 5s\n}", true},
		{"health {\n lameduck\n}", false},
		{"health {\n lame 5s\n}", false},
		{"prometheus :9253", true},
		{"prometheus 9253", false},
		{"prometheus :9253\n prometheus :9254", false},
		{"prometheus :9253 {\n}", false},
		{"loop", true},
		{"loop x", false},
		{"loop\n loop", false},
		{"reload", true},
		{"reload 10s 2s", true},
		{"reload 1s", false},
		{"reload 10s 500ms", false},
		{"reload 10s 2s 1s", false},
		{"debug", true},
		{"debug on", false},
		{"minimal", true},
		{"minimal yes", false},
		{"any whatever it says", true},
		{"cancel 2s", true},
		{"cancel -2s", false},
		{"bufsize 1232", true},
		{"bufsize 100", false},
		{"timeouts {\n read 30s\n}", true},
		{"timeouts {\n read 100ms\n}", false},
		{"timeouts", false},
		{"multisocket 4", true},
		{"multisocket 0", false},
		{"erratic {\n drop 3\n large\n}", true},
		{"erratic {\n drop -1\n}", false},
		{"view v {\n expr name() == 'x.'\n}", true},
		{"view", false},
		{"whoami", true},
		{"whoami x", false},
	}
	for _, tt := range tests {
		_, err := ReadFrom("t", strings.NewReader(".:53 {\n "+tt.body+"\n}\n"))
		if (err == nil) != tt.ok {
			t.Errorf("%q: err = %v, want accepted %v", tt.body, err, tt.ok)
		}
		if err != nil && Reason(err) != "plugin" {
			t.Errorf("%q: Reason(%v) = %q, want plugin", tt.body, err, Reason(err))
		}
	}
}

// TestDirectivesOfCoreDNS checks Directives against the directives the
// project's CoreDNS build registers (`coredns -plugins`), less the lab's
// own lossy plugin: the list must be CoreDNS 1.13.1's, the version the
// differential tests run.
func TestDirectivesOfCoreDNS(t *testing.T) {
	bin := nstest.CoreDNSBinary(t)
	out, err := exec.Command(bin, "-plugins").Output()
	if err != nil {
		t.Fatalf("%s -plugins: %v", bin, err)
	}
	var got []string
	for _, line := range strings.Split(string(out), "\n") {
		// One name a line; the caddy-level "on" comes after a blank line.
		if name := strings.TrimSpace(line); name != "" && name != "lossy" {
			got = append(got, name)
		}
	}
	want := slices.Clone(Directives)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("CoreDNS registers %v\nDirectives hold %v", got, want)
	}
}
