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
// only (before LocalDNS's first start), one CoreDNS refuses, and none. Each
// listener must be served from its own blocks: the node's root zone goes
// to the VNet DNS, the pods' to kube-dns. Without a usable Corefile (and
// with an empty state directory: no last known good) dnsstandby runs from
// the fallback and --validate exits 1 saying so; --upstream, given, then
// wins over the fallback's kube-dns.
func validateWithCorefile(t *testing.T, bin string, args []string) {
	refused := strings.Replace(string(readFile(t, agentBakerCorefile)), "forward .", "froward .", 1)
	for _, tc := range []struct {
		name     string
		file     string   // what the Corefile is written as; "" for none
		text     string   // its content; "" for AgentBaker's
		extra    []string // more args
		wantCode int
		want     []*regexp.Regexp
	}{
		{"updated.localdns.corefile (what LocalDNS runs)", "updated.localdns.corefile", "", nil, 0, []*regexp.Regexp{
			rootRoute("169.254.10.10:53", "168.63.129.16:53"), rootRoute("169.254.10.11:53", "10.0.0.10:53"),
			regexp.MustCompile(`configuration: from the Corefile .*updated\.localdns\.corefile`),
		}},
		{"only localdns.corefile (before LocalDNS's first start)", "localdns.corefile", "", nil, 0, []*regexp.Regexp{
			rootRoute("169.254.10.10:53", "168.63.129.16:53"), rootRoute("169.254.10.11:53", "10.0.0.10:53"),
		}},
		{"a Corefile CoreDNS refuses: the fallback", "updated.localdns.corefile", refused, nil, 1, []*regexp.Regexp{
			regexp.MustCompile(`configuration: the FALLBACK`), regexp.MustCompile(`unknown directive 'froward'`),
			rootRoute("169.254.10.11:53", "10.0.0.10:53"),
		}},
		{"no Corefile: the fallback", "", "", nil, 1, []*regexp.Regexp{
			regexp.MustCompile(`configuration: the FALLBACK`), regexp.MustCompile(`none of the Corefiles .*/updated\.localdns\.corefile, .*/localdns\.corefile exists`),
			rootRoute("169.254.10.11:53", "10.0.0.10:53"),
		}},
		{"no Corefile but --upstream", "", "", []string{"--upstream=10.0.0.20:53"}, 1, []*regexp.Regexp{
			rootRoute("169.254.10.10:53", "10.0.0.20:53"), rootRoute("169.254.10.11:53", "10.0.0.20:53"),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run, dir := inLocalDNSDir(t, args)
			if tc.file != "" {
				text := readFile(t, agentBakerCorefile)
				if tc.text != "" {
					text = []byte(tc.text)
				}
				if err := os.WriteFile(filepath.Join(dir, tc.file), text, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			// A state directory of the test's: no last known good.
			run = append(append(slices.Clone(run), tc.extra...), "--state-dir="+filepath.Join(dir, "state"), "--validate")
			cmd := exec.Command(bin, run...)
			cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // no DNSSTANDBY_* from the test's environment
			out, err := cmd.CombinedOutput()
			if code := cmd.ProcessState.ExitCode(); code != tc.wantCode {
				t.Fatalf("dnsstandby %s: %v, want exit %d\n%s", strings.Join(run, " "), err, tc.wantCode, out)
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
