package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dnsstandby/dnsstandby/internal/gendoc"
)

// localdnsDir is where AKS puts LocalDNS's Corefile.
const localdnsDir = "/opt/azure/containers/localdns"

// TestValidateDocs keeps docs/operating.md's --validate sample the
// binary's output for AgentBaker's Corefile, with the DaemonSet's two
// listeners. The Corefile is read from a temporary directory, whose name
// the sample shows as the node's.
func TestValidateDocs(t *testing.T) {
	data, err := os.ReadFile("../../corefile/testdata/agentbaker.corefile")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "updated.localdns.corefile"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"run", "--listen", "169.254.10.10:53", "--listen", "169.254.10.11:53",
		"--localdns-corefile", localdnsDir + "/updated.localdns.corefile",
		"--fallback-upstream", "10.0.0.10:53", "--state-dir", "", "--localdns-coredns", "", "--fallback-resolv-conf", "", "--validate"}
	run := make([]string, len(args))
	for i, a := range args {
		run[i] = strings.ReplaceAll(a, localdnsDir, dir)
	}
	// `make docs` sets DNSSTANDBY_UPDATE_DOCS, which run refuses as a
	// setting it does not have.
	update, updating := os.LookupEnv(gendoc.UpdateEnv)
	os.Unsetenv(gendoc.UpdateEnv)
	var stdout, stderr bytes.Buffer
	code := dispatch(run, &stdout, &stderr)
	if updating {
		os.Setenv(gendoc.UpdateEnv, update)
	}
	if code != exitOK {
		t.Fatalf("exit %d: %s\n%s", code, stderr.String(), stdout.String())
	}
	shown := make([]string, len(args))
	for i, a := range args {
		if a == "" {
			a = "''"
		}
		shown[i] = a
	}
	body := "```text\n$ dnsstandby " + strings.Join(shown, " ") + "\n" +
		strings.ReplaceAll(stdout.String(), dir, localdnsDir) + "$ echo $?\n0\n```"
	gendoc.Check(t, "../../docs/operating.md", "validate-sample", body)
}
