package main

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
)

func TestVersionCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := dispatch([]string{"version"}, &out, &errOut); code != exitOK {
		t.Fatalf("version: exit %d, stderr %q", code, errOut.String())
	}
	// go test's binary has build information: its Go version at least.
	if got := out.String(); !strings.HasPrefix(got, "dnsstandby ") || !strings.HasSuffix(got, ", "+runtime.Version()+"\n") {
		t.Errorf("version printed %q", got)
	}
	out.Reset()
	if code := dispatch([]string{"version", "extra"}, &out, &errOut); code != exitUsage || out.Len() != 0 {
		t.Errorf("version with an argument: exit %d, stdout %q; want %d and nothing", code, out.String(), exitUsage)
	}
}
