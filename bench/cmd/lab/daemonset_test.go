package main

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/dnsstandby/dnsstandby/bench/lab"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// podUnit runs a dnsstandby as the DaemonSet's pod runs it on a node
// where the unit runs: the node's /run/dnsstandby (the unit's runtime
// directory, which the pod mounts), --handover-from on the admin socket
// there, and --after-handover=wait.
const podUnit = "dnsstandby-pod.service"

// TestUnitAndDaemonSet: the rule for the unit and the DaemonSet on one
// node. The DaemonSet wins and the unit steps aside: a pod started beside
// the running unit takes over with no query lost on either listener; the
// unit's process exits 75 and the unit ends inactive, not failed, never
// restarted, its runtime directory (the lock file the pod now holds) left
// in place; starting the unit while the pod holds the lock leaves it
// inactive with one line naming the pod's PID. A bad option in
// /etc/default/dnsstandby leaves the unit failed, with its line in
// `systemctl status`, and not restarted.
func TestUnitAndDaemonSet(t *testing.T) {
	top := testNode(t, "unit-pod", setupStandby)
	g, ctx := top.guest, context.Background()
	unitPID := mainPID(t, top, "dnsstandby.service")
	// unitGone waits until the unit is no longer active, then checks, a
	// second later, that it stayed so: how it ended and that systemd did
	// not restart it.
	unitGone := func(when, state, result, status string) {
		t.Helper()
		testkit.Eventually(t, 15*time.Second, "dnsstandby.service no longer active "+when, func() bool {
			st, err := g.Show(ctx, "dnsstandby.service", "ActiveState")
			return err == nil && (st["ActiveState"] == "inactive" || st["ActiveState"] == "failed")
		})
		time.Sleep(time.Second)
		st, err := g.Show(ctx, "dnsstandby.service", "ActiveState", "Result", "NRestarts", "ExecMainStatus")
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"ActiveState": state, "Result": result, "NRestarts": "0"}
		if status != "" {
			// systemd keeps a failed main process's status; after a clean
			// stop it reports 0.
			want["ExecMainStatus"] = status
		}
		for k, v := range want {
			if st[k] != v {
				j, _ := g.Journal(ctx, "dnsstandby.service")
				t.Fatalf("%s: dnsstandby.service %s=%s, want %v (all: %v)\n%s", when, k, st[k], want, st, tail(j, 15))
			}
		}
	}

	// The pod takes over under load on both listeners.
	var loads []*lab.Load
	for _, c := range []struct {
		ns     *nstest.Namespace
		server string
	}{{top.pod, localDNS}, {top.node, nodeDNS}} {
		load, err := lab.StartLoad(ctx, lab.LoadConfig{NS: c.ns, Server: netip.MustParseAddrPort(c.server + ":53"), QPS: 1000, Names: nameMix(top.zones)})
		if err != nil {
			t.Fatal(err)
		}
		loads = append(loads, load)
	}
	time.Sleep(time.Second)
	// Type=notify: systemd-run returns once the pod is ready, that is
	// once it serves in the unit's place.
	args := append([]string{"--unit=" + podUnit, "--property=Type=notify", "--property=NotifyAccess=main",
		"--property=TimeoutStartSec=60s", "--setenv=GOMEMLIMIT=200MiB", standbyPath, "run"}, standbyOptions(top.setup, top.bins.fallback)...)
	args = append(args, "--handover-from", "/run/dnsstandby/admin.sock", "--after-handover", "wait")
	out, err := g.Exec(ctx, "systemd-run", args...)
	if err != nil {
		for _, l := range loads {
			l.Stop()
		}
		t.Fatalf("start the pod: %v: %s", err, out)
	}
	unitGone("after the pod took over", "inactive", "success", "")
	time.Sleep(time.Second)
	for i, l := range loads {
		s := lab.Summarize(l.Stop(), lab.ProbeResult{})
		listener := []string{"pods' listener", "node's listener"}[i]
		t.Logf("%s: %d queries, %d answered first try, %d after a retry, %d unanswered (LocalDNS %d, dnsstandby %d), longest gap %.0f ms",
			listener, s.Sent, s.AnsweredFirstTry, s.AnsweredAfterRetry, s.Unanswered, s.AnsweredBy.LocalDNS, s.AnsweredBy.Standby, s.MaxGapMs)
		if s.Sent < 2000 || s.Unanswered != 0 || s.ServFail != 0 {
			t.Errorf("%s: %d of %d queries unanswered, %d SERVFAIL while the pod took over", listener, s.Unanswered, s.Sent, s.ServFail)
		}
	}
	podPID := mainPID(t, top, podUnit)
	journal, _ := g.Journal(ctx, "dnsstandby.service")
	if !strings.Contains(journal, fmt.Sprintf("a warm cache to PID %d", podPID)) {
		t.Errorf("the unit's journal does not name the pod (PID %d) it gave to:\n%s", podPID, tail(journal, 15))
	}
	// The runtime directory stays: the lock file the pod holds, with its PID.
	if lock, err := g.Exec(ctx, "cat", "/run/dnsstandby/dnsstandby.lock"); err != nil || strings.TrimSpace(lock) != fmt.Sprint(podPID) {
		t.Errorf("/run/dnsstandby/dnsstandby.lock after the unit stopped: %q %v, want the pod's PID %d", lock, err, podPID)
	}
	answered(t, top, "the pod serving")

	// The unit started again while the pod serves: it steps aside.
	if out, err := g.Systemctl(ctx, "start", "dnsstandby.service"); err != nil {
		t.Errorf("systemctl start dnsstandby beside the pod: %v\n%s", err, out)
	}
	unitGone("started beside the pod", "inactive", "success", "")
	journal, _ = g.Journal(ctx, "dnsstandby.service")
	if !strings.Contains(journal, fmt.Sprintf("another dnsstandby is running on this node (pid %d holds /run/dnsstandby/dnsstandby.lock)", podPID)) {
		t.Errorf("the unit's journal does not name the pod's PID %d:\n%s", podPID, tail(journal, 10))
	}
	if pid := mainPID(t, top, podUnit); pid != podPID {
		t.Errorf("the pod's PID %d -> %d", podPID, pid)
	}
	answered(t, top, "the pod serving after the unit stepped aside")

	// The pod goes; a typo in the options file: failed, its line shown,
	// not restarted.
	if out, err := g.Systemctl(ctx, "stop", podUnit); err != nil {
		t.Fatalf("stop the pod: %v\n%s", err, out)
	}
	if out, err := g.Exec(ctx, "sed", "-i", `s/^DNSSTANDBY_OPTS="/DNSSTANDBY_OPTS="--lissten 169.254.10.11:53 /`, lab.DnsstandbyDefaultsPath); err != nil {
		t.Fatalf("typo: %v\n%s", err, out)
	}
	if out, err := g.Systemctl(ctx, "start", "dnsstandby.service"); err == nil {
		t.Errorf("systemctl start with a typo succeeded:\n%s", out)
	}
	unitGone("with a typo", "failed", "exit-code", "78")
	status, _ := g.Systemctl(ctx, "status", "dnsstandby.service")
	if !strings.Contains(status, "flag provided but not defined: -lissten") || !strings.Contains(status, "status=78/CONFIG") {
		t.Errorf("systemctl status does not show the typo and its exit:\n%s", status)
	}
	if failed, _ := g.Systemctl(ctx, "--failed", "--plain", "--no-legend"); !strings.Contains(failed, "dnsstandby.service") {
		t.Errorf("systemctl --failed does not list dnsstandby.service:\n%s", failed)
	}

	// Fixed: it starts again.
	if out, err := g.Exec(ctx, "sed", "-i", `s/--lissten 169.254.10.11:53 //`, lab.DnsstandbyDefaultsPath); err != nil {
		t.Fatalf("fix the typo: %v\n%s", err, out)
	}
	if out, err := g.Systemctl(ctx, "start", "dnsstandby.service"); err != nil {
		t.Fatalf("start after the fix: %v\n%s", err, out)
	}
	if pid := mainPID(t, top, "dnsstandby.service"); pid == 0 || pid == unitPID {
		t.Errorf("dnsstandby.service MainPID %d after the fix, want a new one", pid)
	}
	answered(t, top, "the unit back")
}
