package nstest

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
)

// debianPackages names the Debian package of each tool the tests run
// (scripts/install-test-deps installs them; `make test` runs it).
var debianPackages = map[string]string{
	"dig":      "dnsutils",
	"kdig":     "knot-dnsutils",
	"ip":       "iproute2",
	"dnsperf":  "dnsperf",
	"dnsdist":  "dnsdist",
	"promtool": "prometheus",
	"getent":   "libc-bin",
	"taskset":  "util-linux",
}

// lookTool checks that the tool name (a command looked up in PATH, as
// `ip netns exec` will) is installed, so that a missing one fails with
// its package's name rather than ip's exit status.
func lookTool(name string) error {
	if strings.ContainsRune(name, '/') {
		return nil
	}
	if _, err := exec.LookPath(name); err != nil {
		return missingTool(name, err)
	}
	return nil
}

// missingTool turns exec's "not found" for the tool name into an error
// that names its Debian package; other errors pass unchanged.
func missingTool(name string, err error) error {
	if !errors.Is(err, exec.ErrNotFound) {
		return err
	}
	if pkg, ok := debianPackages[name]; ok {
		return fmt.Errorf("%s is not installed: install the Debian package %s (make test-deps does): %w", name, pkg, err)
	}
	return fmt.Errorf("%s is not installed: %w", name, err)
}
