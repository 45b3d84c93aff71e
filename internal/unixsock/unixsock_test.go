package unixsock

import (
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// TestListenMode: the file has the mode asked for. When the umask (022
// here, as usual) lets bind give it all of the mode, the file is never
// chmod'ed: the mode it has was its mode from the start. When the umask
// took bits away, they are added back, which only widens the file to what
// was asked.
func TestListenMode(t *testing.T) {
	// This package's tests are not parallel: nothing else creates files
	// while the umask is set.
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	tests := []struct {
		mode        os.FileMode
		wantChanged bool
	}{
		{0o600, false},
		{0o640, false},
		{0o660, true}, // g+w was masked
		{0o666, true},
	}
	for _, tt := range tests {
		t.Run(tt.mode.String(), func(t *testing.T) {
			dir := t.TempDir()
			w := testkit.WatchDir(t, dir)
			path := filepath.Join(dir, "s.sock")
			ln, err := Listen(path, tt.mode)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			fi, err := os.Lstat(path)
			if err != nil || fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != tt.mode {
				t.Fatalf("file %v (%v), want a socket with mode %v", fi.Mode(), err, tt.mode)
			}
			if created, changed := w.Changed("s.sock"); !created || changed != tt.wantChanged {
				t.Errorf("created %v, changed after %v; want created, changed %v", created, changed, tt.wantChanged)
			}
		})
	}
}

// TestPeerCred: the credentials are the connecting process's, here ours.
func TestPeerCred(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	ln, err := Listen(path, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sc, err := ln.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	cred, err := PeerCred(sc)
	if err != nil {
		t.Fatal(err)
	}
	if int(cred.Uid) != os.Geteuid() || int(cred.Pid) != os.Getpid() {
		t.Errorf("peer %+v, want uid %d pid %d", cred, os.Geteuid(), os.Getpid())
	}
}
