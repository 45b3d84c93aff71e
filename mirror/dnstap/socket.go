package dnstap

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"

	"github.com/dnsstandby/dnsstandby/internal/unixsock"
)

var (
	// ErrInUse means a process still listens on the socket path.
	ErrInUse = errors.New("socket in use by a live listener")
	// ErrNotSocket means the path exists and is not a socket; Listen never
	// removes such a file.
	ErrNotSocket = errors.New("path exists and is not a socket")
)

// listenUnix clears a stale socket at path and listens there, the file
// having mode from the moment it exists (unixsock.Listen: the mode is set
// on the socket before bind, so there is no moment in which another user
// could connect). It returns the file's identity so that removeSocket
// removes this file and no later one.
func listenUnix(path string, mode os.FileMode) (*net.UnixListener, os.FileInfo, error) {
	if err := clearStale(path); err != nil {
		return nil, nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, nil, fmt.Errorf("dnstap: socket directory: %w", err)
	}
	ln, err := unixsock.Listen(path, mode)
	if err != nil {
		return nil, nil, fmt.Errorf("dnstap: listen on %s: %w", path, err)
	}
	// Close removes the file itself, and only if it is still ours.
	ln.SetUnlinkOnClose(false)
	fi, err := os.Lstat(path)
	if err != nil {
		ln.Close()
		os.Remove(path)
		return nil, nil, fmt.Errorf("dnstap: socket %s: %w", path, err)
	}
	return ln, fi, nil
}

// clearStale removes a socket file nobody listens on: the one a killed
// dnsstandby left. It refuses a live socket and anything that is not a
// socket.
func clearStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("dnstap: %w", err)
	}
	if fi.Mode().Type() != os.ModeSocket {
		return fmt.Errorf("dnstap: %s: %w (mode %v); remove it or choose another path", path, ErrNotSocket, fi.Mode())
	}
	c, err := net.DialTimeout("unix", path, probeTimeout)
	if err == nil {
		c.Close()
		return fmt.Errorf("dnstap: %s: %w; is another dnsstandby running?", path, ErrInUse)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("dnstap: cannot tell whether %s is stale: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("dnstap: remove stale socket: %w", err)
	}
	return nil
}

// removeSocket removes path if it is still the file ours describes.
func removeSocket(path string, ours os.FileInfo) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("dnstap: remove socket: %w", err)
	}
	if !os.SameFile(fi, ours) {
		return nil // someone replaced it; it is theirs now
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("dnstap: remove socket: %w", err)
	}
	return nil
}
