package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// agentBakerCorefile is a LocalDNS Corefile as AgentBaker renders it on a
// node: the whoami block on both listeners, each listener's root block
// (the node's forwarding to the VNet DNS 168.63.129.16, the pods' to the
// kube-dns ClusterIP 10.0.0.10) with the hosts plugin and templates, and
// per-zone overrides.
const agentBakerCorefile = "../../corefile/testdata/agentbaker.corefile"

// inLocalDNSDir returns args with the node's LocalDNS directory
// (/opt/azure/containers/localdns) replaced, in every arg naming it, by a
// new test directory, and that directory: dnsstandby then reads the
// Corefile a test puts there as it reads the node's. It fails the test
// when no arg names the node's directory, as the replacement would then
// test nothing.
func inLocalDNSDir(t testing.TB, args []string) ([]string, string) {
	t.Helper()
	dir := t.TempDir()
	if strings.Contains(dir, ",") { // from the test's name: it would split the path list
		t.Fatalf("test directory %q holds a comma", dir)
	}
	out := make([]string, len(args))
	replaced := false
	for i, a := range args {
		out[i] = strings.ReplaceAll(a, localdnsDir+"/", dir+"/")
		replaced = replaced || out[i] != a
	}
	if !replaced {
		t.Fatalf("no argument names %s: %q", localdnsDir, args)
	}
	return out, dir
}

// rootRoute matches the line of `dnsstandby run --validate`'s table that
// says listener forwards the root zone to upstream.
func rootRoute(listener, upstream string) *regexp.Regexp {
	// The table's columns: LISTENER ZONE LOCAL UPSTREAMS ...; LOCAL may
	// hold spaces ("templates 2, hosts /etc/localdns/hosts").
	return regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(listener) + `\s+\.\s+.*\s` + regexp.QuoteMeta(upstream) + `(\s|$)`)
}

// validateWithCorefile runs `dnsstandby ARGS --validate` (args start with
// "run" and read LocalDNS's Corefile from the node's directory) the ways a
// node can have that directory: AgentBaker's Corefile as
// updated.localdns.corefile (what LocalDNS runs), as localdns.corefile
// only (before LocalDNS's first start), no Corefile (dnsstandby must not
// start: it would have no upstream), and no Corefile with --upstream, the
// documented override. Each listener must be served from its own blocks:
// the node's root zone goes to the VNet DNS, the pods' to kube-dns.
func validateWithCorefile(t *testing.T, bin string, args []string) {
	for _, tc := range []struct {
		name   string
		file   string   // what the Corefile is written as; "" for none
		extra  []string // more args
		wantOK bool
		want   []*regexp.Regexp
	}{
		{"updated.localdns.corefile (what LocalDNS runs)", "updated.localdns.corefile", nil, true, []*regexp.Regexp{
			rootRoute("169.254.10.10:53", "168.63.129.16:53"), rootRoute("169.254.10.11:53", "10.0.0.10:53"),
		}},
		{"only localdns.corefile (before LocalDNS's first start)", "localdns.corefile", nil, true, []*regexp.Regexp{
			rootRoute("169.254.10.10:53", "168.63.129.16:53"), rootRoute("169.254.10.11:53", "10.0.0.10:53"),
		}},
		{"no Corefile: no upstream and no start", "", nil, false, []*regexp.Regexp{
			regexp.MustCompile(`no upstream`), regexp.MustCompile(`updated\.localdns\.corefile: no such file`),
		}},
		{"no Corefile but --upstream (the override for such nodes)", "", []string{"--upstream=10.0.0.10:53"}, true, []*regexp.Regexp{
			rootRoute("169.254.10.10:53", "10.0.0.10:53"), rootRoute("169.254.10.11:53", "10.0.0.10:53"),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run, dir := inLocalDNSDir(t, args)
			if tc.file != "" {
				if err := os.WriteFile(filepath.Join(dir, tc.file), readFile(t, agentBakerCorefile), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			run = append(append(slices.Clone(run), tc.extra...), "--validate")
			cmd := exec.Command(bin, run...)
			cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // no DNSSTANDBY_* from the test's environment
			out, err := cmd.CombinedOutput()
			if (err == nil) != tc.wantOK {
				t.Fatalf("dnsstandby %s: %v, want success %v\n%s", strings.Join(run, " "), err, tc.wantOK, out)
			}
			for _, re := range tc.want {
				if !re.Match(out) {
					t.Errorf("output does not match %s:\n%s", re, out)
				}
			}
			if tc.file != "" && !strings.Contains(string(out), filepath.Join(dir, tc.file)) {
				t.Errorf("output does not name %s, the file read:\n%s", filepath.Join(dir, tc.file), out)
			}
		})
	}
}
