package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Exec runs name in the guest, in all its namespaces (nsenter -t PID1 -a),
// to completion, and returns its standard output. The error includes the
// command line and standard error; with a non-zero exit the output is
// returned as well (`systemctl is-active` prints the state and exits 3).
// Without a deadline on ctx the command is bounded by guestExecTimeout.
//
// The command runs in the guest's namespaces but stays in the host's cgroup
// of the caller, outside the guest's units.
func (g *Guest) Exec(ctx context.Context, name string, args ...string) (string, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, guestExecTimeout)
		defer cancel()
	}
	select {
	case <-g.exited:
		return "", fmt.Errorf("guest %s: %s: %w", g.name, name, errGuestGone)
	default:
	}
	argv := append([]string{"-t", strconv.Itoa(g.pid), "-a", "--", name}, args...)
	cmd := exec.CommandContext(ctx, "/usr/bin/nsenter", argv...)
	cmd.Env = []string{"PATH=" + guestPath, "LANG=C.UTF-8", "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0", "TERM=dumb"}
	// nsenter forks to enter the PID namespace: kill the whole group, or
	// the command itself would outlive a cancelled nsenter.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("guest %s: %s: %w\nstdout:\n%s\nstderr:\n%s",
			g.name, strings.Join(append([]string{name}, args...), " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// Systemctl runs systemctl in the guest (without a pager).
func (g *Guest) Systemctl(ctx context.Context, args ...string) (string, error) {
	return g.Exec(ctx, "systemctl", append([]string{"--no-pager"}, args...)...)
}

// Show returns properties of a unit (`systemctl show -p P ... UNIT`), all of
// them if props is empty.
func (g *Guest) Show(ctx context.Context, unit string, props ...string) (map[string]string, error) {
	args := []string{"show"}
	for _, p := range props {
		args = append(args, "-p", p)
	}
	out, err := g.Systemctl(ctx, append(args, "--", unit)...)
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for line := range strings.Lines(out) {
		k, v, ok := strings.Cut(strings.TrimRight(line, "\n"), "=")
		if ok {
			m[k] = v
		}
	}
	for _, p := range props {
		if _, ok := m[p]; !ok {
			return m, fmt.Errorf("guest %s: %s has no property %s", g.name, unit, p)
		}
	}
	return m, nil
}

// MainPID is the unit's main process as systemd knows it, a PID inside the
// guest, or 0 when there is none (stopped, failed, or between restarts).
func (g *Guest) MainPID(ctx context.Context, unit string) (int, error) {
	st, err := g.Show(ctx, unit, "MainPID")
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(st["MainPID"])
	if err != nil {
		return 0, fmt.Errorf("guest %s: %s MainPID %q: %w", g.name, unit, st["MainPID"], err)
	}
	return pid, nil
}

// KillMain reads the unit's MainPID and, when there is one, sends it sig:
// one attempt of the crash-storm harness of AgentBaker PR 9439 (read MainPID,
// `kill -9` it if live). It returns the PID signalled, or 0 if there was
// none. A process that exits between the read and the kill counts as none.
func (g *Guest) KillMain(ctx context.Context, unit string, sig syscall.Signal) (int, error) {
	pid, err := g.MainPID(ctx, unit)
	if err != nil || pid == 0 {
		return 0, err
	}
	// The kill runs in the guest so that pid means the guest's process;
	// ESRCH (exited meanwhile) prints "No such process".
	if _, err := g.Exec(ctx, "kill", "-s", strconv.Itoa(int(sig)), strconv.Itoa(pid)); err != nil {
		if strings.Contains(err.Error(), "No such process") {
			return 0, nil
		}
		return 0, err
	}
	return pid, nil
}

// Journal returns the unit's journal this boot (journalctl -u UNIT), or the
// whole journal for unit "", with precise timestamps.
func (g *Guest) Journal(ctx context.Context, unit string) (string, error) {
	args := []string{"-b", "-q", "--no-pager", "-o", "short-precise"}
	if unit != "" {
		args = append(args, "-u", unit)
	}
	return g.Exec(ctx, "journalctl", args...)
}

// errGuestGone is what methods return after PID 1 exited.
var errGuestGone = errors.New("guest PID 1 has exited")
