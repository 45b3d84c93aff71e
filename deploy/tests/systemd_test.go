package tests

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/dnsstandby/dnsstandby/deploy"
)

// unitSettings reads a unit file into "Section.Key" -> values, in order.
func unitSettings(unit string) map[string][]string {
	out := map[string][]string{}
	section := ""
	sc := bufio.NewScanner(strings.NewReader(unit))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
		default:
			k, v, _ := strings.Cut(line, "=")
			out[section+"."+strings.TrimSpace(k)] = append(out[section+"."+strings.TrimSpace(k)], strings.TrimSpace(v))
		}
	}
	return out
}

// TestSystemdUnitVerifies runs systemd-analyze verify on the unit: it must
// exit 0 and say nothing (it exits 0 on unknown keys and bad values, and
// only warns).
func TestSystemdUnitVerifies(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not installed (Debian package systemd; .ci/run installs it)")
	}
	// verify wants the ExecStart binary to exist: point it at one that does.
	stand, err := exec.LookPath("true")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(deploy.SystemdUnit, "ExecStart=/usr/local/bin/dnsstandby ") {
		t.Fatal("ExecStart is not /usr/local/bin/dnsstandby")
	}
	dir := t.TempDir()
	unit := strings.Replace(deploy.SystemdUnit, "/usr/local/bin/dnsstandby", stand, 1)
	for name, data := range map[string]string{
		"dnsstandby.service": unit,
		// The broken twin proves a warning fails the test.
		"broken.service": strings.Replace(unit, "Restart=always", "Restart=sometimes", 1),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	verify := func(name string) (string, error) {
		cmd := exec.Command(analyze, "verify", "--man=no", filepath.Join(dir, name))
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	if out, err := verify("dnsstandby.service"); err != nil || out != "" {
		t.Errorf("systemd-analyze verify dnsstandby.service: %v\n%s", err, out)
	}
	if out, _ := verify("broken.service"); !strings.Contains(out, "sometimes") {
		t.Errorf("verify did not flag a bad Restart= (so it would not flag ours either): %q", out)
	}
}

// TestSystemdUnitSettings checks the settings the design depends on.
func TestSystemdUnitSettings(t *testing.T) {
	got := unitSettings(deploy.SystemdUnit)
	for key, want := range map[string]string{
		"Unit.StartLimitIntervalSec": "0", // never left failed by a start limit
		"Service.Type":               "notify",
		"Service.ExecReload":         "/bin/kill -HUP $MAINPID", // SIGHUP reloads; systemd 249 has no notify-reload
		"Service.NotifyAccess":       "main",
		"Service.Restart":            "always",
		"Service.RestartSec":         "200ms",
		"Service.WatchdogSec":        "10s",
		"Service.User":               "root", // LocalDNS's UID, or no shared reuseport group
		"Service.ExecStart":          "/usr/local/bin/dnsstandby run $DNSSTANDBY_OPTS",
		"Service.EnvironmentFile":    "-/etc/default/dnsstandby",
		"Service.NoNewPrivileges":    "yes",
		"Service.ProtectSystem":      "strict",
		"Service.ProtectHome":        "yes",
		"Service.PrivateTmp":         "yes",
		"Service.RuntimeDirectory":   "dnsstandby",
		// The lock file and admin.sock of a DaemonSet pod that took over
		// live there: the unit's stop must not remove them.
		"Service.RuntimeDirectoryPreserve": "yes",
		// Another dnsstandby serves the node (75): inactive, not failed,
		// no restart. A configuration error (78): failed, no restart. A
		// crash (2, signals) is in neither: restarted.
		"Service.SuccessExitStatus":        "75",
		"Service.RestartPreventExitStatus": "75 78",
		"Service.StateDirectory":           "dnsstandby",
		"Service.MemoryMax":                "256M",
		"Service.CapabilityBoundingSet":    "CAP_NET_BIND_SERVICE CAP_NET_ADMIN CAP_BPF CAP_NET_RAW CAP_SYS_PTRACE",
	} {
		if v := got[key]; len(v) != 1 || v[0] != want {
			t.Errorf("%s = %q, want %q", key, v, want)
		}
	}
	if !slices.Contains(strings.Fields(strings.Join(got["Unit.Before"], " ")), "localdns.service") {
		t.Errorf("Before = %q: must start before localdns.service", got["Unit.Before"])
	}
	// Nothing that ties our lifetime to LocalDNS's.
	for _, dep := range []string{"Requires", "Requisite", "BindsTo", "PartOf", "Upholds", "Conflicts", "Wants", "After"} {
		for _, v := range got["Unit."+dep] {
			if strings.Contains(v, "localdns") {
				t.Errorf("%s=%s: LocalDNS stopping, failing or restarting must not touch dnsstandby", dep, v)
			}
		}
	}
	if !strings.Contains(deploy.SystemdDefaults, `DNSSTANDBY_OPTS="`) {
		t.Errorf("dnsstandby.default sets no DNSSTANDBY_OPTS:\n%s", deploy.SystemdDefaults)
	}
}

// TestSystemdDefaultsArgs: the options dnsstandby.default gives are ones
// `dnsstandby run` accepts, split on white space as systemd splits
// $DNSSTANDBY_OPTS: both of LocalDNS's listeners, served from LocalDNS's
// Corefile at the node's paths, no upstream written in. This machine has
// no /opt/azure/containers/localdns: the test writes AgentBaker's Corefile
// (corefile/testdata) into a directory of its own and gives that
// directory's paths instead, leaving every other option as the file has
// it (validateWithCorefile).
func TestSystemdDefaultsArgs(t *testing.T) {
	opts := unitOptions(t)
	line := strings.Join(opts, " ")
	var listen, corefiles, upstreams []string
	for i := 0; i+1 < len(opts); i++ {
		switch opts[i] {
		case "--listen":
			listen = append(listen, opts[i+1])
		case "--localdns-corefile":
			corefiles = append(corefiles, opts[i+1])
		case "--upstream":
			upstreams = append(upstreams, opts[i+1])
		}
	}
	slices.Sort(listen)
	if !slices.Equal(listen, localdnsListeners) {
		t.Errorf("DNSSTANDBY_OPTS %q: --listen %q, want %q", line, listen, localdnsListeners)
	}
	if !slices.Equal(corefiles, []string{localdnsCorefiles}) {
		t.Errorf("DNSSTANDBY_OPTS %q: --localdns-corefile %q, want %q", line, corefiles, localdnsCorefiles)
	}
	if len(upstreams) > 0 {
		t.Errorf("DNSSTANDBY_OPTS %q: --upstream %q: the forward targets come from LocalDNS's Corefile; --upstream would replace them all", line, upstreams)
	}
	bin := buildDNSStandby(t)
	validateWithCorefile(t, bin, append([]string{"run"}, opts...))
}

// TestSystemdUnitReadsLocalDNSFiles: the unit's sandbox leaves LocalDNS's
// Corefile and its hosts file readable. ProtectSystem=strict makes them
// read-only, which is all dnsstandby needs; these settings would hide them.
// (Whether systemd really lets the process read them is seen only on a
// node or in the lab, under a real systemd.)
func TestSystemdUnitReadsLocalDNSFiles(t *testing.T) {
	got := unitSettings(deploy.SystemdUnit)
	if v := got["Service.ProtectSystem"]; !slices.Equal(v, []string{"strict"}) {
		t.Errorf("ProtectSystem = %q, want strict (everything read-only, readable)", v)
	}
	if v := got["Service.ProtectHome"]; slices.Contains(v, "tmpfs") {
		t.Errorf("ProtectHome = %q", v)
	}
	for _, key := range []string{"RootDirectory", "RootImage"} {
		if v := got["Service."+key]; len(v) > 0 {
			t.Errorf("%s=%q: the node's files are not under it", key, v)
		}
	}
	// A path setting naming a directory at or above LocalDNS's files
	// hides or replaces them (BindPaths= with DEST after a colon).
	covers := func(p string) bool {
		if p != "/" {
			p = strings.TrimSuffix(p, "/")
		}
		return slices.Contains([]string{"/", "/opt", "/opt/azure", "/opt/azure/containers", localdnsDir, "/etc", "/etc/localdns"}, strings.TrimSuffix(p, "/"))
	}
	for _, key := range []string{"InaccessiblePaths", "TemporaryFileSystem", "BindPaths", "BindReadOnlyPaths"} {
		for _, v := range got["Service."+key] {
			for _, f := range strings.Fields(v) {
				src, dst, _ := strings.Cut(strings.TrimLeft(f, "-+"), ":")
				if key == "TemporaryFileSystem" {
					dst = "" // PATH:OPTIONS
				}
				if covers(src) && key != "BindPaths" && key != "BindReadOnlyPaths" || covers(dst) {
					t.Errorf("%s=%s hides LocalDNS's Corefile (%s) or its hosts file (/etc/localdns)", key, v, localdnsDir)
				}
			}
		}
	}
}

// maxExposure is the highest `systemd-analyze security` exposure the unit
// may have (0 safest, 10 unsafe); it was 4.6 before its SystemCallFilter=.
const maxExposure = 3.5

// TestSystemdUnitExposure runs `systemd-analyze security --offline=yes` on
// the unit and fails above maxExposure. What keeps it from lower (root for
// the reuseport group, the host's network, CAP_NET_ADMIN, CAP_BPF,
// CAP_SYS_PTRACE, packet and netlink sockets) is docs/privileges.md's.
func TestSystemdUnitExposure(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not installed (Debian package systemd)")
	}
	help, _ := exec.Command(analyze, "security", "--help").CombinedOutput()
	if !strings.Contains(string(help), "--offline") {
		t.Skipf("%s has no security --offline (systemd 250+): %s", analyze, firstLine(string(help)))
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "dnsstandby.service")
	if err := os.WriteFile(path, []byte(deploy.SystemdUnit), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "security", "--offline=yes", "--no-pager", path).CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze security: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`Overall exposure level for dnsstandby\.service: ([0-9.]+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("no exposure level in:\n%s", out)
	}
	got, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("exposure %.1f", got)
	if got > maxExposure {
		t.Errorf("exposure %.1f, want at most %.1f; what counts against it:\n%s", got, maxExposure, grepStatus(string(out), "✗"))
	}
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}
