package dnsperf

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ScratchDir makes a temporary directory for a run's files, on a tmpfs
// where there is one: a full-rate `dnsperf -v` writes about 100 MB of
// answer lines, which should not become disk I/O mid-measurement.
func ScratchDir(prefix string) (string, error) {
	parent := os.TempDir()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		parent = "/dev/shm"
	}
	dir, err := os.MkdirTemp(parent, prefix)
	if err != nil {
		return "", fmt.Errorf("scratch directory: %w", err)
	}
	return dir, nil
}

// WriteQueryFile writes dir/queries.txt asking for each name's A record,
// and returns its path.
func WriteQueryFile(dir string, names []string) (string, error) {
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "%s A\n", n)
	}
	path := filepath.Join(dir, "queries.txt")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return "", fmt.Errorf("query file: %w", err)
	}
	return path, nil
}
