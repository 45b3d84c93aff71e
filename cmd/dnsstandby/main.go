// Command dnsstandby is the standby DNS responder that keeps pod DNS
// answering while the node's LocalDNS is down. See README.md.
package main

import (
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"

	"github.com/dnsstandby/dnsstandby/check"
	"github.com/dnsstandby/dnsstandby/daemon"
)

// Exit codes: 2 for usage errors, as flag's and the Go tools' own. `run`
// has two of its own, both from sysexits.h so that systemctl names them,
// and both in the unit's RestartPreventExitStatus= (a crash, exit 2 from
// the Go runtime or a signal, still restarts):
//   - exitConfig (78, CONFIG): its flags, environment or configuration
//     are not usable; the unit stops, failed, with the line that says why.
//   - exitServed (75, TEMPFAIL): another dnsstandby serves this node (it
//     holds the lock, or this one handed over to it); the unit stops,
//     inactive, not failed (SuccessExitStatus=).
const (
	exitOK     = 0
	exitFail   = 1
	exitUsage  = 2
	exitServed = 75
	exitConfig = 78
)

func main() {
	os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr))
}

// command is one subcommand as the usage, the man page and the shell
// completion describe it (gen.go): they are made from this one list and
// from each command's own flag set.
type command struct {
	name    string
	summary string
	flags   func() *flag.FlagSet // nil: it takes none
}

// commands lists the subcommands an operator runs, in the usage's order.
// gen-man and gen-completion, which build the package, are not among them.
func commands() []command {
	return []command{
		{"run", "run the standby responder (dnsstandby run -h for its flags)", func() *flag.FlagSet {
			cfg := daemon.DefaultConfig()
			fs, _ := runFlags(&cfg)
			return fs
		}},
		{"status", "show the mode, LocalDNS's state and recent mode changes [--json]", func() *flag.FlagSet { fs, _ := adminFlags("status"); return fs }},
		{"hold", "keep traffic away from LocalDNS, e.g. before restarting it [--for DURATION]", func() *flag.FlagSet { fs, _ := adminFlags("hold"); return fs }},
		{"release", "end a hold: LocalDNS gets traffic back once it is trusted", func() *flag.FlagSet { fs, _ := adminFlags("release"); return fs }},
		{"check", "audit this node, read-only: PASS/SKIP/INFO/WARN/FAIL per check, exit 0/1/2 [--json]", func() *flag.FlagSet {
			cfg := check.DefaultConfig()
			fs, _ := checkFlags(&cfg, new([]netip.AddrPort), new([]netip.AddrPort))
			return fs
		}},
		{"cleanup", "delete the anchor link a stopped dnsstandby left (refuses while one runs)", func() *flag.FlagSet { fs, _, _ := cleanupFlags(); return fs }},
		{"version", "print the version, commit and Go version of this binary", nil},
	}
}

// usage lists the commands.
func usage() string {
	var b strings.Builder
	b.WriteString("usage: dnsstandby <command> [flags]\n\ncommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(&b, "  %-9s %s\n", c.name, c.summary)
	}
	return b.String()
}

func dispatch(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage())
		return exitUsage
	}
	switch args[0] {
	case "run":
		return runCommand(args[1:], stdout, stderr)
	case "status", "hold", "release":
		return adminCommand(args[0], args[1:], stdout, stderr)
	case "check":
		return checkCommand(args[1:], stdout, stderr)
	case "cleanup":
		return cleanupCommand(args[1:], stdout, stderr)
	case "version", "-version", "--version":
		return versionCommand(args[1:], stdout, stderr)
	case "gen-man":
		return genManCommand(args[1:], stdout, stderr)
	case "gen-completion":
		return genCompletionCommand(args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage())
		return exitOK
	}
	fmt.Fprintf(stderr, "dnsstandby: unknown command %q\n%s", args[0], usage())
	return exitUsage
}
