package peer_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/takeover/peer"
)

// fallbackCgroup makes a cgroup whose last element is AKS's fallback unit
// (AgentBaker's localdns-fallback.service), under a test directory of a
// hierarchy systemd names units in: the unified one, or name=systemd on a
// hybrid host. It returns the file that moves a process into it; the
// test skips where neither is writable.
func fallbackCgroup(t *testing.T) string {
	t.Helper()
	var root string
	for _, dir := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd", "/sys/fs/cgroup"} {
		var st syscall.Statfs_t
		if syscall.Statfs(dir, &st) != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, "cgroup.procs")); err == nil {
			root = dir
			break
		}
	}
	if root == "" {
		t.Skip("no cgroup hierarchy to make a unit's cgroup in")
	}
	top := filepath.Join(root, fmt.Sprintf("dnsstandby-test-%d", os.Getpid()))
	dir := filepath.Join(top, peer.DefaultFallbackUnit)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Skipf("cgroup %s not writable: %v", dir, err)
	}
	t.Cleanup(func() {
		// Empty once its process is gone; the kernel refuses rmdir before.
		for range 50 {
			if os.Remove(dir) == nil || os.IsNotExist(os.Remove(dir)) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		os.Remove(top)
	})
	return filepath.Join(dir, "cgroup.procs")
}

// startFallback starts AKS's fallback CoreDNS as systemd would run
// localdns-fallback.service: LocalDNS's own binary, same UID, in the
// unit's cgroup from its first instruction (a shell moves itself in, then
// execs CoreDNS).
func startFallback(t *testing.T, ns *nstest.Namespace, procs string) *nstest.CoreDNS {
	t.Helper()
	// `ip netns exec` mounts a /sys of its own, without the cgroup made
	// here: the shell writes through our descriptor of the file instead.
	f, err := os.OpenFile(procs, os.O_WRONLY, 0)
	must(t, err)
	t.Cleanup(func() { f.Close() })
	via := fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), f.Fd())
	wrapper := filepath.Join(t.TempDir(), "coredns-in-unit")
	script := fmt.Sprintf("#!/bin/sh\necho $$ > %s || exit 1\nexec %s \"$@\"\n", via, nstest.CoreDNSBinary(t))
	must(t, os.WriteFile(wrapper, []byte(script), 0o755))
	return nstest.StartCoreDNS(t, ns, nstest.CoreDNSConfig{Binary: wrapper, Corefile: corefile, Probe: nodeListener + ":53"})
}

// TestWatcherFallback: AKS's fallback CoreDNS joining the reuseport group
// on the listen address while LocalDNS is down is reported as the
// fallback, never as LocalDNS back (which would start a hold-down and,
// passed, hand it the traffic); its exit is seen at once; LocalDNS's
// return is LocalDNS's. With FallbackUnit "" (what the Watcher did before
// it knew of the fallback) the same CoreDNS is taken for LocalDNS.
func TestWatcherFallback(t *testing.T) {
	e := newEnv(t)
	procs := fallbackCgroup(t)
	// LocalDNS fails for good.
	must(t, e.coredns.Signal(syscall.SIGKILL))
	<-e.coredns.Done()

	cfg := watcherConfig(t, listen)
	cfg.Exclude = e.exclude
	w := startWatcher(t, e.ns, cfg)
	stateWait(t, w, time.Second, "LocalDNS gone", notBound)
	blind := cfg
	blind.FallbackUnit = ""
	old := startWatcher(t, e.ns, blind)
	stateWait(t, old, time.Second, "LocalDNS gone", notBound)

	fb := startFallback(t, e.ns, procs)
	pid := fb.Pid()
	s, _ := stateWait(t, w, 2*time.Second, "the fallback bound", func(s peer.State) bool { return len(s.Fallback) == 2 })
	if s.Bound || len(s.Sockets) != 0 || len(s.PIDs) != 0 || !slices.Equal(s.FallbackPIDs, []int{pid}) {
		t.Errorf("state %+v: want the fallback's two sockets (pid %d) apart, LocalDNS not bound", s, pid)
	}
	for _, sock := range s.Fallback {
		if sock.Unit != peer.DefaultFallbackUnit || sock.Comm != "coredns" || !strings.Contains(sock.String(), "in "+peer.DefaultFallbackUnit) {
			t.Errorf("fallback socket %v: want coredns in %s", sock, peer.DefaultFallbackUnit)
		}
	}
	stateWait(t, old, 2*time.Second, "without FallbackUnit, the fallback taken for LocalDNS", boundBy(pid))

	// Hand-back: localdns.service's ExecStartPre stops the fallback.
	stopped := time.Now()
	must(t, fb.Signal(syscall.SIGKILL))
	_, at := stateWait(t, w, time.Second, "the fallback gone", func(s peer.State) bool { return len(s.Fallback) == 0 && len(s.FallbackPIDs) == 0 })
	t.Logf("fallback gone %v after SIGKILL", at.Sub(stopped))
	if at.Sub(stopped) > exitBound {
		t.Errorf("fallback's exit seen after %v, want under %v (pidfd)", at.Sub(stopped), exitBound)
	}
	<-fb.Done()

	// Then LocalDNS starts: LocalDNS's, not the fallback's.
	again := startCoreDNS(t, e.ns)
	s, _ = stateWait(t, w, 2*time.Second, "LocalDNS bound again", boundBy(again.Pid()))
	if len(s.Fallback) != 0 || s.Sockets[0].Unit == peer.DefaultFallbackUnit {
		t.Errorf("state %+v: LocalDNS taken for the fallback", s)
	}
}
