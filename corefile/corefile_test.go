package corefile

import (
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// aksKubeZones are the .11 zones of testdata/agentbaker.corefile, most
// specific first.
func aksKubeZones() []Zone {
	const file = "testdata/agentbaker.corefile"
	aksPlugins := []string{"bind", "forward", "ready", "cache", "loop", "nsid", "prometheus"}
	return []Zone{
		{
			Name: "health-check.localdns.local.", Port: 53, Key: "health-check.localdns.local:53",
			File: file, Line: 18,
			Bind:    addrs("169.254.10.10", "169.254.10.11"),
			Plugins: []string{"bind", "whoami"},
			Whoami:  true,
		},
		{
			Name: "cluster.local.", Port: 53, Key: "cluster.local:53", File: file, Line: 127,
			Bind:          addrs("169.254.10.11"),
			Plugins:       append([]string{"log"}, aksPlugins...),
			Upstreams:     addrPorts("10.0.0.10:53"),
			ForwardPolicy: "round_robin", ForceTCP: true, MaxConcurrent: 1000,
			MaxFails: 2, HealthCheck: 500 * time.Millisecond, Expire: 10 * time.Second,
			ForwardLine: 130,
			Cache:       aksCache(136, 0, false),
			NSID:        "localdns-pod",
		},
		{
			Name: "testdomain567.com.", Port: 53, Key: "testdomain567.com:53", File: file, Line: 145,
			Bind:          addrs("169.254.10.11"),
			Plugins:       append([]string{"errors"}, aksPlugins...),
			Upstreams:     addrPorts("168.63.129.16:53"),
			ForwardPolicy: "random", PreferUDP: true, MaxConcurrent: 1000,
			MaxFails: 2, HealthCheck: 500 * time.Millisecond, Expire: 10 * time.Second,
			ForwardLine: 148,
			Cache:       aksCache(154, time.Hour, false),
			NSID:        "localdns-pod",
		},
		{
			Name: ".", Port: 53, Key: ".:53", File: file, Line: 94,
			Bind:          addrs("169.254.10.11"),
			Plugins:       []string{"errors", "bind", "hosts", "forward", "ready", "cache", "loop", "nsid", "prometheus", "template"},
			Upstreams:     addrPorts("10.0.0.10:53"),
			ForwardPolicy: "sequential", PreferUDP: true, MaxConcurrent: 1000,
			MaxFails: 2, HealthCheck: 500 * time.Millisecond, Expire: 10 * time.Second,
			ForwardLine: 103,
			Cache:       aksCache(109, time.Hour, true),
			NSID:        "localdns-pod",
			Hosts: &Hosts{File: "/etc/localdns/hosts", Zones: []string{"."}, TTL: 5, Reload: 5 * time.Second,
				Fallthrough: []string{"."}, Line: 98},
			// Compared by templateSummary: regexps and text/templates
			// cannot be written out as values.
			Templates: []Template{{Zones: []string{"internal.cloudapp.net."}, Rcode: 3, Fallthrough: []string{"."}, Line: 118},
				{Zones: []string{"reddog.microsoft.com."}, Rcode: 3, Line: 123}},
		},
	}
}

// TestAgentBakerCorefile reads the Corefile AgentBaker generates and checks
// every setting dnsstandby takes from the pod listener's blocks.
func TestAgentBakerCorefile(t *testing.T) {
	s, err := Load("testdata/agentbaker.corefile", []netip.AddrPort{podListener})
	if err != nil {
		t.Fatal(err)
	}
	if s.File != "testdata/agentbaker.corefile" {
		t.Errorf("File = %q", s.File)
	}
	equalZones(t, s.Zones, aksKubeZones())
	if len(s.Notes) != 0 {
		t.Errorf("notes: %v", s.Notes)
	}
}

// TestAgentBakerListeners checks which blocks each LocalDNS listener gets.
func TestAgentBakerListeners(t *testing.T) {
	tests := []struct {
		name   string
		file   string
		listen []netip.AddrPort
		want   []string // zone names with their block lines
	}{
		{"pods", "agentbaker.corefile", []netip.AddrPort{podListener},
			[]string{"health-check.localdns.local.@18", "cluster.local.@127", "testdomain567.com.@145", ".@94"}},
		{"node", "agentbaker.corefile", []netip.AddrPort{nodeListener},
			[]string{"health-check.localdns.local.@18", "cluster.local.@56", "testdomain456.com.@74", ".@23"}},
		{"node-controller pods", "agentbaker-node-controller.corefile", []netip.AddrPort{podListener},
			[]string{"health-check.localdns.local.@14", ".@90"}},
		{"other port", "agentbaker.corefile", addrPorts("169.254.10.11:5353"), nil},
		{"other address", "agentbaker.corefile", addrPorts("10.1.2.3:53"), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Load(filepath.Join("testdata", tt.file), tt.listen)
			if tt.want == nil {
				if !errors.Is(err, ErrNoServerBlock) {
					t.Fatalf("err = %v, want ErrNoServerBlock", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, z := range s.Zones {
				got = append(got, z.Name+"@"+strconv.Itoa(z.Line))
			}
			if strings.Join(got, " ") != strings.Join(tt.want, " ") {
				t.Errorf("zones = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestAgentBakerNodeController checks the KubeDNS root block of the
// aks-node-controller rendering: serve_stale 72000s verify.
func TestAgentBakerNodeController(t *testing.T) {
	s, err := Load("testdata/agentbaker-node-controller.corefile", []netip.AddrPort{podListener})
	if err != nil {
		t.Fatal(err)
	}
	root := zone(t, s, ".")
	if root.MaxConcurrent != 2000 || !root.PreferUDP || root.ForwardPolicy != "sequential" {
		t.Errorf("forward = %d %v %s", root.MaxConcurrent, root.PreferUDP, root.ForwardPolicy)
	}
	if want := aksCache(105, 72000*time.Second, true); !reflect.DeepEqual(*root.Cache, *want) {
		t.Errorf("cache = %+v, want %+v", *root.Cache, *want)
	}
}

// TestUpdatedCorefile checks the file CoreDNS really runs: localdns.sh
// replaces 168.63.129.16 with the node's VNet DNS servers, space separated.
func TestUpdatedCorefile(t *testing.T) {
	b, err := os.ReadFile("testdata/agentbaker.corefile")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(b), "168.63.129.16", "10.224.0.4 10.224.0.5")
	s, err := Parse("updated.localdns.corefile", strings.NewReader(text), []netip.AddrPort{podListener})
	if err != nil {
		t.Fatal(err)
	}
	z := zone(t, s, "testdomain567.com.")
	if want := addrPorts("10.224.0.4:53", "10.224.0.5:53"); !equalValue(z.Upstreams, want) {
		t.Errorf("upstreams = %v, want %v", z.Upstreams, want)
	}
}

func TestZoneFor(t *testing.T) {
	s, err := Load("testdata/agentbaker.corefile", []netip.AddrPort{podListener, nodeListener})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		local netip.AddrPort
		qname string
		zone  string // "" for none
		line  int
	}{
		{podListener, "kubernetes.default.svc.cluster.local.", "cluster.local.", 127},
		{podListener, "Kubernetes.Default.SVC.Cluster.Local", "cluster.local.", 127},
		{podListener, "cluster.local.", "cluster.local.", 127},
		{podListener, "notcluster.local.", ".", 94},
		{podListener, "mcr.microsoft.com.", ".", 94},
		{podListener, "health-check.localdns.local.", "health-check.localdns.local.", 18},
		{podListener, "www.testdomain567.com.", "testdomain567.com.", 145},
		{podListener, "www.testdomain456.com.", ".", 94},
		{nodeListener, "www.testdomain456.com.", "testdomain456.com.", 74},
		{nodeListener, "svc.cluster.local.", "cluster.local.", 56},
		{nodeListener, "example.com.", ".", 23},
		{netip.MustParseAddrPort("169.254.10.12:53"), "example.com.", "", 0},
		{netip.MustParseAddrPort("169.254.10.11:54"), "example.com.", "", 0},
	}
	for _, tt := range tests {
		z := s.ZoneForAddr(tt.local, tt.qname)
		switch {
		case tt.zone == "" && z != nil:
			t.Errorf("ZoneForAddr(%s, %s) = %s, want none", tt.local, tt.qname, z.Name)
		case tt.zone != "" && (z == nil || z.Name != tt.zone || z.Line != tt.line):
			t.Errorf("ZoneForAddr(%s, %s) = %v, want %s at line %d", tt.local, tt.qname, z, tt.zone, tt.line)
		}
	}

	// ZoneFor ignores the address: with both listeners, the first block
	// in file order wins among zones of the same name.
	if z := s.ZoneFor("svc.cluster.local"); z == nil || z.Line != 56 {
		t.Errorf("ZoneFor(svc.cluster.local) = %v, want line 56", z)
	}
	if z := (Settings{}).ZoneFor("example.com."); z != nil {
		t.Errorf("empty settings gave zone %v", z)
	}
	noRoot := parseText(t, "cluster.local {\n}\n")
	if z := noRoot.ZoneFor("example.com."); z != nil {
		t.Errorf("no root zone, got %v", z)
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "localdns.corefile")
	_, err := Load(missing, []netip.AddrPort{podListener})
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Errorf("missing file: %v", err)
	}

	_, err = Load(dir, []netip.AddrPort{podListener})
	if err == nil || !strings.Contains(err.Error(), dir) {
		t.Errorf("directory: %v", err)
	}

	empty := filepath.Join(dir, "empty.corefile")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Load(empty, []netip.AddrPort{podListener})
	if !errors.Is(err, ErrNoServerBlock) || err.Error() != empty+": no server block serves 169.254.10.11:53" {
		t.Errorf("empty file: %v", err)
	}
}

func TestParseReadError(t *testing.T) {
	_, err := Parse("pipe", errReader{}, []netip.AddrPort{podListener})
	var e *Error
	if !errors.As(err, &e) || e.File != "pipe" || !errors.Is(err, errBroken) {
		t.Errorf("err = %v", err)
	}
}

var errBroken = errors.New("broken")

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errBroken }

// TestImport checks that imported files are read as CoreDNS reads them,
// and that their blocks and errors name the imported file.
func TestImport(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("zones.conf", "\ncluster.local:53 {\n  bind 169.254.10.11\n  forward . 10.0.0.10\n}\n")
	write("cache.conf", "cache 30 {\n  serve_stale 1h verify\n}\n")
	write("bad.conf", "cache {\n  serve_stale soon\n}\n")
	main := write("localdns.corefile", "import zones.conf\n.:53 {\n  bind 169.254.10.11\n  import cache.conf\n}\n")

	s, err := Load(main, []netip.AddrPort{podListener})
	if err != nil {
		t.Fatal(err)
	}
	cl := zone(t, s, "cluster.local.")
	if cl.File != filepath.Join(dir, "zones.conf") || cl.Line != 3 {
		t.Errorf("imported block at %s:%d, want zones.conf:3 (its first directive)", cl.File, cl.Line)
	}
	root := zone(t, s, ".")
	if root.File != main || root.Line != 2 || root.Cache == nil || !root.Cache.StaleVerify || root.Cache.Line != 1 {
		t.Errorf("root block %s:%d cache %+v", root.File, root.Line, deref(root.Cache))
	}

	bad := write("bad.corefile", ".:53 {\n  import bad.conf\n}\n")
	_, err = Load(bad, []netip.AddrPort{podListener})
	if want := filepath.Join(dir, "bad.conf") + `:2: cache: serve_stale: invalid duration "soon"`; err == nil || err.Error() != want {
		t.Errorf("err = %v, want %s", err, want)
	}
}
