package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// fakeStore is systemd's file descriptor store as a process sees it: a
// NOTIFY_SOCKET that keeps what FDSTORE=1 sends, under its FDNAME, one
// copy per open file, and drops what FDSTOREREMOVE=1 names.
type fakeStore struct {
	conn *net.UnixConn
	path string
	done chan struct{}

	mu    sync.Mutex
	names []string
	files []*os.File
}

func newFakeStore(t *testing.T) *fakeStore {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	s := &fakeStore{conn: conn, path: path, done: make(chan struct{})}
	go s.serve()
	t.Cleanup(func() {
		conn.Close()
		<-s.done
		for _, f := range s.files {
			f.Close()
		}
	})
	return s
}

func (s *fakeStore) serve() {
	defer close(s.done)
	b, oob := make([]byte, 4096), make([]byte, 1024)
	for {
		n, oobn, _, _, err := s.conn.ReadMsgUnix(b, oob)
		if err != nil {
			return
		}
		var fds []int
		msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
		for _, m := range msgs {
			got, _ := unix.ParseUnixRights(&m)
			fds = append(fds, got...)
		}
		kv := map[string]string{}
		for line := range strings.SplitSeq(string(b[:n]), "\n") {
			if k, v, ok := strings.Cut(line, "="); ok {
				kv[k] = v
			}
		}
		s.mu.Lock()
		switch {
		case kv["FDSTORE"] == "1":
			for _, fd := range fds {
				if s.holds(fd) {
					unix.Close(fd)
					continue
				}
				s.names = append(s.names, kv["FDNAME"])
				s.files = append(s.files, os.NewFile(uintptr(fd), kv["FDNAME"]))
			}
			fds = nil
		case kv["FDSTOREREMOVE"] == "1":
			for i := len(s.names) - 1; i >= 0; i-- {
				if s.names[i] == kv["FDNAME"] {
					s.files[i].Close()
					s.names = slices.Delete(s.names, i, i+1)
					s.files = slices.Delete(s.files, i, i+1)
				}
			}
		}
		s.mu.Unlock()
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
}

// holds says whether fd is an open file the store has already, as
// systemd compares them.
func (s *fakeStore) holds(fd int) bool {
	var a unix.Stat_t
	if unix.Fstat(fd, &a) != nil {
		return false
	}
	for _, f := range s.files {
		var b unix.Stat_t
		if unix.Fstat(int(f.Fd()), &b) == nil && a.Dev == b.Dev && a.Ino == b.Ino {
			return true
		}
	}
	return false
}

// contents returns the stored names and files (the store keeps them).
func (s *fakeStore) contents() ([]string, []*os.File) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.names), slices.Clone(s.files)
}

// copies returns the stored names and a copy of each file, as systemd
// passes them to the next process; the caller closes the copies. They
// are made under the store's lock: the store closes a file it is told to
// remove, and the new process may tell it so while it starts.
func (s *fakeStore) copies(t *testing.T) ([]string, []*os.File) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	files := make([]*os.File, len(s.files))
	for i, f := range s.files {
		fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		files[i] = os.NewFile(uintptr(fd), f.Name())
		t.Cleanup(func() { files[i].Close() })
	}
	return slices.Clone(s.names), files
}

func (s *fakeStore) has(name string) bool {
	names, _ := s.contents()
	return slices.Contains(names, name)
}

// lockedBuffer collects a process's output.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// startUnderStore runs `dnsstandby run` in the node namespace as systemd
// runs a unit with a file descriptor store: NOTIFY_SOCKET is the store,
// and the files given are passed as systemd passes the stored ones
// (fds from 3, LISTEN_FDS, LISTEN_FDNAMES, LISTEN_PID the process's own).
func (l *lab) startUnderStore(t *testing.T, store *fakeStore, stateDir, lock string, names []string, files []*os.File) (*exec.Cmd, *lockedBuffer) {
	t.Helper()
	args := []string{"-c", `LISTEN_PID=$$ exec "$0" "$@"`, binary, "run", "--metrics-addr", "127.0.0.1:9355", "--log-format", "text",
		"--anchor-kind", "bridge", "--admin-socket", "", "--state-dir", stateDir, "--lock-file", lock,
		"--listen", standbyAddr, "--upstream", kubeDNS}
	cmd := l.node.Command(context.Background(), "sh", args...)
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+store.path)
	if len(files) > 0 {
		cmd.Env = append(cmd.Env, fmt.Sprintf("LISTEN_FDS=%d", len(files)), "LISTEN_FDNAMES="+strings.Join(names, ":"))
		cmd.ExtraFiles = files
	}
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-exited
		if t.Failed() {
			t.Logf("dnsstandby[%d] output:\n%s", cmd.Process.Pid, out.String())
		}
	})
	s := &standby{metrics: "127.0.0.1:9355"}
	testkit.Eventually(t, 15*time.Second, "dnsstandby ready", func() bool {
		select {
		case <-exited:
			t.Fatalf("dnsstandby exited:\n%s", out.String())
		default:
		}
		code, _, err := l.get(s, "/readyz")
		return err == nil && code == http.StatusOK
	})
	return cmd, out
}

// stopAndWait sends SIGTERM and waits for the process to exit.
func stopAndWait(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 15*time.Second, "dnsstandby exited", func() bool {
		return errors.Is(cmd.Process.Signal(syscall.Signal(0)), os.ErrProcessDone)
	})
}

// TestHandoverFdStore restarts dnsstandby as systemd does with a file
// descriptor store, kube-dns gone in between (a takeover): the second
// process answers on the first's sockets without binding (a query sent
// while no process ran is answered by the second), from the first's
// cache alone (its state directory is empty), refuses a stray socket and
// removes it from the store, and logs the handover with both PIDs.
func TestHandoverFdStore(t *testing.T) {
	l := newLab(t)
	store := newFakeStore(t)
	lock := filepath.Join(t.TempDir(), "dnsstandby.lock")
	const warm = "kubernetes.default.svc.cluster.local."

	first, firstOut := l.startUnderStore(t, store, t.TempDir(), lock, nil, nil)
	m := new(dns.Msg)
	m.SetQuestion(warm, dns.TypeA)
	if r := l.ask(t, "udp", standbyAddr, m); r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
		t.Fatalf("first process: %v", r)
	}
	testkit.Eventually(t, 5*time.Second, "sockets stored", func() bool {
		return store.has("udp-169.254.10.11-53-0") && store.has("tcp-169.254.10.11-53-0")
	})
	stopAndWait(t, first)
	if !store.has("cache") {
		t.Fatalf("no cache in the store after the first stopped:\n%s", firstOut.String())
	}
	if !strings.Contains(firstOut.String(), "handover: caches stored for the next process") {
		t.Fatalf("first process did not log storing its caches:\n%s", firstOut.String())
	}

	// kube-dns gone: the second process can answer only from the cache.
	if err := l.kubeDNS.Close(); err != nil {
		t.Logf("stop kube-dns: %v", err)
	}
	// A query while no process reads: it waits on the stored socket.
	conn, err := l.node.Dial("udp", "", standbyAddr, timeout)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	queued := new(dns.Msg)
	queued.SetQuestion(warm, dns.TypeA)
	raw, err := queued.Pack()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(raw); err != nil {
		t.Fatal(err)
	}

	// A stray socket in the store: bound elsewhere, it must be refused.
	var stray *os.File
	must(t, l.node.Do(func() error {
		pc, err := net.ListenPacket("udp4", asideAddr)
		if err != nil {
			return err
		}
		defer pc.Close()
		stray, err = pc.(*net.UDPConn).File()
		return err
	}))
	store.mu.Lock()
	store.names, store.files = append(store.names, "udp-stray"), append(store.files, stray) // the store holds it now
	store.mu.Unlock()
	names, files := store.copies(t)

	second, secondOut := l.startUnderStore(t, store, t.TempDir(), lock, names, files)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 4096)
	n, err := conn.Read(b)
	if err != nil {
		t.Fatalf("the query sent while no process ran: %v", err)
	}
	r := new(dns.Msg)
	if err := r.Unpack(b[:n]); err != nil || r.Id != queued.Id || r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
		t.Fatalf("the query sent while no process ran: %v %v", r, err)
	}

	out := secondOut.String()
	line := grepLines(out, "handover: took 2 sockets and a warm cache from the previous process")
	for _, want := range []string{fmt.Sprintf("from_pid=%d ", first.Process.Pid), fmt.Sprintf(" pid=%d ", second.Process.Pid)} {
		if !strings.Contains(line, want) {
			t.Fatalf("second process's handover line %q lacks %q:\n%s", line, want, grepLines(out, "handover", "listening"))
		}
	}
	for _, bad := range []string{"steering not attached", "cache snapshot loaded"} {
		if strings.Contains(out, bad) {
			t.Fatalf("second process logged %q:\n%s", bad, out)
		}
	}
	if !strings.Contains(out, "inherited socket not needed") {
		t.Fatalf("the stray socket was not refused:\n%s", grepLines(out, "handover"))
	}
	testkit.Eventually(t, 5*time.Second, "stray socket and cache file removed from the store", func() bool {
		return !store.has("udp-stray") && !store.has("cache")
	})
	if r := l.ask(t, "tcp", standbyAddr, m); r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
		t.Fatalf("second process over TCP: %v", r)
	}
	stopAndWait(t, second)
}
