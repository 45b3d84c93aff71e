package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dnsstandby/dnsstandby/bench/lab"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// Tests of deploy/systemd/dnsstandby.service under a real systemd: the lab
// node runs that unit beside localdns.service.

// testBinaries builds dnsstandby into a temporary directory (bound into
// the guests, so /tmp is fine) and finds CoreDNS.
func testBinaries(t *testing.T) binaries {
	t.Helper()
	nstest.RequireRoot(t)
	coredns := nstest.CoreDNSBinary(t)
	bin := filepath.Join(t.TempDir(), "dnsstandby")
	root, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-o", bin, "./cmd/dnsstandby")
	build.Dir = root // the main module's own go.sum
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build dnsstandby: %v\n%s", err, out)
	}
	return binaries{coredns: coredns, dnsstandby: bin}
}

// testNode builds one lab node with the given setup and tears it down at
// the end of the test.
func testNode(t *testing.T, id, setup string) *topology {
	t.Helper()
	bins := testBinaries(t)
	zones := nstest.KubeDNSZones(nstest.ZoneOptions{Services: 20})
	top, err := buildTopology(context.Background(), id, setup, bins, zones, nodeSpec{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := top.close(); err != nil {
			t.Errorf("tear down: %v", err)
		}
	})
	return top
}

// answered asks the pod's nameserver once and fails the test unless the
// answer is a success.
func answered(t *testing.T, top *topology, when string) {
	t.Helper()
	q := lab.LoadName{FQDN: top.zones.Services[0].FQDN, Type: 1}.Query()
	r, err := top.pod.Exchange("udp", "", localDNS+":53", q, time.Second)
	if err != nil || r.Rcode != 0 || len(r.Answer) == 0 {
		t.Fatalf("%s: pod query: %v %v", when, r, err)
	}
}

func mainPID(t *testing.T, top *topology, unit string) int {
	t.Helper()
	pid, err := top.guest.MainPID(context.Background(), unit)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// TestUnitReadyRestartWatchdog runs, on one node, what the unit promises
// while LocalDNS is healthy: READY only once listeners, anchor and
// steering are in place; `systemctl restart dnsstandby` loses no query;
// a stalled dnsstandby is restarted by the watchdog.
func TestUnitReadyRestartWatchdog(t *testing.T) {
	top := testNode(t, "unit-ready", setupStandby)
	g, ctx := top.guest, context.Background()

	t.Run("ready means in place", func(t *testing.T) {
		// buildTopology's `systemctl start` returned at READY=1; nothing
		// has waited since.
		out, err := g.Exec(ctx, standbyPath, "status", "--json")
		if err != nil {
			t.Fatal(err)
		}
		var st struct {
			Mode     string `json:"mode"`
			Steering struct {
				Level string `json:"level"`
			} `json:"steering"`
			Peer struct {
				Adopted     map[string]int `json:"adopted"`
				Unadoptable map[string]int `json:"unadoptable"`
			} `json:"peer"`
			AnchorReady *bool `json:"anchor_ready"`
		}
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("status: %v\n%s", err, out)
		}
		if st.Steering.Level != "adopt" || st.AnchorReady == nil || !*st.AnchorReady {
			t.Errorf("right after READY: steering %q, anchor ready %v, want adopt, true", st.Steering.Level, st.AnchorReady)
		}
		mptcp, _ := g.Exec(ctx, "cat", "/proc/sys/net/mptcp/enabled")
		addrs, err := g.Exec(ctx, "ip", "-o", "addr", "show", "dev", "dnsstandby")
		// Both of LocalDNS's listeners: adopted, and kept local by the anchor.
		for _, ip := range []string{nodeDNS, localDNS} {
			if st.Peer.Adopted[ip+":53/udp"] == 0 {
				t.Errorf("right after READY: adopted %v, want LocalDNS's UDP socket on %s", st.Peer.Adopted, ip)
			}
			// LocalDNS's TCP listener is handled either way: adopted, or
			// (a CoreDNS built with Go ≥ 1.24 where the kernel enables
			// MPTCP) reported as not adoptable rather than as adopted.
			tcp := ip + ":53/tcp"
			if st.Peer.Adopted[tcp]+st.Peer.Unadoptable[tcp] != 1 {
				t.Errorf("LocalDNS's TCP listener on %s: adopted %d, unadoptable %d, want one of them 1", ip, st.Peer.Adopted[tcp], st.Peer.Unadoptable[tcp])
			}
			if strings.TrimSpace(mptcp) == "1" && st.Peer.Unadoptable[tcp] != 1 {
				t.Errorf("MPTCP is on, yet LocalDNS's TCP listener on %s is not reported unadoptable: %+v", ip, st.Peer)
			}
			if err != nil || !strings.Contains(addrs, ip+"/32") {
				t.Errorf("anchor link lacks %s: %q %v", ip, addrs, err)
			}
		}
		show, err := g.Show(ctx, "dnsstandby.service", "ActiveState", "SubState", "StatusText")
		if err != nil {
			t.Fatal(err)
		}
		if show["ActiveState"] != "active" || !strings.Contains(show["StatusText"], "steering adopt") {
			t.Errorf("unit: %v", show)
		}
		// The order in the journal: the steering was attached, then
		// systemd saw READY ("Started").
		journal, _ := g.Journal(ctx, "dnsstandby.service")
		attached, started := strings.Index(journal, "takeover started"), strings.Index(journal, "Started dnsstandby.service")
		if attached < 0 || started < 0 || attached > started {
			t.Errorf("journal: \"takeover started\" at %d, \"Started\" at %d, want both, in that order:\n%s", attached, started, tail(journal, 20))
		}
	})

	t.Run("restart loses no query", func(t *testing.T) {
		load, err := lab.StartLoad(ctx, lab.LoadConfig{NS: top.pod, Server: netip.MustParseAddrPort(localDNS + ":53"), QPS: 2000, Names: nameMix(top.zones)})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
		const restarts = 3
		for i := range restarts {
			before := mainPID(t, top, "dnsstandby.service")
			if out, err := g.Systemctl(ctx, "restart", "dnsstandby.service"); err != nil {
				load.Stop()
				t.Fatalf("restart %d: %v\n%s", i, err, out)
			}
			if after := mainPID(t, top, "dnsstandby.service"); after == before || after == 0 {
				t.Errorf("restart %d: MainPID %d -> %d", i, before, after)
			}
			time.Sleep(700 * time.Millisecond)
		}
		s := lab.Summarize(load.Stop(), lab.ProbeResult{})
		if s.Sent < 3000 || s.AnsweredFirstTry != s.Sent {
			t.Errorf("%d restarts under %d queries: %d answered first try, %d after a retry, %d unanswered, %d SERVFAIL",
				restarts, s.Sent, s.AnsweredFirstTry, s.AnsweredAfterRetry, s.Unanswered, s.ServFail)
		}
		t.Logf("%d restarts: %d of %d queries answered first try (LocalDNS %d, dnsstandby %d)",
			restarts, s.AnsweredFirstTry, s.Sent, s.AnsweredBy.LocalDNS, s.AnsweredBy.Standby)
	})

	t.Run("watchdog restarts a stalled dnsstandby", func(t *testing.T) {
		// A shorter watchdog than the shipped 10 s keeps the test short;
		// the mechanism is the unit's.
		const dropIn = "/etc/systemd/system/dnsstandby.service.d/test-watchdog.conf"
		if _, err := g.Exec(ctx, "sh", "-c", fmt.Sprintf("mkdir -p %s && printf '[Service]\\nWatchdogSec=2s\\nTimeoutAbortSec=1s\\n' > %s",
			filepath.Dir(dropIn), dropIn)); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{{"daemon-reload"}, {"restart", "dnsstandby.service"}} {
			if out, err := g.Systemctl(ctx, args...); err != nil {
				t.Fatalf("%v: %v\n%s", args, err, out)
			}
		}
		stalled, err := g.KillMain(ctx, "dnsstandby.service", syscall.SIGSTOP)
		if err != nil || stalled == 0 {
			t.Fatalf("SIGSTOP dnsstandby: pid %d, %v", stalled, err)
		}
		// Pods keep their answers: the steering heartbeat stops and the
		// kernel hands everything to LocalDNS.
		answered(t, top, "dnsstandby stopped")
		testkit.Eventually(t, 15*time.Second, "watchdog restart", func() bool {
			pid, err := g.MainPID(ctx, "dnsstandby.service")
			return err == nil && pid != 0 && pid != stalled
		})
		if journal, _ := g.Journal(ctx, "dnsstandby.service"); !strings.Contains(journal, "Watchdog timeout") {
			t.Errorf("journal does not tell the watchdog:\n%s", tail(journal, 20))
		}
		testkit.Eventually(t, 5*time.Second, "active again", func() bool {
			st, err := g.Show(ctx, "dnsstandby.service", "ActiveState")
			return err == nil && st["ActiveState"] == "active"
		})
		answered(t, top, "after the watchdog restart")
	})
}

// TestUnitOutlivesLocalDNS: nothing LocalDNS's unit does stops dnsstandby:
// a stop, and a crash storm that exhausts the shipped unit's start limit
// and leaves it failed. dnsstandby keeps its PID and answers throughout.
func TestUnitOutlivesLocalDNS(t *testing.T) {
	top := testNode(t, "unit-outlive", setupStandbyShipped)
	g, ctx := top.guest, context.Background()
	pid := mainPID(t, top, "dnsstandby.service")
	still := func(when string) {
		t.Helper()
		st, err := g.Show(ctx, "dnsstandby.service", "ActiveState", "MainPID")
		if err != nil || st["ActiveState"] != "active" || st["MainPID"] != fmt.Sprint(pid) {
			t.Fatalf("%s: dnsstandby %v %v, want active with MainPID %d", when, st, err, pid)
		}
		answered(t, top, when)
	}

	if out, err := g.Systemctl(ctx, "stop", "localdns.service"); err != nil {
		t.Fatalf("stop localdns: %v\n%s", err, out)
	}
	still("localdns stopped")
	if out, err := g.Systemctl(ctx, "start", "localdns.service"); err != nil {
		t.Fatalf("start localdns: %v\n%s", err, out)
	}
	still("localdns started again")

	// The crash storm: SIGKILL LocalDNS's main process whenever it is up,
	// until systemd gives up on it.
	testkit.Eventually(t, 20*time.Second, "localdns failed by its start limit", func() bool {
		_, _ = g.KillMain(ctx, "localdns.service", syscall.SIGKILL)
		st, err := g.Show(ctx, "localdns.service", "ActiveState")
		return err == nil && st["ActiveState"] == "failed"
	})
	journal, _ := g.Journal(ctx, "localdns.service")
	if !strings.Contains(journal, "Start request repeated too quickly") {
		t.Errorf("localdns failed, but not by its start limit:\n%s", tail(journal, 20))
	}
	still("localdns failed for good")
}
