package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/dnsstandby/dnsstandby/handover"
	"github.com/dnsstandby/dnsstandby/takeover/anchor"
)

// cleanupCommand removes what a stopped dnsstandby leaves on the node on
// purpose: the anchor link holding the listen addresses, which stays so
// that the addresses stay local across restarts. The steering programs
// need nothing: with dnsstandby's sockets gone they pass every query to
// LocalDNS, and a dnsstandby started with --steering off detaches them.
// It refuses while a dnsstandby runs (it takes the same lock).
func cleanupCommand(args []string, stdout, stderr io.Writer) int {
	fs, link, lockFile := cleanupFlags()
	if err := parseWithEnv(fs, args, os.LookupEnv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stdout, "usage: dnsstandby cleanup [flags]\n\nDeletes the anchor link a stopped dnsstandby left (it keeps LocalDNS's\naddresses local across restarts); refuses while dnsstandby runs.")
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return exitOK
		}
		fmt.Fprintf(stderr, "dnsstandby cleanup: %v\n", err)
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "dnsstandby cleanup: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	if *lockFile != "" {
		release, err := handover.LockInstance(*lockFile)
		if err != nil {
			fmt.Fprintf(stderr, "dnsstandby cleanup: %v\n", err)
			return exitFail
		}
		defer release()
	}
	removed, err := anchor.Remove(*link, "")
	switch {
	case err != nil:
		fmt.Fprintf(stderr, "dnsstandby cleanup: anchor: %v\n", err)
		return exitFail
	case removed:
		fmt.Fprintf(stdout, "deleted link %s and the addresses it held\n", *link)
	default:
		fmt.Fprintf(stdout, "no link %s: nothing to clean up\n", *link)
	}
	return exitOK
}

// cleanupFlags binds the flags of `dnsstandby cleanup`.
func cleanupFlags() (fs *flag.FlagSet, link, lockFile *string) {
	fs = flag.NewFlagSet("dnsstandby cleanup", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	link = fs.String("anchor-link", anchor.DefaultLink, "the anchor link to delete, if dnsstandby made it")
	lockFile = fs.String("lock-file", handover.DefaultLockFile, "the lock a running dnsstandby holds")
	return fs, link, lockFile
}
