package daemon

import (
	"log/slog"

	"github.com/dnsstandby/dnsstandby/handover"
)

// This file is the daemon's side of the hand-off between processes
// (package handover): what it tells the Handover, and what the Handover
// may ask of it (served).

// handoverConfig is the Handover's part of the configuration.
func (d *Daemon) handoverConfig() handover.Config {
	return handover.Config{
		LockFile:   d.cfg.LockFile,
		From:       d.cfg.HandoverFrom,
		Listen:     d.cfg.Listen,
		CacheLimit: handoverLimit(&d.cfg),
		GiverStop:  d.cfg.ShutdownTimeout,
		Logger:     d.base,
	}
}

// handoverLimit bounds the cache file: twice the caches' byte bound (a
// snapshot is smaller than the entries in memory, so a full cache fits),
// at least 16 MiB.
func handoverLimit(cfg *Config) int64 { return max(2*cfg.Cache.MaxBytes, 16<<20) }

// served is handover.Server over a running daemon.
type served struct{ d *Daemon }

// Sockets are the responder's.
func (s served) Sockets() ([]handover.Socket, error) {
	socks, err := s.d.srv.Sockets()
	if err != nil {
		return nil, err
	}
	out := make([]handover.Socket, 0, len(socks))
	for _, k := range socks {
		out = append(out, handover.Socket{Addr: k.Addr, UDP: k.UDP, Conn: k.Conn})
	}
	return out, nil
}

// Caches are those in force on every view, and with them the last known
// good; none without a cache.
func (s served) Caches() []handover.CacheSave {
	var saves []handover.CacheSave
	for _, v := range s.d.views {
		v.mu.Lock()
		if v.set != nil {
			for zone, zc := range v.set.caches {
				saves = append(saves, handover.CacheSave{Key: handover.CacheKey(v.listen, zone), Save: zc.c.Save})
			}
		}
		v.mu.Unlock()
	}
	if len(saves) == 0 {
		return nil
	}
	if lg := s.d.lastGoodSave(); lg != nil {
		saves = append(saves, *lg)
	}
	return saves
}

// handOver runs at stop, before the read loops stop, while dnsstandby
// still answers: the Handover stores the caches for the next process,
// then the disk snapshots are written (for a cold start: a stop drops
// the store), unless a surge taker serves with the caches and writes
// them.
func (d *Daemon) handOver() {
	if !d.hand.Stop() {
		for _, zc := range d.caches() {
			if zc.snap.path == "" {
				continue
			}
			if err := zc.snap.save(zc.c, slog.LevelInfo); err != nil {
				zc.snap.log.Error("cache snapshot not written", slog.Any("err", err))
			}
		}
	}
	d.savedAtStop.Store(true)
}
