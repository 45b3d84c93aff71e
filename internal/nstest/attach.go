package nstest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Attach names the network namespace of process pid, like `ip netns attach
// NAME PID`: a bind mount of /proc/PID/ns/net at /run/netns/NAME, so that
// `ip netns exec NAME`, AddVeth, AddLink and the rest work on a namespace
// someone else made (a container, or a systemd booted in namespaces of its
// own). The namespace is left as it is found: Attach neither adds links nor
// sets loopback up.
//
// The name keeps the namespace alive after pid exits, until Close, which
// stops the processes started through the returned Namespace and removes the
// name, as for a namespace from Create. A name not made by UniqueName is not
// removed by ReapStale; its owner must remove it with Detach if it dies
// without closing it.
func Attach(name string, pid int) (*Namespace, error) {
	if err := checkNamespaceName(name); err != nil {
		return nil, fmt.Errorf("attach namespace: %w", err)
	}
	if pid <= 0 {
		return nil, fmt.Errorf("attach namespace %s: invalid pid %d", name, pid)
	}
	// Open the process's namespace first: a pid that is gone fails here,
	// before anything is created under /run/netns.
	src := fmt.Sprintf("/proc/%d/ns/net", pid)
	srcFd, err := unix.Open(src, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("attach namespace %s: open %s: %w", name, src, err)
	}
	defer unix.Close(srcFd)
	if err := prepareNetnsDir(); err != nil {
		return nil, fmt.Errorf("attach namespace %s: %w", name, err)
	}
	path := filepath.Join(netnsDir, name)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return nil, fmt.Errorf("attach namespace %s: %w", name, err)
	}
	f.Close()
	n := &Namespace{name: name, fd: -1, procs: map[*Process]struct{}{}}
	fail := func(err error) (*Namespace, error) {
		return nil, errors.Join(fmt.Errorf("attach namespace %s to pid %d: %w", name, pid, err), n.Close())
	}
	// Bind the descriptor opened above, not the /proc path again: if pid
	// exited and its number was reused in between, the path would name
	// another process's namespace.
	fdPath := fmt.Sprintf("/proc/self/fd/%d", srcFd)
	if err := unix.Mount(fdPath, path, "none", unix.MS_BIND, ""); err != nil {
		return fail(fmt.Errorf("bind-mount %s on %s: %w", src, path, err))
	}
	if n.fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
		return fail(fmt.Errorf("open %s: %w", path, err))
	}
	err = onThread(func() error { return unix.Setns(n.fd, unix.CLONE_NEWNET) }, func() error {
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		n.nl = h
		return err
	})
	if err != nil {
		return fail(fmt.Errorf("open netlink socket: %w", err))
	}
	return n, nil
}

// Detach removes the name of a namespace, like `ip netns delete NAME`,
// without a Namespace value: for cleaning up after a process that attached
// or created a namespace and died without closing it. The namespace itself
// lives on while a process or an open descriptor still holds it. A name that
// does not exist is no error.
func Detach(name string) error {
	if err := checkNamespaceName(name); err != nil {
		return fmt.Errorf("detach namespace: %w", err)
	}
	if err := removeNamed(name); err != nil {
		return fmt.Errorf("detach namespace %s: %w", name, err)
	}
	if err := os.RemoveAll(filepath.Join(etcNetnsDir, name)); err != nil {
		return fmt.Errorf("detach namespace %s: %w", name, err)
	}
	return nil
}

func checkNamespaceName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return fmt.Errorf("invalid name %q", name)
	}
	return nil
}
