package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/dnsstandby/dnsstandby/bench/lab"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

// TestRunningBuild: the status must come from the unit's main process and
// say the build wanted.
func TestRunningBuild(t *testing.T) {
	const next = "dnsstandby v0.0.0-lab-upgrade, go1.26.8"
	tests := []struct {
		name    string
		version string
		pid     int
		mainPID int
		wantErr string
	}{
		{"the new build", next, 42, 42, ""},
		{"the old build still runs", "dnsstandby (devel), go1.26.8", 42, 42, `says "dnsstandby (devel), go1.26.8"`},
		{"a status without a version (an older build)", "", 42, 42, `says ""`},
		{"another process answers", next, 41, 42, "main PID is 42"},
		{"a status without a PID", next, 0, 0, "from PID 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := runningBuild(tc.version, tc.pid, tc.mainPID, next)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("error %v, want none", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("error %v, want one with %q", err, tc.wantErr)
			}
		})
	}
}

// TestInstallScript runs the upgrade's install on plain files, umount
// stubbed: the path gets the new build by a rename, the file the old
// process runs keeps its inode and content, and nothing is left beside.
func TestInstallScript(t *testing.T) {
	dir := t.TempDir()
	stubs := filepath.Join(dir, "stubs")
	if err := os.Mkdir(stubs, 0o755); err != nil {
		t.Fatal(err)
	}
	// The lab's bind is detached before the rename; here there is none.
	umountLog := filepath.Join(dir, "umount.log")
	if err := os.WriteFile(filepath.Join(stubs, "umount"), []byte("#!/bin/sh\necho \"$@\" >>"+umountLog+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	next, path := filepath.Join(dir, "next"), filepath.Join(dir, "bin", "dnsstandby")
	if err := os.WriteFile(next, []byte("new build"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("old build"), 0o755); err != nil {
		t.Fatal(err)
	}
	// What the running process holds: the old file, open.
	running, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer running.Close()
	oldInode := inode(t, path)

	cmd := exec.Command("sh", "-c", installScript, "sh", next, path)
	cmd.Env = []string{"PATH=" + stubs + ":" + os.Getenv("PATH")}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("install: %v\n%s", err, out)
	}

	if got, _ := os.ReadFile(path); string(got) != "new build" {
		t.Errorf("%s holds %q, want the new build", path, got)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("%s: %v, %v: want mode 0755", path, st, err)
	}
	if inode(t, path) == oldInode {
		t.Errorf("%s kept inode %d: written in place, not renamed over", path, oldInode)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(running.Fd()), &st); err != nil || st.Ino != oldInode {
		t.Errorf("the running file: inode %d, %v, want %d", st.Ino, err, oldInode)
	}
	buf := make([]byte, 16)
	if n, _ := running.ReadAt(buf, 0); string(buf[:n]) != "old build" {
		t.Errorf("the running file now holds %q, want the old build", buf[:n])
	}
	if _, err := os.Stat(path + ".dpkg-new"); !os.IsNotExist(err) {
		t.Errorf("%s.dpkg-new left behind: %v", path, err)
	}
	if log, _ := os.ReadFile(umountLog); strings.TrimSpace(string(log)) != "-l "+path {
		t.Errorf("umount ran with %q, want a lazy detach of %s", log, path)
	}
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestUpgradeReplacesExecStart: the file standby-upgrade replaces is the
// one the unit runs.
func TestUpgradeReplacesExecStart(t *testing.T) {
	for _, l := range strings.Split(lab.DnsstandbyUnit(), "\n") {
		if exe, ok := strings.CutPrefix(l, "ExecStart="); ok {
			if f := strings.Fields(exe); len(f) == 0 || f[0] != standbyPath {
				t.Errorf("the unit runs %q, the upgrade replaces %s", exe, standbyPath)
			}
			return
		}
	}
	t.Error("the unit has no ExecStart")
}

// TestUnitUpgrade runs standby-upgrade's upgrade on one node while
// LocalDNS is healthy: the next build installed as dpkg does leaves the
// old process running its build; `systemctl restart` starts the next
// build, which takes the sockets from the fd store and answers.
func TestUnitUpgrade(t *testing.T) {
	bins := testBinaries(t) // skips without root
	bins.next = filepath.Join(t.TempDir(), "dnsstandby-next")
	root, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-buildvcs=false", "-ldflags",
		"-X github.com/dnsstandby/dnsstandby/internal/buildinfo.linkedVersion=v0.0.0-test-upgrade", "-o", bins.next, "./cmd/dnsstandby")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the next dnsstandby: %v\n%s", err, out)
	}
	ctx := context.Background()
	if err := bins.readNext(ctx); err != nil {
		t.Fatal(err)
	}
	zones := nstest.KubeDNSZones(nstest.ZoneOptions{Services: 20})
	top, err := buildTopology(ctx, "unit-upgrade", setupStandby, bins, zones, nodeSpec{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := top.close(); err != nil {
			t.Errorf("tear down: %v", err)
		}
	})

	if err := top.runsBuild(ctx, bins.version); err != nil {
		t.Fatalf("before: %v", err)
	}
	old := mainPID(t, top, "dnsstandby.service")
	if err := top.installNext(ctx); err != nil {
		t.Fatal(err)
	}
	if err := top.runsBuild(ctx, bins.version); err != nil {
		t.Errorf("installed, not restarted: %v", err)
	}
	if err := top.upgraded(ctx); err == nil {
		t.Error("installed, not restarted: the check says upgraded")
	}
	answered(t, top, "installed, not restarted")
	if out, err := top.guest.Systemctl(ctx, "restart", "dnsstandby.service"); err != nil {
		t.Fatalf("restart: %v: %s", err, out)
	}
	if err := top.upgraded(ctx); err != nil {
		t.Error(err)
	}
	if now := mainPID(t, top, "dnsstandby.service"); now == old || now == 0 {
		t.Errorf("main PID %d after the restart, was %d", now, old)
	}
	answered(t, top, "upgraded")
	journal, err := top.guest.Journal(ctx, "dnsstandby.service")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(journal, "handover: took") {
		t.Errorf("the next build did not take the stored sockets; journal:\n%s", tail(journal, 30))
	}
}
