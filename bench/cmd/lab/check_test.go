package main

import (
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// checkReport is `dnsstandby check --json` as a script reads it (kept apart
// from the check package's types on purpose: this is the interface).
type checkReport struct {
	Status  string `json:"status"`
	Results []struct {
		Name   string `json:"name"`
		Status string `json:"status"`
		Found  string `json:"found"`
		Fix    string `json:"fix"`
	} `json:"results"`
}

// row returns the result named name, failing the test if there is none.
func (r checkReport) row(t *testing.T, name string) (status, found string) {
	t.Helper()
	for _, res := range r.Results {
		if res.Name == name {
			return res.Status, res.Found
		}
	}
	t.Fatalf("no %q row in the report", name)
	return "", ""
}

// TestCheckOnLabNodes runs `dnsstandby check --json` inside two lab nodes,
// each a real systemd with LocalDNS as localdns.service and dnsstandby as
// dnsstandby.service (deploy/systemd): the audit reads the node's real
// units, links, sockets and daemon. On the node with AgentBaker PR 9439's
// unit everything it asserts passes; on the node with the unit as shipped
// the restart policy is advice (INFO), and the audit fails (exit code 2)
// because kubelet points pods past LocalDNS.
func TestCheckOnLabNodes(t *testing.T) {
	checkLabNodes(t, testBinaries(t)) // skips without root
}

func checkLabNodes(t *testing.T, bins binaries) {
	zones := nstest.KubeDNSZones(nstest.ZoneOptions{Services: 20})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tops, err := buildAll(ctx, "check", []string{setupStandby, setupStandbyShipped}, bins, zones, func(string) nodeSpec { return nodeSpec{} })
	if err != nil {
		t.Fatal(err)
	}
	// Registered before anything can fail: the nodes go even then.
	t.Cleanup(func() {
		if err := closeAll(tops); err != nil {
			t.Errorf("tear down: %v", err)
		}
	})
	fixed, shipped := tops[0], tops[1]

	// kubelet's files, as a node has them: the fixed node's pods use
	// LocalDNS through the config file; the shipped node's flags file
	// points them at kube-dns directly (a flag overrides the file).
	for _, k := range []struct {
		top        *topology
		path, data string
	}{
		{fixed, "/var/lib/kubelet/config.yaml", "kind: KubeletConfiguration\nclusterDNS:\n- " + localDNS + "\nclusterDomain: cluster.local\n"},
		{shipped, "/var/lib/kubelet/config.yaml", "kind: KubeletConfiguration\nclusterDNS:\n- " + localDNS + "\n"},
		{shipped, "/etc/default/kubelet", "KUBELET_FLAGS=--v=2 --cluster-dns=" + clusterIP + " --cluster-domain=cluster.local\n"},
	} {
		// The guest's / is an overlay whose writes stay in the guest.
		if _, err := k.top.guest.Exec(ctx, "sh", "-c", `mkdir -p "$(dirname "$1")" && printf '%s' "$2" > "$1"`, "sh", k.path, k.data); err != nil {
			t.Fatal(err)
		}
	}

	// LocalDNS gets traffic from dnsstandby once it passed the hold-down
	// (about 4 s after dnsstandby saw it bound).
	testkit.Eventually(t, 20*time.Second, "dnsstandby in mirror mode", func() bool {
		out, err := fixed.guest.Exec(ctx, standbyPath, "status", "--json")
		return err == nil && strings.Contains(out, `"mode":"mirror"`)
	})

	t.Run("pr9439", func(t *testing.T) {
		rep, code := runCheck(ctx, t, fixed)
		for _, want := range []struct{ name, status, found string }{
			{"localdns-unit", "PASS", "Restart=on-failure RestartSec=2s StartLimitBurst=5 StartLimitIntervalSec=12min KillMode=mixed"},
			{"cluster-dns", "PASS", "clusterDNS = " + localDNS},
			// On LocalDNS's link and on dnsstandby's anchor.
			{"address " + localDNS, "PASS", "local on "},
			// Both sides in the group, one UID (root).
			{"reuseport-group " + localDNS + ":53", "PASS", "coredns["},
			{"reuseport-group " + localDNS + ":53", "PASS", "dnsstandby["},
			{"steering", "PASS", "level adopt"},
			{"upstreams", "PASS", clusterIP + ":53 NOERROR for SOA cluster.local."},
		} {
			status, found := rep.row(t, want.name)
			if status != want.status || !strings.Contains(found, want.found) {
				t.Errorf("%s: %s %q, want %s and %q", want.name, status, found, want.status, want.found)
			}
		}
		// The daemon's own row also weighs its address anchor, which is
		// the unit's business, not this test's: it must not fail.
		if status, found := rep.row(t, "dnsstandby"); status == "FAIL" || !strings.Contains(found, "mode mirror") {
			t.Errorf("dnsstandby: %s %q, want mode mirror", status, found)
		}
		if _, found := rep.row(t, "reuseport-group "+localDNS+":53"); strings.Count(found, "uid ") != strings.Count(found, "uid 0") {
			t.Errorf("group members not all root, as on AKS: %s", found)
		}
		// A daemon that reports its figures (cmd/dnsstandby/status.go
		// wired into the admin socket) has the tap feeding the cache.
		for _, name := range []string{"mirror", "cache"} {
			if status, found := rep.row(t, name); !strings.Contains(found, "does not report") && status != "PASS" {
				t.Errorf("%s: %s %q, want PASS", name, status, found)
			}
		}
		if code == 2 || rep.Status == "FAIL" {
			t.Errorf("exit %d, status %s: the fixed node has no failure", code, rep.Status)
		}
	})

	t.Run("shipped", func(t *testing.T) {
		rep, code := runCheck(ctx, t, shipped)
		// Advice, not a failure: dnsstandby answers while the wedged
		// unit stays failed.
		if status, found := rep.row(t, "localdns-unit"); status != "INFO" || !strings.Contains(found, "start limit in about 0.5s") {
			t.Errorf("localdns-unit: %s %q, want INFO: 5 starts 100 ms apart wedge the unit", status, found)
		}
		if status, found := rep.row(t, "cluster-dns"); status != "FAIL" || !strings.Contains(found, "--cluster-dns = "+clusterIP) {
			t.Errorf("cluster-dns: %s %q, want FAIL from the flags file", status, found)
		}
		if code != 2 || rep.Status != "FAIL" {
			t.Errorf("exit %d, status %s; want 2, FAIL", code, rep.Status)
		}
	})
}

// runCheck runs `dnsstandby check --json` in the node and returns its
// report and exit code.
func runCheck(ctx context.Context, t *testing.T, top *topology) (checkReport, int) {
	t.Helper()
	out, err := top.guest.Exec(ctx, standbyPath, "check", "--json", "--upstream", clusterIP+":53")
	code := 0
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatal(err)
		}
		code = ee.ExitCode()
	}
	t.Logf("%s: dnsstandby check --json, exit %d:\n%s", top.setup, code, out)
	var rep checkReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("unreadable report: %v\n%s", err, out)
	}
	return rep, code
}
