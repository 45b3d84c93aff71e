// Package unixsock makes the unix sockets dnsstandby listens on for other
// local processes (the admin socket, the dnstap socket): with their file
// mode in place from the moment the file exists, and with the peer's
// credentials at hand to check on accept.
package unixsock

import (
	"context"
	"fmt"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// Listen creates a stream socket file at path, with permission bits mode
// from the moment the file exists, and listens on it. The file is not
// removed first: clearing a stale one is the caller's business.
//
// Linux creates a socket's file in bind(2) with the mode of the socket's
// own inode, less the umask (net/unix/af_unix.c: S_IFSOCK | (i_mode &
// ~umask)). So the socket is fchmod'ed to mode between socket(2) and
// bind(2), through ListenConfig's Control, which net calls exactly there:
// the file is born with mode, less the umask, and no process ever sees
// it wider. Chmod after listen, as before, leaves a window in which the
// file has the umask's mode (0755 under 022, 0777 under 0); a umask set
// around bind would change every thread's file creation for the moment,
// since the umask is per process. When the umask took bits of mode away,
// they are put back with chmod afterwards: that only ever widens the file
// to what was asked, never beyond.
func Listen(path string, mode os.FileMode) (*net.UnixListener, error) {
	mode = mode.Perm()
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		if cerr := c.Control(func(fd uintptr) { err = unix.Fchmod(int(fd), uint32(mode)) }); cerr != nil {
			return cerr
		}
		if err != nil {
			return fmt.Errorf("set socket mode %v before bind: %w", mode, err)
		}
		return nil
	}}
	l, err := lc.Listen(context.Background(), "unix", path)
	if err != nil {
		return nil, err
	}
	ln := l.(*net.UnixListener)
	fi, err := os.Lstat(path)
	if err == nil && fi.Mode().Perm() != mode {
		err = os.Chmod(path, mode)
	}
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("set socket mode %v: %w", mode, err)
	}
	return ln, nil
}

// PeerCred returns the credentials c's peer had when it connected
// (SO_PEERCRED): the kernel's record, which the peer cannot forge.
func PeerCred(c *net.UnixConn) (*unix.Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var gerr error
	if err := rc.Control(func(fd uintptr) { cred, gerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return nil, fmt.Errorf("peer credentials: %w", err)
	}
	if gerr != nil {
		return nil, fmt.Errorf("peer credentials: SO_PEERCRED: %w", gerr)
	}
	return cred, nil
}
