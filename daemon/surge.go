package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dnsstandby/dnsstandby/admin"
	"github.com/dnsstandby/dnsstandby/handover"
)

// The surge handover: a second process started with HandoverFrom asks the
// running one, over its admin socket, for what systemd's store would
// carry across a restart (the listen sockets, a memfd of the caches) and
// for the instance lock's open file. The giver keeps serving until the
// taker replies that its listeners read and its steering program is
// attached; then it stops as at SIGTERM, without writing the store or
// the snapshots (the taker serves and writes them), and without freeing
// the lock, which the taker holds through the same open file.

// handoverReplyTimeout bounds how long the giver waits for the taker to
// start from its files (views, caches loaded, tap, steering) while it
// goes on serving; a taker that takes longer gets nothing and the giver
// stays.
const handoverReplyTimeout = 30 * time.Second

// surge is one process's part in surge handovers: as giver (gave is
// closed once it gave) or as taker (taking, until it replied).
type surge struct {
	giving   atomic.Bool
	gave     chan struct{}
	gaveOnce sync.Once
	toPID    atomic.Int32

	taking *taking
}

func newSurge() *surge { return &surge{gave: make(chan struct{})} }

// taking is the taker's side of a handover under way.
type taking struct {
	c       *net.UnixConn
	fromPID int32 // the giver's, from SO_PEERCRED
	offer   *handover.Offer
	replied bool
}

// Give is admin.Giver: it hands what this process serves with to peer,
// which asked over the admin socket (root, as admin checked). Until peer
// replies that it serves, this process serves on; nothing it sends is
// lost if peer dies midway, since the sockets and the lock are shared,
// not moved.
func (d *Daemon) Give(c *net.UnixConn, peer *unix.Ucred) error {
	log := d.log.With("pid", os.Getpid(), "to_pid", peer.Pid)
	refuse := func(err error) error {
		_ = handover.Refuse(c, os.Getpid(), err)
		return err
	}
	select {
	case <-d.ready:
	default:
		return refuse(errors.New("not started yet"))
	}
	if d.cfg.LockFile != "" && d.lock == nil {
		return refuse(errors.New("no instance lock to pass"))
	}
	if !d.surge.giving.CompareAndSwap(false, true) {
		return refuse(errors.New("a handover is under way or done"))
	}
	gave := false
	defer func() {
		if !gave {
			d.surge.giving.Store(false)
		}
	}()
	log.Info("handover: asked for by PID " + fmt.Sprint(peer.Pid))
	// Writing the caches takes longer than admin's request bound.
	_ = c.SetDeadline(time.Now().Add(handoverReplyTimeout))

	var names []string
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	socks, err := d.srv.Sockets()
	if err != nil {
		return refuse(fmt.Errorf("sockets: %w", err))
	}
	index := map[string]int{}
	for _, s := range socks {
		k := handover.SocketName(s.Addr, s.UDP, 0)
		var dup int
		cerr := s.Conn.Control(func(fd uintptr) { dup, err = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) })
		if err = errors.Join(cerr, err); err != nil {
			return refuse(fmt.Errorf("socket %s: %w", k, err))
		}
		fds = append(fds, dup)
		names = append(names, handover.SocketName(s.Addr, s.UDP, index[k]))
		index[k]++
	}
	entries := 0
	if f, n, err := d.writeCacheFile(); err != nil {
		log.Error("handover: caches not handed over: the taker loads the disk snapshots", slog.Any("err", err))
	} else if f != nil {
		dup, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		f.Close()
		if err != nil {
			return refuse(fmt.Errorf("cache file: %w", err))
		}
		fds, names, entries = append(fds, dup), append(names, handover.CacheName), n
	}
	if d.lock != nil {
		dup, err := unix.FcntlInt(d.lock.f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return refuse(fmt.Errorf("lock file: %w", err))
		}
		fds, names = append(fds, dup), append(names, handover.LockName)
	}
	if err := handover.SendOffer(c, os.Getpid(), names, fds); err != nil {
		return err
	}
	_ = c.SetDeadline(time.Now().Add(handoverReplyTimeout))
	if err := handover.ReadReply(c); err != nil {
		return err
	}
	gave = true
	if d.lock != nil {
		d.lock.given.Store(true)
	}
	d.surge.toPID.Store(peer.Pid)
	cache := "a warm cache"
	if entries == 0 {
		cache = "an empty cache"
	}
	log.Info(fmt.Sprintf("handover: gave %d sockets and %s to PID %d", len(socks), cache, peer.Pid),
		"sockets", len(socks), "cache_entries", entries)
	d.surge.gaveOnce.Do(func() { close(d.surge.gave) })
	return nil
}

// writeCacheFile writes every cache in force into a sealed memfd; nil
// when there is no cache.
func (d *Daemon) writeCacheFile() (*os.File, int, error) {
	var saves []handover.CacheSave
	for _, v := range d.views {
		v.mu.Lock()
		if v.set != nil {
			for zone, zc := range v.set.caches {
				saves = append(saves, handover.CacheSave{Key: handover.CacheKey(v.listen, zone), Save: zc.c.Save})
			}
		}
		v.mu.Unlock()
	}
	if len(saves) == 0 {
		return nil, 0, nil
	}
	if lg := d.lastGoodSave(); lg != nil {
		saves = append(saves, *lg)
	}
	return handover.WriteCaches(os.Getpid(), handoverLimit(&d.cfg), saves)
}

// gaveHandover says whether this process handed over to another.
func (d *Daemon) gaveHandover() bool {
	select {
	case <-d.surge.gave:
		return true
	default:
		return false
	}
}

// take asks the process serving the admin socket HandoverFrom for its
// files, and returns the instance lock it passed (nil without
// LockFile). The files wait in d.surge.taking for inherit. Any error
// leaves the running process as it was.
func (d *Daemon) take(ctx context.Context) (*instanceLock, error) {
	path := d.cfg.HandoverFrom
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, peer, err := admin.DialHandover(actx, path)
	if err != nil {
		return nil, fmt.Errorf("handover: %w", err)
	}
	o, err := handover.ReadOffer(c)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("handover from PID %d: %w", peer.Pid, err)
	}
	t := &taking{c: c, fromPID: peer.Pid, offer: o}
	var lock *instanceLock
	if lf := o.TakeLock(); lf != nil || d.cfg.LockFile != "" {
		if lock, err = adoptLock(lf, d.cfg.LockFile); err != nil {
			t.refuse(err)
			return nil, fmt.Errorf("handover from PID %d: %w", peer.Pid, err)
		}
	}
	d.surge.taking = t
	d.log.Info("handover: offered by PID "+fmt.Sprint(peer.Pid), "pid", os.Getpid(), "from_pid", peer.Pid, "files", len(o.Files))
	return lock, nil
}

// refuse tells the giver the handover failed (it serves on) and closes
// what it offered.
func (t *taking) refuse(err error) {
	if t.replied {
		return
	}
	t.replied = true
	_ = t.c.SetDeadline(time.Now().Add(time.Second))
	_ = handover.SendReply(t.c, os.Getpid(), err)
	t.c.Close()
	t.offer.Close()
}

// accept tells the giver that this process serves: it stops. The lock is
// ours from here: our PID goes into its file.
func (d *Daemon) acceptHandover() error {
	t := d.surge.taking
	if t == nil || t.replied {
		return nil
	}
	t.replied = true
	_ = t.c.SetDeadline(time.Now().Add(5 * time.Second))
	err := handover.SendReply(t.c, os.Getpid(), nil)
	t.c.Close()
	if err != nil {
		return fmt.Errorf("handover from PID %d: %w", t.fromPID, err)
	}
	if d.lock != nil {
		d.lock.own()
	}
	d.log.Info(fmt.Sprintf("handover: serving in place of PID %d, which stops", t.fromPID), "pid", os.Getpid(), "from_pid", t.fromPID)
	return nil
}

// afterGiver retries start, which binds what the giver holds until it
// has stopped (the admin socket, the metrics address), for as long as a
// giver's stop may take; without a handover it runs start once.
func (d *Daemon) afterGiver(ctx context.Context, what string, start func() error) error {
	err := start()
	if d.surge.taking == nil || err == nil {
		return err
	}
	d.log.Info("handover: waiting for the previous process to free the "+what, slog.Any("err", err))
	deadline := time.Now().Add(d.cfg.ShutdownTimeout + 10*time.Second)
	for err != nil && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
		err = start()
	}
	return err
}
