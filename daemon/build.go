package daemon

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dnsstandby/dnsstandby/corefile"
	"github.com/dnsstandby/dnsstandby/internal/atomicfile"
)

// This file learns what LocalDNS's CoreDNS accepts: the directives of the
// binary LocalDNS runs, which `coredns -plugins` lists. A Corefile is
// judged against them, so that a directive of that build (or a plugin it
// lacks) is judged as LocalDNS's CoreDNS judges it. Without the binary
// (another path, not mounted), CoreDNS 1.13.1's standard build stands in.

// pluginsTimeout bounds `coredns -plugins`: it prints and exits in about
// 100 ms of CPU (the binary's package init).
const pluginsTimeout = 5 * time.Second

// maxPluginsOutput bounds what is read of its output: 60 names.
const maxPluginsOutput = 64 << 10

// pluginName is what a line of `coredns -plugins` must be.
var pluginName = regexp.MustCompile(`^[a-z0-9_]+$`)

// builds caches the build of LocalDNS's binary by the file's identity, so
// that it runs once per binary, not at each resolution (the retries of a
// refused Corefile come every second), and keeps it in the state directory,
// so that a start does not run it again either: running it is about 100 ms
// of CPU on the way to binding, and a cold start's gap is made of such
// steps.
type builds struct {
	mu    sync.Mutex // guards following
	key   string     // path, inode, size, modification time of what was run
	build corefile.Build
	err   error
}

// buildFile is the build's copy in the state directory: the binary's
// identity on the first line, then its directives, one a line.
const buildFile = "localdns-coredns-plugins"

// get returns the build of the CoreDNS at path, or the standard build
// and why the binary's could not be had. "" is no binary: the standard
// build. stateDir ("" for none) keeps a build across starts.
func (b *builds) get(path, stateDir string) (corefile.Build, error) {
	if path == "" {
		return corefile.Build{}, nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return corefile.Build{}, fmt.Errorf("LocalDNS's CoreDNS: %w", err)
	}
	key := path
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		key = fmt.Sprintf("%s %d %d %d", path, st.Ino, fi.Size(), fi.ModTime().UnixNano())
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if key != b.key {
		b.key = key
		var ok bool
		if b.build, ok = storedBuild(stateDir, key, path); ok {
			b.err = nil
		} else if b.build, b.err = pluginsOf(path); b.err == nil {
			storeBuild(stateDir, key, b.build)
		}
	}
	return b.build, b.err
}

// storedBuild reads the build kept in stateDir for the binary key names
// (at path); anything else there, or nothing, is none (false).
func storedBuild(stateDir, key, path string) (corefile.Build, bool) {
	if stateDir == "" {
		return corefile.Build{}, false
	}
	b, err := os.ReadFile(filepath.Join(stateDir, buildFile))
	if err != nil || len(b) > maxPluginsOutput {
		return corefile.Build{}, false
	}
	first, rest, _ := strings.Cut(string(b), "\n")
	names := strings.Fields(rest)
	if first != key || len(names) == 0 {
		return corefile.Build{}, false
	}
	for _, n := range names {
		if !pluginName.MatchString(n) {
			return corefile.Build{}, false
		}
	}
	return corefile.Build{Directives: names, From: path}, true
}

// storeBuild keeps build for the binary key names in stateDir; a failure
// costs only a run of the binary at the next start. It writes only when
// the state directory exists (the daemon makes it) and holds no copy for
// this binary, so `run --validate` on a node serving leaves it as it was.
func storeBuild(stateDir, key string, build corefile.Build) {
	if stateDir == "" {
		return
	}
	_ = atomicfile.Write(filepath.Join(stateDir, buildFile), func(w io.Writer) error {
		_, err := io.WriteString(w, key+"\n"+strings.Join(build.Directives, "\n")+"\n")
		return err
	})
}

// pluginsOf runs `path -plugins` and reads the directives it lists, one a
// line (caddy's own "on" after a blank line among them).
func pluginsOf(path string) (corefile.Build, error) {
	ctx, cancel := context.WithTimeout(context.Background(), pluginsTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "-plugins")
	cmd.Env = []string{} // nothing of ours
	var out bytes.Buffer
	cmd.Stdout = &limited{w: &out, n: maxPluginsOutput}
	if err := cmd.Run(); err != nil {
		return corefile.Build{}, fmt.Errorf("%s -plugins: %w", path, err)
	}
	var names []string
	for _, line := range strings.Split(out.String(), "\n") {
		name := strings.TrimSpace(line)
		if name == "" {
			continue
		}
		if !pluginName.MatchString(name) {
			return corefile.Build{}, fmt.Errorf("%s -plugins: %q is not a plugin name", path, name)
		}
		names = append(names, name)
	}
	// A CoreDNS without these is not one LocalDNS could run.
	for _, must := range []string{"forward", "cache", "bind"} {
		if !slices.Contains(names, must) {
			return corefile.Build{}, fmt.Errorf("%s -plugins lists no %s: not a CoreDNS", path, must)
		}
	}
	return corefile.Build{Directives: names, From: path}, nil
}

// limited writes at most n bytes to w and drops the rest.
type limited struct {
	w io.Writer
	n int
}

func (l *limited) Write(p []byte) (int, error) {
	k := min(len(p), l.n)
	l.n -= k
	if k > 0 {
		if _, err := l.w.Write(p[:k]); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}
