package handover

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Store talks to systemd's file descriptor store over NOTIFY_SOCKET.
// Its zero value, or one made outside systemd, does nothing.
type Store struct {
	socket string // NOTIFY_SOCKET; "" outside systemd
}

// StoreFromEnv returns the Store of the unit this process runs in.
func StoreFromEnv() Store { return Store{socket: os.Getenv("NOTIFY_SOCKET")} }

// Enabled says whether there is a service manager to store into. Whether
// the unit has FileDescriptorStoreMax= set cannot be asked on systemd
// before 254 ($FDSTORE); without it systemd drops what is sent and logs it.
func (s Store) Enabled() bool { return s.socket != "" }

// Put stores the file descriptor of conn under name (FDSTORE=1). systemd
// keeps one copy of each open file however often it is sent, and does
// not poll it (FDPOLL=0: a socket's error must not drop it from the store).
func (s Store) Put(name string, conn syscall.RawConn) error {
	var serr error
	err := conn.Control(func(fd uintptr) { serr = s.send(storeMsg(name), int(fd)) })
	if err = errors.Join(err, serr); err != nil {
		return fmt.Errorf("handover: store %s: %w", name, err)
	}
	return nil
}

// PutFile stores f under name.
func (s Store) PutFile(name string, f *os.File) error {
	if err := s.send(storeMsg(name), int(f.Fd())); err != nil {
		return fmt.Errorf("handover: store %s: %w", name, err)
	}
	return nil
}

func storeMsg(name string) string { return "FDSTORE=1\nFDPOLL=0\nFDNAME=" + name }

// Remove drops every file stored under name (FDSTOREREMOVE=1).
func (s Store) Remove(name string) error {
	if err := s.send("FDSTOREREMOVE=1\nFDNAME="+name, -1); err != nil {
		return fmt.Errorf("handover: remove %s from the store: %w", name, err)
	}
	return nil
}

// send writes one notification, with fd attached (SCM_RIGHTS) unless it
// is negative.
func (s Store) send(state string, fd int) error {
	if s.socket == "" {
		return nil
	}
	if strings.ContainsAny(state[strings.LastIndex(state, "=")+1:], ":\n") {
		return errors.New("a stored file's name may not hold ':' or a newline")
	}
	// A connected datagram socket cannot carry SCM_RIGHTS through Go's
	// net package (WriteMsgUnix refuses it): send with sendmsg directly.
	// x/sys turns a leading '@' into an abstract address, as systemd's
	// NOTIFY_SOCKET may be.
	sock, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(sock)
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	return unix.Sendmsg(sock, []byte(state), oob, &unix.SockaddrUnix{Name: s.socket}, 0)
}
