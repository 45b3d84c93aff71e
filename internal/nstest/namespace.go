// Package nstest builds network fixtures out of real kernel network
// namespaces for integration tests and the lab: named namespaces, links
// (veth pairs, address anchors), routes, processes and Go code run inside a
// namespace, a CoreDNS started from a Corefile, and the zones of a
// kube-dns-like CoreDNS with the answers they must give.
//
// It owns everything it creates and removes it again: functions that take a
// testing.TB register their cleanup with t.Cleanup and fail the test on
// error; the others return errors and a cleanup (Close) for the lab, which
// runs outside `go test`.
//
// Namespaces are named like `ip netns add` names them (a bind mount under
// /run/netns), so `ip netns exec NAME ...` works on them and glibc clients
// started that way read /etc/netns/NAME/resolv.conf.
package nstest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

const (
	// netnsDir is where `ip netns` keeps its names; netns bind mounts live
	// here and nowhere else, or `ip netns exec NAME` would not find them.
	netnsDir = "/run/netns"
	// etcNetnsDir holds per-namespace files that `ip netns exec` bind-mounts
	// over /etc (resolv.conf for glibc clients).
	etcNetnsDir = "/etc/netns"
	// namePrefix starts every namespace name UniqueName makes; the pid after
	// it keeps parallel test binaries apart and lets a later run find the
	// namespaces of a run that died without cleaning up.
	namePrefix = "nstest-"
)

// Namespace is a named network namespace. Its methods may be called from any
// goroutine; they never change the calling thread's namespace.
type Namespace struct {
	name string
	fd   int             // open handle on the namespace; good until Close
	nl   *netlink.Handle // netlink sockets opened inside the namespace

	closeOnce sync.Once
	closeErr  error

	mu     sync.Mutex            // guards following
	procs  map[*Process]struct{} // started here and not yet reaped
	etcDir bool                  // we created etcNetnsDir/name
	closed bool
}

// Name is the namespace's name, as `ip netns list` shows it.
func (n *Namespace) Name() string { return n.name }

// Path is the namespace's bind mount, usable with setns(2) or nsenter.
func (n *Namespace) Path() string { return filepath.Join(netnsDir, n.name) }

func (n *Namespace) String() string { return n.name }

var (
	nameSeq   atomic.Uint64
	reapOnce  sync.Once
	roleRegex = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)
)

// UniqueName returns a namespace name unique to this process and call:
// "nstest-PID-SEQ-role". The role is what a reader of `ip netns list` sees.
func UniqueName(role string) string {
	return fmt.Sprintf("%s%d-%d-%s", namePrefix, os.Getpid(), nameSeq.Add(1), role)
}

// New creates a namespace named UniqueName(role) with loopback up, and
// removes it (after stopping every process started in it) when the test
// ends. Call RequireRoot first.
func New(t testing.TB, role string) *Namespace {
	t.Helper()
	if !roleRegex.MatchString(role) {
		t.Fatalf("nstest.New: role %q: want letters, digits, '_', '.', '-'", role)
	}
	reapOnce.Do(func() {
		if err := ReapStale(); err != nil {
			t.Logf("nstest: removing namespaces left by dead test runs: %v", err)
		}
	})
	ns, cleanup, err := Create(UniqueName(role))
	if err != nil {
		t.Fatalf("nstest.New(%q): %v", role, err)
	}
	t.Cleanup(func() {
		if err := cleanup(); err != nil {
			t.Errorf("remove namespace %s: %v", ns.name, err)
		}
	})
	return ns
}

// Create makes a named network namespace with loopback up. The returned
// cleanup is ns.Close: it stops the processes started in the namespace and
// removes it. Use it outside tests; tests use New.
func Create(name string) (ns *Namespace, cleanup func() error, err error) {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return nil, nil, fmt.Errorf("create namespace: invalid name %q", name)
	}
	if err := prepareNetnsDir(); err != nil {
		return nil, nil, fmt.Errorf("create namespace %s: %w", name, err)
	}
	path := filepath.Join(netnsDir, name)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return nil, nil, fmt.Errorf("create namespace %s: %w", name, err)
	}
	f.Close()
	n := &Namespace{name: name, fd: -1, procs: map[*Process]struct{}{}}
	fail := func(err error) (*Namespace, func() error, error) {
		return nil, nil, errors.Join(fmt.Errorf("create namespace %s: %w", name, err), n.Close())
	}
	// unshare(CLONE_NEWNET) moves only the calling thread; the new namespace
	// lives on through the bind mount once the thread has left it.
	err = onThread(func() error { return unix.Unshare(unix.CLONE_NEWNET) }, func() error {
		self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(self, path, "none", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind-mount %s on %s: %w", self, path, err)
		}
		return nil
	})
	if err != nil {
		return fail(err)
	}
	if n.fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
		return fail(fmt.Errorf("open %s: %w", path, err))
	}
	// Netlink sockets opened inside the namespace act on it from any thread.
	err = onThread(func() error { return unix.Setns(n.fd, unix.CLONE_NEWNET) }, func() error {
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		n.nl = h
		return err
	})
	if err != nil {
		return fail(fmt.Errorf("open netlink socket: %w", err))
	}
	if err := n.setUp("lo"); err != nil {
		return fail(err)
	}
	return n, n.Close, nil
}

// Close stops every process started in the namespace that is still running
// and removes the namespace and its /etc/netns directory. The kernel frees
// the namespace, and the links in it, once nothing holds it any more (a
// socket opened in Do does). Close is safe to call more than once, but not
// while another method of n is running.
func (n *Namespace) Close() error {
	n.closeOnce.Do(func() {
		n.mu.Lock()
		n.closed = true
		procs := make([]*Process, 0, len(n.procs))
		for p := range n.procs {
			procs = append(procs, p)
		}
		etcDir := n.etcDir
		n.mu.Unlock()

		var errs []error
		for _, p := range procs {
			if err := p.Stop(); err != nil {
				errs = append(errs, err)
			}
		}
		if n.nl != nil {
			n.nl.Close()
		}
		if n.fd >= 0 {
			unix.Close(n.fd)
		}
		if err := removeNamed(n.name); err != nil {
			errs = append(errs, err)
		}
		if etcDir {
			if err := os.RemoveAll(filepath.Join(etcNetnsDir, n.name)); err != nil {
				errs = append(errs, err)
			}
		}
		n.closeErr = errors.Join(errs...)
	})
	return n.closeErr
}

// removeNamed undoes the bind mount and removes the name, like `ip netns
// delete`. A name whose mount is already gone is removed all the same.
func removeNamed(name string) error {
	path := filepath.Join(netnsDir, name)
	err := unix.Unmount(path, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}

// prepareNetnsDir makes /run/netns a shared mount point, as `ip netns add`
// does. Without that, a process started earlier by `ip netns exec` (which
// runs in a mount namespace of its own) keeps a private copy of every
// namespace mount it saw, and so keeps those namespaces alive after they
// were deleted. A lock keeps parallel test binaries from stacking two bind
// mounts on the directory.
func prepareNetnsDir() error {
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		return err
	}
	dir, err := os.Open(netnsDir)
	if err != nil {
		return err
	}
	defer dir.Close()
	if err := unix.Flock(int(dir.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", netnsDir, err)
	}
	defer unix.Flock(int(dir.Fd()), unix.LOCK_UN)
	err = unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) { // not a mount point yet
		if err := unix.Mount(netnsDir, netnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind-mount %s on itself: %w", netnsDir, err)
		}
		err = unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	}
	if err != nil {
		return fmt.Errorf("make %s a shared mount: %w", netnsDir, err)
	}
	return nil
}

// Do runs fn on an OS thread that has joined the namespace, and returns its
// error. Sockets fn opens stay in the namespace after Do returns and may be
// used from any goroutine. Goroutines fn starts do not run in the namespace,
// and fn must not call t.FailNow (it runs on a goroutine of its own); a
// panic in fn is re-raised in the caller.
func (n *Namespace) Do(fn func() error) error {
	if err := n.usable(); err != nil {
		return err
	}
	err := onThread(func() error { return unix.Setns(n.fd, unix.CLONE_NEWNET) }, fn)
	if err != nil {
		return fmt.Errorf("in namespace %s: %w", n.name, err)
	}
	return nil
}

func (n *Namespace) usable() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return fmt.Errorf("namespace %s is closed", n.name)
	}
	return nil
}

// errGoexit reports an fn that ended its goroutine instead of returning.
var errGoexit = errors.New("function called runtime.Goexit (t.FailNow?) instead of returning")

// onThread runs enter and then fn on a fresh goroutine locked to its OS
// thread, then moves the thread back to the network namespace it started in.
// If it cannot move back, the goroutine exits still locked, and the Go
// runtime ends the thread with it: no other goroutine can ever run on a
// thread stranded in the wrong namespace.
func onThread(enter, fn func() error) error {
	type result struct {
		err      error
		panicked any
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		origin, err := unix.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{err: fmt.Errorf("open own namespace: %w", err)}
			return
		}
		defer unix.Close(origin)
		if err := enter(); err != nil {
			if rerr := unix.Setns(origin, unix.CLONE_NEWNET); rerr != nil {
				done <- result{err: errors.Join(fmt.Errorf("enter namespace: %w", err), fmt.Errorf("return to own namespace: %w", rerr))}
				return
			}
			runtime.UnlockOSThread()
			done <- result{err: fmt.Errorf("enter namespace: %w", err)}
			return
		}
		res := result{err: errGoexit}
		defer func() {
			if r := recover(); r != nil {
				res = result{panicked: r}
			}
			if err := unix.Setns(origin, unix.CLONE_NEWNET); err != nil {
				res.err = errors.Join(res.err, fmt.Errorf("return to own namespace (thread discarded): %w", err))
				done <- res
				return
			}
			runtime.UnlockOSThread()
			done <- res
		}()
		res.err = fn()
	}()
	res := <-done
	if res.panicked != nil {
		panic(res.panicked)
	}
	return res.err
}

// ReapStale removes namespaces named by UniqueName in a process that is no
// longer running: a test binary that was killed never ran its cleanups. The
// processes it started in them died with it (they get SIGKILL when their
// parent dies).
func ReapStale() error {
	entries, err := os.ReadDir(netnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), namePrefix)
		if !ok {
			continue
		}
		pidText, _, ok := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if !ok || err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := unix.Kill(pid, 0); !errors.Is(err, unix.ESRCH) {
			continue // alive (or not ours to judge)
		}
		if err := removeNamed(e.Name()); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := os.RemoveAll(filepath.Join(etcNetnsDir, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

var (
	probeOnce sync.Once
	probeErr  error
)

// RequireRoot skips the test unless it runs as root on a kernel that lets it
// create a named network namespace (checked once per process).
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces: run the tests as root (CI does; locally `sudo -E make test`)")
	}
	probeOnce.Do(func() {
		_, cleanup, err := Create(UniqueName("probe"))
		if err != nil {
			probeErr = err
			return
		}
		probeErr = cleanup()
	})
	if probeErr != nil {
		t.Skipf("network namespaces unavailable here: %v", probeErr)
	}
}

// SetResolvConf writes /etc/netns/NAME/resolv.conf, which `ip netns exec`
// shows the command as /etc/resolv.conf (glibc's resolver and dig read it).
// Close removes it.
func (n *Namespace) SetResolvConf(text string) error {
	if err := n.usable(); err != nil {
		return err
	}
	dir := filepath.Join(etcNetnsDir, n.name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("resolv.conf for %s: %w", n.name, err)
	}
	n.mu.Lock()
	n.etcDir = true
	n.mu.Unlock()
	if err := os.WriteFile(filepath.Join(dir, "resolv.conf"), []byte(text), 0o644); err != nil {
		return fmt.Errorf("resolv.conf for %s: %w", n.name, err)
	}
	return nil
}
