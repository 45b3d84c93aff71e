package nstest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

const (
	// stopTimeout bounds the wait for a SIGKILLed process group to be
	// reaped; the kernel needs milliseconds, so reaching it means a process
	// stuck in the kernel (D state), worth an error of its own.
	stopTimeout = 10 * time.Second
	// waitDelay bounds how long Wait keeps copying output after the process
	// exited, in case a grandchild kept the pipe open.
	waitDelay = time.Second
	// runTimeout bounds a command that Run (the test helper) runs to
	// completion; dig and friends finish in milliseconds here.
	runTimeout = time.Minute
	// outputLimit is how much of a background process's output is kept (the
	// tail): enough for a failing CoreDNS's start-up and last errors, bounded
	// for one that logs every query.
	outputLimit = 256 << 10
	// freezeTimeout bounds the wait for a SIGSTOPped process's threads to
	// stop; they need milliseconds, even on a loaded machine.
	freezeTimeout = 5 * time.Second
)

// ipCommand finds the `ip` binary once; root's PATH has it, a sudo'ed test
// binary's PATH may not.
var ipCommand = sync.OnceValue(func() string {
	if p, err := exec.LookPath("ip"); err == nil {
		return p
	}
	for _, p := range []string{"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return "ip"
})

// Command returns a command that runs name in the namespace through `ip
// netns exec` (so /etc/netns/NAME files are mounted over /etc for it). The
// command is the leader of a process group of its own, which is killed
// whole when ctx ends, and it gets SIGKILL if the test binary dies.
func (n *Namespace) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, ipCommand(), append([]string{"netns", "exec", n.name, name}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return killGroup(cmd.Process.Pid) }
	cmd.WaitDelay = waitDelay
	return cmd
}

// Run runs name in the namespace to completion and returns its standard
// output. Its error includes the command line and both outputs.
func (n *Namespace) Run(ctx context.Context, name string, args ...string) (string, error) {
	if err := n.usable(); err != nil {
		return "", err
	}
	if err := lookTool(name); err != nil {
		return "", fmt.Errorf("%s: %w", n.name, err)
	}
	var stdout, stderr bytes.Buffer
	cmd := n.Command(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s: %s: %w\nstdout:\n%s\nstderr:\n%s",
			n.name, strings.Join(append([]string{name}, args...), " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// Process is a command running in the background in a namespace.
type Process struct {
	ns   *Namespace // always non-nil
	cmd  *exec.Cmd
	out  *tailBuffer
	done chan struct{} // closed once the process is reaped
	err  error         // exit status, set before done closes

	stopOnce sync.Once
	stopErr  error
}

// Start starts name in the namespace in the background, with its combined
// output kept (the last 256 KiB). Stop it with Stop; the namespace's Close
// stops it too.
func (n *Namespace) Start(name string, args ...string) (*Process, error) {
	return n.StartIn("", name, args...)
}

// StartIn is Start with the working directory set to dir ("" for the
// caller's).
func (n *Namespace) StartIn(dir, name string, args ...string) (*Process, error) {
	return n.startIn(dir, "", name, args...)
}

// startIn is StartIn with the process started in the cgroup2 directory
// cgroup ("" for the caller's): there from its first instruction on, so
// that every socket it opens belongs to that cgroup (a socket keeps the
// cgroup it was made in).
func (n *Namespace) startIn(dir, cgroup, name string, args ...string) (*Process, error) {
	if err := lookTool(name); err != nil {
		return nil, fmt.Errorf("%s: %w", n.name, err)
	}
	p := &Process{ns: n, out: &tailBuffer{limit: outputLimit}, done: make(chan struct{})}
	p.cmd = n.Command(context.Background(), name, args...)
	p.cmd.Dir = dir
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if cgroup != "" {
		cg, err := os.Open(cgroup)
		if err != nil {
			return nil, fmt.Errorf("%s: start %s: open cgroup: %w", n.name, name, err)
		}
		defer cg.Close()
		p.cmd.SysProcAttr.UseCgroupFD, p.cmd.SysProcAttr.CgroupFD = true, int(cg.Fd())
	}

	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, fmt.Errorf("start %s: namespace %s is closed", name, n.name)
	}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: start %s: %w", n.name, name, err)
	}
	n.procs[p] = struct{}{}
	go func() {
		p.err = p.cmd.Wait()
		n.mu.Lock()
		delete(n.procs, p)
		n.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

func (p *Process) String() string {
	return fmt.Sprintf("%s[%d] in %s", p.cmd.Args[4], p.cmd.Process.Pid, p.ns.name)
}

// Pid is the process's id (`ip netns exec` executes the command in its own
// place, so this is the command itself).
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Output is the tail of what the process wrote to stdout and stderr so far.
func (p *Process) Output() string { return p.out.String() }

// Signal sends sig to the process (not its group).
func (p *Process) Signal(sig syscall.Signal) error {
	select {
	case <-p.done:
		return fmt.Errorf("signal %s: %w", p, os.ErrProcessDone)
	default:
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal %s: %w", p, err)
	}
	return nil
}

// Freeze stops the process with SIGSTOP and returns once every thread of
// it is stopped. kill(2) returns before that: the kernel wakes one thread to
// start the group stop, and until it has run, another thread woken by a
// packet can still answer it.
func (p *Process) Freeze() error {
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	var running int
	err := testkit.Poll(context.Background(), freezeTimeout, func() (bool, error) {
		var err error
		running, err = runningThreads(p.Pid())
		return running == 0, err
	})
	switch {
	case errors.Is(err, testkit.ErrNotWithin):
		return fmt.Errorf("freeze %s: %d threads not stopped %v after SIGSTOP", p, running, freezeTimeout)
	case err != nil:
		return fmt.Errorf("freeze %s: %w", p, err)
	}
	return nil
}

// runningThreads counts the threads of process pid not in the stopped
// state.
func runningThreads(pid int) (int, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, err
	}
	running := 0
	for _, task := range tasks {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			continue // the thread exited
		}
		// The state follows the parenthesised command name, which may
		// itself hold spaces and parentheses.
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) == 0 || (fields[0] != "T" && fields[0] != "t") {
			running++
		}
	}
	return running, nil
}

// Done is closed once the process has exited and been reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is the process's exit status (as exec.Cmd.Wait reports it) once Done
// is closed, and nil before.
func (p *Process) Err() error {
	select {
	case <-p.done:
		return p.err
	default:
		return nil
	}
}

// Stop kills the process's whole group with SIGKILL and waits until it is
// reaped. It does not report how the process exited (Err does), only a
// failure to stop it. Safe to call more than once.
func (p *Process) Stop() error {
	p.stopOnce.Do(func() {
		if err := killGroup(p.cmd.Process.Pid); err != nil {
			p.stopErr = fmt.Errorf("stop %s: %w", p, err)
			return
		}
		select {
		case <-p.done:
		case <-time.After(stopTimeout):
			p.stopErr = fmt.Errorf("stop %s: not reaped %v after SIGKILL", p, stopTimeout)
		}
	})
	return p.stopErr
}

// killGroup SIGKILLs the process group led by pid. A group that is gone
// already is no error.
func killGroup(pid int) error {
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}

// Start starts name in ns like ns.Start, stops it when the test ends, and
// then logs its output if the test failed.
func Start(t testing.TB, ns *Namespace, name string, args ...string) *Process {
	t.Helper()
	p, err := ns.Start(name, args...)
	if err != nil {
		t.Fatal(err)
	}
	stopWithTest(t, p)
	return p
}

func stopWithTest(t testing.TB, p *Process) {
	t.Cleanup(func() {
		if err := p.Stop(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("output of %s:\n%s", p, p.Output())
		}
	})
}

// Run runs name in ns to completion (at most a minute) and returns its
// standard output; it fails the test, showing both outputs, if the command
// fails.
func Run(t testing.TB, ns *Namespace, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), runTimeout)
	defer cancel()
	out, err := ns.Run(ctx, name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// tailBuffer keeps the last limit bytes written to it.
type tailBuffer struct {
	limit int

	mu      sync.Mutex // guards following
	buf     []byte
	dropped int64
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.limit; over > 0 {
		b.dropped += int64(over)
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.dropped > 0 {
		return fmt.Sprintf("[%d bytes dropped]\n%s", b.dropped, b.buf)
	}
	return string(b.buf)
}
