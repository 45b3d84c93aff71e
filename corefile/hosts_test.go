package corefile

import (
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestHosts checks how the hosts directive is read, defaults included.
func TestHosts(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name  string
		keys  string // server block keys; "" is ".:53"
		body  string // the block's lines after bind
		want  *Hosts
		notes []string
	}{
		{
			name: "no hosts",
			body: "whoami",
			want: nil,
		},
		{
			name: "bare: CoreDNS's defaults and the block's zones",
			body: "hosts",
			want: &Hosts{File: "/etc/hosts", Zones: []string{"."}, TTL: 3600, Reload: 5 * time.Second, Line: 3},
		},
		{
			name: "AKS",
			body: "hosts /etc/localdns/hosts {\n    ttl 5\n    reload 5s\n    fallthrough\n  }",
			want: &Hosts{File: "/etc/localdns/hosts", Zones: []string{"."}, TTL: 5, Reload: 5 * time.Second,
				Fallthrough: []string{"."}, Line: 3},
		},
		{
			name: "every key's zones, reverse CIDRs expanded",
			keys: "example.org:53 10.0.0.0/23:53",
			body: "hosts /h",
			want: &Hosts{File: "/h", Zones: []string{"example.org.", "0.0.10.in-addr.arpa.", "1.0.10.in-addr.arpa."},
				TTL: 3600, Reload: 5 * time.Second, Line: 3},
		},
		{
			name: "zones given, normalized; a bad one dropped and noted",
			body: "hosts /h Example.ORG 10.0.0.0/24 a..b {\n    fallthrough EXAMPLE.org\n    no_reverse\n    reload 0\n  }",
			want: &Hosts{File: "/h", Zones: []string{"example.org.", "0.0.10.in-addr.arpa."}, TTL: 3600,
				NoReverse: true, Fallthrough: []string{"example.org."}, Line: 3},
			notes: []string{`test.corefile:3: hosts: zone "a..b" ignored`},
		},
		{
			name: "inline lines before fallthrough, options mixed in",
			body: "hosts {\n    10.0.0.1 a.example.org b\n    ttl 60\n    ::1 c # d\n    fallthrough\n  }",
			want: &Hosts{File: "/etc/hosts", Zones: []string{"."}, Inline: []string{"10.0.0.1 a.example.org b", "::1 c"},
				TTL: 60, Reload: 5 * time.Second, Fallthrough: []string{"."}, Line: 3},
		},
		{
			name: "a fallthrough whose zones are all dropped leaves later lines inline",
			body: "hosts {\n    fallthrough a..b\n    10.0.0.1 x\n  }",
			want: &Hosts{File: "/etc/hosts", Zones: []string{"."}, Inline: []string{"10.0.0.1 x"},
				TTL: 3600, Reload: 5 * time.Second, Fallthrough: []string{}, Line: 3},
			notes: []string{`test.corefile:4: hosts: zone "a..b" ignored`},
		},
		{
			name: "a word after no_reverse is the next line",
			body: "hosts {\n    no_reverse 10.0.0.1 x\n  }",
			want: &Hosts{File: "/etc/hosts", Zones: []string{"."}, Inline: []string{"10.0.0.1 x"},
				TTL: 3600, NoReverse: true, Reload: 5 * time.Second, Line: 3},
		},
		{
			name: "ttl bounds and extra arguments",
			body: "hosts {\n    ttl 65535 1\n  }",
			want: &Hosts{File: "/etc/hosts", Zones: []string{"."}, TTL: 65535, Reload: 5 * time.Second, Line: 3},
		},
		{
			name: "relative file joined to root",
			body: "root " + dir + "\n  hosts myhosts",
			want: &Hosts{File: filepath.Join(dir, "myhosts"), Zones: []string{"."}, TTL: 3600, Reload: 5 * time.Second, Line: 4},
		},
		{
			name:  "relative file without root is noted",
			body:  "hosts myhosts",
			want:  &Hosts{File: "myhosts", Zones: []string{"."}, TTL: 3600, Reload: 5 * time.Second, Line: 3},
			notes: []string{`test.corefile:3: hosts: file "myhosts" is relative`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			keys := tt.keys
			if keys == "" {
				keys = ".:53"
			}
			s := parseText(t, keys+" {\n  bind 169.254.10.11\n  "+tt.body+"\n}\n")
			for _, z := range s.Zones {
				if !reflect.DeepEqual(z.Hosts, tt.want) {
					t.Errorf("zone %s: Hosts =\n %+v\nwant\n %+v", z.Name, z.Hosts, tt.want)
				}
			}
			if len(s.Notes) != len(tt.notes) {
				t.Fatalf("notes %v, want %d like %v", s.Notes, len(tt.notes), tt.notes)
			}
			for i, n := range s.Notes {
				if !strings.HasPrefix(n.String(), tt.notes[i]) {
					t.Errorf("note %q, want it to start %q", n, tt.notes[i])
				}
			}
		})
	}
}

// TestHostsPerZone checks that the zones of one block do not share their
// Hosts.
func TestHostsPerZone(t *testing.T) {
	s := parseText(t, "a.example:53 b.example:53 {\n  bind 169.254.10.11\n  hosts /h {\n    1.2.3.4 x.a.example\n  }\n}\n")
	if len(s.Zones) != 2 || s.Zones[0].Hosts == s.Zones[1].Hosts {
		t.Fatalf("zones %v share or lack Hosts", zoneNames(s))
	}
	s.Zones[0].Hosts.Zones[0] = "changed."
	s.Zones[0].Hosts.Inline[0] = "changed"
	if h := s.Zones[1].Hosts; h.Zones[0] != "a.example." || h.Inline[0] != "1.2.3.4 x.a.example" {
		t.Errorf("zone %s Hosts changed with the other zone's: %+v", s.Zones[1].Name, h)
	}
}

func TestWhoami(t *testing.T) {
	tests := []struct {
		name string
		body string
		want bool
	}{
		{"absent", "hosts", false},
		{"present", "whoami", true},
		{"twice: CoreDNS reads only the first", "whoami\n  whoami x", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := parseText(t, ".:53 {\n  bind 169.254.10.11\n  "+tt.body+"\n}\n")
			if got := s.Zones[0].Whoami; got != tt.want {
				t.Errorf("Whoami = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestHostsErrors checks what CoreDNS refuses in hosts, whoami and root.
func TestHostsErrors(t *testing.T) {
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	const head = ".:53 {\n  bind 169.254.10.11\n  "
	tests := []struct {
		name, body, want string
	}{
		{"hosts twice", "hosts\n  hosts", "test.corefile:4: hosts: can only be used once per server block"},
		{"ttl without value", "hosts {\n    ttl\n  }", "test.corefile:4: hosts: ttl needs a time in second"},
		{"ttl not a number", "hosts {\n    ttl 5s\n  }", "test.corefile:4: hosts: ttl needs a number of second"},
		{"ttl zero", "hosts {\n    ttl 0\n  }", "test.corefile:4: hosts: ttl provided is invalid"},
		{"ttl too large", "hosts {\n    ttl 65536\n  }", "test.corefile:4: hosts: ttl provided is invalid"},
		{"reload without value", "hosts {\n    reload\n  }", "test.corefile:4: hosts: reload needs a duration (zero seconds to disable)"},
		{"reload two values", "hosts {\n    reload 1s 2s\n  }", "test.corefile:4: hosts: reload needs a duration (zero seconds to disable)"},
		{"reload not a duration", "hosts {\n    reload 5\n  }", "test.corefile:4: hosts: invalid duration for reload '5'"},
		{"reload negative", "hosts {\n    reload -1s\n  }", "test.corefile:4: hosts: invalid negative duration for reload '-1s'"},
		{"unknown line after fallthrough", "hosts {\n    fallthrough\n    10.0.0.1 x\n  }", "test.corefile:5: hosts: unknown property '10.0.0.1'"},
		{"file that cannot be looked at", "hosts " + notDir + "/hosts", "test.corefile:3: hosts: unable to access hosts file '" + notDir + "/hosts': "},
		{"whoami with an argument", "whoami x", "test.corefile:3: whoami: wrong argument count"},
		{"whoami with a block", "whoami {\n  }", "test.corefile:3: whoami: unexpected '{'"},
		{"root without a path", "root\n  hosts", "test.corefile:3: root: wrong argument count"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("test.corefile", strings.NewReader(head+tt.body+"\n}\n"), []netip.AddrPort{podListener})
			if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
				t.Fatalf("error %v, want it to start %q", err, tt.want)
			}
		})
	}
}
