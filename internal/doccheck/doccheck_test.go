package doccheck

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/dnsstandby/dnsstandby/internal/gendoc"
)

// root is the repository's top directory, seen from this package's.
const root = "../.."

const module = "github.com/dnsstandby/dnsstandby"

// Directories that hold no document of the project: build output, the
// lab's results, dependencies.
var skipDirs = map[string]bool{".git": true, "bin": true, "dist": true, "out": true, "node_modules": true, "testdata": true}

// documents returns the repository's Markdown files, by path from root.
func documents(t *testing.T) map[string]string {
	t.Helper()
	docs := map[string]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && skipDirs[d.Name()] {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(d.Name(), ".md") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		docs[rel] = string(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if docs["README.md"] == "" || docs["bench/README.md"] == "" {
		t.Fatalf("found %d documents, not README.md and bench/README.md: is root %s the repository?", len(docs), root)
	}
	return docs
}

// TestFiguresOnce: no figure the project measures is stated in two
// documents, or in one with two values.
func TestFiguresOnce(t *testing.T) {
	var all []Statement
	for file, text := range documents(t) {
		all = append(all, Figures(file, text)...)
	}
	for _, c := range Conflicts(all) {
		t.Error(c)
	}
	// The figures this test exists for must be found where they live, or
	// a change of wording would make it pass by seeing nothing.
	for _, want := range []string{"how long `make lab` takes", "how long one lab scenario takes", "how long `make test` takes", "crash-storm table, PR 9439 and dnsstandby: unanswered"} {
		found := false
		for _, s := range all {
			found = found || s.Figure == want
		}
		if !found {
			t.Errorf("%s: stated nowhere the test can find", want)
		}
	}
}

func TestFigures(t *testing.T) {
	headline := "| node | answered on the first try | unanswered |\n|---|--:|--:|\n| LocalDNS as shipped | 15.20% | 62,691 |\n| PR 9439 and dnsstandby | 99.91% | 0 |\n"
	tests := []struct {
		name      string
		docs      map[string]string
		conflicts int
	}{
		{"once", map[string]string{
			"bench/README.md": "| `make lab` (every scenario) | about 15 minutes |\n| `make test` | about 4–5 minutes |\n",
			"README.md":       "    make lab    # every scenario\n\nHow long: see bench/README.md.\n",
		}, 0},
		{"two values in two documents", map[string]string{
			"CONTRIBUTING.md": "    make lab                         # every scenario, about 8 minutes\n",
			"README.md":       "A full `make lab` takes about 13 minutes.\n",
		}, 1},
		{"the same value in two documents", map[string]string{
			"a.md": "`make test` takes about 4 minutes.\n",
			"b.md": "As root, `make test` (about 4 minutes).\n",
		}, 1},
		{"several subjects in one sentence", map[string]string{
			"README.md": "Measured: from a fresh clone `make lab\nSCENARIO=crash-storm` 2 min 0 s and `.ci/run` (`make test`) 3 min 56 s; a\nfull `make lab` 13 min 9 s.\n",
			"bench.md":  "| `make lab SCENARIO=NAME` | about 2–3 minutes |\n",
		}, 1}, // the scenario; test and lab are stated in one document each
		{"a duration of something else", map[string]string{
			"a.md": "A mirrored entry is fresh for at most 5 minutes.\n",
			"b.md": "Entries live 5 minutes in the cache.\n",
		}, 0},
		{"headline in one document", map[string]string{"README.md": headline}, 0},
		{"headline restated differently", map[string]string{
			"README.md":      headline,
			"docs/design.md": "| setup | answered on the first try | unanswered |\n|---|--:|--:|\n| LocalDNS as shipped | 15.55% | 124,306 |\n",
		}, 2},
		{"other tables", map[string]string{
			"README.md": headline,
			"bench.md":  "| scenario | setup | sent | answered 1st try |\n|---|---|--:|--:|\n| crash-storm | localdns-shipped | 147,458 | 15.55% |\n",
		}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var all []Statement
			for f, text := range tt.docs {
				all = append(all, Figures(f, text)...)
			}
			got := Conflicts(all)
			if len(got) != tt.conflicts {
				t.Errorf("%d conflicts, want %d: %q (statements %v)", len(got), tt.conflicts, got, all)
			}
		})
	}
}

// goList runs the go command in the repository's top directory.
func goList(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, msg)
	}
	return string(out)
}

// moduleDeps returns, for each package of the module, the packages of the
// module it depends on (not its tests), all relative to the module.
func moduleDeps(t *testing.T) map[string][]string {
	t.Helper()
	deps := map[string][]string{}
	rel := func(p string) (string, bool) {
		r, ok := strings.CutPrefix(p, module+"/")
		return r, ok
	}
	for _, l := range strings.Split(strings.TrimSpace(goList(t, "-f", "{{.ImportPath}} {{join .Deps \" \"}}", "./...")), "\n") {
		f := strings.Fields(l)
		p, ok := rel(f[0])
		if !ok {
			t.Fatalf("go list: %s is outside %s", f[0], module)
		}
		deps[p] = []string{}
		for _, d := range f[1:] {
			if r, ok := rel(d); ok {
				deps[p] = append(deps[p], r)
			}
		}
	}
	return deps
}

// TestArchitecture holds docs/architecture.md's package table to `go
// list`: every package has a row, every row a package, and no package
// imports what its row forbids or a test-only package.
func TestArchitecture(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "docs/architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := PackageTable(string(b))
	if err != nil {
		t.Fatal(err)
	}
	testOnly := []string{"internal/testkit", "internal/nstest", "internal/gendoc", "internal/doccheck"}
	for _, v := range Violations(rows, moduleDeps(t), testOnly) {
		t.Error(v)
	}
}

func TestViolations(t *testing.T) {
	deps := map[string][]string{
		"takeover":         {"takeover/peer"},
		"daemon":           {"takeover", "takeover/peer", "pipeline", "internal/testkit"},
		"pipeline":         {},
		"takeover/peer":    {},
		"internal/testkit": {},
	}
	table := func(rows ...string) string {
		return "x\n\n" + tableHeader + "\n|---|---|---|\n" + strings.Join(rows, "\n") + "\n\nafter\n"
	}
	all := []string{
		"| `takeover` | mode | `pipeline` |",
		"| `takeover/peer` | LocalDNS | any of this module |",
		"| `pipeline` | answer | `takeover` |",
		"| `daemon` | assembly | — |",
		"| `internal/testkit` | tests | — |",
	}
	tests := []struct {
		name string
		rows []string
		deps map[string][]string
		want []string // a word each violation must hold, in order
	}{
		{"clean", []string{all[0], all[1], all[2], all[3], all[4]}, map[string][]string{
			"takeover": {"takeover/peer"}, "daemon": {"takeover", "pipeline"}, "pipeline": {}, "takeover/peer": {}, "internal/testkit": {},
		}, nil},
		{"missing and extra", []string{all[0], all[1], all[2], all[4], "| `gone` | nothing | — |"}, map[string][]string{
			"takeover": {}, "daemon": {}, "pipeline": {}, "takeover/peer": {}, "internal/testkit": {},
		}, []string{"daemon is missing", "gone is not a package"}},
		{"forbidden imports", all, map[string][]string{
			"takeover": {"takeover/peer", "pipeline"}, "daemon": {}, "pipeline": {}, "takeover/peer": {"pipeline"}, "internal/testkit": {},
		}, []string{"takeover imports pipeline", "takeover/peer imports pipeline"}},
		{"test-only import", all, deps, []string{"daemon imports internal/testkit, which only tests"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rows, err := PackageTable(table(tt.rows...))
			if err != nil {
				t.Fatal(err)
			}
			got := Violations(rows, tt.deps, []string{"internal/testkit"})
			if len(got) != len(tt.want) {
				t.Fatalf("violations %q, want %d", got, len(tt.want))
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("violation %d: %q, want it to say %q", i, got[i], w)
				}
			}
		})
	}
}

func TestPackageTableErrors(t *testing.T) {
	for _, text := range []string{
		"no table here\n",
		tableHeader + "\n|---|---|---|\n| `a` `b` | two | — |\n",
		tableHeader + "\n|---|---|---|\n| `a` | two cells |\n",
		tableHeader + "\n|---|---|---|\n| `a` | bad forbid | pipeline |\n",
	} {
		if _, err := PackageTable(text); err == nil {
			t.Errorf("PackageTable(%q): no error", text)
		}
	}
}

// TestEvents: which calls are log events, and what is read of them.
func TestEvents(t *testing.T) {
	dir := t.TempDir()
	src := `package p
func f() {
	d.log.Warn("peer gone", "listener", l, slog.Any("err", err))
	log.Error("stop "+name, slog.Any("err", err))
	s.logger.Info("not an event")
	t.Error("not a log line")
	http.Error(w, "not a log line", 500)
	base.Warn("plain")
}
`
	if err := os.WriteFile(filepath.Join(dir, "p.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "p_test.go"), []byte("package p\nfunc g() { log.Warn(\"in a test\") }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := Events(dir, "p")
	if err != nil {
		t.Fatal(err)
	}
	want := []Event{
		{"WARN", "peer gone", []string{"listener", "err"}, "p"},
		{"ERROR", "stop …", []string{"err"}, "p"},
		{"WARN", "plain", nil, "p"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Events = %+v, want %+v", got, want)
	}
}

// moduleEvents returns every WARN and ERROR line the module's packages
// (not its tests) log.
func moduleEvents(t *testing.T) []Event {
	t.Helper()
	var all []Event
	for _, l := range strings.Split(strings.TrimSpace(goList(t, "-f", "{{.ImportPath}} {{.Dir}}", "./...")), "\n") {
		path, dir, _ := strings.Cut(l, " ")
		pkg := strings.TrimPrefix(strings.TrimPrefix(path, module), "/")
		if pkg == "" {
			pkg = "."
		}
		evs, err := Events(dir, pkg)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, evs...)
	}
	return all
}

// TestEventsDocs: docs/operating.md lists every WARN and ERROR line the
// code logs (generated), and each message its short list of lines to
// alert on names is one the code logs.
func TestEventsDocs(t *testing.T) {
	events := moduleEvents(t)
	if len(events) < 50 {
		t.Fatalf("%d events found: is the parser reading the tree?", len(events))
	}
	path := filepath.Join(root, "docs/operating.md")
	gendoc.Check(t, path, "log-events", EventTable(events))
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	section, _, _ := strings.Cut(string(doc[strings.Index(string(doc), "## Events"):]), "<!-- generated log-events")
	named := regexp.MustCompile("`([^`]+)`")
	for _, row := range strings.Split(section, "\n") {
		if !strings.HasPrefix(row, "| WARN") && !strings.HasPrefix(row, "| ERROR") {
			continue
		}
		for _, m := range named.FindAllStringSubmatch(cells(row)[1], -1) {
			name := strings.TrimSpace(strings.TrimSuffix(strings.TrimSuffix(m[1], "..."), "…"))
			if strings.Contains(name, " ") && !slices.ContainsFunc(events, func(e Event) bool { return strings.HasPrefix(e.Msg, name) }) {
				t.Errorf("docs/operating.md, Events: %q is no message the code logs", name)
			}
		}
	}
}
