package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// notifySocket stands in for systemd's notification socket: it sets
// NOTIFY_SOCKET for the test and returns the datagrams received.
func notifySocket(t *testing.T) <-chan string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("NOTIFY_SOCKET", path)
	got := make(chan string, 1000)
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			got <- string(buf[:n])
		}
	})
	t.Cleanup(func() { conn.Close(); wg.Wait() })
	return got
}

func TestNotifyReadyAndStopping(t *testing.T) {
	got := notifySocket(t)
	sd := notify{slog.New(slog.NewTextHandler(io.Discard, nil))}
	sd.ready("serving; mode mirror; steering adopt")
	sd.stopping()
	for _, want := range []string{"READY=1\nSTATUS=serving; mode mirror; steering adopt", "STOPPING=1\nSTATUS=draining"} {
		select {
		case m := <-got:
			if m != want {
				t.Errorf("got %q, want %q", m, want)
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("no %q", want)
		}
	}
}

// TestWatchdogPetsOnlyWhileHealthy: pets arrive every third of
// WATCHDOG_USEC while the serving loops are healthy, none while one is
// stuck, and they resume when it recovers.
func TestWatchdogPetsOnlyWhileHealthy(t *testing.T) {
	got := notifySocket(t)
	t.Setenv("WATCHDOG_USEC", "150000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	var stuck atomic.Bool
	healthy := func() error {
		if stuck.Load() {
			return errors.New("udp read loop 0 stuck for 6s")
		}
		return nil
	}
	var logs strings.Builder
	var mu sync.Mutex
	sd := notify{slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { sd.watchdog(ctx, healthy) })
	defer func() { cancel(); wg.Wait() }()

	pets := func(d time.Duration) int {
		n := 0
		for end := time.After(d); ; {
			select {
			case m := <-got:
				if m != "WATCHDOG=1" {
					t.Fatalf("unexpected notification %q", m)
				}
				n++
			case <-end:
				return n
			}
		}
	}
	if n := pets(500 * time.Millisecond); n < 3 {
		t.Fatalf("%d pets in 500ms with a 150ms watchdog, want at least 3", n)
	}
	stuck.Store(true)
	pets(100 * time.Millisecond) // one pet may have been on its way
	if n := pets(500 * time.Millisecond); n != 0 {
		t.Fatalf("%d pets while a serving loop is stuck", n)
	}
	stuck.Store(false)
	if n := pets(500 * time.Millisecond); n < 2 {
		t.Fatalf("%d pets after recovery, want them back", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logs.String(), "serving is stuck") || !strings.Contains(logs.String(), "serving again") {
		t.Errorf("log does not tell the stall and the recovery:\n%s", logs.String())
	}
}

func TestWatchdogOffWithoutSystemd(t *testing.T) {
	t.Setenv("WATCHDOG_USEC", "")
	done := make(chan struct{})
	go func() {
		notify{slog.New(slog.DiscardHandler)}.watchdog(context.Background(), func() error { return nil })
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("watchdog loop runs although the unit has no watchdog")
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestNotifyStepAside: a dnsstandby that finds another serving says
// READY (not STOPPING: systemd ignores READY=1 beside it), then waits (the barrier) until systemd has read
// them, so that the unit sees a clean stop, not a start that failed; a
// manager that does not read costs at most the barrier's timeout.
func TestNotifyStepAside(t *testing.T) {
	got := notifySocket(t)
	sd := notify{slog.New(slog.NewTextHandler(io.Discard, nil))}
	start := time.Now()
	sd.stepAside("another dnsstandby is running on this node (pid 42 holds /run/dnsstandby/dnsstandby.lock)")
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("stepAside took %v: the barrier did not see the message read", took)
	}
	for _, want := range []string{"READY=1\nSTATUS=another dnsstandby is running on this node (pid 42 holds /run/dnsstandby/dnsstandby.lock)", "BARRIER=1"} {
		select {
		case m := <-got:
			if m != want {
				t.Errorf("got %q, want %q", m, want)
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("no %q", want)
		}
	}

	// Nobody reads: the barrier gives up.
	path := filepath.Join(t.TempDir(), "deaf")
	deaf, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer deaf.Close()
	t.Setenv("NOTIFY_SOCKET", path)
	if err := barrier(100 * time.Millisecond); err == nil {
		t.Error("barrier returned nil with nobody reading")
	}
}
