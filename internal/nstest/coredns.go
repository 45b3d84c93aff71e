package nstest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// CoreDNSEnv names the environment variable that points at a coredns binary;
// without it FindCoreDNS looks for REPO/bin/coredns (`make bin/coredns`).
const CoreDNSEnv = "DNSSTANDBY_COREDNS"

const (
	// mainModule is the module line that marks the repository root (the
	// bench module lives below it under a longer path).
	mainModule = "module github.com/dnsstandby/dnsstandby"
	// coreDNSReadyTimeout bounds CoreDNS's start-up: it is up in about 100 ms
	// here; a slow CI machine under `go test ./...` gets ample margin.
	coreDNSReadyTimeout = 15 * time.Second
	// probeTimeout is how long a readiness probe waits for its answer.
	probeTimeout = 25 * time.Millisecond
)

// ErrNoCoreDNS means no coredns binary was found.
var ErrNoCoreDNS = errors.New("no coredns binary: run `make bin/coredns` at the repository root, or set " + CoreDNSEnv)

// FindCoreDNS returns the coredns binary to use: $DNSSTANDBY_COREDNS if set,
// else bin/coredns in the repository holding the working directory.
func FindCoreDNS() (string, error) {
	if p := os.Getenv(CoreDNSEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%w (%s=%s: %v)", ErrNoCoreDNS, CoreDNSEnv, p, err)
		}
		return p, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", fmt.Errorf("%w (%v)", ErrNoCoreDNS, err)
	}
	p := filepath.Join(root, "bin", "coredns")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%w (%v)", ErrNoCoreDNS, err)
	}
	return p, nil
}

// RepoRoot returns the directory of the main module's go.mod, searched
// upwards from the working directory (a package's directory under go test).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if isMainModule(filepath.Join(dir, "go.mod")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod of github.com/dnsstandby/dnsstandby above the working directory")
		}
		dir = parent
	}
}

func isMainModule(gomod string) bool {
	f, err := os.Open(gomod)
	if err != nil {
		return false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if strings.TrimSpace(s.Text()) == mainModule {
			return true
		}
	}
	return false
}

// CoreDNSBinary is FindCoreDNS for tests: it skips the test, saying how to
// build CoreDNS, when there is none.
func CoreDNSBinary(t testing.TB) string {
	t.Helper()
	p, err := FindCoreDNS()
	if err != nil {
		t.Skip(err)
	}
	return p
}

// CoreDNSConfig says how to start a CoreDNS.
type CoreDNSConfig struct {
	Binary   string            // coredns binary; "" means FindCoreDNS
	Corefile string            // the Corefile; relative paths in it resolve in Dir
	Files    map[string]string // more files to write into Dir (zone files), by relative name
	Probe    string            // "ADDR:PORT" that must answer a DNS query (any rcode) before start returns
	Args     []string          // more command-line arguments
	Cgroup   string            // a cgroup2 directory to start CoreDNS in, as systemd starts a unit in its own; "": the caller's
}

// CoreDNS is a running CoreDNS.
type CoreDNS struct {
	*Process
	Dir    string // holds the Corefile and Files; CoreDNS runs in it
	ownDir bool   // LaunchCoreDNS made Dir and Close removes it
}

// StartCoreDNS writes the Corefile and files into a test temp directory,
// starts CoreDNS in ns, waits until cfg.Probe answers, and stops it when the
// test ends (logging its output if the test failed). It skips the test when
// no coredns binary is found.
func StartCoreDNS(t testing.TB, ns *Namespace, cfg CoreDNSConfig) *CoreDNS {
	t.Helper()
	if cfg.Binary == "" {
		cfg.Binary = CoreDNSBinary(t)
	}
	c, err := launchCoreDNS(ns, cfg, t.TempDir())
	if c != nil {
		stopWithTest(t, c.Process)
	}
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// LaunchCoreDNS is StartCoreDNS outside tests: it writes into a new
// temporary directory, and Close stops CoreDNS and removes the directory.
func LaunchCoreDNS(ns *Namespace, cfg CoreDNSConfig) (*CoreDNS, error) {
	dir, err := os.MkdirTemp("", "nstest-coredns-")
	if err != nil {
		return nil, fmt.Errorf("start coredns: %w", err)
	}
	c, err := launchCoreDNS(ns, cfg, dir)
	if err != nil {
		if c != nil {
			err = errors.Join(err, c.Process.Stop())
		}
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	c.ownDir = true
	return c, nil
}

// Close stops CoreDNS and removes a directory LaunchCoreDNS made.
func (c *CoreDNS) Close() error {
	err := c.Stop()
	if c.ownDir {
		err = errors.Join(err, os.RemoveAll(c.Dir))
	}
	return err
}

// launchCoreDNS returns the process, if it started, even with an error, so
// that the caller can stop it.
func launchCoreDNS(ns *Namespace, cfg CoreDNSConfig, dir string) (*CoreDNS, error) {
	if cfg.Binary == "" {
		p, err := FindCoreDNS()
		if err != nil {
			return nil, err
		}
		cfg.Binary = p
	}
	if cfg.Probe == "" {
		return nil, errors.New("start coredns: CoreDNSConfig.Probe is empty")
	}
	files := map[string]string{"Corefile": cfg.Corefile}
	maps.Copy(files, cfg.Files)
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if !filepath.IsLocal(name) {
			return nil, fmt.Errorf("start coredns: file name %q is not local to its directory", name)
		}
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, fmt.Errorf("start coredns: %w", err)
		}
		if err := os.WriteFile(p, []byte(files[name]), 0o644); err != nil {
			return nil, fmt.Errorf("start coredns: %w", err)
		}
	}
	args := append([]string{"-conf", filepath.Join(dir, "Corefile")}, cfg.Args...)
	p, err := ns.startIn(dir, cfg.Cgroup, cfg.Binary, args...)
	if err != nil {
		return nil, fmt.Errorf("start coredns: %w", err)
	}
	c := &CoreDNS{Process: p, Dir: dir}
	if err := waitAnswering(ns, p, cfg.Probe, coreDNSReadyTimeout); err != nil {
		return c, fmt.Errorf("start coredns: %w\noutput:\n%s", err, p.Output())
	}
	return c, nil
}

// waitAnswering polls addr with a DNS query from inside ns until any reply
// comes back, the process exits, or timeout passes.
func waitAnswering(ns *Namespace, p *Process, addr string, timeout time.Duration) error {
	q := new(dns.Msg)
	q.SetQuestion(".", dns.TypeNS)
	var lastErr error
	err := testkit.Poll(context.Background(), timeout, func() (bool, error) {
		select {
		case <-p.Done():
			return false, fmt.Errorf("%s exited before answering on %s: %v", p, addr, p.Err())
		default:
		}
		// A refused UDP port answers at once with ICMP; testkit.Poll's pause keeps
		// that from spinning.
		_, lastErr = ns.Exchange("udp", "", addr, q, probeTimeout)
		return lastErr == nil, nil
	})
	if errors.Is(err, testkit.ErrNotWithin) {
		return fmt.Errorf("%s not answering on %s after %v: %v", p, addr, timeout, lastErr)
	}
	return err
}
