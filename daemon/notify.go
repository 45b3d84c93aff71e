package daemon

import (
	"context"
	"fmt"
	"log/slog"
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
