package handover

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// listen binds a socket with SO_REUSEPORT (as the responder does) or
// without.
func listen(t *testing.T, network, addr string, reuse bool) *os.File {
	t.Helper()
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if reuse {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
			}
		})
		return errors.Join(err, serr)
	}}
	lc.SetMultipathTCP(false)
	var f *os.File
	var err error
	if strings.HasPrefix(network, "udp") {
		pc, lerr := lc.ListenPacket(context.Background(), network, addr)
		if lerr != nil {
			t.Fatal(lerr)
		}
		defer pc.Close()
		f, err = pc.(*net.UDPConn).File()
	} else {
		ln, lerr := lc.Listen(context.Background(), network, addr)
		if lerr != nil {
			t.Fatal(lerr)
		}
		defer ln.Close()
		f, err = ln.(*net.TCPListener).File()
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func localAddr(t *testing.T, f *os.File) netip.AddrPort {
	t.Helper()
	sa, err := unix.Getsockname(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), uint16(sa.Port))
	}
	t.Fatalf("not an inet socket: %T", sa)
	return netip.AddrPort{}
}

func TestFits(t *testing.T) {
	udp := listen(t, "udp4", "127.0.0.1:0", true)
	tcp := listen(t, "tcp4", "127.0.0.1:0", true)
	noReuse := listen(t, "udp4", "127.0.0.1:0", false)
	udp6 := listen(t, "udp6", "[::1]:0", true)
	tcpBound, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The file owns the descriptor: closing it as well would close,
	// from the file's finalizer, whatever reuses its number later.
	tcpBoundFile := os.NewFile(uintptr(tcpBound), "bound")
	defer tcpBoundFile.Close()
	_ = unix.SetsockoptInt(tcpBound, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	if err := unix.Bind(tcpBound, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	memfd, err := unix.MemfdCreate("x", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(memfd)
	other := netip.MustParseAddrPort("127.0.0.2:53")

	tests := []struct {
		name    string
		fd      int
		ap      netip.AddrPort
		udp     bool
		wantErr string
	}{
		{"udp fits", int(udp.Fd()), localAddr(t, udp), true, ""},
		{"tcp fits", int(tcp.Fd()), localAddr(t, tcp), false, ""},
		{"udp6 fits", int(udp6.Fd()), localAddr(t, udp6), true, ""},
		{"udp as tcp", int(udp.Fd()), localAddr(t, udp), false, "socket type"},
		{"tcp as udp", int(tcp.Fd()), localAddr(t, tcp), true, "socket type"},
		{"other address", int(udp.Fd()), other, true, "bound to"},
		{"other port", int(udp.Fd()), netip.AddrPortFrom(localAddr(t, udp).Addr(), localAddr(t, udp).Port()+1), true, "bound to"},
		{"v6 socket for a v4 address", int(udp6.Fd()), other, true, "address family"},
		{"no SO_REUSEPORT", int(noReuse.Fd()), localAddr(t, noReuse), true, "SO_REUSEPORT not set"},
		{"tcp not listening", tcpBound, localAddr(t, tcpBoundFile), false, "not listening"},
		{"not a socket", memfd, other, true, "SO_DOMAIN"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Fits(tt.fd, tt.ap, tt.udp)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Fits: %v, want nil", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("Fits: %v, want %q", err, tt.wantErr)
			}
		})
	}
}

// TestTake passes real sockets as inherited files: those that fit are
// taken and still bound to the same socket (a datagram sent to it before
// the take is read after), the rest are refused, closed and named for
// removal from the store.
func TestTake(t *testing.T) {
	udp := listen(t, "udp4", "127.0.0.1:0", true)
	tcp := listen(t, "tcp4", "127.0.0.1:0", true)
	stray := listen(t, "udp4", "127.0.0.1:0", true)
	noReuse := listen(t, "udp4", "127.0.0.1:0", false)
	ap, tap := localAddr(t, udp), localAddr(t, tcp)

	// A query queued while no process reads.
	c, err := net.Dial("udp", ap.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("queued")); err != nil {
		t.Fatal(err)
	}

	dup := func(f *os.File, name string) *os.File {
		fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		return os.NewFile(uintptr(fd), name)
	}
	in := FromFiles([]*os.File{
		dup(noReuse, "udp-no-reuse"),
		dup(tcp, SocketName(tap, false, 0)),
		dup(stray, "udp-stray"),
		dup(udp, SocketName(ap, true, 0)),
	}, nil)
	if got := in.Sockets(); got != 4 {
		t.Fatalf("Sockets = %d, want 4", got)
	}
	if conn := in.TakeUDP(netip.MustParseAddrPort("127.0.0.3:53")); conn != nil {
		t.Fatalf("TakeUDP of an address nothing is bound to: %v", conn.LocalAddr())
	}
	conn := in.TakeUDP(ap)
	if conn == nil {
		t.Fatal("TakeUDP: nil, want the inherited socket")
	}
	defer conn.Close()
	if conn.LocalAddr().(*net.UDPAddr).AddrPort() != ap {
		t.Fatalf("took %v, want %v", conn.LocalAddr(), ap)
	}
	if again := in.TakeUDP(ap); again != nil {
		t.Fatal("TakeUDP twice: the same socket handed out again")
	}
	_ = conn.SetReadDeadline(timeSoon())
	b := make([]byte, 64)
	n, err := conn.Read(b)
	if err != nil || string(b[:n]) != "queued" {
		t.Fatalf("read on the inherited socket: %q %v, want the queued datagram", b[:n], err)
	}
	ln := in.TakeTCP(tap)
	if ln == nil {
		t.Fatal("TakeTCP: nil, want the inherited listener")
	}
	defer ln.Close()
	if in.Taken() != 2 {
		t.Fatalf("Taken = %d, want 2", in.Taken())
	}
	rest := in.Rest([]netip.AddrPort{ap, tap})
	want := []string{"udp-no-reuse", "udp-stray"}
	if strings.Join(rest, ",") != strings.Join(want, ",") {
		t.Fatalf("Rest = %v, want %v", rest, want)
	}
	if in.Sockets() != 0 {
		t.Fatalf("Sockets after Rest = %d", in.Sockets())
	}
}

func TestSocketName(t *testing.T) {
	tests := []struct {
		ap   string
		udp  bool
		i    int
		want string
	}{
		{"169.254.10.11:53", true, 0, "udp-169.254.10.11-53-0"},
		{"169.254.10.10:53", false, 1, "tcp-169.254.10.10-53-1"},
		{"[fd53::11]:53", true, 2, "udp-fd53__11-53-2"},
	}
	for _, tt := range tests {
		if got := SocketName(netip.MustParseAddrPort(tt.ap), tt.udp, tt.i); got != tt.want {
			t.Errorf("SocketName(%s, %v, %d) = %q, want %q", tt.ap, tt.udp, tt.i, got, tt.want)
		}
	}
}

func saver(data string) func(io.Writer) (int, error) {
	return func(w io.Writer) (int, error) {
		_, err := io.WriteString(w, data)
		return len(data), err
	}
}

func TestCachesRoundTrip(t *testing.T) {
	big := strings.Repeat("x", 200_000) // past the writer's buffer
	f, n, err := WriteCaches(4242, 1<<20, []CacheSave{
		{Key: CacheKey(netip.MustParseAddrPort("169.254.10.11:53"), "cluster.local."), Save: saver("one")},
		{Key: CacheKey(netip.MustParseAddrPort("169.254.10.11:53"), "."), Save: saver(big)},
		{Key: "empty", Save: saver("")},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if n != 3+len(big) {
		t.Fatalf("entries = %d", n)
	}
	if _, err := f.Write([]byte("more")); err == nil {
		t.Fatal("write to the sealed file succeeded")
	}
	w, err := ReadCaches(f, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if w.FromPID != 4242 || w.Len() != 3 {
		t.Fatalf("FromPID %d, Len %d", w.FromPID, w.Len())
	}
	if got := string(w.Take("169.254.10.11:53 cluster.local.")); got != "one" {
		t.Fatalf("cluster.local. = %q", got)
	}
	if got := w.Take("169.254.10.11:53 ."); !bytes.Equal(got, []byte(big)) {
		t.Fatalf("root: %d bytes, want %d", len(got), len(big))
	}
	if w.Take("169.254.10.11:53 .") != nil {
		t.Fatal("Take twice")
	}
	if _, err := ReadCaches(f, 1000); err == nil || !strings.Contains(err.Error(), "over the limit") {
		t.Fatalf("ReadCaches under a smaller limit: %v", err)
	}
}

func TestWriteCachesLimit(t *testing.T) {
	_, _, err := WriteCaches(1, 1000, []CacheSave{{Key: "k", Save: saver(strings.Repeat("x", 2000))}})
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("err = %v, want ErrTooLarge", err)
	}
}

func TestReadCachesRefuses(t *testing.T) {
	good := func() []byte {
		f, _, err := WriteCaches(7, 1<<20, []CacheSave{{Key: "k", Save: saver("data")}})
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		b, err := io.ReadAll(io.NewSectionReader(f, 0, 1<<20))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}()
	memfd := func(b []byte, seal bool) *os.File {
		fd, err := unix.MemfdCreate("t", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			t.Fatal(err)
		}
		f := os.NewFile(uintptr(fd), "t")
		t.Cleanup(func() { f.Close() })
		if _, err := f.Write(b); err != nil {
			t.Fatal(err)
		}
		if seal {
			if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, seals); err != nil {
				t.Fatal(err)
			}
		}
		return f
	}
	plain, err := os.Create(filepath.Join(t.TempDir(), "cache"))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	plain.Write(good)
	mod := func(f func([]byte) []byte) []byte { return f(bytes.Clone(good)) }

	tests := []struct {
		name    string
		f       *os.File
		wantErr string
	}{
		{"good", memfd(good, true), ""},
		{"unsealed", memfd(good, false), "seals"},
		{"a plain file", plain, "not a memfd"},
		{"bad magic", memfd(mod(func(b []byte) []byte { b[0] = 'X'; return b }), true), "bad magic"},
		{"other version", memfd(mod(func(b []byte) []byte { b[9] = 9; return b }), true), "version"},
		{"truncated", memfd(good[:len(good)-3], true), "past the end"},
		{"no end marker", memfd(good[:len(good)-2], true), "no end marker"},
		{"trailing bytes", memfd(append(bytes.Clone(good), 1), true), "after the end marker"},
		{"length past the end", memfd(mod(func(b []byte) []byte { b[warmHeader+2] = 0xff; return b }), true), "past the end"},
		{"too short", memfd([]byte("DSBY"), true), "too short"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := ReadCaches(tt.f, 1<<20)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				w.Close()
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

// TestStore receives what Store sends on a NOTIFY_SOCKET of the test's
// own, as systemd would: the message and the descriptor attached.
func TestStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify")
	rx, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	s := Store{socket: path}
	udp := listen(t, "udp4", "127.0.0.1:0", true)
	pc, err := net.FilePacketConn(udp)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	rc, err := pc.(*net.UDPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	recv := func() (string, []int) {
		t.Helper()
		_ = rx.SetReadDeadline(timeSoon())
		b, oob := make([]byte, 256), make([]byte, 64)
		n, oobn, _, _, err := rx.ReadMsgUnix(b, oob)
		if err != nil {
			t.Fatal(err)
		}
		var fds []int
		msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
		for _, m := range msgs {
			got, _ := unix.ParseUnixRights(&m)
			fds = append(fds, got...)
		}
		return string(b[:n]), fds
	}
	if err := s.Put("udp-127.0.0.1-53-0", rc); err != nil {
		t.Fatal(err)
	}
	msg, fds := recv()
	if msg != "FDSTORE=1\nFDPOLL=0\nFDNAME=udp-127.0.0.1-53-0" || len(fds) != 1 {
		t.Fatalf("got %q with %d fds", msg, len(fds))
	}
	if err := Fits(fds[0], localAddr(t, udp), true); err != nil {
		t.Fatalf("the stored descriptor: %v", err)
	}
	unix.Close(fds[0])
	if err := s.Remove("cache"); err != nil {
		t.Fatal(err)
	}
	if msg, fds := recv(); msg != "FDSTOREREMOVE=1\nFDNAME=cache" || len(fds) != 0 {
		t.Fatalf("got %q with %d fds", msg, len(fds))
	}
	if err := s.Remove("a:b"); err == nil {
		t.Fatal("a name with ':' was sent")
	}
	// systemd's own NOTIFY_SOCKET is abstract: "@/org/freedesktop/...".
	abstract := fmt.Sprintf("@dnsstandby-handover-test-%d", os.Getpid())
	arx, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: abstract, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer arx.Close()
	if err := (Store{socket: abstract}).Remove("cache"); err != nil {
		t.Fatalf("abstract NOTIFY_SOCKET: %v", err)
	}
	_ = arx.SetReadDeadline(timeSoon())
	if n, err := arx.Read(make([]byte, 64)); err != nil || n == 0 {
		t.Fatalf("abstract NOTIFY_SOCKET: read %d %v", n, err)
	}
	if err := (Store{}).Remove("cache"); err != nil {
		t.Fatalf("outside systemd: %v", err)
	}
}

func timeSoon() time.Time { return time.Now().Add(2 * time.Second) }
