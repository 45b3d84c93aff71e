package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// instance is a `dnsstandby run` started in the node namespace: its
// output, and its exit once it came.
type instance struct {
	cmd    *exec.Cmd
	out    *lockedBuffer
	exited chan struct{}
	err    error // Wait's, once exited is closed
}

func (l *lab) startInstance(t *testing.T, args ...string) *instance {
	t.Helper()
	args = append([]string{"run", "--metrics-addr", "127.0.0.1:9355", "--log-format", "text", "--anchor-kind", "bridge",
		"--listen", standbyAddr, "--upstream", kubeDNS}, args...)
	in := &instance{cmd: l.node.Command(context.Background(), binary, args...), out: &lockedBuffer{}, exited: make(chan struct{})}
	in.cmd.Stdout, in.cmd.Stderr = in.out, in.out
	if err := in.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { in.err = in.cmd.Wait(); close(in.exited) }()
	t.Cleanup(func() {
		_ = in.cmd.Process.Signal(syscall.SIGKILL)
		<-in.exited
		if t.Failed() {
			t.Logf("dnsstandby[%d] output:\n%s", in.cmd.Process.Pid, in.out.String())
		}
	})
	return in
}

// waitLog waits until the instance logged want; it fails if it exits first.
func (in *instance) waitLog(t *testing.T, within time.Duration, want string) {
	t.Helper()
	testkit.Eventually(t, within, "dnsstandby logs "+want, func() bool {
		if strings.Contains(in.out.String(), want) {
			return true
		}
		select {
		case <-in.exited:
			t.Fatalf("dnsstandby[%d] exited (%v) before logging %q:\n%s", in.cmd.Process.Pid, in.err, want, in.out.String())
		default:
		}
		return false
	})
}

// TestSurgeHandover: instance A serves alone (LocalDNS absent, kube-dns
// gone: a takeover from its cache); a second instance without
// --handover-from exits 75 and changes nothing; B, started with it, takes
// A's sockets, cache and lock while queries flow every millisecond or
// two: none is lost, B answers from A's cache (its own state directory
// is empty and kube-dns is gone), A exits 75 (another serves the node)
// logging the handover with
// both PIDs, and B's status says it serves.
func TestSurgeHandover(t *testing.T) {
	l := newLab(t)
	dir := t.TempDir()
	lock, sock := filepath.Join(dir, "dnsstandby.lock"), filepath.Join(dir, "admin.sock")
	const warm = "kubernetes.default.svc.cluster.local."

	a := l.startInstance(t, "--lock-file", lock, "--admin-socket", sock, "--state-dir", t.TempDir())
	a.waitLog(t, 15*time.Second, "dnsstandby ready")
	m := new(dns.Msg)
	m.SetQuestion(warm, dns.TypeA)
	if r := l.ask(t, "udp", standbyAddr, m); r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
		t.Fatalf("A: %v", r)
	}
	if err := l.kubeDNS.Close(); err != nil {
		t.Logf("stop kube-dns: %v", err)
	}

	// Without the flag: exit 75, one line, A untouched.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	out, err := l.node.Run(ctx, binary, "run", "--listen", standbyAddr, "--upstream", kubeDNS, "--metrics-addr", "127.0.0.1:9356",
		"--anchor-kind", "bridge", "--admin-socket", filepath.Join(dir, "other.sock"), "--state-dir", t.TempDir(), "--lock-file", lock)
	cancel()
	if err == nil || !strings.Contains(err.Error(), "exit status 75") || !strings.Contains(err.Error(), "another dnsstandby is running on this node") {
		t.Fatalf("second run without --handover-from: %v %q, want exit 75 saying another runs", err, out)
	}
	if r := l.ask(t, "udp", standbyAddr, m); r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
		t.Fatalf("A after the refused second run: %v", r)
	}

	// Queries throughout, one at a time, each given a second.
	var sent, lost atomic.Int64
	var worst atomic.Int64 // slowest answer, in µs
	qctx, stopQueries := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for qctx.Err() == nil {
			start := time.Now()
			sent.Add(1)
			r, err := l.node.Exchange("udp", "", standbyAddr, m, time.Second)
			if err != nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
				lost.Add(1)
				t.Logf("query %d: %v %v", sent.Load(), r, err)
			}
			if us := time.Since(start).Microseconds(); us > worst.Load() {
				worst.Store(us)
			}
			time.Sleep(time.Millisecond)
		}
	})
	defer func() { stopQueries(); wg.Wait() }()
	time.Sleep(300 * time.Millisecond)

	b := l.startInstance(t, "--lock-file", lock, "--admin-socket", sock, "--state-dir", t.TempDir(), "--handover-from", sock)
	b.waitLog(t, 20*time.Second, "dnsstandby ready")
	select {
	case <-a.exited:
	case <-time.After(15 * time.Second):
		t.Fatalf("A still runs after the handover:\n%s", a.out.String())
	}
	if ee, ok := a.err.(*exec.ExitError); !ok || ee.ExitCode() != 75 {
		t.Fatalf("A exited with %v, want 75 (another serves the node):\n%s", a.err, a.out.String())
	}
	time.Sleep(500 * time.Millisecond)
	stopQueries()
	wg.Wait()
	t.Logf("%d queries, %d lost, slowest %v", sent.Load(), lost.Load(), time.Duration(worst.Load())*time.Microsecond)
	if lost.Load() != 0 || sent.Load() < 100 {
		t.Errorf("%d of %d queries lost across the handover", lost.Load(), sent.Load())
	}

	apid, bpid := a.cmd.Process.Pid, b.cmd.Process.Pid
	t.Logf("A[%d]:\n%s\nB[%d]:\n%s", apid, grepLines(a.out.String(), "handover", "stopped"), bpid, grepLines(b.out.String(), "handover", "ready"))
	gave := grepLines(a.out.String(), fmt.Sprintf("handover: gave 1 sockets and a warm cache to PID %d", bpid))
	if gave == "" {
		// UDP and TCP: two sockets per address.
		gave = grepLines(a.out.String(), fmt.Sprintf("handover: gave 2 sockets and a warm cache to PID %d", bpid))
	}
	if !strings.Contains(gave, fmt.Sprintf("pid=%d ", apid)) {
		t.Errorf("A's handover line %q lacks its PID:\n%s", gave, grepLines(a.out.String(), "handover"))
	}
	bout := b.out.String()
	if line := grepLines(bout, fmt.Sprintf("handover: serving in place of PID %d", apid)); !strings.Contains(line, fmt.Sprintf("pid=%d ", bpid)) {
		t.Errorf("B's handover line %q lacks its PID:\n%s", line, grepLines(bout, "handover"))
	}
	if !strings.Contains(bout, "cache loaded from the previous process") || strings.Contains(bout, "cache snapshot loaded") {
		t.Errorf("B did not start from A's cache:\n%s", grepLines(bout, "cache", "handover"))
	}
	if line := grepLines(bout, "handover: took 2 sockets"); line == "" {
		t.Errorf("B did not take A's sockets:\n%s", grepLines(bout, "handover"))
	}

	// B's status: served from the admin socket A left, in takeover.
	var st struct {
		Mode string `json:"mode"`
		PID  int    `json:"pid"`
	}
	testkit.Eventually(t, 10*time.Second, "B's status", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		out, err := l.node.Run(ctx, binary, "status", "--json", "--admin-socket", sock)
		return err == nil && json.Unmarshal([]byte(out), &st) == nil && st.Mode != ""
	})
	if st.Mode != "takeover" || st.PID != b.cmd.Process.Pid {
		t.Errorf("B's status: mode %q, pid %d; want takeover, pid %d", st.Mode, st.PID, b.cmd.Process.Pid)
	}
	if r := l.ask(t, "tcp", standbyAddr, m); r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
		t.Fatalf("B over TCP: %v", r)
	}
	// The lock is B's now: its PID in the file, and a third run refused.
	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := l.node.Run(ctx, binary, "run", "--listen", standbyAddr, "--upstream", kubeDNS, "--metrics-addr", "127.0.0.1:9356",
		"--anchor-kind", "bridge", "--admin-socket", "", "--state-dir", t.TempDir(), "--lock-file", lock); err == nil ||
		!strings.Contains(err.Error(), fmt.Sprintf("pid %d holds", bpid)) {
		t.Errorf("a run after the handover: %v, want exit 75 naming B's PID %d", err, bpid)
	}
}
