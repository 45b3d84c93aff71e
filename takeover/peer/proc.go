package peer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// procRoot is where the processes of our PID namespace are listed. In a
// container without the host's PID namespace it lists only the container's
// processes, and LocalDNS's sockets show with PID 0.
const procRoot = "/proc"

// socketLinkInode parses the target of a /proc/PID/fd link to a socket,
// "socket:[INODE]", and returns the inode.
func socketLinkInode(link string) (uint64, bool) {
	rest, ok := strings.CutPrefix(link, "socket:[")
	if !ok {
		return 0, false
	}
	digits, ok := strings.CutSuffix(rest, "]")
	if !ok || digits == "" {
		return 0, false
	}
	inode, err := strconv.ParseUint(digits, 10, 64)
	if err != nil {
		return 0, false
	}
	return inode, true
}

// eachSocketFD calls fn with each socket file descriptor of process pid and
// the socket's inode, until fn returns false. It reads root/PID/fd, which
// needs ptrace-read rights over the process (root has them).
func eachSocketFD(root string, pid int, fn func(fd int, inode uint64) bool) error {
	dir := filepath.Join(root, strconv.Itoa(pid), "fd")
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, name := range names {
		fd, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		link, err := os.Readlink(filepath.Join(dir, name))
		if err != nil {
			continue // closed since the listing
		}
		if inode, ok := socketLinkInode(link); ok && !fn(fd, inode) {
			return nil
		}
	}
	return nil
}

// findFD returns the number of a file descriptor of process pid that holds
// the socket inode.
func findFD(root string, pid int, inode uint64) (int, error) {
	found := -1
	err := eachSocketFD(root, pid, func(fd int, ino uint64) bool {
		if ino == inode {
			found = fd
			return false
		}
		return true
	})
	if err != nil {
		return -1, fmt.Errorf("read fds of process %d: %w", pid, err)
	}
	if found < 0 {
		return -1, fmt.Errorf("socket:[%d] in process %d: %w", inode, pid, ErrSocketNotHeld)
	}
	return found, nil
}

// readComm returns the process's name, or "" if it cannot be read.
func readComm(root string, pid int) string {
	b, err := os.ReadFile(filepath.Join(root, strconv.Itoa(pid), "comm"))
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(b), "\n")
}

// readUnit returns the systemd unit the process runs in, from its cgroup,
// or "" if it cannot be read or names none.
func readUnit(root string, pid int) string {
	b, err := os.ReadFile(filepath.Join(root, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return ""
	}
	return unitFromCgroup(string(b))
}

// unitFromCgroup returns the systemd unit (a .service or .scope) named by
// a /proc/PID/cgroup text: the unified hierarchy's line ("0::PATH") if
// its path names one, else the name=systemd hierarchy's (a hybrid node).
// The unit is the deepest path element with such a suffix, so a path seen
// from inside a cgroup namespace ("/../../system.slice/x.service") and a
// unit's own sub-cgroups still give it.
func unitFromCgroup(text string) string {
	var unified, named string
	for line := range strings.Lines(text) {
		id, rest, ok := strings.Cut(strings.TrimSuffix(line, "\n"), ":")
		if !ok {
			continue
		}
		ctrl, path, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		switch {
		case id == "0" && ctrl == "":
			unified = unitOfPath(path)
		case ctrl == "name=systemd":
			named = unitOfPath(path)
		}
	}
	if unified != "" {
		return unified
	}
	return named
}

func unitOfPath(path string) string {
	elems := strings.Split(path, "/")
	for i := len(elems) - 1; i >= 0; i-- {
		if e := elems[i]; strings.HasSuffix(e, ".service") || strings.HasSuffix(e, ".scope") {
			return e
		}
	}
	return ""
}

// fillOwners sets PID, Comm and Unit of every socket in socks whose PID is 0 to a
// process holding it: the processes in hints first (LocalDNS's last known
// PIDs, so that a rescan costs nothing while LocalDNS keeps its sockets),
// then every process under root until all are found, the service manager
// (PID 1) last: it holds copies of the sockets in its file descriptor
// store (dnsstandby's, for the next process), and the process serving
// them is the owner to name. A socket held by no visible process keeps
// PID 0. Only a root that cannot be listed is an
// error; processes that vanish or deny access are skipped.
func fillOwners(root string, socks []Socket, hints []int) error {
	want := map[uint64][]int{} // inode -> indexes into socks
	for i, s := range socks {
		if s.PID == 0 {
			want[s.Inode] = append(want[s.Inode], i)
		}
	}
	if len(want) == 0 {
		return nil
	}
	scan := func(pid int) {
		var comm, unit string
		_ = eachSocketFD(root, pid, func(_ int, inode uint64) bool {
			idx, ok := want[inode]
			if !ok {
				return true
			}
			if comm == "" {
				comm, unit = readComm(root, pid), readUnit(root, pid)
			}
			for _, i := range idx {
				socks[i].PID, socks[i].Comm, socks[i].Unit = pid, comm, unit
			}
			delete(want, inode)
			return len(want) > 0
		})
	}
	seen := map[int]bool{}
	for _, pid := range hints {
		if pid > 0 && !seen[pid] && len(want) > 0 {
			seen[pid] = true
			scan(pid)
		}
	}
	if len(want) == 0 {
		return nil
	}
	f, err := os.Open(root)
	if err != nil {
		return fmt.Errorf("list processes: %w", err)
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return fmt.Errorf("list processes: %w", err)
	}
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil || pid <= serviceManager || seen[pid] {
			continue
		}
		scan(pid)
		if len(want) == 0 {
			return nil
		}
	}
	if !seen[serviceManager] {
		scan(serviceManager)
	}
	return nil
}

// serviceManager is PID 1, systemd on a node: see fillOwners.
const serviceManager = 1

// SocketInode returns the inode of the socket behind rc (from
// (*net.UDPConn).SyscallConn and the like): what sock_diag and /proc/PID/fd
// name it by. dnsstandby passes its own sockets' inodes as the exclude set
// of FindSockets and WatcherConfig.
func SocketInode(rc syscall.RawConn) (uint64, error) {
	var (
		st    unix.Stat_t
		sterr error
	)
	if err := rc.Control(func(fd uintptr) { sterr = unix.Fstat(int(fd), &st) }); err != nil {
		return 0, fmt.Errorf("socket inode: %w", err)
	}
	if sterr != nil {
		return 0, fmt.Errorf("socket inode: fstat: %w", sterr)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return 0, errors.New("socket inode: not a socket")
	}
	return st.Ino, nil
}
