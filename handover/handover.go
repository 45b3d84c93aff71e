// Package handover owns the hand-off between one dnsstandby process and
// the next on a node: the instance lock that keeps a second one from
// changing anything, the sockets and caches a restart or an upgrade
// takes from systemd's file descriptor store (FileDescriptorStoreMax=),
// and the surge handover, in which a second running process asks the
// first, over its admin socket, for the same files and for its lock.
//
// What passes is the listen sockets, so that datagrams and connections
// queued on them while neither process reads are answered by the next
// one rather than lost with a closed socket, and the caches, written into
// a sealed memfd, so that the next process starts warm without the disk.
// It never trusts what it receives: a socket is taken only when its
// family, type, protocol, local address and SO_REUSEPORT are what the
// listen address needs, a cache file only when it is sealed, within its
// bound and checks out, and a lock only when it is the file at the
// lock's path and holds the flock.
//
// The daemon calls a Handover at three points: Begin before it binds or
// makes a cache, Serving once its listeners read and its steering
// program is attached, and Stop when it stops. It sees the daemon only
// through Server: the sockets it serves on and its caches.
package handover

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/activation"
)

// Server is what a Handover asks of the process it runs in, once it
// serves.
type Server interface {
	// Sockets returns every listen socket: a UDP socket or TCP listener
	// per entry.
	Sockets() ([]Socket, error)
	// Caches returns the caches in force, each with how to write it, and
	// what else travels with them (the last known good); none when the
	// process has no cache: then no cache file is written.
	Caches() []CacheSave
}

// Socket is one of the server's listen sockets.
type Socket struct {
	Addr netip.AddrPort
	UDP  bool
	Conn syscall.RawConn
}

// Config says what a Handover hands on and where from.
type Config struct {
	// LockFile is locked by Begin ("" : no lock).
	LockFile string
	// From is the admin socket of a dnsstandby that may be running (""
	// : none): when LockFile is held, Begin asks that process for a
	// surge handover rather than failing with ErrRunning.
	From string
	// Listen is the listen addresses: inherited sockets that fit none
	// are closed and removed from the store.
	Listen []netip.AddrPort
	// CacheLimit bounds the cache file, written and read.
	CacheLimit int64
	// GiverStop bounds how long a giver takes to stop: AfterGiver
	// retries that long (and 10 s more).
	GiverStop time.Duration
	// Logger is tagged component=handover; nil discards.
	Logger *slog.Logger
}

// Systemd is what the service manager gives a process: the files of its
// store (LISTEN_FDS), read only when no surge handover brings its own,
// and the store to put files into.
type Systemd struct {
	Files func() []*os.File
	Store Store
}

// SystemdFromEnv is the Systemd of the unit this process runs in; outside
// systemd it has no files and a Store that does nothing.
func SystemdFromEnv() Systemd {
	return Systemd{Files: func() []*os.File { return activation.Files(true) }, Store: StoreFromEnv()}
}

// Handover is one process's part in hand-offs: what it took at start,
// what it gives or stores for the next. Begin makes one.
type Handover struct {
	cfg   Config
	log   *slog.Logger
	store Store
	lock  *instanceLock // nil without LockFile
	take  *taking       // the surge handover this process takes, until it replied

	// Read by the start-up goroutine until Serving.
	in        *Inherited
	warm      *Warm // nil once Serving ran, or if no cache file came
	fromPID   int   // the predecessor's, from the cache file; 0 unknown
	warmCache bool
	entries   int // loaded from the cache file

	srv     Server        // set by Serving, before serving is closed
	serving chan struct{} // closed by Serving: Give may give
	giving  atomic.Bool
	gave    chan struct{} // closed once this process gave
	gaveTo  atomic.Int32
	once    sync.Once
}

// Begin runs before the daemon binds a socket or makes a cache: it takes
// the instance lock, or, when it is held and cfg.From names the holder's
// admin socket, asks the holder for a surge handover; then it takes the
// files the predecessor passed (the holder's offer, else systemd's) and
// maps their cache file. An error (ErrRunning, a refused handover)
// leaves the node as it was. Close releases what Begin took.
func Begin(ctx context.Context, cfg Config, sd Systemd) (*Handover, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	h := &Handover{cfg: cfg, log: cfg.Logger.With("component", "handover"), store: sd.Store,
		serving: make(chan struct{}), gave: make(chan struct{})}
	if cfg.LockFile != "" {
		lock, err := lockInstance(cfg.LockFile)
		if errors.Is(err, ErrRunning) && cfg.From != "" {
			// One runs: ask it for a surge handover. A refusal
			// leaves it as it was, like the error above.
			lock, err = h.takeFrom(ctx)
		}
		if err != nil {
			return nil, err
		}
		h.lock = lock
	} else if cfg.From != "" {
		if _, err := h.takeFrom(ctx); err != nil {
			h.log.Info("handover: none taken: starting on its own", slog.Any("err", err))
		}
	}
	if t := h.take; t != nil {
		// A surge handover's files, in place of systemd's.
		h.in = FromFiles(t.offer.Files, cfg.Logger)
		t.offer.Files = nil
	} else {
		var files []*os.File
		if sd.Files != nil {
			files = sd.Files()
		}
		h.in = FromFiles(files, cfg.Logger)
	}
	if f := h.in.Cache(); f != nil {
		w, err := ReadCaches(f, cfg.CacheLimit)
		f.Close()
		if err != nil {
			h.log.Error("handover: cache file ignored: the caches load from the disk snapshots", slog.Any("err", err))
		} else {
			h.warm, h.fromPID, h.warmCache = w, w.FromPID, true
		}
	}
	return h, nil
}

// Inherited returns the sockets the predecessor passed, for the
// listeners to take; nil when there are none.
func (h *Handover) Inherited() *Inherited {
	if h == nil || h.in.Sockets() == 0 {
		return nil
	}
	return h.in
}

// Cache returns the bytes the predecessor's cache file holds under key
// and forgets them; nil if it has none. They are valid until Serving.
func (h *Handover) Cache(key string) []byte {
	if h == nil {
		return nil
	}
	return h.warm.Take(key)
}

// LoadCache fills c with the cache the predecessor passed under key;
// false if there is none or it does not load (the caller then loads the
// disk snapshot). Lines go to log, the cache's own.
func (h *Handover) LoadCache(key string, c interface {
	Load(io.Reader) (int, error)
}, log *slog.Logger) bool {
	b := h.Cache(key)
	if b == nil {
		return false
	}
	start := time.Now()
	n, err := c.Load(bytes.NewReader(b))
	if err != nil {
		log.Error("handover: cache from the previous process ignored: loading the disk snapshot", slog.Any("err", err))
		return false
	}
	h.entries += n
	log.Info("cache loaded from the previous process", "entries", n, "took", time.Since(start).Round(time.Millisecond).String())
	return true
}

// Serving runs once srv's listeners read and its steering program is
// attached. It unmaps the cache file, closes the inherited sockets no
// listener took and removes them from the store (left there, each stays
// in its reuseport group with no one reading it), removes the consumed
// cache file, stores every socket of srv for the next process and logs
// the handover; then it tells a giver that this process serves (the
// giver stops) and makes the lock ours. From here srv may give.
func (h *Handover) Serving(srv Server) error {
	h.srv = srv
	h.keepSockets()
	err := h.accept()
	close(h.serving)
	return err
}

func (h *Handover) keepSockets() {
	if h.warm != nil {
		if n := h.warm.Len(); n > 0 {
			h.log.Info("handover: caches of the previous process not needed", "caches", n)
		}
		h.warm.Close()
		h.warm = nil
	}
	for _, name := range h.in.Rest(h.cfg.Listen) {
		if err := h.store.Remove(name); err != nil {
			h.log.Warn("handover: unneeded socket not removed from the store", slog.Any("err", err))
		}
	}
	if err := h.store.Remove(CacheName); err != nil {
		h.log.Warn("handover: cache file not removed from the store", slog.Any("err", err))
	}
	socks, err := h.srv.Sockets()
	if err != nil {
		h.log.Warn("handover: sockets not stored: the next process binds new ones", slog.Any("err", err))
		return
	}
	stored, index := 0, map[string]int{}
	for _, s := range socks {
		k := SocketName(s.Addr, s.UDP, 0)
		name := SocketName(s.Addr, s.UDP, index[k])
		index[k]++
		if err := h.store.Put(name, s.Conn); err != nil {
			h.log.Warn("handover: socket not stored: the next process binds a new one", "name", name, slog.Any("err", err))
			continue
		}
		stored++
	}
	taken := h.in.Taken()
	if taken > 0 || h.warmCache {
		cache := "a warm cache"
		if !h.warmCache {
			cache = "no cache"
		}
		h.log.Info("handover: took "+strconv.Itoa(taken)+" sockets and "+cache+" from the previous process",
			"from_pid", h.fromPID, "pid", os.Getpid(), "sockets", taken, "bound", len(socks)-taken, "cache_entries", h.entries, "stored", stored)
		return
	}
	if h.store.Enabled() {
		h.log.Info("handover: nothing inherited; sockets stored for the next process", "stored", stored)
	}
}

// Stop runs at the daemon's stop, before its read loops stop, while it
// still answers: it writes every cache into a sealed memfd and stores it
// for the next process, so that nothing but the drain stands between
// reading the last query and exiting; queries that arrive meanwhile wait
// on the stored sockets for the next process. It returns true when this
// process gave to a surge taker: the taker serves with the caches and
// writes the disk snapshots, which the caller then must not (two writers
// would race on the files); false: the caller writes them (a stop drops
// the store: a cold start loads them).
func (h *Handover) Stop() (gave bool) {
	if h.Gave() {
		return true
	}
	if h.srv == nil || !h.store.Enabled() {
		return false
	}
	saves := h.srv.Caches()
	if len(saves) == 0 {
		return false
	}
	start := time.Now()
	f, n, err := WriteCaches(os.Getpid(), h.cfg.CacheLimit, saves)
	if err == nil {
		err = h.store.PutFile(CacheName, f)
		f.Close()
	}
	if err != nil {
		h.log.Error("handover: caches not handed over: the next process loads the disk snapshots", slog.Any("err", err))
	} else {
		h.log.Info("handover: caches stored for the next process", "caches", len(saves), "entries", n, "took", time.Since(start).Round(time.Millisecond).String())
	}
	return false
}

// Close releases the lock (a lock given on is only closed: its holder
// goes on) and, when this process took a surge handover but did not get
// to serve, tells the giver, which serves on. It runs last, once the
// daemon's parts have stopped.
func (h *Handover) Close() error {
	if t := h.take; t != nil {
		t.refuse(errors.New("start failed: see its log"))
	}
	h.warm.Close() // nil once Serving ran
	if h.lock != nil {
		return h.lock.release()
	}
	return nil
}

// GaveC is closed once this process has handed over to a surge taker:
// the daemon then stops.
func (h *Handover) GaveC() <-chan struct{} { return h.gave }

// Gave says whether this process handed over to a surge taker.
func (h *Handover) Gave() bool {
	select {
	case <-h.gave:
		return true
	default:
		return false
	}
}

// GaveTo is the PID of the surge taker this process gave to; 0 if none.
func (h *Handover) GaveTo() int { return int(h.gaveTo.Load()) }
