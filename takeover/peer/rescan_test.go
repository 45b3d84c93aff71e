package peer

import (
	"errors"
	"net/netip"
	"testing"
	"time"
)

func TestRescanAfter(t *testing.T) {
	addr := netip.MustParseAddrPort("169.254.10.11:53")
	sock := Socket{Proto: UDP, Addr: addr, Inode: 7, PID: 42}
	settled := State{Bound: true, Sockets: []Socket{sock}, PIDs: []int{42}}
	watched := map[int]*Process{42: nil}
	for _, tc := range []struct {
		name       string
		prev, next func(State) State
		procs      map[int]*Process
		want       time.Duration
	}{
		{"settled", nil, nil, watched, time.Second},
		{"not bound", nil, func(s State) State { s.Bound = false; return s }, watched, 200 * time.Millisecond},
		{"changed since the last scan", func(s State) State { s.Sockets = nil; return s }, nil, watched, 200 * time.Millisecond},
		{"scan failed", nil, func(s State) State { s.Err = errors.New("sock_diag"); return s }, watched, 200 * time.Millisecond},
		{"fallback present", nil, func(s State) State { s.Fallback = []Socket{{Proto: UDP, Addr: addr, Inode: 8, PID: 43}}; return s }, watched, 200 * time.Millisecond},
		{"holder not visible", nil, func(s State) State { s.Sockets = []Socket{{Proto: UDP, Addr: addr, Inode: 7}}; return s }, watched, 200 * time.Millisecond},
		{"holder without a pidfd", nil, nil, map[int]*Process{}, 200 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := settled
			if tc.next != nil {
				next = tc.next(next)
			}
			prev := next
			if tc.prev != nil {
				prev = tc.prev(prev)
			}
			w := &Watcher{cfg: DefaultWatcherConfig(), procs: tc.procs}
			if got := w.rescanAfter(prev, next); got != tc.want {
				t.Errorf("rescanAfter = %v, want %v", got, tc.want)
			}
		})
	}
	// RescanSettled under Rescan: Rescan throughout.
	w := &Watcher{cfg: WatcherConfig{Rescan: time.Hour, RescanSettled: time.Second}, procs: watched}
	if got := w.rescanAfter(settled, settled); got != time.Hour {
		t.Errorf("RescanSettled under Rescan: rescanAfter = %v, want Rescan", got)
	}
}
