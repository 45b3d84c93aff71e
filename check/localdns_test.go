package check

import (
	"github.com/dnsstandby/dnsstandby/status"

	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

func TestCorefileListeners(t *testing.T) {
	agentBaker, err := os.ReadFile("../corefile/testdata/agentbaker.corefile")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		corefile string
		want     string // the listeners, "ADDR:PORT" joined by ", "
		wantErr  string
	}{
		{"AgentBaker's", string(agentBaker), "169.254.10.10:53, 169.254.10.11:53", ""},
		// The node's listener has the whoami block only: CoreDNS listens
		// there all the same.
		{"no node root block", testkit.Corefile{KubeDNS: "10.0.0.10"}.String(), "169.254.10.10:53, 169.254.10.11:53", ""},
		{"the pods' listener only", ".:53 {\n bind 169.254.10.11\n forward . 10.0.0.10\n}\n", "169.254.10.11:53", ""},
		{"except", ".:53 {\n bind 169.254.10.10 169.254.10.11 {\n  except 169.254.10.10\n }\n forward . 10.0.0.10\n}\n", "169.254.10.11:53", ""},
		{"another address", ".:53 {\n bind 127.0.0.53\n forward . 10.0.0.10\n}\n", "127.0.0.53:53", ""},
		{"another port", "dns://.:5353 {\n bind 169.254.10.11\n forward . 10.0.0.10\n}\n", "169.254.10.11:5353", ""},
		{"key without port", "cluster.local {\n bind 169.254.10.11\n forward . 10.0.0.10\n}\n", "169.254.10.11:53", ""},
		// No bind: every address, the defaults among them.
		{"no bind", ".:53 {\n forward . 10.0.0.10\n}\n", "169.254.10.10:53, 169.254.10.11:53", ""},
		{"TLS only", "tls://.:853 {\n bind 169.254.10.11\n forward . 10.0.0.10\n}\n", "", ""},
		{"a block CoreDNS refuses, on another listener", ".:53 {\n bind 169.254.10.10\n cache 3600 {\n  serve_stale x\n }\n}\n.:53 {\n bind 169.254.10.11\n forward . 10.0.0.10\n}\n", "", "serve_stale"},
		{"syntax", ".:53 {\n bind 169.254.10.11\n", "", "syntax error"},
		{"bad bind", ".:53 {\n bind\n forward . 10.0.0.10\n}\n", "", "bind"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := corefileListeners("Corefile", []byte(tt.corefile))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s := joinAddrPorts(got); s != tt.want {
				t.Fatalf("got %q, want %q", s, tt.want)
			}
		})
	}
}

func TestReadLocalDNSCorefile(t *testing.T) {
	dir := t.TempDir()
	updated, original := filepath.Join(dir, "updated.localdns.corefile"), filepath.Join(dir, "localdns.corefile")
	paths := updated + "," + original
	if err := os.WriteFile(original, []byte(".:53 {\n bind 169.254.10.11\n forward . 10.0.0.10\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Only the second exists: it is read.
	f := readLocalDNSCorefile(paths)
	if f.Path != original || f.Err != nil || len(f.Listeners) != 1 || len(f.Tried) != 2 {
		t.Fatalf("%+v", f)
	}
	// The first wins once it exists.
	if err := os.WriteFile(updated, []byte(".:53 {\n bind 169.254.10.10 169.254.10.11\n forward . 10.0.0.10\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if f := readLocalDNSCorefile(paths); f.Path != updated || f.Err != nil || len(f.Listeners) != 2 {
		t.Fatalf("%+v", f)
	}
	if f := readLocalDNSCorefile(filepath.Join(dir, "absent")); f.Path != "" || f.Err != nil {
		t.Fatalf("absent: %+v", f)
	}
	// A directory exists but cannot be read as a file.
	if f := readLocalDNSCorefile(dir); f.Path != dir || f.Err == nil {
		t.Fatalf("directory: %+v", f)
	}
}

func TestLocalDNSListenersResult(t *testing.T) {
	const path = "/opt/azure/containers/localdns/updated.localdns.corefile"
	ap := netip.MustParseAddrPort
	both := corefileFacts{Path: path, Listeners: []netip.AddrPort{ap("169.254.10.10:53"), ap("169.254.10.11:53")}}
	listening := func(listen ...string) daemonFacts {
		return daemonFacts{Status: daemon(func(s *status.Daemon) { s.Config.Listen = listen })}
	}
	noSocket := fmt.Errorf("admin socket: %w", fs.ErrNotExist)
	tests := []struct {
		name      string
		f         corefileFacts
		d         daemonFacts
		want      Status
		wantFound string
		wantFix   string
	}{
		{"both covered", both, listening("169.254.10.10:53", "169.254.10.11:53"), Pass,
			"LocalDNS serves 169.254.10.10:53, 169.254.10.11:53 (" + path + "); dnsstandby listens on 169.254.10.10:53, 169.254.10.11:53", ""},
		{"the node's listener uncovered", both, listening("169.254.10.11:53"), Warn,
			"169.254.10.10:53 not covered", "add --listen 169.254.10.10:53 to dnsstandby's options"},
		{"neither covered", both, listening("127.0.0.1:53"), Warn,
			"169.254.10.10:53, 169.254.10.11:53 not covered", "add --listen 169.254.10.10:53 --listen 169.254.10.11:53 "},
		{"another port is not the same listener", both, listening("169.254.10.10:5353", "169.254.10.11:53"), Warn,
			"169.254.10.10:53 not covered", "--listen 169.254.10.10:53"},
		{"a wildcard covers", both, listening("0.0.0.0:53"), Pass, "dnsstandby listens on 0.0.0.0:53", ""},
		{"more than LocalDNS is fine", corefileFacts{Path: path, Listeners: both.Listeners[1:]}, listening("169.254.10.10:53", "169.254.10.11:53"), Pass,
			"LocalDNS serves 169.254.10.11:53", ""},
		{"no Corefile", corefileFacts{Tried: []string{path, "/opt/azure/containers/localdns/localdns.corefile"}}, listening("169.254.10.11:53"), Warn,
			"not at " + path + " nor /opt/azure/containers/localdns/localdns.corefile", "--localdns-corefile"},
		{"unreadable Corefile", corefileFacts{Path: path, Err: errors.New("Corefile:3: Unexpected EOF")}, listening("169.254.10.11:53"), Warn,
			"cannot read LocalDNS's Corefile " + path + ": Corefile:3: Unexpected EOF", "fix the Corefile"},
		{"no listener", corefileFacts{Path: path}, listening("169.254.10.11:53"), Warn, "no block of " + path + " serves plain DNS", "--localdns-corefile"},
		{"daemon not running", both, daemonFacts{Err: noSocket}, Warn, "dnsstandby's listen addresses are not known", "dnsstandby row"},
		{"older daemon", both, daemonFacts{Status: daemon(func(s *status.Daemon) { s.Config = nil })}, Warn, "does not report its listen addresses", "as new"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := localdnsListenersResult(tt.f, tt.d)
			if r.Name != "localdns-listeners" || r.Status != tt.want {
				t.Fatalf("%s %s, want %s: %s (fix: %s)", r.Name, r.Status, tt.want, r.Found, r.Fix)
			}
			checkRow(t, r, tt.wantFound, tt.wantFix)
		})
	}
}
