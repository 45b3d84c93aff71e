package handover

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// DefaultLockFile is where a dnsstandby says it runs: the unit's runtime
// directory, which the DaemonSet mounts from the node, so that the unit
// and a DaemonSet pod on one node see the same lock.
const DefaultLockFile = "/run/dnsstandby/dnsstandby.lock"

// ErrRunning is returned by Begin when another dnsstandby holds the lock
// (and there is no --handover-from to ask it for a handover).
var ErrRunning = errors.New("another dnsstandby is running on this node")

// instanceLock is the lock one dnsstandby per node holds while it runs.
// A surge handover shares it: the taker holds the giver's open file, so
// the flock stays held across both.
type instanceLock struct {
	f     *os.File
	owned bool        // ours to write our PID in and empty at release
	given atomic.Bool // passed on to a taker: released without emptying
}

// lockInstance takes the lock at path before the daemon changes anything
// on the node: two dnsstandby processes would each attach their steering program
// to LocalDNS's reuseport groups and replace each other's, so a second
// one must stop before its first side effect. The lock is an flock on the
// file, released by the kernel when the process dies however it dies; the
// file holds the PID of the holder, for the error the next one gives.
func lockInstance(path string) (*instanceLock, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder := readPID(f)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w (pid %s holds %s): stop it first; this one changed nothing", ErrRunning, holder, path)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	l := &instanceLock{f: f}
	l.own()
	return l, nil
}

// own makes the lock ours: our PID goes into its file.
func (l *instanceLock) own() {
	l.owned = true
	pid := []byte(strconv.Itoa(os.Getpid()) + "\n")
	if err := l.f.Truncate(0); err == nil {
		_, _ = l.f.WriteAt(pid, 0)
	}
}

// adoptLock checks the lock file f a surge handover passed: it must be
// the file at path (nil f only without a path) and hold the flock, which
// flock on it then confirms without blocking (another open file holding
// it would refuse). It is not ours until the handover is accepted (own).
func adoptLock(f *os.File, path string) (*instanceLock, error) {
	if f == nil {
		return nil, errors.New("the offer holds no instance lock")
	}
	if path == "" {
		f.Close()
		return nil, errors.New("an instance lock offered, but this process runs without --lock-file")
	}
	var got, want unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &got); err != nil {
		f.Close()
		return nil, fmt.Errorf("offered lock: %w", err)
	}
	if err := unix.Stat(path, &want); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if got.Dev != want.Dev || got.Ino != want.Ino {
		f.Close()
		return nil, fmt.Errorf("the offered lock is not %s (another --lock-file?)", path)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("the offered lock does not hold %s: %w", path, err)
	}
	return &instanceLock{f: f}, nil
}

// readPID returns the PID a lock file holds, or "unknown".
func readPID(f *os.File) string {
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	if pid := string(bytes.TrimSpace(b[:n])); pid != "" {
		return pid
	}
	return "unknown"
}

// LockInstance takes the lock a running dnsstandby holds, for commands
// that must not run beside one (`dnsstandby cleanup`); ErrRunning if one
// runs. release drops it.
func LockInstance(path string) (release func() error, err error) {
	l, err := lockInstance(path)
	if err != nil {
		return nil, err
	}
	return l.release, nil
}

// release drops the lock; the file stays, empty, for the next holder. A
// lock given on, or not yet ours, is only closed: its holder goes on.
func (l *instanceLock) release() error {
	if l.owned && !l.given.Load() {
		_ = l.f.Truncate(0)
	}
	return l.f.Close()
}
