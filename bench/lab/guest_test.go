package lab_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dnsstandby/dnsstandby/bench/lab"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// guestTestOrphanEnv makes the test binary boot a guest and wait to be
// killed (see TestGuestReapsDeadRun).
const guestTestOrphanEnv = "DNSSTANDBY_GUEST_TEST_ORPHAN"

// guestTestRequire skips the test without what a guest needs.
func guestTestRequire(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to boot a systemd guest (namespaces, cgroups, mounts): run the tests as root")
	}
	for _, p := range []string{"/lib/systemd/systemd", "/usr/bin/nsenter", "/usr/bin/unshare", "/usr/bin/setpriv"} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("a systemd guest needs %s: %v", p, err)
		}
	}
}

// TestGuestReapsDeadRun boots a guest from a child test binary, kills the
// child with SIGKILL (as a timed-out or interrupted `go test` dies), checks
// that the guest's PID 1 died with it, and that the next BootGuest removes
// what the dead run left: state, cgroup, named network namespace.
func TestGuestReapsDeadRun(t *testing.T) {
	if name := os.Getenv(guestTestOrphanEnv); name != "" {
		guestTestOrphan(name)
		return
	}
	guestTestRequire(t)
	t.Parallel()
	name := fmt.Sprintf("labtest-%d-orphan", os.Getpid())
	cmd := exec.Command(os.Args[0], "-test.run=^TestGuestReapsDeadRun$")
	cmd.Env = append(os.Environ(), guestTestOrphanEnv+"="+name)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	guestTestMust(t, err)
	guestTestMust(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })

	pid := 0
	lines := bufio.NewScanner(out)
	deadline := time.AfterFunc(30*time.Second, func() { cmd.Process.Kill() })
	for pid == 0 && lines.Scan() {
		if rest, ok := strings.CutPrefix(lines.Text(), "guest PID 1: "); ok {
			pid, _ = strconv.Atoi(rest)
		}
	}
	deadline.Stop()
	if pid == 0 {
		t.Fatalf("the child never reported its guest booted: %v", lines.Err())
	}
	// Every boot reaps dead guests (under the lock): hold it, so that no
	// guest booting meanwhile, in this test binary or another, reaps ours
	// before we have seen what it left.
	unlock, err := lab.GuestLock()
	guestTestMust(t, err)
	var once sync.Once
	release := func() { once.Do(unlock) }
	t.Cleanup(release) // also when the test fails below
	guestTestMust(t, cmd.Process.Kill())
	cmd.Wait()

	// PID 1 gets SIGKILL when its owner dies, and the whole guest with it.
	testkit.Eventually(t, 5*time.Second, fmt.Sprintf("guest PID 1 (%d) gone with its owner", pid), func() bool {
		return !guestTestExists(fmt.Sprintf("/proc/%d", pid))
	})
	left := []string{"/run/netns/" + name, "/run/dnsstandby-guest/" + name}
	for _, p := range left {
		if !guestTestExists(p) {
			t.Fatalf("%s is not there: the dead run left nothing to reap?", p)
		}
	}
	release()

	g, err := lab.BootGuest(t.Context(), lab.GuestConfig{Name: name + "2"})
	guestTestMust(t, err)
	defer g.Close()
	for _, p := range left {
		if guestTestExists(p) {
			t.Errorf("%s still there after the next boot", p)
		}
	}
	if out, err := exec.Command("ip", "netns", "list").CombinedOutput(); err != nil || strings.Contains(string(out), name+" ") || strings.Contains(string(out), name+"\n") {
		t.Errorf("ip netns list (%v) still shows %s:\n%s", err, name, out)
	}
	guestTestMust(t, g.Close())
}

// guestTestOrphan is the child of TestGuestReapsDeadRun: it boots a guest,
// says so, and waits to be killed.
func guestTestOrphan(name string) {
	g, err := lab.BootGuest(context.Background(), lab.GuestConfig{Name: name})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("guest PID 1: %d\n", g.PID())
	time.Sleep(time.Minute)
	g.Close()
	os.Exit(1)
}

// TestGuestBootFailure boots a guest whose enabled unit fails: BootGuest
// returns an error that names the unit and shows its journal, and leaves
// nothing behind.
func TestGuestBootFailure(t *testing.T) {
	guestTestRequire(t)
	t.Parallel()
	name := fmt.Sprintf("labtest-%d-broken", os.Getpid())
	g, err := lab.BootGuest(t.Context(), lab.GuestConfig{
		Name: name,
		Units: map[string]string{"broken.service": "[Service]\nType=oneshot\n" +
			"ExecStart=/bin/sh -c 'echo the-broken-unit-says-why; exit 3'\n"},
		Files:  map[string]lab.GuestFile{"/etc/lab-test/hello": {Data: "hi\n"}},
		Enable: []string{"broken.service"},
	})
	if err == nil {
		g.Close()
		t.Fatal("BootGuest succeeded with a failing unit")
	}
	for _, want := range []string{"degraded", "broken.service", "the-broken-unit-says-why"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("boot error lacks %q:\n%v", want, err)
		}
	}
	for _, p := range []string{"/run/netns/" + name, "/run/dnsstandby-guest/" + name} {
		if guestTestExists(p) {
			t.Errorf("%s left behind by a failed boot", p)
		}
	}
}

// TestGuestExec checks the command helpers against a bare guest: files land
// with their modes, Exec runs in the guest's namespaces, Show and MainPID
// read units, KillMain of a unit without a main process is a no-op.
func TestGuestExec(t *testing.T) {
	guestTestRequire(t)
	t.Parallel()
	ctx := t.Context()
	g, err := lab.BootGuest(ctx, lab.GuestConfig{
		Name: fmt.Sprintf("labtest-%d-exec", os.Getpid()),
		Units: map[string]string{"sleeper.service": "[Service]\nExecStart=/usr/local/bin/sleeper\n",
			"nothing.service": "[Service]\nType=oneshot\nExecStart=/bin/true\n"},
		Files: map[string]lab.GuestFile{
			"/usr/local/bin/sleeper": {Data: "#!/bin/sh\nexec sleep 600\n", Mode: 0o755},
		},
		Binds:  map[string]string{"/opt/lab-test/os-release": "/etc/os-release"},
		Enable: []string{"sleeper.service"},
	})
	guestTestMust(t, err)
	defer g.Close()

	if out, err := g.Exec(ctx, "hostname"); err != nil || strings.TrimSpace(out) != g.Name() {
		t.Errorf("hostname in the guest: %q, %v; want %s", out, err, g.Name())
	}
	if out, err := g.Exec(ctx, "stat", "-c", "%a", "/usr/local/bin/sleeper"); err != nil || strings.TrimSpace(out) != "755" {
		t.Errorf("mode of a guest file: %q, %v; want 755", out, err)
	}
	if _, err := g.Exec(ctx, "sh", "-c", "echo x > /opt/lab-test/os-release"); err == nil {
		t.Error("a read-only bind is writable")
	}
	if _, err := os.Stat("/usr/local/bin/sleeper"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a guest file reached the host's disk (%v)", err)
	}
	if out, err := g.Exec(ctx, "sh", "-c", "echo $$"); err != nil || strings.TrimSpace(out) == strconv.Itoa(os.Getpid()) {
		t.Errorf("Exec not in the guest's PID namespace: %q, %v", out, err)
	}
	pid, err := g.MainPID(ctx, "sleeper.service")
	if err != nil || pid <= 1 {
		t.Fatalf("MainPID of a running unit: %d, %v", pid, err)
	}
	if comm, err := g.Exec(ctx, "cat", fmt.Sprintf("/proc/%d/comm", pid)); err != nil || strings.TrimSpace(comm) != "sleep" {
		t.Errorf("MainPID %d is %q (%v) in the guest, want sleep", pid, comm, err)
	}
	if killed, err := g.KillMain(ctx, "nothing.service", syscall.SIGKILL); err != nil || killed != 0 {
		t.Errorf("KillMain of a unit with no main process: %d, %v", killed, err)
	}
	killed, err := g.KillMain(ctx, "sleeper.service", syscall.SIGTERM)
	if err != nil || killed != pid {
		t.Errorf("KillMain: %d, %v; want %d", killed, err, pid)
	}
	var st map[string]string
	testkit.Eventually(t, 10*time.Second, "sleeper.service no longer active", func() bool {
		st, err = g.Show(ctx, "sleeper.service", "ActiveState", "MainPID")
		return err != nil || st["ActiveState"] != "active"
	})
	if err != nil || st["ActiveState"] != "inactive" || st["MainPID"] != "0" {
		t.Errorf("after SIGTERM: %v, %v; want inactive, MainPID 0", st, err)
	}
	if _, err := g.Show(ctx, "sleeper.service", "NoSuchProperty"); err == nil {
		t.Error("Show of a property systemd does not have succeeded")
	}
	guestTestMust(t, g.Close())
	if _, err := g.Exec(ctx, "true"); err == nil {
		t.Error("Exec after Close succeeded")
	}
}

func guestTestExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func guestTestMust(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
