// Package benchcmd is what the benchmark commands (peers, mirrorcost) do
// around their measurements: run under a context that SIGINT and SIGTERM
// end, check the machine before creating anything, keep themselves off the
// servers' CPU, record the servers with perf on request, and write their
// results as JSON.
package benchcmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dnsstandby/dnsstandby/bench/internal/procstat"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

// Main parses the command line with parse and runs run with what it
// returned, under a context that SIGINT and SIGTERM end. It exits 2 if
// parse fails, 1 if run does, each after a line "name: error".
func Main[O any](name string, parse func() (O, error), run func(context.Context, O) error) {
	o, err := parse()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err = run(ctx, o)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

// CheckSplit checks the flags every command has: -duration is dnsperf's -l
// (whole seconds), and the servers' CPU is not the client's.
func CheckSplit(duration time.Duration, serverCPU, clientCPU int) error {
	if duration < time.Second || duration%time.Second != 0 {
		return fmt.Errorf("-duration %v: want whole seconds, at least 1 (dnsperf -l)", duration)
	}
	if serverCPU == clientCPU {
		return errors.New("-server-cpu and -client-cpu must differ")
	}
	return nil
}

// Preflight is what a run needs, checked before anything is created, so
// that a missing tool says so at once instead of after a minute of
// measuring.
type Preflight struct {
	// RootFor says why the command needs root.
	RootFor string
	// CPUs must be available to this process.
	CPUs []int
	// CoreDNS, if it points at "", is set to nstest.FindCoreDNS's binary.
	CoreDNS *string
	// Tools must be on $PATH; Packages are the Debian packages that have
	// them, for the error.
	Tools    []string
	Packages string
	// Binaries must exist; each is made absolute. Make is the make target
	// that builds them, for the error.
	Binaries []*string
	Make     string
}

// Check checks, in order: root, the CPUs, CoreDNS, the tools and the
// binaries.
func (p Preflight) Check() error {
	if os.Geteuid() != 0 {
		return errors.New("needs root: " + p.RootFor)
	}
	var allowed unix.CPUSet
	if err := unix.SchedGetaffinity(0, &allowed); err != nil {
		return fmt.Errorf("CPU affinity: %w", err)
	}
	for _, cpu := range p.CPUs {
		if !allowed.IsSet(cpu) {
			return fmt.Errorf("CPU %d is not available to this process (it may use %d CPUs)", cpu, allowed.Count())
		}
	}
	if p.CoreDNS != nil && *p.CoreDNS == "" {
		path, err := nstest.FindCoreDNS()
		if err != nil {
			return err
		}
		*p.CoreDNS = path
	}
	for _, t := range p.Tools {
		if _, err := exec.LookPath(t); err != nil {
			return fmt.Errorf("%s: %w (Debian: apt-get install %s)", t, err, p.Packages)
		}
	}
	for _, b := range p.Binaries {
		abs, err := filepath.Abs(*b)
		if err != nil {
			return err
		}
		if _, err := os.Stat(abs); err != nil {
			return fmt.Errorf("%w (`make %s` builds it)", err, p.Make)
		}
		*b = abs
	}
	return nil
}

// TakeClientCPU pins this process, and so what it starts from now on, to
// the client's CPU, off the servers', and prints the load average.
func TakeClientCPU(cpu int) error {
	if err := procstat.Pin(os.Getpid(), cpu); err != nil {
		return err
	}
	if load, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Printf("load average before the run: %s", load)
	}
	return nil
}

// PerfFile is where StartPerf(dir, name, ...) writes its samples.
func PerfFile(dir, name string) string { return filepath.Join(dir, name+".perf.data") }

// StartPerf samples the stacks of pids into DIR/NAME.perf.data (with more
// than one, `perf report --sort comm,dso,sym` tells them apart); perf runs
// on cpu, the client's, so as not to take the servers'. StopPerf ends it.
func StartPerf(dir, name string, cpu int, pids ...int) (*exec.Cmd, error) {
	list := make([]string, len(pids))
	for i, pid := range pids {
		list[i] = strconv.Itoa(pid)
	}
	return startPerf(dir, cpu, "record", "-q", "-g", "-F", "999", "-p", strings.Join(list, ","), "-o", PerfFile(dir, name))
}

// SchedFile is where StartPerfSched(dir, name, ...) records.
func SchedFile(dir, name string) string { return filepath.Join(dir, name+".sched.data") }

// StartPerfSched records the scheduler's events on recordCPU into
// DIR/NAME.sched.data, for perf sched timehist; perf runs on cpu.
// StopPerf ends it.
func StartPerfSched(dir, name string, cpu, recordCPU int) (*exec.Cmd, error) {
	return startPerf(dir, cpu, "sched", "record", "-q", "-C", strconv.Itoa(recordCPU), "-o", SchedFile(dir, name))
}

// startPerf starts perf with args on cpu, its output going to dir.
func startPerf(dir string, cpu int, args ...string) (*exec.Cmd, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("perf: %w", err)
	}
	cmd := exec.Command("taskset", append([]string{"-c", strconv.Itoa(cpu), "perf"}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("perf: %w", err)
	}
	return cmd, nil
}

// StopPerf ends perf (record, or sched record) with SIGINT, which makes it write its file.
func StopPerf(cmd *exec.Cmd) {
	_ = cmd.Process.Signal(syscall.SIGINT)
	_ = cmd.Wait()
}

// WriteJSON writes v to path, indented, creating its directory.
func WriteJSON(path string, v any) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
