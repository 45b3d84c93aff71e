package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/dnsstandby/dnsstandby/cache"
)

// snapshotName is the cache snapshot's file in --state-dir.
const snapshotName = "cache.snapshot"

// writeAtomic writes a file so that a crash at any moment leaves either the
// old file or the new one, never a torn one: a temporary file in the same
// directory, fsynced, renamed over the old, and the directory fsynced.
func writeAtomic(path string, write func(io.Writer) error) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if err := write(tmp); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: sync: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("write %s: sync directory: %w", path, err)
	}
	return nil
}

// saveSnapshot writes the cache to dir/cache.snapshot.
func saveSnapshot(c *cache.Cache, dir string, log *slog.Logger) {
	start := time.Now()
	var n int
	err := writeAtomic(filepath.Join(dir, snapshotName), func(w io.Writer) error {
		var err error
		n, err = c.Save(w)
		return err
	})
	if err != nil {
		log.Error("cache snapshot not written", "err", err.Error())
		return
	}
	log.Info("cache snapshot written", "entries", n, "took", time.Since(start).Round(time.Millisecond).String())
}

// loadSnapshot loads dir/cache.snapshot into c, if there is one. A bad
// snapshot is logged and ignored: the cache stays empty and works.
func loadSnapshot(c *cache.Cache, dir string, log *slog.Logger) {
	path := filepath.Join(dir, snapshotName)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		log.Info("no cache snapshot to load", "path", path)
		return
	}
	if err != nil {
		log.Error("cache snapshot not loaded", "path", path, "err", err.Error())
		return
	}
	defer f.Close()
	start := time.Now()
	n, err := c.Load(f)
	if err != nil {
		log.Error("cache snapshot ignored", "path", path, "err", err.Error())
		return
	}
	log.Info("cache snapshot loaded", "path", path, "entries", n, "took", time.Since(start).Round(time.Millisecond).String())
}

// snapshotLoop writes a snapshot every interval until ctx ends.
func snapshotLoop(ctx context.Context, c *cache.Cache, dir string, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			saveSnapshot(c, dir, log)
		}
	}
}
