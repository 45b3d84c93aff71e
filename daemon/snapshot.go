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
	"github.com/dnsstandby/dnsstandby/internal/atomicfile"
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
	err := atomicfile.Write(s.path, func(w io.Writer) error {
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
