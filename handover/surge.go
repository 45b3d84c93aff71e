package handover

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dnsstandby/dnsstandby/admin"
)

// The surge handover: a second process started with Config.From asks the
// running one, over its admin socket, for what systemd's store would
// carry across a restart (the listen sockets, a memfd of the caches) and
// for the instance lock's open file. The giver keeps serving until the
// taker replies that its listeners read and its steering program is
// attached; then it stops as at SIGTERM, without writing the store or
// the snapshots (the taker serves and writes them), and without freeing
// the lock, which the taker holds through the same open file.

// replyTimeout bounds how long the giver waits for the taker to start
// from its files (views, caches loaded, tap, steering) while it goes on
// serving; a taker that takes longer gets nothing and the giver stays.
const replyTimeout = 30 * time.Second

// taking is the taker's side of a handover under way.
type taking struct {
	c       *net.UnixConn
	fromPID int32 // the giver's, from SO_PEERCRED
	offer   *Offer
	replied bool
}

// Give is admin.Giver: it hands what this process serves with to peer,
// which asked over the admin socket (root, as admin checked). Until peer
// replies that it serves, this process serves on; nothing it sends is
// lost if peer dies midway, since the sockets and the lock are shared,
// not moved.
func (h *Handover) Give(c *net.UnixConn, peer *unix.Ucred) error {
	log := h.log.With("pid", os.Getpid(), "to_pid", peer.Pid)
	refuse := func(err error) error {
		_ = Refuse(c, os.Getpid(), err)
		return err
	}
	select {
	case <-h.serving:
	default:
		return refuse(errors.New("not started yet"))
	}
	if h.cfg.LockFile != "" && h.lock == nil {
		return refuse(errors.New("no instance lock to pass"))
	}
	if !h.giving.CompareAndSwap(false, true) {
		return refuse(errors.New("a handover is under way or done"))
	}
	gave := false
	defer func() {
		if !gave {
			h.giving.Store(false)
		}
	}()
	log.Info("handover: asked for by PID " + fmt.Sprint(peer.Pid))
	// Writing the caches takes longer than admin's request bound.
	_ = c.SetDeadline(time.Now().Add(replyTimeout))

	var names []string
	var fds []int
	defer func() { closeAll(fds) }()
	socks, err := h.srv.Sockets()
	if err != nil {
		return refuse(fmt.Errorf("sockets: %w", err))
	}
	index := map[string]int{}
	for _, s := range socks {
		k := SocketName(s.Addr, s.UDP, 0)
		var dup int
		cerr := s.Conn.Control(func(fd uintptr) { dup, err = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) })
		if err = errors.Join(cerr, err); err != nil {
			return refuse(fmt.Errorf("socket %s: %w", k, err))
		}
		fds = append(fds, dup)
		names = append(names, SocketName(s.Addr, s.UDP, index[k]))
		index[k]++
	}
	entries := 0
	if saves := h.srv.Caches(); len(saves) > 0 {
		f, n, err := WriteCaches(os.Getpid(), h.cfg.CacheLimit, saves)
		if err != nil {
			log.Error("handover: caches not handed over: the taker loads the disk snapshots", slog.Any("err", err))
		} else {
			dup, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
			f.Close()
			if err != nil {
				return refuse(fmt.Errorf("cache file: %w", err))
			}
			fds, names, entries = append(fds, dup), append(names, CacheName), n
		}
	}
	if h.lock != nil {
		dup, err := unix.FcntlInt(h.lock.f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return refuse(fmt.Errorf("lock file: %w", err))
		}
		fds, names = append(fds, dup), append(names, LockName)
	}
	if err := SendOffer(c, os.Getpid(), names, fds); err != nil {
		return err
	}
	_ = c.SetDeadline(time.Now().Add(replyTimeout))
	if err := ReadReply(c); err != nil {
		return err
	}
	gave = true
	if h.lock != nil {
		h.lock.given.Store(true)
	}
	h.gaveTo.Store(peer.Pid)
	cache := "a warm cache"
	if entries == 0 {
		cache = "an empty cache"
	}
	log.Info(fmt.Sprintf("handover: gave %d sockets and %s to PID %d", len(socks), cache, peer.Pid),
		"sockets", len(socks), "cache_entries", entries)
	h.once.Do(func() { close(h.gave) })
	return nil
}

// takeFrom asks the process serving the admin socket cfg.From for its
// files, and returns the instance lock it passed (nil without LockFile).
// The files wait in h.take for Begin. Any error leaves the running
// process as it was.
func (h *Handover) takeFrom(ctx context.Context) (*instanceLock, error) {
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, peer, err := admin.DialHandover(actx, h.cfg.From)
	if err != nil {
		return nil, fmt.Errorf("handover: %w", err)
	}
	o, err := ReadOffer(c)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("handover from PID %d: %w", peer.Pid, err)
	}
	t := &taking{c: c, fromPID: peer.Pid, offer: o}
	var lock *instanceLock
	if lf := o.TakeLock(); lf != nil || h.cfg.LockFile != "" {
		if lock, err = adoptLock(lf, h.cfg.LockFile); err != nil {
			t.refuse(err)
			return nil, fmt.Errorf("handover from PID %d: %w", peer.Pid, err)
		}
	}
	h.take = t
	h.log.Info("handover: offered by PID "+fmt.Sprint(peer.Pid), "pid", os.Getpid(), "from_pid", peer.Pid, "files", len(o.Files))
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
	_ = SendReply(t.c, os.Getpid(), err)
	t.c.Close()
	t.offer.Close()
}

// accept tells the giver that this process serves: it stops. The lock is
// ours from here: our PID goes into its file.
func (h *Handover) accept() error {
	t := h.take
	if t == nil || t.replied {
		return nil
	}
	t.replied = true
	_ = t.c.SetDeadline(time.Now().Add(5 * time.Second))
	err := SendReply(t.c, os.Getpid(), nil)
	t.c.Close()
	if err != nil {
		return fmt.Errorf("handover from PID %d: %w", t.fromPID, err)
	}
	if h.lock != nil {
		h.lock.own()
	}
	h.log.Info(fmt.Sprintf("handover: serving in place of PID %d, which stops", t.fromPID), "pid", os.Getpid(), "from_pid", t.fromPID)
	return nil
}

// AfterGiver retries start, which binds what a giver holds until it has
// stopped (the admin socket, the metrics address), for as long as a
// giver's stop may take; without a surge handover it runs start once.
func (h *Handover) AfterGiver(ctx context.Context, what string, start func() error) error {
	err := start()
	if h.take == nil || err == nil {
		return err
	}
	h.log.Info("handover: waiting for the previous process to free the "+what, slog.Any("err", err))
	deadline := time.Now().Add(h.cfg.GiverStop + 10*time.Second)
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
