package lab_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/dnsstandby/dnsstandby/bench/internal/testbed"
	"github.com/dnsstandby/dnsstandby/bench/lab"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// debTestBuild builds the Debian package for this machine (`make deb`) and
// returns its path.
func debTestBuild(t *testing.T) string {
	t.Helper()
	dist := t.TempDir()
	repo := filepath.Join("..", "..")
	cmd := exec.Command("make", "-C", repo, "--no-print-directory", "deb", "DIST="+dist, "ARCHES="+runtime.GOARCH)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make deb: %v\n%s", err, out)
	}
	debs, err := filepath.Glob(filepath.Join(dist, "dnsstandby_*_"+runtime.GOARCH+".deb"))
	if err != nil || len(debs) != 1 {
		t.Fatalf("make deb wrote %v (%v), want one package", debs, err)
	}
	return debs[0]
}

// debTestMetrics scrapes dnsstandby's metrics (127.0.0.1:9355, as
// /etc/default/dnsstandby has it) from inside the node.
func debTestMetrics(ctx context.Context, n *localdnsTestNode) (testbed.Metrics, error) {
	client := &http.Client{
		Timeout: 2 * time.Second,
		Transport: &http.Transport{DialContext: func(_ context.Context, network, addr string) (net.Conn, error) {
			return n.node.Dial(network, "", addr, time.Second)
		}},
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:9355/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metrics: %s", resp.Status)
	}
	return testbed.ParseMetrics(resp.Body)
}

// TestDebInSystemdGuest installs the Debian package `make deb` builds with
// dpkg into a node: a systemd guest running LocalDNS (the shipped unit)
// with its Corefile where AKS keeps it, and a kube-dns behind it. Then, as
// docs/install.md tells an operator:
//   - after dpkg -i the unit is known to systemd (postinst's daemon-reload)
//     but neither enabled nor started;
//   - the operator edits /etc/default/dnsstandby (here: a bridge anchor,
//     as this machine has no dummy driver) and runs systemctl enable --now:
//     the installed unit runs /usr/bin/dnsstandby, reads LocalDNS's
//     Corefile, mirrors LocalDNS and, LocalDNS stopped, answers the pods'
//     and the node's listeners itself;
//   - installing the package again (an upgrade) keeps the edited conffile
//     and restarts the running service;
//   - dpkg --purge stops it and removes the unit, the conffile, the enable
//     link and the state directory.
func TestDebInSystemdGuest(t *testing.T) {
	localdnsTestRequire(t)
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatal("needs make (Debian package make)")
	}
	deb := debTestBuild(t)
	n := localdnsTestBoot(t, lab.LocalDNSShipped)
	g := n.guest
	ctx := t.Context()
	n.waitAnswering(t, lab.LocalDNSPodIP, 10*time.Second)

	// The package goes into the guest's own file system (its /var/tmp,
	// in the overlay's tmpfs), through PID 1's view of it.
	data, err := os.ReadFile(deb)
	localdnsTestMust(t, err)
	localdnsTestMust(t, os.WriteFile(fmt.Sprintf("/proc/%d/root/var/tmp/dnsstandby.deb", g.PID()), data, 0o644))
	exec := func(name string, args ...string) string {
		t.Helper()
		out, err := g.Exec(ctx, name, args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	show := func(props ...string) map[string]string {
		t.Helper()
		st, err := g.Show(ctx, "dnsstandby.service", props...)
		localdnsTestMust(t, err)
		return st
	}

	// Installed: known, not enabled, not started.
	reloads := func() int {
		j, err := g.Journal(ctx, "")
		localdnsTestMust(t, err)
		return strings.Count(j, "systemd[1]: Reloading")
	}
	before := reloads()
	exec("dpkg", "-i", "/var/tmp/dnsstandby.deb")
	st := show("LoadState", "ActiveState", "UnitFileState", "FragmentPath", "ExecMainPID", "NeedDaemonReload")
	for k, want := range map[string]string{
		"LoadState":        "loaded",
		"ActiveState":      "inactive",
		"UnitFileState":    "disabled",
		"ExecMainPID":      "0",
		"NeedDaemonReload": "no",
	} {
		if st[k] != want {
			t.Errorf("after dpkg -i: %s=%s, want %s", k, st[k], want)
		}
	}
	// /usr/lib/systemd/system, where the package puts it; systemd names
	// it /lib/systemd/system on a merged-/usr system, where both are one.
	if p := st["FragmentPath"]; p != "/usr/lib/systemd/system/dnsstandby.service" && p != "/lib/systemd/system/dnsstandby.service" {
		t.Errorf("after dpkg -i: FragmentPath=%s, want the package's unit", p)
	}
	if after := reloads(); after != before+1 {
		t.Errorf("systemd reloaded %d times during dpkg -i, want once (postinst's daemon-reload)", after-before)
	}
	if out := exec("dpkg-query", "-W", "-f", "${Status} ${Conffiles}", "dnsstandby"); !strings.HasPrefix(out, "install ok installed") || !strings.Contains(out, "/etc/default/dnsstandby") {
		t.Errorf("dpkg-query: %q, want installed with the conffile /etc/default/dnsstandby", out)
	}
	if out := exec("dnsstandby", "version"); !strings.HasPrefix(out, "dnsstandby ") {
		t.Errorf("dnsstandby version in the guest: %q", out)
	}

	// Configured, then enabled and started by the operator.
	exec("sed", "-i", `s|^DNSSTANDBY_OPTS="\(.*\)"$|DNSSTANDBY_OPTS="\1 --anchor-kind bridge"|`, "/etc/default/dnsstandby")
	if opts := exec("grep", "^DNSSTANDBY_OPTS=", "/etc/default/dnsstandby"); !strings.Contains(opts, "--localdns-corefile /opt/azure/containers/localdns/updated.localdns.corefile") || !strings.Contains(opts, "--anchor-kind bridge\"") {
		t.Fatalf("/etc/default/dnsstandby: %s", opts)
	}
	if out, err := g.Systemctl(ctx, "enable", "--now", "dnsstandby.service"); err != nil {
		j, _ := g.Journal(ctx, "dnsstandby.service")
		t.Fatalf("systemctl enable --now: %v\n%s\n%s", err, out, localdnsTestTail(j, 30))
	}
	st = show("ActiveState", "SubState", "UnitFileState", "MainPID", "ExecStart")
	if st["ActiveState"] != "active" || st["UnitFileState"] != "enabled" || !strings.Contains(st["ExecStart"], "path=/usr/bin/dnsstandby ") {
		t.Fatalf("after enable --now: %v", st)
	}
	firstPID := st["MainPID"]
	mode := func(want string) {
		t.Helper()
		var m testbed.Metrics
		var err error
		testkit.Eventually(t, 15*time.Second, "dnsstandby_mode "+want, func() bool {
			m, err = debTestMetrics(ctx, n)
			return err == nil && m.Sum("dnsstandby_mode", map[string]string{"mode": want}) == 1
		})
	}
	mode("mirror")

	// LocalDNS stopped: the installed unit answers both listeners alone.
	if out, err := g.Systemctl(ctx, "stop", lab.LocalDNSUnitName); err != nil {
		t.Fatalf("stop LocalDNS: %v\n%s", err, out)
	}
	mode("takeover")
	for _, ip := range []string{lab.LocalDNSPodIP, lab.LocalDNSNodeIP} {
		n.waitAnswering(t, ip, 5*time.Second)
	}

	// Installed again: an upgrade keeps the edited conffile and restarts
	// the running service onto the new binary.
	exec("dpkg", "-i", "/var/tmp/dnsstandby.deb")
	if opts := exec("grep", "^DNSSTANDBY_OPTS=", "/etc/default/dnsstandby"); !strings.Contains(opts, "--anchor-kind bridge") {
		t.Errorf("the upgrade replaced the edited /etc/default/dnsstandby: %s", opts)
	}
	st = show("ActiveState", "UnitFileState", "MainPID")
	if st["ActiveState"] != "active" || st["UnitFileState"] != "enabled" || st["MainPID"] == firstPID || st["MainPID"] == "0" {
		t.Errorf("after the upgrade: %v, want active, enabled, a new MainPID (was %s)", st, firstPID)
	}
	n.waitAnswering(t, lab.LocalDNSPodIP, 10*time.Second)

	// Purged: stopped, and nothing of it left.
	exec("dpkg", "--purge", "dnsstandby")
	if st := show("LoadState", "ActiveState"); st["LoadState"] != "not-found" || st["ActiveState"] != "inactive" {
		t.Errorf("after dpkg --purge: %v, want not-found, inactive", st)
	}
	for _, p := range []string{"/usr/bin/dnsstandby", "/usr/lib/systemd/system/dnsstandby.service", "/etc/default/dnsstandby",
		"/etc/systemd/system/multi-user.target.wants/dnsstandby.service", "/var/lib/dnsstandby"} {
		if _, err := g.Exec(ctx, "test", "!", "-e", p, "-a", "!", "-L", p); err != nil {
			t.Errorf("%s left after dpkg --purge", p)
		}
	}
}
