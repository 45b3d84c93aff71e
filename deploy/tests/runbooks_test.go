package tests

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// runbooksDir holds one page per alert, relative to these tests.
const runbooksDir = "../../docs/runbooks"

// runbookURL is where an alert's runbook_url points: the page of the same
// name in the repository's docs/runbooks.
var runbookURL = regexp.MustCompile(`^https://github\.com/dnsstandby/dnsstandby/blob/main/docs/runbooks/([A-Za-z0-9]+)\.md$`)

// TestRunbooks: every alert's runbook_url names a page that exists in
// docs/runbooks and bears the alert's name; every page there is some
// alert's and is listed in the index; each page says what to look at on
// the node (dnsstandby status, journalctl, systemctl) before the kubectl
// equivalents for the DaemonSet.
func TestRunbooks(t *testing.T) {
	alerts := loadAlerts(t).all()
	linked := map[string]bool{}
	for _, r := range alerts {
		u := r.Annotations["runbook_url"]
		m := runbookURL.FindStringSubmatch(u)
		if m == nil {
			t.Errorf("%s: runbook_url %q, want %s", r.Alert, u, strings.ReplaceAll(runbookURL.String()[1:len(runbookURL.String())-1], `\`, ""))
			continue
		}
		if m[1] != r.Alert {
			t.Errorf("%s: runbook_url names %s.md, want %s.md", r.Alert, m[1], r.Alert)
		}
		linked[m[1]+".md"] = true
	}
	index := string(readFile(t, filepath.Join(runbooksDir, "README.md")))
	pages, err := filepath.Glob(filepath.Join(runbooksDir, "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	exists := map[string]bool{}
	for _, p := range pages {
		name := filepath.Base(p)
		if name == "README.md" {
			continue
		}
		exists[name] = true
		if !linked[name] {
			t.Errorf("%s: no alert's runbook_url points at it", p)
		}
		if !strings.Contains(index, "("+name+")") {
			t.Errorf("%s: not listed in %s/README.md", p, runbooksDir)
		}
		checkRunbook(t, p)
	}
	for name := range linked {
		if !exists[name] {
			t.Errorf("%s/%s: an alert's runbook_url points at it, and it does not exist", runbooksDir, name)
		}
	}
	if len(exists) != len(alerts) {
		t.Errorf("%d runbooks for %d alerts", len(exists), len(alerts))
	}
}

// checkRunbook holds one page to the shape every runbook has.
func checkRunbook(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	node := strings.Index(page, "\n## On the node\n")
	kube := strings.Index(page, "\n## With the DaemonSet\n")
	if node < 0 || kube < node {
		t.Errorf("%s: want a section \"On the node\" and after it \"With the DaemonSet\"", path)
		return
	}
	onNode := page[node:kube]
	for _, want := range []string{"dnsstandby status", "journalctl -u dnsstandby", "systemctl status"} {
		if !strings.Contains(onNode, want) {
			t.Errorf("%s: the node section does not say %q", path, want)
		}
	}
	if strings.Contains(onNode, "kubectl") {
		t.Errorf("%s: kubectl in the node section: the node comes first, kubectl second", path)
	}
	for _, want := range []string{"kubectl -n kube-system exec", "kubectl -n kube-system logs"} {
		if !strings.Contains(page[kube:], want) {
			t.Errorf("%s: the DaemonSet section does not say %q", path, want)
		}
	}
	// Relative links lead to files that exist.
	for _, m := range regexp.MustCompile(`\]\(([^)#:]+)(#[^)]*)?\)`).FindAllStringSubmatch(page, -1) {
		if _, err := os.Stat(filepath.Join(filepath.Dir(path), m[1])); err != nil {
			t.Errorf("%s: link %s: %v", path, m[1], err)
		}
	}
}
