package dnstap

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	fs "github.com/farsightsec/golang-framestream"

	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// socketEnv names the socket a child (testkit.RunAs) connects to.
const socketEnv = "DNSSTANDBY_TEST_SOCKET"

// TestMain runs the child's action when this binary was started by
// testkit.RunAs: begin a handshake on the socket and say whether the
// receiver answered it.
func TestMain(m *testing.M) {
	if os.Getenv(testkit.ChildEnv) != "" {
		fmt.Println(childHandshake(os.Getenv(socketEnv)))
		return
	}
	os.Exit(m.Run())
}

// childHandshake sends READY and reports "accepted" if ACCEPT comes back,
// "closed" if the receiver closes the connection instead.
func childHandshake(path string) string {
	c, err := net.DialTimeout("unix", path, testTimeout)
	if err != nil {
		return "dial: " + err.Error()
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(testTimeout))
	if _, err := c.Write(ctlFrame(fs.CONTROL_READY, ContentType)); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		return "closed" // the receiver closed before our write
	}
	var b [4]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return "no answer"
		}
		return "closed"
	}
	return "accepted"
}

// TestSocketModeFromCreation: the socket file is 0600 from the moment it
// exists. A watch on the directory, set before Listen, sees the file
// created and never chmod'ed afterwards, so its mode now is the mode bind
// gave it: there was no moment with a wider one (listening first and
// chmod'ing after, as before, shows as a change).
func TestSocketModeFromCreation(t *testing.T) {
	cfg := testConfig(t)
	w := testkit.WatchDir(t, filepath.Dir(cfg.Path))
	listen(t, cfg, func([]byte) error { return nil })
	fi, err := os.Lstat(cfg.Path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, err %v; want 0600", fi.Mode(), err)
	}
	created, changed := w.Changed(filepath.Base(cfg.Path))
	if !created || changed {
		t.Fatalf("socket file created %v, its mode changed after %v: want created with 0600 and never changed", created, changed)
	}
}

// TestPeerCredentials: only LocalDNS's user (PeerUID) and root get a
// handshake. The socket is opened to everyone here (mode 0666 in a
// directory anyone may enter), as if its mode had been loosened, so that
// only the peer check stands in the way; a child process connects as the
// user of each case.
func TestPeerCredentials(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to start a child as another user")
	}
	const nobody = 65534
	tests := []struct {
		name     string
		peerUID  uint32
		uid      uint32
		accepted bool
	}{
		{"root, PeerUID root", 0, 0, true},
		{"nobody, PeerUID root", 0, nobody, false},
		{"nobody, PeerUID nobody", nobody, nobody, true},
		{"root, PeerUID nobody", nobody, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Path = filepath.Join(testkit.PublicDir(t), "dnstap.sock")
			cfg.Mode, cfg.PeerUID = 0o666, tt.peerUID
			r := listen(t, cfg, func([]byte) error { return nil })
			out, err := testkit.RunAs(t, tt.uid, tt.uid, "handshake", socketEnv+"="+cfg.Path)
			if err != nil {
				t.Fatalf("child: %v\n%s", err, out)
			}
			out = strings.TrimSpace(out)
			want := "closed"
			if tt.accepted {
				want = "accepted"
			}
			if out != want {
				t.Fatalf("child uid %d: %q, want %q", tt.uid, out, want)
			}
			st := r.Stats()
			if tt.accepted != (st.ConnectionsTotal == 1) || tt.accepted == (st.Refused == 1) {
				t.Errorf("stats: %d connections, %d refused", st.ConnectionsTotal, st.Refused)
			}
		})
	}
}
