package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"golang.org/x/sys/unix"
)

// notify tells systemd (Type=notify) how dnsstandby is doing. Outside
// systemd, or under a unit of another type, NOTIFY_SOCKET is unset and
// every call does nothing.
type notify struct{ log *slog.Logger }

func (n notify) send(state string) {
	if _, err := daemon.SdNotify(false, state); err != nil {
		n.log.Warn("sd_notify", "state", state, slog.Any("err", err))
	}
}

// ready is sent once listeners, anchor and steering are in place: from
// then on a restart of LocalDNS is covered.
func (n notify) ready(status string) { n.send(daemon.SdNotifyReady + "\nSTATUS=" + status) }

// stepAside is sent when another dnsstandby serves the node and this one
// exits without starting: READY=1 first, so that the unit ends as a clean
// stop (inactive) rather than a failed start (a Type=notify main process
// that exits before READY=1 fails with result 'protocol', whatever its
// exit status).
// The barrier makes systemd read READY=1 before it sees the exit. No
// STOPPING=1 with it: systemd ignores READY=1 beside STOPPING=1.
func (n notify) stepAside(status string) {
	n.send(daemon.SdNotifyReady + "\nSTATUS=" + status)
	if err := barrier(time.Second); err != nil {
		n.log.Warn("sd_notify barrier", slog.Any("err", err))
	}
}

// barrier returns once systemd has read every notification sent before
// it (sd_notify_barrier(3): BARRIER=1 with a pipe's write end, which
// systemd closes once it got there), or after timeout. Outside systemd it
// returns at once.
func barrier(timeout time.Duration) error {
	sock := os.Getenv("NOTIFY_SOCKET")
	if sock == "" {
		return nil
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return err
	}
	defer unix.Close(p[0])
	s, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		unix.Close(p[1])
		return err
	}
	err = unix.Sendmsg(s, []byte("BARRIER=1"), unix.UnixRights(p[1]), &unix.SockaddrUnix{Name: sock}, 0)
	unix.Close(s)
	unix.Close(p[1])
	if err != nil {
		return err
	}
	fds := []unix.PollFd{{Fd: int32(p[0]), Events: unix.POLLHUP}}
	for {
		n, err := unix.Poll(fds, int(timeout.Milliseconds()))
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return err
		case n == 0:
			return errors.New("systemd did not answer")
		}
		return nil
	}
}

// reloading and reloaded bracket a reload asked of dnsstandby (SIGHUP,
// systemctl reload), as sd_notify(3) asks of a service that reloads:
// systemd shows the unit "reloading" meanwhile. MONOTONIC_USEC is what
// Type=notify-reload (systemd 253+) needs to match the reload to its
// request; older systemd ignores it. READY=1 alone keeps the STATUS= of
// the start.
func (n notify) reloading() {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	n.send(fmt.Sprintf("%s\nMONOTONIC_USEC=%d", daemon.SdNotifyReloading, ts.Nano()/1000))
}

func (n notify) reloaded() { n.send(daemon.SdNotifyReady) }

func (n notify) stopping() { n.send(daemon.SdNotifyStopping + "\nSTATUS=draining") }

// watchdog pets systemd's watchdog (WatchdogSec) while healthy reports the
// serving loops making progress, and stops petting while it does not, so
// that systemd kills and restarts a dnsstandby whose loops are stuck. The
// eBPF heartbeat has taken traffic off our sockets long before that; this
// is the slower cure. It returns at once when the unit has no watchdog.
func (n notify) watchdog(ctx context.Context, healthy func() error) {
	interval, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		n.log.Warn("systemd watchdog settings unreadable: not petting it", slog.Any("err", err))
		return
	}
	if interval == 0 {
		return
	}
	// Three pets per interval: one late tick must not cost a restart.
	t := time.NewTicker(interval / 3)
	defer t.Stop()
	failing := false
	for {
		if err := healthy(); err != nil {
			if !failing {
				n.log.Error("not petting the systemd watchdog: serving is stuck", slog.Any("err", err), "watchdog", interval.String())
			}
			failing = true
		} else {
			if failing {
				n.log.Info("serving again: petting the systemd watchdog")
			}
			failing = false
			n.send(daemon.SdNotifyWatchdog)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
