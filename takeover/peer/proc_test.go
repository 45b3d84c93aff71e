package peer

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func TestSocketLinkInode(t *testing.T) {
	tests := []struct {
		link  string
		inode uint64
		ok    bool
	}{
		{"socket:[12345]", 12345, true},
		{"socket:[18446744073709551615]", 1<<64 - 1, true},
		{"socket:[]", 0, false},
		{"socket:[12a]", 0, false},
		{"socket:[-1]", 0, false},
		{"socket:12345", 0, false},
		{"socket:[12345", 0, false},
		{"pipe:[12345]", 0, false},
		{"anon_inode:[pidfd]", 0, false},
		{"/dev/null", 0, false},
		{"", 0, false},
	}
	for _, tt := range tests {
		inode, ok := socketLinkInode(tt.link)
		if inode != tt.inode || ok != tt.ok {
			t.Errorf("socketLinkInode(%q) = %d, %v; want %d, %v", tt.link, inode, ok, tt.inode, tt.ok)
		}
	}
}

// fakeProc builds a /proc-like tree: for each pid, a comm file and an fd
// directory of links with the given targets (by fd number).
func fakeProc(t *testing.T, procs map[int]map[int]string, comms map[int]string) string {
	t.Helper()
	root := t.TempDir()
	for pid, fds := range procs {
		dir := filepath.Join(root, strconv.Itoa(pid))
		if err := os.MkdirAll(filepath.Join(dir, "fd"), 0o755); err != nil {
			t.Fatal(err)
		}
		if c, ok := comms[pid]; ok {
			if err := os.WriteFile(filepath.Join(dir, "comm"), []byte(c+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		for fd, target := range fds {
			if err := os.Symlink(target, filepath.Join(dir, "fd", strconv.Itoa(fd))); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Entries of /proc that are not processes.
	for _, name := range []string{"net", "sys"} {
		if err := os.MkdirAll(filepath.Join(root, name), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("100", filepath.Join(root, "self")); err != nil {
		t.Fatal(err)
	}
	return root
}

func TestFillOwners(t *testing.T) {
	root := fakeProc(t, map[int]map[int]string{
		100: {0: "/dev/null", 1: "pipe:[9]", 3: "socket:[555]", 7: "socket:[556]"},
		200: {4: "socket:[777]", 5: "anon_inode:[eventpoll]"},
		300: {3: "socket:[777]"}, // shares 777 with 200 (inherited)
		400: {},
		// systemd's file descriptor store holds a copy of the standby's
		// socket for its next process; 1 also holds one no one serves.
		1:   {12: "socket:[888]", 13: "socket:[889]"},
		500: {3: "socket:[888]"},
	}, map[int]string{100: "coredns", 200: "localdns.sh", 300: "coredns", 1: "systemd", 500: "dnsstandby"})
	// 300 runs in AKS's fallback unit; the others' cgroups name none.
	if err := os.WriteFile(filepath.Join(root, "300", "cgroup"), []byte("0::/system.slice/localdns-fallback.service\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name   string
		hints  []int
		inodes []uint64
		pids   []int
		comms  []string
		units  []string // nil: none
	}{
		{"scan", nil, []uint64{555, 556, 999}, []int{100, 100, 0}, []string{"coredns", "coredns", ""}, nil},
		{"hint first", []int{300}, []uint64{777}, []int{300}, []string{"coredns"}, []string{"localdns-fallback.service"}},
		{"stale hint", []int{12345, 400}, []uint64{555}, []int{100}, []string{"coredns"}, nil},
		{"none", nil, nil, nil, nil, nil},
		{"stored by the service manager: the serving process named", nil, []uint64{888}, []int{500}, []string{"dnsstandby"}, nil},
		{"held by the service manager alone", nil, []uint64{889}, []int{1}, []string{"systemd"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			socks := make([]Socket, len(tt.inodes))
			for i, ino := range tt.inodes {
				socks[i] = Socket{Proto: UDP, Inode: ino}
			}
			if err := fillOwners(root, socks, tt.hints); err != nil {
				t.Fatal(err)
			}
			for i, s := range socks {
				if s.PID != tt.pids[i] || s.Comm != tt.comms[i] {
					t.Errorf("socket:[%d]: owner %s[%d], want %s[%d]", s.Inode, s.Comm, s.PID, tt.comms[i], tt.pids[i])
				}
				if want := unitWant(tt.units, i); s.Unit != want {
					t.Errorf("socket:[%d]: unit %q, want %q", s.Inode, s.Unit, want)
				}
			}
		})
	}
	// 777 is held by 200 and 300; without a hint either is right.
	socks := []Socket{{Inode: 777}}
	if err := fillOwners(root, socks, nil); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains([]int{200, 300}, socks[0].PID) {
		t.Errorf("socket:[777] owner %d, want 200 or 300", socks[0].PID)
	}
	if err := fillOwners(filepath.Join(root, "missing"), []Socket{{Inode: 1}}, nil); err == nil {
		t.Error("fillOwners with a missing root: no error")
	}
}

func TestFindFD(t *testing.T) {
	root := fakeProc(t, map[int]map[int]string{
		100: {0: "/dev/null", 3: "socket:[555]", 12: "socket:[556]"},
	}, nil)
	tests := []struct {
		pid   int
		inode uint64
		fd    int
		err   error // errors.Is target, or nil
	}{
		{100, 555, 3, nil},
		{100, 556, 12, nil},
		{100, 557, -1, ErrSocketNotHeld},
		{101, 555, -1, os.ErrNotExist},
	}
	for _, tt := range tests {
		fd, err := findFD(root, tt.pid, tt.inode)
		if fd != tt.fd || (tt.err == nil) != (err == nil) || (tt.err != nil && !errors.Is(err, tt.err)) {
			t.Errorf("findFD(%d, %d) = %d, %v; want %d, %v", tt.pid, tt.inode, fd, err, tt.fd, tt.err)
		}
	}
}

func TestUIDWarning(t *testing.T) {
	s := Socket{Proto: UDP, Addr: netip.MustParseAddrPort("169.254.10.11:53"), UID: 101}
	want := "LocalDNS socket 169.254.10.11:53/udp is owned by UID 101, dnsstandby runs as 0: " +
		"the kernel will not put them in one reuseport group; run dnsstandby as UID 101"
	if got := UIDWarning(s, 0); got != want {
		t.Errorf("UIDWarning:\n got %q\nwant %q", got, want)
	}
	s = Socket{Proto: TCP, Addr: netip.MustParseAddrPort("[fd00::11]:53"), UID: 0}
	want = "LocalDNS socket [fd00::11]:53/tcp is owned by UID 0, dnsstandby runs as 1000: " +
		"the kernel will not put them in one reuseport group; run dnsstandby as UID 0"
	if got := UIDWarning(s, 1000); got != want {
		t.Errorf("UIDWarning:\n got %q\nwant %q", got, want)
	}
}

// TestDiagEncoding checks the inet_diag request against the kernel's
// layout and parses a reply built by hand.
func TestDiagEncoding(t *testing.T) {
	ne := binary.NativeEndian
	req := diagRequest(7, unix.AF_INET, TCP, 53)
	if len(req) != 16+56 {
		t.Fatalf("request of %d bytes, want nlmsghdr (16) + inet_diag_req_v2 (56)", len(req))
	}
	if got := ne.Uint32(req[0:]); got != uint32(len(req)) {
		t.Errorf("nlmsg_len %d, want %d", got, len(req))
	}
	if got := ne.Uint16(req[4:]); got != unix.SOCK_DIAG_BY_FAMILY {
		t.Errorf("nlmsg_type %d", got)
	}
	if got := ne.Uint16(req[6:]); got != unix.NLM_F_REQUEST|unix.NLM_F_DUMP {
		t.Errorf("nlmsg_flags %#x", got)
	}
	if got := ne.Uint32(req[8:]); got != 7 {
		t.Errorf("nlmsg_seq %d", got)
	}
	r := req[16:]
	if r[0] != unix.AF_INET || r[1] != unix.IPPROTO_TCP || ne.Uint32(r[4:]) != 1<<tcpListen {
		t.Errorf("tcp request family %d proto %d states %#x", r[0], r[1], ne.Uint32(r[4:]))
	}
	if r[8] != 0 || r[9] != 53 {
		t.Errorf("idiag_sport bytes %v, want network order [0 53]", r[8:10])
	}
	r = diagRequest(8, unix.AF_INET6, UDP, 5353)[16:]
	if r[0] != unix.AF_INET6 || r[1] != unix.IPPROTO_UDP || ne.Uint32(r[4:]) != 1<<tcpClose {
		t.Errorf("udp request family %d proto %d states %#x", r[0], r[1], ne.Uint32(r[4:]))
	}

	msg := make([]byte, sizeofInetDiagMsg)
	msg[0], msg[1] = unix.AF_INET, tcpClose
	binary.BigEndian.PutUint16(msg[4:], 53)
	copy(msg[8:], []byte{169, 254, 10, 11})
	ne.PutUint32(msg[4+48+12:], 101)    // idiag_uid
	ne.PutUint32(msg[4+48+16:], 424242) // idiag_inode
	s, err := parseDiagMsg(msg)
	if err != nil {
		t.Fatal(err)
	}
	want := diagSocket{
		addr:  netip.MustParseAddrPort("169.254.10.11:53"),
		peer:  netip.MustParseAddrPort("0.0.0.0:0"),
		state: tcpClose, uid: 101, inode: 424242,
	}
	if s != want {
		t.Errorf("parseDiagMsg = %+v, want %+v", s, want)
	}
	if _, err := parseDiagMsg(msg[:40]); err == nil {
		t.Error("parseDiagMsg of a short message: no error")
	}
}

// TestDiagKernelFilter checks that the kernel, not only our code, filters
// a dump by port and state: a rescan must not copy every socket of the
// node. It needs no root (sock_diag dumps are open to all).
func TestDiagKernelFilter(t *testing.T) {
	d, err := openDiag()
	if err != nil {
		t.Skip(err)
	}
	defer d.close()
	lo := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}
	var udps []*net.UDPConn
	for range 3 {
		c, err := net.ListenUDP("udp4", lo)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		udps = append(udps, c)
	}
	ln, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: lo.IP})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.DialTCP("tcp4", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept() // an established socket on the listener's port
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()

	inode := func(c syscall.Conn) uint64 {
		rc, err := c.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		ino, err := SocketInode(rc)
		if err != nil {
			t.Fatal(err)
		}
		return ino
	}
	tests := []struct {
		proto Proto
		conn  syscall.Conn
		addr  netip.AddrPort
	}{
		{UDP, udps[1], udps[1].LocalAddr().(*net.UDPAddr).AddrPort()},
		{TCP, ln, ln.Addr().(*net.TCPAddr).AddrPort()},
	}
	for _, tt := range tests {
		raw, err := d.dump(unix.AF_INET, tt.proto, tt.addr.Port())
		if err != nil {
			t.Fatal(err)
		}
		if len(raw) != 1 || raw[0].addr != tt.addr || raw[0].inode != inode(tt.conn) {
			t.Errorf("%s dump for port %d: %+v, want only %s (inode %d)", tt.proto, tt.addr.Port(), raw, tt.addr, inode(tt.conn))
		}
	}
}

func TestUnitFromCgroup(t *testing.T) {
	tests := []struct {
		name, text, want string
	}{
		{"unified", "0::/system.slice/localdns-fallback.service\n", "localdns-fallback.service"},
		{"unified, no newline", "0::/system.slice/localdns.service", "localdns.service"},
		{"seen from a container's cgroup namespace", "0::/../../system.slice/localdns-fallback.service\n", "localdns-fallback.service"},
		{"a unit's own sub-cgroup", "0::/system.slice/localdns.service/payload\n", "localdns.service"},
		{"a transient scope", "0::/system.slice/run-r1a2b.scope\n", "run-r1a2b.scope"},
		{"a pod's container", "0::/kubepods.slice/kubepods-burstable.slice/cri-containerd-0123.scope\n", "cri-containerd-0123.scope"},
		{"hybrid: name=systemd names the unit", "9:name=systemd:/system.slice/localdns-fallback.service\n4:memory:/x\n0::/\n", "localdns-fallback.service"},
		{"hybrid: unified first", "1:name=systemd:/system.slice/a.service\n0::/system.slice/b.service\n", "b.service"},
		{"legacy controllers only", "4:memory:/system.slice/localdns.service\n", ""},
		{"root", "0::/\n", ""},
		{"a slice only", "0::/system.slice\n", ""},
		{"empty", "", ""},
		{"garbage", "not a cgroup line\n::\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := unitFromCgroup(tt.text); got != tt.want {
				t.Errorf("unitFromCgroup(%q) = %q, want %q", tt.text, got, tt.want)
			}
		})
	}
}

func TestSocketString(t *testing.T) {
	base := Socket{Proto: UDP, Addr: netip.MustParseAddrPort("169.254.10.11:53"), Inode: 7}
	withUnit := base
	withUnit.PID, withUnit.Comm, withUnit.Unit = 42, "coredns", "localdns-fallback.service"
	noUnit := withUnit
	noUnit.Unit = ""
	tests := []struct {
		s    Socket
		want string
	}{
		{base, "169.254.10.11:53/udp inode 7 uid 0 owner not visible"},
		{noUnit, "169.254.10.11:53/udp inode 7 uid 0 coredns[42]"},
		{withUnit, "169.254.10.11:53/udp inode 7 uid 0 coredns[42] in localdns-fallback.service"},
	}
	for _, tt := range tests {
		if got := tt.s.String(); got != tt.want {
			t.Errorf("String() = %q, want %q", got, tt.want)
		}
	}
}

// unitWant is units[i], or "" when units is nil.
func unitWant(units []string, i int) string {
	if units == nil {
		return ""
	}
	return units[i]
}
