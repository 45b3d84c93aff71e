// Package cgroupv2 finds the cgroup2 (unified) hierarchy and the cgroup a
// process is in, from /proc: where the mirror tap attaches its egress
// program (LocalDNS's cgroup), and where tests and the benchmarks put a
// LocalDNS of their own.
package cgroupv2

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Of returns the directory of the cgroup2 (unified) cgroup process
// pid is in, under the cgroup2 mount at root.
func Of(procRoot, root string, pid int) (string, error) {
	f, err := os.Open(filepath.Join(procRoot, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return "", fmt.Errorf("read cgroup of pid %d: %w", pid, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rel, ok := strings.CutPrefix(sc.Text(), "0::")
		if !ok {
			continue
		}
		if !strings.HasPrefix(rel, "/") || strings.Contains(rel, "/..") {
			// Outside this cgroup namespace: dnsstandby in a container
			// with a cgroup namespace of its own.
			return "", fmt.Errorf("cgroup of pid %d (%s) is outside dnsstandby's cgroup namespace", pid, rel)
		}
		return filepath.Join(root, rel), nil
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read cgroup of pid %d: %w", pid, err)
	}
	return "", fmt.Errorf("pid %d is in no cgroup2 (unified) cgroup", pid)
}

// Mount returns where the cgroup2 hierarchy is mounted (its root as this
// cgroup namespace sees it): /sys/fs/cgroup on a unified host,
// /sys/fs/cgroup/unified on a hybrid one.
func Mount(procRoot string) (string, error) { return mountIn(filepath.Join(procRoot, "self")) }

// errNoMount: a mount table without a cgroup2 hierarchy.
var errNoMount = errors.New("no cgroup2 hierarchy is mounted")

// mountIn finds the cgroup2 mount point in proc's mountinfo.
func mountIn(proc string) (string, error) {
	f, err := os.Open(filepath.Join(proc, "mountinfo"))
	if err != nil {
		return "", fmt.Errorf("find the cgroup2 mount: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		fields, fs := strings.Fields(pre), strings.Fields(post)
		if len(fields) >= 5 && len(fs) >= 1 && fs[0] == "cgroup2" && fields[3] == "/" {
			return unescapeMount(fields[4]), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("find the cgroup2 mount: %w", err)
	}
	return "", errNoMount
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Make creates the cgroup name under the cgroup of the calling process and
// returns its directory. The caller removes it with Remove once the
// processes in it have exited.
func Make(name string) (string, error) {
	root, err := Mount("/proc")
	if err != nil {
		return "", err
	}
	own, err := Of("/proc", root, os.Getpid())
	if err != nil {
		return "", err
	}
	dir := filepath.Join(own, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", fmt.Errorf("create cgroup: %w", err)
	}
	return dir, nil
}

// Move puts process pid (all its threads) into the cgroup at dir.
func Move(dir string, pid int) error {
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		return fmt.Errorf("move pid %d into cgroup %s: %w", pid, dir, err)
	}
	return nil
}

// Remove removes the cgroup at dir, which must hold no process.
func Remove(dir string) error {
	if err := os.Remove(dir); err != nil {
		return fmt.Errorf("remove cgroup: %w", err)
	}
	return nil
}
