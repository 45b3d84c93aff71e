package peer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dnsstandby/dnsstandby/clock"
)

// WatcherConfig says what a Watcher watches. Start from
// DefaultWatcherConfig.
type WatcherConfig struct {
	// Addrs are the listen addresses dnsstandby shares with LocalDNS
	// (169.254.10.11:53); at least one.
	Addrs []netip.AddrPort
	// Exclude reports whether a socket inode is one of ours (SocketInode),
	// or nil. It is called from the Watcher's goroutine and must be safe
	// for that.
	Exclude func(inode uint64) bool
	// Rescan is the interval between socket listings when no exit woke
	// the Watcher; positive. It bounds how long a LocalDNS that binds
	// again goes unnoticed; exits do not wait for it (the pidfd reports
	// them at once).
	Rescan time.Duration
	// RescanSettled is the interval instead while LocalDNS is settled:
	// bound on every address, each holder's exit watched by a pidfd, no
	// fallback, no error, and nothing changed at the last scan. What it
	// delays is only a socket LocalDNS opens or closes without exiting (a
	// reload of its Corefile), which dnsstandby's own socket covers
	// meanwhile; anything else brings back Rescan. Under Rescan (0 too),
	// Rescan throughout.
	RescanSettled time.Duration
	// FallbackUnit is the systemd unit of AKS's LocalDNS fallback
	// (localdns-fallback.service): a second CoreDNS, LocalDNS's own
	// binary under the same UID, that joins the reuseport group on the
	// listen address while LocalDNS's unit is failed. Sockets held by a
	// process in that unit are reported apart (State.Fallback) and are
	// never taken for LocalDNS's. "" takes every socket not ours for
	// LocalDNS's.
	FallbackUnit string
	// Logger gets one line per change (LocalDNS bound or gone, UID
	// mismatches, scan errors), never one per scan; nil discards.
	Logger *slog.Logger
}

// DefaultWatcherConfig returns the defaults: no addresses, a rescan every
// 200 ms, every second once LocalDNS is settled, and AKS's fallback unit,
// localdns-fallback.service. A rescan is two sock_diag dumps the kernel
// filters to one port (holders known from the last scan), about 30 µs
// here (BenchmarkRescan), but each wakes an idle daemon: standing by,
// the rescans at 200 ms were 45% of an idle dnsstandby's CPU.
func DefaultWatcherConfig() WatcherConfig {
	return WatcherConfig{Rescan: 200 * time.Millisecond, RescanSettled: time.Second, FallbackUnit: DefaultFallbackUnit}
}

// DefaultFallbackUnit is the systemd unit AKS runs its LocalDNS fallback
// in (AgentBaker: OnFailure=localdns-fallback.service on localdns.service).
const DefaultFallbackUnit = "localdns-fallback.service"

// State is what a Watcher last saw of LocalDNS.
type State struct {
	// Bound is true when LocalDNS has a UDP socket on every watched
	// address: it gets its share of pods' queries.
	Bound bool
	// Sockets are LocalDNS's sockets on the watched addresses (UDP sockets
	// and TCP listeners), by address, protocol and inode.
	Sockets []Socket
	// PIDs are the processes holding Sockets, ascending; empty when none is
	// visible (another PID namespace).
	PIDs []int
	// Fallback are the sockets on the watched addresses held by a process
	// in WatcherConfig.FallbackUnit: AKS's fallback CoreDNS, not
	// LocalDNS. They count neither for Bound nor in Sockets and PIDs.
	Fallback []Socket
	// FallbackPIDs are the processes holding Fallback, ascending.
	FallbackPIDs []int
	// UIDMismatch holds a warning per socket whose owner UID differs from
	// our effective UID: the kernel does not let such sockets share a
	// reuseport group with ours.
	UIDMismatch []string
	// Err is the last scan's error, or nil. When set, the rest of the
	// State is what the last good scan saw.
	Err error
	// At is when the State was observed.
	At time.Time
}

// equal reports whether s and o describe the same situation (At aside).
func (s State) equal(o State) bool {
	return s.Bound == o.Bound &&
		slices.Equal(s.Sockets, o.Sockets) &&
		slices.Equal(s.PIDs, o.PIDs) &&
		slices.Equal(s.Fallback, o.Fallback) &&
		slices.Equal(s.FallbackPIDs, o.FallbackPIDs) &&
		slices.Equal(s.UIDMismatch, o.UIDMismatch) &&
		errText(s.Err) == errText(o.Err)
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// UIDWarning is the State.UIDMismatch text for a LocalDNS socket owned by
// another UID than ours (euid).
func UIDWarning(s Socket, euid uint32) string {
	return fmt.Sprintf("LocalDNS socket %s/%s is owned by UID %d, dnsstandby runs as %d: "+
		"the kernel will not put them in one reuseport group; run dnsstandby as UID %d",
		s.Addr, s.Proto, s.UID, euid, s.UID)
}

// Watcher reports LocalDNS's presence on a set of listen addresses: its
// sockets (sock_diag), the processes holding them (/proc), and their exit
// (pidfd).
type Watcher struct {
	cfg  WatcherConfig // Logger non-nil, tagged component=peer
	diag *diagConn     // in the namespace StartWatcher ran in; owned by run
	euid uint32

	updates chan State    // latest State not yet read; never closed
	kick    chan struct{} // a watched process exited: scan now
	cancel  context.CancelFunc
	done    chan struct{} // closed when run returns

	closeOnce sync.Once

	mu  sync.Mutex // guards following
	cur State

	// Owned by the goroutine that scans (StartWatcher, then run).
	procs      map[int]*Process // pidfds of the processes holding Sockets
	owners     map[uint64]owner // holder of each socket seen, by inode
	unresolved map[uint64]bool  // sockets whose holder is not visible
	unwatched  map[int]bool     // holders we may not open a pidfd on
	warned     map[string]bool  // one-time warnings already logged
}

type owner struct {
	pid  int
	comm string
	unit string
}

// StartWatcher lists LocalDNS's sockets once (an error here means the
// kernel or our privileges cannot support watching) and keeps watching
// until ctx ends or Close. Its sock_diag socket sees the network namespace
// of the calling thread.
func StartWatcher(ctx context.Context, cfg WatcherConfig) (*Watcher, error) {
	if len(cfg.Addrs) == 0 {
		return nil, errors.New("peer: Addrs must not be empty")
	}
	if cfg.Rescan <= 0 {
		return nil, fmt.Errorf("peer: Rescan must be positive, got %s", cfg.Rescan)
	}
	if cfg.RescanSettled < 0 {
		return nil, fmt.Errorf("peer: RescanSettled must not be negative, got %s", cfg.RescanSettled)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.Logger = cfg.Logger.With("component", "peer")
	cfg.Addrs = slices.Clone(cfg.Addrs)
	for i, a := range cfg.Addrs {
		if !a.IsValid() {
			return nil, fmt.Errorf("peer: Addrs: invalid address %v", a)
		}
		cfg.Addrs[i] = netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
	}
	d, err := openDiag()
	if err != nil {
		return nil, fmt.Errorf("start peer watcher: %w", err)
	}
	w := &Watcher{
		cfg:        cfg,
		diag:       d,
		euid:       uint32(os.Geteuid()),
		updates:    make(chan State, 1),
		kick:       make(chan struct{}, 1),
		done:       make(chan struct{}),
		procs:      map[int]*Process{},
		owners:     map[uint64]owner{},
		unresolved: map[uint64]bool{},
		unwatched:  map[int]bool{},
		warned:     map[string]bool{},
	}
	first, err := w.scan()
	if err != nil {
		w.closeProcs()
		d.close()
		return nil, fmt.Errorf("start peer watcher: %w", err)
	}
	w.logChange(State{}, first)
	if !first.Bound {
		cfg.Logger.Info("LocalDNS is not bound", "addrs", addrStrings(cfg.Addrs), "sockets", len(first.Sockets))
	}
	w.publish(first)
	ctx, w.cancel = context.WithCancel(ctx)
	go w.run(ctx)
	return w, nil
}

// Updates delivers a State whenever it changes, starting with the first:
// at once when a watched process exits, else within the rescan interval.
// It holds only the latest State (a slow reader skips stale ones, and never
// slows the Watcher). It is never closed, so that a reader selecting on it
// beside its own context never mistakes a stopped Watcher for a zero State
// (LocalDNS not bound); stop reading on your own context. States and their
// slices are shared: treat them as read-only.
func (w *Watcher) Updates() <-chan State { return w.updates }

// Current returns the latest State (read-only, like those on Updates).
func (w *Watcher) Current() State {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cur
}

// Close stops the Watcher and waits for its goroutines; safe to call more
// than once.
func (w *Watcher) Close() error {
	w.closeOnce.Do(func() {
		w.cancel()
		<-w.done
	})
	return nil
}

func (w *Watcher) run(ctx context.Context) {
	defer close(w.done)
	defer w.diag.close()
	defer w.closeProcs()
	rescan := time.NewTimer(clock.UntilNext(w.cfg.Rescan))
	defer rescan.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-rescan.C:
		case <-w.kick:
		}
		prev := w.Current()
		next, err := w.scan()
		if err != nil {
			next = prev
			next.Err, next.At = err, time.Now()
		}
		if !next.equal(prev) {
			w.logChange(prev, next)
			w.publish(next)
		}
		// At the instants the daemon's other periodic work shares.
		rescan.Reset(clock.UntilNext(w.rescanAfter(prev, next)))
	}
}

// rescanAfter is the wait before the scan after next: RescanSettled if
// LocalDNS is settled (see WatcherConfig), else Rescan.
func (w *Watcher) rescanAfter(prev, next State) time.Duration {
	settled := next.Err == nil && next.Bound && len(next.Fallback) == 0 && next.equal(prev)
	for _, s := range next.Sockets {
		if _, watched := w.procs[s.PID]; s.PID == 0 || !watched {
			settled = false
		}
	}
	if settled {
		return max(w.cfg.Rescan, w.cfg.RescanSettled)
	}
	return w.cfg.Rescan
}

// publish makes s the current State and the one Updates delivers next.
func (w *Watcher) publish(s State) {
	w.mu.Lock()
	w.cur = s
	w.mu.Unlock()
	select {
	case <-w.updates: // a State nobody read: replaced
	default:
	}
	w.updates <- s // never blocks: this goroutine is the only sender
}

// scan lists the sockets, finds their holders, and opens pidfds on new
// holders.
func (w *Watcher) scan() (State, error) {
	now := time.Now()
	var socks []Socket
	for _, proto := range []Proto{UDP, TCP} {
		s, err := w.diag.bound(w.cfg.Addrs, proto, w.cfg.Exclude)
		if err != nil {
			return State{}, err
		}
		socks = append(socks, s...)
	}
	slices.SortFunc(socks, func(a, b Socket) int {
		return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Proto, b.Proto), cmp.Compare(a.Inode, b.Inode))
	})
	if err := w.resolveOwners(socks); err != nil {
		return State{}, err
	}
	w.trackProcesses(socks)
	socks, fallback := w.splitFallback(socks)

	s := State{Sockets: socks, Fallback: fallback, At: now, Bound: true}
	for _, a := range w.cfg.Addrs {
		if !slices.ContainsFunc(socks, func(s Socket) bool { return s.Proto == UDP && s.Addr == a }) {
			s.Bound = false
		}
	}
	for _, sock := range socks {
		if sock.UID != w.euid {
			s.UIDMismatch = append(s.UIDMismatch, UIDWarning(sock, w.euid))
		}
	}
	s.PIDs, s.FallbackPIDs = holders(socks), holders(fallback)
	slices.Sort(s.UIDMismatch)
	s.UIDMismatch = slices.Compact(s.UIDMismatch)
	return s, nil
}

// holders are the processes holding socks, ascending, each once; nil
// when none is visible.
func holders(socks []Socket) []int {
	var pids []int
	for _, sock := range socks {
		if sock.PID != 0 {
			pids = append(pids, sock.PID)
		}
	}
	slices.Sort(pids)
	return slices.Compact(pids)
}

// splitFallback separates the sockets held by the fallback unit's
// processes from LocalDNS's. The fallback is LocalDNS's own binary under
// the same UID, so neither the socket nor the process name tells them
// apart; the unit systemd started it in does, and it is known as soon as
// the socket is (no probe, no wait).
func (w *Watcher) splitFallback(socks []Socket) (localdns, fallback []Socket) {
	if w.cfg.FallbackUnit == "" {
		return socks, nil
	}
	for _, s := range socks {
		if s.Unit == w.cfg.FallbackUnit {
			fallback = append(fallback, s)
		} else {
			localdns = append(localdns, s)
		}
	}
	return localdns, fallback
}

// resolveOwners fills in the holders of socks: from what earlier scans
// found, and for new sockets from /proc (the last holders first). A socket
// whose holder was not visible is not searched for again: its fd was there
// before it was bound, so a later search would not find it either.
func (w *Watcher) resolveOwners(socks []Socket) error {
	var todo []int
	for i, s := range socks {
		if o, ok := w.owners[s.Inode]; ok {
			socks[i].PID, socks[i].Comm, socks[i].Unit = o.pid, o.comm, o.unit
		} else if !w.unresolved[s.Inode] {
			todo = append(todo, i)
		}
	}
	if len(todo) > 0 {
		batch := make([]Socket, len(todo))
		for j, i := range todo {
			batch[j] = socks[i]
		}
		if err := fillOwners(procRoot, batch, slices.Collect(maps.Keys(w.procs))); err != nil {
			return err
		}
		for j, i := range todo {
			socks[i] = batch[j]
			if batch[j].PID == 0 {
				w.unresolved[batch[j].Inode] = true
				w.warnOnce("owner-hidden", "LocalDNS's process is not visible in "+procRoot+
					": its exit is noticed by rescan only, and its sockets cannot be adopted (run dnsstandby in the host PID namespace)",
					"socket", batch[j].String())
			} else {
				w.owners[batch[j].Inode] = owner{batch[j].PID, batch[j].Comm, batch[j].Unit}
			}
		}
	}
	// Forget sockets that are gone.
	for inode := range w.owners {
		if !slices.ContainsFunc(socks, func(s Socket) bool { return s.Inode == inode }) {
			delete(w.owners, inode)
		}
	}
	for inode := range w.unresolved {
		if !slices.ContainsFunc(socks, func(s Socket) bool { return s.Inode == inode }) {
			delete(w.unresolved, inode)
		}
	}
	return nil
}

// trackProcesses holds a pidfd on every process holding socks, and lets go
// of those that hold none any more.
func (w *Watcher) trackProcesses(socks []Socket) {
	want := map[int]uint64{} // pid -> one socket it holds
	for _, s := range socks {
		if s.PID != 0 {
			want[s.PID] = s.Inode
		}
	}
	for pid, p := range w.procs {
		if _, ok := want[pid]; !ok {
			p.Close()
			delete(w.procs, pid)
		}
	}
	maps.DeleteFunc(w.unwatched, func(pid int, _ bool) bool { _, ok := want[pid]; return !ok })
	for pid, inode := range want {
		if _, ok := w.procs[pid]; ok || w.unwatched[pid] {
			continue
		}
		p, err := openProcess(procRoot, pid, w.kick)
		if errors.Is(err, unix.ESRCH) {
			// Exited since /proc was read; the next scan shows its
			// sockets gone.
			w.forget(pid)
			w.kickSoon()
			continue
		}
		if err != nil {
			w.unwatched[pid] = true
			w.warnOnce(fmt.Sprintf("pidfd-%d", pid), "cannot watch LocalDNS's process for exit; noticing it by rescan only", slog.Any("err", err))
			continue
		}
		if !p.HoldsSocket(inode) {
			// The PID was reused after the holder exited: the pidfd is on
			// another process. Look again.
			p.Close()
			w.forget(pid)
			w.kickSoon()
			continue
		}
		w.procs[pid] = p
	}
}

// forget drops what is known of the sockets pid held, so that the next
// scan looks their holders up again.
func (w *Watcher) forget(pid int) {
	maps.DeleteFunc(w.owners, func(_ uint64, o owner) bool { return o.pid == pid })
}

// kickSoon asks for another scan without waiting for the rescan timer.
func (w *Watcher) kickSoon() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

func (w *Watcher) closeProcs() {
	for pid, p := range w.procs {
		p.Close()
		delete(w.procs, pid)
	}
}

func (w *Watcher) warnOnce(key, msg string, args ...any) {
	if w.warned[key] {
		return
	}
	w.warned[key] = true
	w.cfg.Logger.Warn(msg, args...)
}

// logChange logs what differs between two States: one line per change.
func (w *Watcher) logChange(prev, next State) {
	log := w.cfg.Logger
	if e := errText(next.Err); e != errText(prev.Err) {
		if next.Err != nil {
			log.Warn("cannot list LocalDNS's sockets; keeping the last state", slog.Any("err", next.Err))
		} else {
			log.Info("listing LocalDNS's sockets works again")
		}
	}
	if next.Err != nil {
		return
	}
	switch {
	case next.Bound && !prev.Bound:
		log.Info("LocalDNS is bound", "pids", next.PIDs, "sockets", len(next.Sockets))
	case !next.Bound && prev.Bound:
		// LocalDNS crashed or was stopped: an operator may alert on it.
		log.Warn("LocalDNS is not bound", "pids", next.PIDs, "sockets", len(next.Sockets))
	case !slices.Equal(next.PIDs, prev.PIDs):
		log.Info("LocalDNS's processes changed", "pids", next.PIDs, "was", prev.PIDs, "bound", next.Bound)
	}
	for _, m := range next.UIDMismatch {
		if !slices.Contains(prev.UIDMismatch, m) {
			log.Warn(m)
		}
	}
}

// addrStrings is addrs for a log line.
func addrStrings(addrs []netip.AddrPort) []string {
	out := make([]string, len(addrs))
	for i, a := range addrs {
		out[i] = a.String()
	}
	return out
}
