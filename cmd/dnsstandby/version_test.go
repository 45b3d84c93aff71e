package main

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
)

func TestVersionCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	for _, cmd := range []string{"version", "--version", "-version"} {
		out.Reset()
		if code := dispatch([]string{cmd}, &out, &errOut); code != exitOK {
			t.Fatalf("%s: exit %d, stderr %q", cmd, code, errOut.String())
		}
		// go test's binary has build information: its Go version at least.
		if got := out.String(); !strings.HasPrefix(got, "dnsstandby ") || !strings.HasSuffix(got, ", "+runtime.Version()+"\n") {
			t.Errorf("%s printed %q", cmd, got)
		}
	}
	out.Reset()
	if code := dispatch([]string{"version", "extra"}, &out, &errOut); code != exitUsage || out.Len() != 0 {
		t.Errorf("version with an argument: exit %d, stdout %q; want %d and nothing", code, out.String(), exitUsage)
	}
}
