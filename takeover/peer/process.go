package peer

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Process is a peer process (LocalDNS's CoreDNS) held by a pidfd. Unlike a
// PID, a pidfd always names the process it was opened on: if that process
// exits and its PID is reused, the pidfd still refers to the dead one.
type Process struct {
	pid  int
	root string   // /proc, or a test tree
	file *os.File // the pidfd, in the runtime poller; good until Close

	exited chan struct{}   // closed when the process exits
	done   chan struct{}   // closed when the wait goroutine returns
	kick   chan<- struct{} // or nil; gets a token (never blocking) on exit

	closeOnce sync.Once
	closeErr  error
}

// OpenProcess opens a pidfd on process pid (pidfd_open, Linux 5.3) and
// starts watching for its exit. The process must be visible in our PID
// namespace. Close releases it.
//
// A PID read from /proc may have been reused by the time it is opened;
// check that the process holds the socket you found (HoldsSocket) after
// opening it.
func OpenProcess(pid int) (*Process, error) {
	return openProcess(procRoot, pid, nil)
}

func openProcess(root string, pid int, kick chan<- struct{}) (*Process, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("open process %d: invalid pid", pid)
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if errors.Is(err, unix.ENOSYS) {
			err = fmt.Errorf("%w (pidfd_open needs Linux 5.3)", err)
		}
		return nil, fmt.Errorf("open process %d: pidfd_open: %w", pid, err)
	}
	// A non-blocking fd goes into the runtime's poller (os.NewFile checks),
	// so waiting for the exit parks a goroutine rather than a thread, and
	// Close wakes it. A pidfd polls readable once the process has exited.
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("open process %d: set pidfd non-blocking: %w", pid, err)
	}
	p := &Process{
		pid:    pid,
		root:   root,
		file:   os.NewFile(uintptr(fd), fmt.Sprintf("pidfd:%d", pid)),
		exited: make(chan struct{}),
		done:   make(chan struct{}),
		kick:   kick,
	}
	rc, err := p.file.SyscallConn()
	if err != nil {
		p.file.Close()
		return nil, fmt.Errorf("open process %d: %w", pid, err)
	}
	go p.wait(rc)
	return p, nil
}

// wait closes p.exited when the process exits, and returns early when
// Close closes the pidfd.
func (p *Process) wait(rc syscall.RawConn) {
	defer close(p.done)
	err := rc.Read(func(fd uintptr) bool {
		// The poller may wake us spuriously; ask the pidfd itself.
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			n, err := unix.Poll(pfd, 0)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return err != nil || n > 0
		}
	})
	if err != nil {
		return // closed by Close
	}
	close(p.exited)
	if p.kick != nil {
		select {
		case p.kick <- struct{}{}:
		default: // a token is already pending
		}
	}
}

// PID is the process's id.
func (p *Process) PID() int { return p.pid }

// Exited is closed the moment the process exits (all its threads: by then
// the kernel has closed its sockets). It is never closed if Close comes
// first.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// HoldsSocket reports whether the process holds a file descriptor for the
// socket inode. After OpenProcess on a PID read from /proc, a true answer
// proves the pidfd is on the process that holds the socket, not on one
// that reused its PID.
func (p *Process) HoldsSocket(inode uint64) bool {
	_, err := findFD(p.root, p.pid, inode)
	return err == nil
}

// DupSocket duplicates the process's file descriptor for the socket inode
// into ours (pidfd_getfd, Linux 5.6) and returns it, close-on-exec. The
// caller closes it: an adopted socket must not be kept open, or it stays
// in the reuseport group after LocalDNS has closed its own descriptor.
//
// It finds the descriptor's number in /proc/PID/fd and checks with fstat
// that the duplicate is that socket (the number may have been reused in
// between). pidfd_getfd needs ptrace rights over the process
// (PTRACE_MODE_ATTACH): CAP_SYS_PTRACE, or the same UID where Yama's
// kernel.yama.ptrace_scope allows it.
func (p *Process) DupSocket(inode uint64) (int, error) {
	// Two tries: a descriptor number closed and reused between the /proc
	// read and pidfd_getfd is found again by the second.
	var lastErr error
	for range 2 {
		num, err := findFD(p.root, p.pid, inode)
		if err != nil {
			return -1, fmt.Errorf("duplicate socket: %w", err)
		}
		var (
			fd     = -1
			dupErr error
		)
		rc, err := p.file.SyscallConn()
		if err != nil {
			return -1, fmt.Errorf("duplicate socket:[%d] of process %d: %w", inode, p.pid, err)
		}
		if err := rc.Control(func(pidfd uintptr) { fd, dupErr = unix.PidfdGetfd(int(pidfd), num, 0) }); err != nil {
			return -1, fmt.Errorf("duplicate socket:[%d] of process %d: %w", inode, p.pid, err)
		}
		if dupErr != nil {
			return -1, fmt.Errorf("duplicate socket:[%d] (fd %d) of process %d: pidfd_getfd: %w%s",
				inode, num, p.pid, dupErr, getfdHint(dupErr))
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("duplicate socket:[%d] of process %d: fstat: %w", inode, p.pid, err)
		}
		if st.Mode&unix.S_IFMT == unix.S_IFSOCK && st.Ino == inode {
			return fd, nil
		}
		unix.Close(fd)
		lastErr = fmt.Errorf("duplicate socket:[%d] of process %d: fd %d now holds inode %d", inode, p.pid, num, st.Ino)
	}
	return -1, lastErr
}

// getfdHint explains the errors of pidfd_getfd that have a known fix.
func getfdHint(err error) string {
	switch {
	case errors.Is(err, unix.EPERM):
		return " (needs ptrace rights over the process: CAP_SYS_PTRACE, or the same UID with kernel.yama.ptrace_scope 0; " +
			"in a container also a seccomp profile that allows pidfd_getfd and no AppArmor ptrace denial)"
	case errors.Is(err, unix.ENOSYS):
		return " (pidfd_getfd needs Linux 5.6)"
	case errors.Is(err, unix.ESRCH):
		return " (the process has exited)"
	}
	return ""
}

// Close releases the pidfd and stops watching; Exited is not closed by it.
// Safe to call more than once.
func (p *Process) Close() error {
	p.closeOnce.Do(func() {
		if err := p.file.Close(); err != nil {
			p.closeErr = fmt.Errorf("close pidfd of process %d: %w", p.pid, err)
		}
		<-p.done
	})
	return p.closeErr
}
