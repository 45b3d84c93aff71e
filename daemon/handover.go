package daemon

import (
	"bytes"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/dnsstandby/dnsstandby/handover"
	"github.com/dnsstandby/dnsstandby/responder"
)

// handoverState is what this process took from its predecessor through
// systemd's file descriptor store (sockets, a warm cache) and what it
// leaves there for its successor. Outside systemd, or with a unit without
// FileDescriptorStoreMax=, nothing is inherited and what is stored is
// dropped: dnsstandby binds new sockets and loads the disk snapshots.
type handoverState struct {
	log   *slog.Logger
	store handover.Store
	in    *handover.Inherited
	warm  *handover.Warm // nil once the views are built, or if none came
	limit int64          // bound of the cache file, written and read

	fromPID   int // the predecessor's, from the cache file; 0 unknown
	warmCache bool
	entries   int         // loaded from the cache file
	saved     atomic.Bool // the stop's disk snapshots are written
}

// handoverLimit bounds the cache file: twice the caches' byte bound (a
// snapshot is smaller than the entries in memory, so a full cache fits),
// at least 16 MiB.
func handoverLimit(cfg *Config) int64 { return max(2*cfg.Cache.MaxBytes, 16<<20) }

// inherit takes what systemd passed (LISTEN_FDS) before anything binds or
// any cache is made: the sockets wait for startListeners, the cache file
// is mapped and checked for newZoneCache.
func (d *Daemon) inherit() {
	h := &handoverState{log: d.base.With("component", "handover"), store: handover.StoreFromEnv(), limit: handoverLimit(&d.cfg)}
	if t := d.surge.taking; t != nil {
		// A surge handover's files, in place of systemd's.
		h.in = handover.FromFiles(t.offer.Files, d.base)
		t.offer.Files = nil
	} else {
		h.in = handover.FromEnv(d.base)
	}
	if f := h.in.Cache(); f != nil {
		w, err := handover.ReadCaches(f, h.limit)
		f.Close()
		if err != nil {
			h.log.Error("handover: cache file ignored: the caches load from the disk snapshots", slog.Any("err", err))
		} else {
			h.warm, h.fromPID, h.warmCache = w, w.FromPID, true
			if b := w.Take(handover.LastGoodKey); b != nil {
				d.takeHandedLastGood(b)
			}
		}
	}
	d.ho = h
}

// loadWarm fills c, the cache of zone on ap, from the predecessor's cache
// file; false if the file has no such cache or it does not load.
func (d *Daemon) loadWarm(ap netip.AddrPort, zone string, c interface {
	Load(io.Reader) (int, error)
}, log *slog.Logger) bool {
	h := d.ho
	if h == nil || h.warm == nil {
		return false
	}
	b := h.warm.Take(handover.CacheKey(ap, zone))
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

// inheritor is what the responder takes sockets from; nil when nothing
// was inherited.
func (d *Daemon) inheritor() responder.Inheritor {
	if d.ho == nil || d.ho.in.Sockets() == 0 {
		return nil
	}
	return d.ho.in
}

// keepSockets runs once the listeners exist: it closes the inherited
// sockets no listener took and removes them from the store (left there,
// each stays in its reuseport group with no one reading it), removes the
// consumed cache file, and stores every socket of ours for the next
// process. It logs the handover.
func (d *Daemon) keepSockets() {
	h := d.ho
	if h == nil {
		return
	}
	if h.warm != nil {
		if n := h.warm.Len(); n > 0 {
			h.log.Info("handover: caches of the previous process not needed", "caches", n)
		}
		h.warm.Close()
		h.warm = nil
	}
	for _, name := range h.in.Rest(d.cfg.Listen) {
		if err := h.store.Remove(name); err != nil {
			h.log.Warn("handover: unneeded socket not removed from the store", slog.Any("err", err))
		}
	}
	if err := h.store.Remove(handover.CacheName); err != nil {
		h.log.Warn("handover: cache file not removed from the store", slog.Any("err", err))
	}
	socks, err := d.srv.Sockets()
	if err != nil {
		h.log.Warn("handover: sockets not stored: the next process binds new ones", slog.Any("err", err))
		return
	}
	stored, index := 0, map[string]int{}
	for _, s := range socks {
		k := handover.SocketName(s.Addr, s.UDP, 0)
		name := handover.SocketName(s.Addr, s.UDP, index[k])
		index[k]++
		if err := h.store.Put(name, s.Conn); err != nil {
			h.log.Warn("handover: socket not stored: the next process binds a new one", "name", name, slog.Any("err", err))
			continue
		}
		stored++
	}
	taken := d.srv.Inherited()
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

// handOver runs at stop, before the read loops stop, while dnsstandby
// still answers: it writes every cache into a sealed memfd and stores it
// for the next process, then the disk snapshots (for a cold start: a
// stop drops the store), so that nothing but the drain stands between
// reading the last query and exiting. Queries that arrive meanwhile wait
// on the stored sockets for the next process.
func (d *Daemon) handOver() {
	h := d.ho
	if h == nil {
		return
	}
	if d.gaveHandover() {
		// The taker serves with the caches and writes the snapshots;
		// two writers would race on the files.
		h.saved.Store(true)
		return
	}
	zcs := d.caches()
	if h.store.Enabled() && len(zcs) > 0 {
		start := time.Now()
		f, n, err := d.writeCacheFile()
		if err == nil {
			err = h.store.PutFile(handover.CacheName, f)
			f.Close()
		}
		if err != nil {
			h.log.Error("handover: caches not handed over: the next process loads the disk snapshots", slog.Any("err", err))
		} else {
			h.log.Info("handover: caches stored for the next process", "caches", len(zcs), "entries", n, "took", time.Since(start).Round(time.Millisecond).String())
		}
	}
	for _, zc := range zcs {
		if zc.snap.path == "" {
			continue
		}
		if err := zc.snap.save(zc.c, slog.LevelInfo); err != nil {
			zc.snap.log.Error("cache snapshot not written", slog.Any("err", err))
		}
	}
	h.saved.Store(true)
}

// savedAtStop says whether handOver wrote the disk snapshots already.
func (d *Daemon) savedAtStop() bool { return d.ho != nil && d.ho.saved.Load() }
