package testkit

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// ChildEnv carries the action of a test binary that RunAs started. A
// package whose tests use RunAs checks it first thing in TestMain and, when
// it is set, does the action instead of running tests.
const ChildEnv = "DNSSTANDBY_TEST_CHILD"

// RunAs runs the test binary again as uid:gid, with ChildEnv set to action
// and the variables env ("NAME=value") added, and returns what it wrote
// and how it exited. The binary is copied to a directory any user may
// read (go test's own is root's alone), and the caller needs root to
// switch users. Files the child must reach need a path it may traverse:
// see PublicDir.
func RunAs(t testing.TB, uid, gid uint32, action string, env ...string) (string, error) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(PublicDir(t), filepath.Base(self))
	copyFile(t, self, bin, 0o755)
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(append(os.Environ(), ChildEnv+"="+action), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// PublicDir returns a new directory that every user may enter and read
// (mode 0755), removed when the test ends. t.TempDir's are root's alone.
func PublicDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "dnsstandby-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func copyFile(t testing.TB, from, to string, mode os.FileMode) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// FileEvents watches a directory with inotify from the moment it is
// called: Changed then tells, for a file in it, whether the file was
// created and whether its attributes (mode, owner) changed after. A file
// created and never changed has had its present mode since it existed.
type FileEvents struct {
	t  testing.TB
	fd int
}

// WatchDir starts watching dir; the watch ends with the test.
func WatchDir(t testing.TB, dir string) *FileEvents {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatalf("inotify: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_ATTRIB); err != nil {
		t.Fatalf("inotify watch %s: %v", dir, err)
	}
	return &FileEvents{t: t, fd: fd}
}

// Changed reads the events so far and reports those of the file name (a
// base name in the watched directory).
func (w *FileEvents) Changed(name string) (created, changed bool) {
	w.t.Helper()
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Read(w.fd, buf)
		if errors.Is(err, unix.EAGAIN) {
			return created, changed
		}
		if err != nil {
			w.t.Fatalf("read inotify events: %v", err)
		}
		for b := buf[:n]; len(b) >= unix.SizeofInotifyEvent; {
			mask := binary.NativeEndian.Uint32(b[4:])
			l := int(binary.NativeEndian.Uint32(b[12:]))
			ev := string(bytes.TrimRight(b[unix.SizeofInotifyEvent:unix.SizeofInotifyEvent+l], "\x00"))
			b = b[unix.SizeofInotifyEvent+l:]
			if ev != name {
				continue
			}
			created = created || mask&unix.IN_CREATE != 0
			changed = changed || mask&unix.IN_ATTRIB != 0
		}
	}
}
