package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/dnsstandby/dnsstandby/cache"
)

// snapshotPath is where the cache of zone on the listen address ap keeps
// its snapshot in dir: cache-169.254.10.11-53-cluster.local.snapshot,
// "root" standing for the root zone. Bytes a file name should not hold
// are replaced by "_".
func snapshotPath(dir string, ap netip.AddrPort, zone string) string {
	name := strings.TrimSuffix(strings.ToLower(zone), ".")
	if name == "" {
		name = "root"
	}
	name = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '.' || r == '-' {
			return r
		}
		return '_'
	}, name)
	return filepath.Join(dir, fmt.Sprintf("cache-%s-%d-%s.snapshot", ap.Addr(), ap.Port(), name))
}

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

// snapshots keeps a cache's snapshot in the file path.
type snapshots struct {
	path string
	log  *slog.Logger
}

// save writes the cache's snapshot and logs it at level: the periodic
// writes at debug, the one at stop at info.
func (s snapshots) save(c *cache.Cache, level slog.Level) error {
	start := time.Now()
	var n int
	err := writeAtomic(s.path, func(w io.Writer) error {
		var err error
		n, err = c.Save(w)
		return err
	})
	if err != nil {
		return fmt.Errorf("cache snapshot: %w", err)
	}
	s.log.Log(context.Background(), level, "cache snapshot written", "entries", n, "took", time.Since(start).Round(time.Millisecond).String())
	return nil
}

// load loads the snapshot into c, if there is one. A bad snapshot is
// logged and ignored: the cache stays empty and works.
func (s snapshots) load(c *cache.Cache) {
	path := s.path
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		s.log.Info("no cache snapshot to load", "path", path)
		return
	}
	if err != nil {
		s.log.Error("cache snapshot not loaded", "path", path, slog.Any("err", err))
		return
	}
	defer f.Close()
	start := time.Now()
	n, err := c.Load(f)
	if err != nil {
		s.log.Error("cache snapshot ignored", "path", path, slog.Any("err", err))
		return
	}
	s.log.Info("cache snapshot loaded", "path", path, "entries", n, "took", time.Since(start).Round(time.Millisecond).String())
}

// copyFrom fills the empty cache c with the entries of old, the zone's
// cache under its former policy: a reloaded Corefile that changes a
// block's cache policy does not cost that block its answers.
func (s snapshots) copyFrom(old, c *cache.Cache) {
	var b bytes.Buffer
	n, err := old.Save(&b)
	if err == nil {
		n, err = c.Load(&b)
	}
	if err != nil {
		s.log.Error("cache policy changed: entries not carried over", slog.Any("err", err))
		return
	}
	s.log.Info("cache policy changed: entries carried over", "entries", n)
}
