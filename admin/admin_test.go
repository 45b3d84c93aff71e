package admin

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dnsstandby/dnsstandby/internal/testkit"
	"github.com/dnsstandby/dnsstandby/status"
)

// socketEnv names the socket a child (testkit.RunAs) sends its request to.
const socketEnv = "DNSSTANDBY_TEST_SOCKET"

// TestMain runs the child's action when this binary was started by
// testkit.RunAs: ask for a hold on the socket, and say how it went.
func TestMain(m *testing.M) {
	if action := os.Getenv(testkit.ChildEnv); action != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if action == "handover" {
			fmt.Println(askHandover(ctx, os.Getenv(socketEnv)))
			return
		}
		if _, err := Do(ctx, os.Getenv(socketEnv), Request{Cmd: action}); err != nil {
			fmt.Printf("refused: %v\n", err)
		} else {
			fmt.Println("served")
		}
		return
	}
	os.Exit(m.Run())
}

type fakeHandler struct {
	mu      sync.Mutex
	holding time.Duration
	held    bool
}

// Status reports the hold in the status's Holding, and its duration in
// Reason, where the test can read them back.
func (f *fakeHandler) Status() status.Daemon {
	f.mu.Lock()
	defer f.mu.Unlock()
	var st status.Daemon
	st.Holding, st.Reason = f.held, f.holding.String()
	return st
}

// fakeEpoch is when the fake's timed holds count from.
var fakeEpoch = time.Date(2026, 12, 4, 4, 0, 0, 0, time.UTC)

// Hold replaces the hold, as the controller does, and returns the one
// replaced; a timed one ends fakeEpoch plus its duration.
func (f *fakeHandler) Hold(d time.Duration) (Hold, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	was := Hold{Holding: f.held}
	if f.held && f.holding > 0 {
		was.Until = fakeEpoch.Add(f.holding)
	}
	f.held, f.holding = true, d
	return was, nil
}
func (f *fakeHandler) Release() error { f.mu.Lock(); f.held = false; f.mu.Unlock(); return nil }

func start(t *testing.T) (string, *fakeHandler) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "admin.sock")
	h := &fakeHandler{}
	s, err := Listen(path, h, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return path, h
}

func TestRequests(t *testing.T) {
	path, _ := start(t)
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, err %v; want 0600", fi.Mode().Perm(), err)
	}
	ctx := context.Background()
	tests := []struct {
		req      Request
		wantErr  string
		check    func(t *testing.T, st status.Daemon)
		replaced string // the answer's Replaced, as String says it; "": none
	}{
		{Request{Cmd: "status"}, "", func(t *testing.T, s status.Daemon) {
			if s.Holding {
				t.Errorf("status %+v", s)
			}
		}, ""},
		{Request{Cmd: "hold", For: "30s"}, "", func(t *testing.T, s status.Daemon) {
			if !s.Holding || s.Reason != "30s" {
				t.Errorf("status after hold %+v", s)
			}
		}, "no hold"},
		{Request{Cmd: "hold"}, "", func(t *testing.T, s status.Daemon) {
			if s.Reason != "0s" {
				t.Errorf("hold without duration: %+v", s)
			}
		}, "until 2026-12-04T04:00:30Z (timed)"},
		{Request{Cmd: "hold", For: "1m"}, "", func(t *testing.T, s status.Daemon) {
			if s.Reason != "1m0s" {
				t.Errorf("hold for 1m: %+v", s)
			}
		}, "until released"},
		{Request{Cmd: "release"}, "", func(t *testing.T, s status.Daemon) {
			if s.Holding {
				t.Errorf("status after release %+v", s)
			}
		}, ""},
		{Request{Cmd: "hold", For: "soon"}, `bad duration "soon"`, nil, ""},
		{Request{Cmd: "hold", For: "-5s"}, `bad duration "-5s"`, nil, ""},
		{Request{Cmd: "reboot"}, `unknown command "reboot"`, nil, ""},
	}
	for _, tt := range tests {
		resp, err := Do(ctx, path, tt.req)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%+v: error %v, want %q", tt.req, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%+v: %v", tt.req, err)
		}
		var st status.Daemon
		if err := json.Unmarshal(resp.Status, &st); err != nil {
			t.Fatal(err)
		}
		tt.check(t, st)
		if got := resp.Replaced; (got == nil) != (tt.replaced == "") || got != nil && got.String() != tt.replaced {
			t.Errorf("%+v: replaced %v, want %q", tt.req, got, tt.replaced)
		}
	}
}

func TestMalformedRequests(t *testing.T) {
	path, _ := start(t)
	for _, raw := range []string{"", "{", "not json", `{"cmd":"status","extra":1}`, strings.Repeat("x", 10000), "\x00\xff"} {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write([]byte(raw))
		_ = c.(*net.UnixConn).CloseWrite()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		var resp Response
		err = json.NewDecoder(c).Decode(&resp)
		c.Close()
		if err != nil || resp.OK || resp.Error == "" {
			t.Errorf("request %q: response %+v, err %v; want an error response", raw[:min(len(raw), 20)], resp, err)
		}
	}
	// Still serving.
	if _, err := Do(context.Background(), path, Request{Cmd: "status"}); err != nil {
		t.Fatalf("after malformed requests: %v", err)
	}
}

func TestStaleAndLiveSockets(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "admin.sock")
	// A stale socket file (its server gone) is replaced.
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	s, err := Listen(path, &fakeHandler{}, nil)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	defer s.Close()
	// A live one is not taken over.
	if _, err := Listen(path, &fakeHandler{}, nil); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second server on a live socket: %v", err)
	}
	// A regular file is left alone.
	file := filepath.Join(dir, "file")
	os.WriteFile(file, []byte("x"), 0o644)
	if _, err := Listen(file, &fakeHandler{}, nil); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("regular file: %v", err)
	}
}

func TestNoServer(t *testing.T) {
	_, err := Do(context.Background(), filepath.Join(t.TempDir(), "none.sock"), Request{Cmd: "status"})
	if err == nil || !strings.Contains(err.Error(), "is dnsstandby running") {
		t.Fatalf("error %v", err)
	}
}

// TestSocketModeFromCreation: the socket file is 0600 from the moment it
// exists. A watch on the directory, set before Listen, sees the file
// created and never chmod'ed afterwards, so the mode it has now is the
// mode bind gave it: there was no moment with a wider one. (Listening and
// then chmod'ing, as before, shows as a change, and under the usual umask
// 022 the file was 0755 until then; under umask 0, 0777: connectable by
// anyone.)
func TestSocketModeFromCreation(t *testing.T) {
	dir := t.TempDir()
	w := testkit.WatchDir(t, dir)
	path := filepath.Join(dir, "admin.sock")
	s, err := Listen(path, &fakeHandler{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, err %v; want 0600", fi.Mode(), err)
	}
	created, changed := w.Changed("admin.sock")
	if !created || changed {
		t.Fatalf("socket file created %v, its mode changed after %v: want created with 0600 and never changed", created, changed)
	}
}

// listenPublic serves h on a socket opened to everyone (mode 0666 in a
// directory anyone may enter), as if its mode had been loosened, so that
// only the peer check stands in the way. It is closed when the test ends.
func listenPublic(t *testing.T, h Handler) (*Server, string) {
	t.Helper()
	path := filepath.Join(testkit.PublicDir(t), "admin.sock")
	s, err := Listen(path, h, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	return s, path
}

// TestPeerCredentials: only root is served. The socket is opened to
// everyone here (mode 0666 in a directory anyone may enter), as if its
// mode had been loosened, so that only the peer check stands in the way;
// a child process connects as root, then as nobody.
func TestPeerCredentials(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to start a child as another user")
	}
	tests := []struct {
		name   string
		uid    uint32
		served bool
	}{
		{"root", 0, true},
		{"nobody", 65534, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &fakeHandler{}
			_, path := listenPublic(t, h)
			out, err := testkit.RunAs(t, tt.uid, tt.uid, "hold", socketEnv+"="+path)
			if err != nil {
				t.Fatalf("child: %v\n%s", err, out)
			}
			served := strings.HasPrefix(out, "served")
			if served != tt.served || h.Status().Holding != tt.served {
				t.Fatalf("uid %d: child says %q, holding %v; want served %v", tt.uid, strings.TrimSpace(out), h.Status().Holding, tt.served)
			}
		})
	}
}

// askHandover asks for a handover and says what came: "served N files"
// or "refused: ...". What a giver sends is package handover's business;
// the giver here sends one line with its files attached, and takes a line
// back as the reply.
func askHandover(ctx context.Context, path string) string {
	c, _, err := DialHandover(ctx, path)
	if err != nil {
		return "refused: " + err.Error()
	}
	defer c.Close()
	b, oob := make([]byte, 512), make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := c.ReadMsgUnix(b, oob)
	if err != nil {
		return "refused: " + err.Error()
	}
	var fds []int
	msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
	for i := range msgs {
		got, _ := unix.ParseUnixRights(&msgs[i])
		fds = append(fds, got...)
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	if len(fds) == 0 {
		return "refused: " + strings.TrimSpace(string(b[:n]))
	}
	_, _ = c.Write([]byte("ok\n"))
	return fmt.Sprintf("served %d files", len(fds))
}

// giver is a Handler that gives /dev/null and waits for the taker's line.
type giver struct {
	fakeHandler
	mu    sync.Mutex
	peers []int32
	err   error
}

func (g *giver) Give(c *net.UnixConn, peer *unix.Ucred) error {
	f, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer f.Close()
	_, _, err = c.WriteMsgUnix([]byte("offer\n"), unix.UnixRights(int(f.Fd())), nil)
	if err == nil {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		var line string
		if line, err = bufio.NewReader(c).ReadString('\n'); err == nil && line != "ok\n" {
			err = fmt.Errorf("reply %q", line)
		}
	}
	g.mu.Lock()
	g.peers, g.err = append(g.peers, peer.Pid), err
	g.mu.Unlock()
	return err
}

// TestHandoverRequest: a handover request reaches the Giver, with the
// peer's credentials, from root only; a handler that is not a Giver
// refuses it in words the taker reports.
func TestHandoverRequest(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to start a child as another user")
	}
	tests := []struct {
		name   string
		uid    uint32
		served bool
	}{
		{"root", 0, true},
		{"nobody", 65534, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := &giver{}
			s, path := listenPublic(t, g)
			out, err := testkit.RunAs(t, tt.uid, tt.uid, "handover", socketEnv+"="+path)
			if err != nil {
				t.Fatalf("child: %v\n%s", err, out)
			}
			s.Close()
			g.mu.Lock()
			defer g.mu.Unlock()
			if served := strings.HasPrefix(out, "served 1 files"); served != tt.served || (len(g.peers) == 1) != tt.served {
				t.Fatalf("uid %d: child says %q, Give called for %v; want served %v", tt.uid, strings.TrimSpace(out), g.peers, tt.served)
			}
			if tt.served && (g.peers[0] <= 0 || g.err != nil) {
				t.Errorf("Give: peer pid %d, reply %v", g.peers[0], g.err)
			}
		})
	}
	t.Run("not a giver", func(t *testing.T) {
		path, _ := start(t)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if out := askHandover(ctx, path); !strings.Contains(out, "handover: this process cannot hand over") {
			t.Errorf("asked a handler that cannot give: %q", out)
		}
	})
}
