// Command dnsstandby is the standby DNS responder that keeps pod DNS
// answering while the node's LocalDNS is down. See README.md.
package main

import (
	"fmt"
	"io"
	"os"
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

const usage = `usage: dnsstandby <command> [flags]

commands:
  run       run the standby responder (dnsstandby run -h for its flags)
  status    show the mode, LocalDNS's state and recent mode changes [--json]
  hold      keep traffic away from LocalDNS, e.g. before restarting it [--for DURATION]
  release   end a hold: LocalDNS gets traffic back once it is trusted
  check     audit this node, read-only: PASS/SKIP/INFO/WARN/FAIL per check, exit 0/1/2 [--json]
  cleanup   delete the anchor link a stopped dnsstandby left (refuses while one runs)
  version   print the version, commit and Go version of this binary
`

func dispatch(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
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
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	fmt.Fprintf(stderr, "dnsstandby: unknown command %q\n%s", args[0], usage)
	return exitUsage
}
