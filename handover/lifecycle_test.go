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
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dnsstandby/dnsstandby/admin"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
	"github.com/dnsstandby/dnsstandby/status"
)

// These tests run the hand-off's three paths — a restart and an upgrade
// through systemd's store, and a surge handover over the admin socket —
// between two Handovers in one test process, each over a fake of the
// daemon (fakeServer: real sockets, caches of a few bytes) and, for the
// store, a fake of systemd that keeps what NOTIFY_SOCKET sends.

// fakeServer is handover.Server over real sockets and named caches.
type fakeServer struct {
	udp    []*net.UDPConn
	tcp    []*net.TCPListener
	caches map[string]string // key: its snapshot
}

func (s *fakeServer) Sockets() ([]Socket, error) {
	var out []Socket
	for _, c := range s.udp {
		rc, err := c.SyscallConn()
		if err != nil {
			return nil, err
		}
		out = append(out, Socket{Addr: c.LocalAddr().(*net.UDPAddr).AddrPort(), UDP: true, Conn: rc})
	}
	for _, l := range s.tcp {
		rc, err := l.SyscallConn()
		if err != nil {
			return nil, err
		}
		out = append(out, Socket{Addr: l.Addr().(*net.TCPAddr).AddrPort(), Conn: rc})
	}
	return out, nil
}

func (s *fakeServer) Caches() []CacheSave {
	var out []CacheSave
	for k, v := range s.caches {
		out = append(out, CacheSave{Key: k, Save: func(w io.Writer) (int, error) { _, err := io.WriteString(w, v); return 1, err }})
	}
	return out
}

func (s *fakeServer) close() {
	for _, c := range s.udp {
		c.Close()
	}
	for _, l := range s.tcp {
		l.Close()
	}
}

// fakeCache is what LoadCache fills.
type fakeCache struct{ got string }

func (c *fakeCache) Load(r io.Reader) (int, error) {
	b, err := io.ReadAll(r)
	c.got = string(b)
	return 1, err
}

// fakeSystemd is a unit's file descriptor store: it reads what Store
// sends to its NOTIFY_SOCKET and keeps one copy of each file by name, as
// systemd does, until FDSTOREREMOVE.
type fakeSystemd struct {
	t     *testing.T
	rx    *net.UnixConn
	path  string
	files map[string][]*os.File
}

func newFakeSystemd(t *testing.T) *fakeSystemd {
	path := filepath.Join(t.TempDir(), "notify")
	rx, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	sd := &fakeSystemd{t: t, rx: rx, path: path, files: map[string][]*os.File{}}
	t.Cleanup(func() {
		rx.Close()
		for _, fs := range sd.files {
			for _, f := range fs {
				f.Close()
			}
		}
	})
	return sd
}

// drain applies every message sent so far.
func (sd *fakeSystemd) drain() {
	for {
		_ = sd.rx.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		b, oob := make([]byte, 512), make([]byte, unix.CmsgSpace(4))
		n, oobn, _, _, err := sd.rx.ReadMsgUnix(b, oob)
		if err != nil {
			return
		}
		var fds []int
		msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
		for i := range msgs {
			got, _ := unix.ParseUnixRights(&msgs[i])
			fds = append(fds, got...)
		}
		kv := map[string]string{}
		for _, line := range strings.Split(string(b[:n]), "\n") {
			k, v, _ := strings.Cut(line, "=")
			kv[k] = v
		}
		name := kv["FDNAME"]
		switch {
		case kv["FDSTOREREMOVE"] == "1":
			for _, f := range sd.files[name] {
				f.Close()
			}
			delete(sd.files, name)
		case kv["FDSTORE"] == "1" && len(fds) == 1:
			f := os.NewFile(uintptr(fds[0]), name)
			if sd.has(f) {
				f.Close()
				continue
			}
			sd.files[name] = append(sd.files[name], f)
		default:
			sd.t.Errorf("fake systemd: unexpected %q with %d files", b[:n], len(fds))
		}
	}
}

// has says whether the store holds f's open file already.
func (sd *fakeSystemd) has(f *os.File) bool {
	var a unix.Stat_t
	if unix.Fstat(int(f.Fd()), &a) != nil {
		return false
	}
	for _, fs := range sd.files {
		for _, g := range fs {
			var b unix.Stat_t
			if unix.Fstat(int(g.Fd()), &b) == nil && a.Dev == b.Dev && a.Ino == b.Ino {
				return true
			}
		}
	}
	return false
}

func (sd *fakeSystemd) names() []string {
	var out []string
	for name, fs := range sd.files {
		for range fs {
			out = append(out, name)
		}
	}
	return out
}

// systemd is what the unit's next process gets: a copy of every stored
// file (LISTEN_FDS), and the store.
func (sd *fakeSystemd) systemd() Systemd {
	return Systemd{Store: Store{socket: sd.path}, Files: func() []*os.File {
		var out []*os.File
		for name, fs := range sd.files {
			for _, f := range fs {
				fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
				if err != nil {
					sd.t.Fatal(err)
				}
				out = append(out, os.NewFile(uintptr(fd), name))
			}
		}
		return out
	}}
}

// reuseUDP binds a UDP socket with SO_REUSEPORT, as the responder does.
func reuseUDP(t *testing.T, addr string) *net.UDPConn {
	t.Helper()
	f := listen(t, "udp4", addr, true)
	defer f.Close() // the conn has its own descriptor
	pc, err := net.FilePacketConn(f)
	if err != nil {
		t.Fatal(err)
	}
	return pc.(*net.UDPConn)
}

func reuseTCP(t *testing.T, addr string) *net.TCPListener {
	t.Helper()
	f := listen(t, "tcp4", addr, true)
	defer f.Close()
	l, err := net.FileListener(f)
	if err != nil {
		t.Fatal(err)
	}
	return l.(*net.TCPListener)
}

func addrOf(c *net.UDPConn) netip.AddrPort { return c.LocalAddr().(*net.UDPAddr).AddrPort() }

// sendTo sends one datagram to ap from a fresh client socket.
func sendTo(t *testing.T, ap netip.AddrPort, msg string) {
	t.Helper()
	c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(ap))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
}

// readOne reads the datagram waiting on c.
func readOne(t *testing.T, c *net.UDPConn) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	b := make([]byte, 512)
	n, err := c.Read(b)
	if err != nil {
		t.Fatalf("the datagram sent while no process read: %v", err)
	}
	return string(b[:n])
}

// TestRestartAndUpgrade: the first process stores its sockets once it
// serves and its caches at stop; a datagram sent while no process reads
// waits on the stored socket; the next process (the same listen
// addresses for a restart; one dropped and one added for an upgrade that
// changes them) takes the sockets and the caches, reads the datagram,
// binds what it was not passed, closes and removes from the store what
// it does not serve, and removes the consumed cache file. The lock is
// the first's until it closes, then the next's.
func TestRestartAndUpgrade(t *testing.T) {
	tests := []struct {
		name    string
		keepB   bool // the next process serves B too
		wantOut []string
	}{
		{"restart", true, []string{"udp-127.0.0.1", "udp-127.0.0.2"}},
		{"upgrade", false, []string{"udp-127.0.0.1", "udp-127.0.0.3"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			sd := newFakeSystemd(t)
			lock := filepath.Join(t.TempDir(), "dnsstandby.lock")
			a, b := reuseUDP(t, "127.0.0.1:0"), reuseUDP(t, "127.0.0.2:0")
			apA, apB := addrOf(a), addrOf(b)
			keyA := CacheKey(apA, ".")

			h1, err := Begin(ctx, Config{LockFile: lock, Listen: []netip.AddrPort{apA, apB}, CacheLimit: 1 << 20, Logger: testkit.Logger(t)}, sd.systemd())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := Begin(ctx, Config{LockFile: lock}, Systemd{}); !errors.Is(err, ErrRunning) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d holds", os.Getpid())) {
				t.Fatalf("a second Begin: %v, want ErrRunning naming pid %d", err, os.Getpid())
			}
			srv1 := &fakeServer{udp: []*net.UDPConn{a, b}, caches: map[string]string{keyA: "cache of A", LastGoodKey: "last good"}}
			if err := h1.Serving(srv1); err != nil {
				t.Fatal(err)
			}
			sd.drain()
			if got := strings.Join(sd.names(), " "); !strings.Contains(got, "udp-127.0.0.1-") || !strings.Contains(got, "udp-127.0.0.2-") {
				t.Fatalf("stored once serving: %q, want both sockets", got)
			}
			if h1.Stop() {
				t.Fatal("Stop says it gave a surge handover")
			}
			sd.drain()
			if len(sd.files[CacheName]) != 1 {
				t.Fatalf("stored at stop: %q, want the cache file", sd.names())
			}
			// The first process exits: its lock and sockets go.
			if err := h1.Close(); err != nil {
				t.Fatal(err)
			}
			srv1.close()
			sendTo(t, apA, "query while none reads")

			listen := []netip.AddrPort{apA, apB}
			if !tt.keepB {
				listen = []netip.AddrPort{apA, netip.MustParseAddrPort("127.0.0.3:0")}
			}
			h2, err := Begin(ctx, Config{LockFile: lock, Listen: listen, CacheLimit: 1 << 20, Logger: testkit.Logger(t)}, sd.systemd())
			if err != nil {
				t.Fatalf("the next process: %v", err)
			}
			defer h2.Close()
			in := h2.Inherited()
			if in == nil {
				t.Fatal("nothing inherited")
			}
			a2 := in.TakeUDP(apA)
			if a2 == nil {
				t.Fatal("A's socket not taken")
			}
			defer a2.Close()
			if got := readOne(t, a2); got != "query while none reads" {
				t.Fatalf("read %q", got)
			}
			var c fakeCache
			if !h2.LoadCache(keyA, &c, testkit.Logger(t)) || c.got != "cache of A" {
				t.Fatalf("cache of A: %q", c.got)
			}
			if got := string(h2.Cache(LastGoodKey)); got != "last good" {
				t.Fatalf("last good: %q", got)
			}
			srv2 := &fakeServer{udp: []*net.UDPConn{a2}}
			if tt.keepB {
				b2 := in.TakeUDP(apB)
				if b2 == nil {
					t.Fatal("B's socket not taken")
				}
				srv2.udp = append(srv2.udp, b2)
			} else {
				srv2.udp = append(srv2.udp, reuseUDP(t, "127.0.0.3:0"))
			}
			defer srv2.close()
			if err := h2.Serving(srv2); err != nil {
				t.Fatal(err)
			}
			sd.drain()
			var got []string
			for _, n := range sd.names() {
				got = append(got, n[:strings.LastIndex(n[:strings.LastIndex(n, "-")], "-")])
			}
			slices.Sort(got)
			if !slices.Equal(got, tt.wantOut) {
				t.Fatalf("the store after the next process serves: %q, want %q (the cache file consumed)", sd.names(), tt.wantOut)
			}
			if !tt.keepB {
				// B is closed everywhere: bound without SO_REUSEPORT now.
				if c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(apB)); err != nil {
					t.Fatalf("B still bound after the upgrade dropped it: %v", err)
				} else {
					c.Close()
				}
			}
			if _, err := lockInstance(lock); !errors.Is(err, ErrRunning) {
				t.Fatalf("the lock after the next process started: %v, want held", err)
			}
		})
	}
}

// giver serves the admin socket as the daemon does: Give is the
// Handover's.
type giver struct{ h *Handover }

func (giver) Status() status.Daemon                          { return status.Daemon{} }
func (giver) Hold(time.Duration) (admin.Hold, error)         { return admin.Hold{}, nil }
func (giver) Release() error                                 { return nil }
func (g giver) Give(c *net.UnixConn, peer *unix.Ucred) error { return g.h.Give(c, peer) }

// TestSurge: a second process with From, while the first holds the
// lock, gets the first's sockets (the same kernel sockets: a datagram
// sent to the address waits for whichever reads), its caches and its
// lock's open file; the first serves on until the second replies, and a
// second that fails before it serves leaves the first as it was. Once
// the second serves, the first has given (its Stop writes nothing),
// and the lock, never free, holds the second's PID.
func TestSurge(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the admin socket hands over to root only")
	}
	ctx := context.Background()
	dir := t.TempDir()
	lock, sock := filepath.Join(dir, "dnsstandby.lock"), filepath.Join(dir, "admin.sock")
	a := reuseUDP(t, "127.0.0.1:0")
	apA := addrOf(a)
	l := reuseTCP(t, apA.String())
	keyA := CacheKey(apA, ".")
	cfg := Config{LockFile: lock, From: sock, Listen: []netip.AddrPort{apA}, CacheLimit: 1 << 20, GiverStop: time.Second, Logger: testkit.Logger(t)}

	h1, err := Begin(ctx, Config{LockFile: lock, Listen: cfg.Listen, CacheLimit: 1 << 20, Logger: testkit.Logger(t)}, Systemd{})
	if err != nil {
		t.Fatal(err)
	}
	defer h1.Close()
	srv1 := &fakeServer{udp: []*net.UDPConn{a}, tcp: []*net.TCPListener{l}, caches: map[string]string{keyA: "cache of A"}}
	defer srv1.close()
	if err := h1.Serving(srv1); err != nil {
		t.Fatal(err)
	}
	as, err := admin.Listen(sock, giver{h1}, testkit.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer as.Close()

	// Without From: refused, the first untouched.
	if _, err := Begin(ctx, Config{LockFile: lock}, Systemd{}); !errors.Is(err, ErrRunning) {
		t.Fatalf("Begin without From: %v, want ErrRunning", err)
	}
	// A taker that fails before it serves: the first serves on and may
	// give again.
	failed, err := Begin(ctx, cfg, Systemd{})
	if err != nil {
		t.Fatal(err)
	}
	failed.Close()
	testkit.Eventually(t, 5*time.Second, "the first to take its refusal", func() bool { return !h1.giving.Load() })
	if h1.Gave() {
		t.Fatal("the first gave to a taker that failed")
	}
	if _, err := Begin(ctx, Config{LockFile: lock}, Systemd{}); !errors.Is(err, ErrRunning) {
		t.Fatalf("the lock after a failed taker: %v, want still held", err)
	}

	h2, err := Begin(ctx, cfg, Systemd{})
	if err != nil {
		t.Fatal(err)
	}
	defer h2.Close()
	in := h2.Inherited()
	a2, l2 := in.TakeUDP(apA), in.TakeTCP(apA)
	if a2 == nil || l2 == nil {
		t.Fatalf("taken: udp %v, tcp %v", a2, l2)
	}
	srv2 := &fakeServer{udp: []*net.UDPConn{a2}, tcp: []*net.TCPListener{l2}}
	defer srv2.close()
	sendTo(t, apA, "query during the handover")
	if got := readOne(t, a2); got != "query during the handover" {
		t.Fatalf("read %q", got)
	}
	var c fakeCache
	if !h2.LoadCache(keyA, &c, testkit.Logger(t)) || c.got != "cache of A" {
		t.Fatalf("cache of A: %q", c.got)
	}
	if h1.Gave() {
		t.Fatal("the first gave before the second served")
	}
	if err := h2.Serving(srv2); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h1.GaveC():
	case <-time.After(5 * time.Second):
		t.Fatal("the first did not give once the second served")
	}
	if h1.GaveTo() != os.Getpid() {
		t.Errorf("GaveTo %d, want %d", h1.GaveTo(), os.Getpid())
	}
	if !h1.Stop() {
		t.Error("the giver's Stop does not say it gave: it would write the snapshots beside the taker")
	}
	if err := h1.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := lockInstance(lock); !errors.Is(err, ErrRunning) {
		t.Fatalf("the lock after the giver closed: %v, want held by the taker", err)
	}
	if b, err := os.ReadFile(lock); err != nil || !bytes.Equal(bytes.TrimSpace(b), []byte(fmt.Sprint(os.Getpid()))) {
		t.Fatalf("the lock file holds %q (%v), want the taker's PID", b, err)
	}
	// The giver's admin socket is for the taker to bind once it is gone.
	as.Close()
	bound := 0
	err = h2.AfterGiver(ctx, "admin socket", func() error {
		bound++
		s, err := admin.Listen(sock, giver{h2}, testkit.Logger(t))
		if err == nil {
			s.Close()
		}
		return err
	})
	if err != nil || bound != 1 {
		t.Fatalf("the taker's admin socket: %v after %d tries", err, bound)
	}
}
