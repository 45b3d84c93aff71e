package nstest_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

// TestAttach names the network namespace of a process that made its own
// (as a systemd booted in namespaces does), works in it through the name,
// keeps it past the process's death, and checks that Close and Detach leave
// nothing behind.
func TestAttach(t *testing.T) {
	nstest.RequireRoot(t)

	// A process in a network namespace of its own, named by nobody.
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	must(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	pid := cmd.Process.Pid
	var procNS syscall.Stat_t
	must(t, syscall.Stat(filepath.Join("/proc", strconv.Itoa(pid), "ns/net"), &procNS))

	name := nstest.UniqueName("attached")
	ns, err := nstest.Attach(name, pid)
	must(t, err)
	t.Cleanup(func() { ns.Close() })
	if inode := nsInode(t, ns); inode != procNS.Ino {
		t.Fatalf("%s names namespace %d, want the process's %d", ns.Path(), inode, procNS.Ino)
	}
	if _, err := nstest.Attach(name, pid); err == nil {
		t.Error("attaching a name twice succeeded")
	}
	if _, err := nstest.Attach(nstest.UniqueName("gone"), 1<<22+1); err == nil {
		t.Error("attaching a pid that does not exist succeeded")
	}

	// Attach leaves the namespace as it found it: loopback is still down.
	if out := nstest.Run(t, ns, "ip", "-o", "link", "show", "lo"); strings.Contains(out, ",UP") {
		t.Errorf("Attach set loopback up: %s", out)
	}
	must(t, ns.AddLink("anchor", "", "169.254.10.11/32"))
	// The process sees the link: it is its namespace.
	out, err := exec.Command("nsenter", "-t", strconv.Itoa(pid), "-n", "ip", "-o", "addr", "show", "anchor").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "169.254.10.11/32") {
		t.Errorf("the process does not see the link added through the name: %v\n%s", err, out)
	}

	// The name keeps the namespace after the process is gone.
	must(t, cmd.Process.Kill())
	cmd.Wait()
	if out := nstest.Run(t, ns, "ip", "-o", "addr", "show", "anchor"); !strings.Contains(out, "169.254.10.11/32") {
		t.Errorf("namespace lost its link when the process died: %s", out)
	}
	inode := nsInode(t, ns)
	must(t, ns.Close())
	checkGone(t, []string{name}, []string{"anchor"}, []uint64{inode}, pid)

	// Detach removes a name whose Namespace value is lost (its process died).
	lost := exec.Command("sleep", "60")
	lost.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	must(t, lost.Start())
	defer func() { lost.Process.Kill(); lost.Wait() }()
	lostName := nstest.UniqueName("lost")
	lostNS, err := nstest.Attach(lostName, lost.Process.Pid)
	must(t, err)
	// Detach as a later run would, for a name whose owner died; the
	// Namespace value is closed afterwards only to release its descriptors.
	t.Cleanup(func() { lostNS.Close() })
	must(t, nstest.Detach(lostName))
	if _, err := os.Stat(filepath.Join("/run/netns", lostName)); !os.IsNotExist(err) {
		t.Errorf("Detach left /run/netns/%s (%v)", lostName, err)
	}
	out, err = exec.Command("ip", "netns", "list").CombinedOutput()
	must(t, err)
	if strings.Contains(string(out), lostName) {
		t.Errorf("ip netns list still shows %s after Detach:\n%s", lostName, out)
	}
	must(t, nstest.Detach(lostName)) // gone already: no error
}
