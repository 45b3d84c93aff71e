package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// DefaultLockFile is where a dnsstandby says it runs: the unit's runtime
// directory, which the DaemonSet mounts from the node, so that the unit
// and a DaemonSet pod on one node see the same lock.
const DefaultLockFile = "/run/dnsstandby/dnsstandby.lock"

// ErrRunning is returned by Run when another dnsstandby holds the lock.
var ErrRunning = errors.New("another dnsstandby is running on this node")

// instanceLock is the lock one dnsstandby per node holds while it runs.
type instanceLock struct{ f *os.File }

// lockInstance takes the lock at path before Run changes anything on the
// node: two dnsstandby processes would each attach their steering program
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
	pid := []byte(strconv.Itoa(os.Getpid()) + "\n")
	if err := f.Truncate(0); err == nil {
		_, err = f.WriteAt(pid, 0)
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

// release drops the lock; the file stays, empty, for the next holder.
func (l *instanceLock) release() error {
	_ = l.f.Truncate(0)
	return l.f.Close()
}
