package main

import (
	"fmt"
	"io"

	"github.com/dnsstandby/dnsstandby/internal/buildinfo"
)

func versionCommand(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		fmt.Fprintf(stderr, "dnsstandby version: takes no arguments, got %q\n", args)
		return exitUsage
	}
	fmt.Fprintln(stdout, buildinfo.Read())
	return exitOK
}
