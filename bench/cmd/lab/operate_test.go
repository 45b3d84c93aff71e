package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dnsstandby/dnsstandby/bench/lab"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// TestUnitJournalAndReload runs, under the lab's systemd, what an operator
// of the unit does with it: `journalctl -p warning` finds dnsstandby's
// warnings and none of its info lines; `systemctl reload` applies a
// rewritten Corefile at once, with the process kept.
func TestUnitJournalAndReload(t *testing.T) {
	top := testNode(t, "unit-operate", setupStandby)
	g, ctx := top.guest, context.Background()
	const unit = "dnsstandby.service"
	journal := func(args ...string) string {
		t.Helper()
		out, err := g.Exec(ctx, "journalctl", append([]string{"-b", "-q", "--no-pager", "-o", "cat", "-u", unit}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}

	t.Run("journalctl -p warning", func(t *testing.T) {
		// A WARN: LocalDNS stopped. INFO lines: the start's.
		if out, err := g.Systemctl(ctx, "stop", "localdns.service"); err != nil {
			t.Fatalf("stop localdns: %v\n%s", err, out)
		}
		testkit.Eventually(t, 10*time.Second, "the warning in the journal", func() bool {
			return strings.Contains(journal(), "LocalDNS is not bound")
		})
		all, warnings := journal(), journal("-p", "warning")
		if !strings.Contains(all, `"msg":"dnsstandby ready"`) {
			t.Fatalf("no info line to filter out:\n%s", tail(all, 20))
		}
		if !strings.Contains(warnings, `"msg":"LocalDNS is not bound"`) || strings.Contains(warnings, `"level":"INFO"`) {
			t.Errorf("journalctl -p warning -u %s: want the warning and no INFO line:\n%s", unit, tail(warnings, 20))
		}
		for line := range strings.Lines(all) {
			if strings.HasPrefix(line, "<") {
				t.Errorf("journald kept the priority prefix: %q", line)
				break
			}
		}
		if out, err := g.Systemctl(ctx, "start", "localdns.service"); err != nil {
			t.Fatalf("start localdns: %v\n%s", err, out)
		}
	})

	t.Run("systemctl reload", func(t *testing.T) {
		// The periodic check off, so that only the reload can apply the
		// change.
		const dropIn = "/run/systemd/system/dnsstandby.service.d/no-check.conf"
		if out, err := g.Exec(ctx, "sh", "-c", "mkdir -p /run/systemd/system/dnsstandby.service.d && printf '[Service]\\nEnvironment=DNSSTANDBY_COREFILE_CHECK_INTERVAL=0\\n' >"+dropIn); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		for _, args := range [][]string{{"daemon-reload"}, {"restart", unit}} {
			if out, err := g.Systemctl(ctx, args...); err != nil {
				t.Fatalf("%v: %v\n%s", args, err, out)
			}
		}
		pid := mainPID(t, top, unit)
		inForce := func() string {
			t.Helper()
			out, err := g.Exec(ctx, standbyPath, "status", "--json")
			if err != nil {
				t.Fatal(err)
			}
			var st struct {
				Config struct {
					Source struct {
						SHA256 string `json:"sha256"`
					} `json:"source"`
				} `json:"config"`
			}
			if err := json.Unmarshal([]byte(out), &st); err != nil {
				t.Fatalf("status: %v\n%s", err, out)
			}
			return st.Config.Source.SHA256
		}
		before := inForce()
		out, err := g.Exec(ctx, "sh", "-c", fmt.Sprintf("echo '# rewritten by the lab' >>%s && sha256sum %s", lab.LocalDNSCorefilePath, lab.LocalDNSCorefilePath))
		if err != nil {
			t.Fatal(err)
		}
		rewritten, _, _ := strings.Cut(out, " ")
		time.Sleep(500 * time.Millisecond)
		if now := inForce(); now != before || now == rewritten {
			t.Fatalf("applied without a reload (sha256 %.12s, was %.12s): is the periodic check off?", now, before)
		}
		asked := time.Now()
		if out, err := g.Systemctl(ctx, "reload", unit); err != nil {
			t.Fatalf("reload: %v\n%s", err, out)
		}
		testkit.Eventually(t, 2*time.Second, "the rewritten Corefile in force", func() bool { return inForce() == rewritten })
		t.Logf("in force %s after systemctl reload", time.Since(asked).Round(time.Millisecond))
		testkit.Eventually(t, 2*time.Second, "active after the reload", func() bool {
			st, err := g.Show(ctx, unit, "ActiveState")
			return err == nil && st["ActiveState"] == "active"
		})
		if now := mainPID(t, top, unit); now != pid {
			t.Errorf("MainPID %d after the reload, was %d", now, pid)
		}
		if j := journal(); !strings.Contains(j, `"msg":"Corefile reloaded","component":"daemon","trigger":"reload"`) {
			t.Errorf("journal does not log the reload:\n%s", tail(j, 20))
		}
		answered(t, top, "after the reload")
	})
}
