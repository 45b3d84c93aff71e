package doccheck

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// A Row is one package of docs/architecture.md's package table.
type Row struct {
	Package string   // relative to the module, e.g. "takeover/peer"
	Forbid  []string // packages it may not import, directly or not
	// ForbidAll: it may import no package of the module at all.
	ForbidAll bool
	Line      int
}

const (
	tableHeader = "| package | owns | may not import |"
	anyOfModule = "any of this module"
)

var backticked = regexp.MustCompile("`([^`]+)`")

// PackageTable reads the package table from docs/architecture.md's text:
// the table whose header is tableHeader, one package a row.
func PackageTable(text string) ([]Row, error) {
	var rows []Row
	in := false
	for i, l := range strings.Split(text, "\n") {
		t := strings.TrimSpace(l)
		switch {
		case t == tableHeader:
			if in || rows != nil {
				return nil, fmt.Errorf("line %d: a second package table", i+1)
			}
			in = true
		case !in, strings.HasPrefix(t, "|---"):
		case !strings.HasPrefix(t, "|"):
			in = false
		default:
			c := cells(t)
			if len(c) != 3 {
				return nil, fmt.Errorf("line %d: %d cells, want 3 (package, owns, may not import)", i+1, len(c))
			}
			m := backticked.FindAllStringSubmatch(c[0], -1)
			if len(m) != 1 {
				return nil, fmt.Errorf("line %d: %q: one package in backquotes a row", i+1, c[0])
			}
			r := Row{Package: m[0][1], Line: i + 1}
			switch c[2] {
			case "—", "-":
			case anyOfModule:
				r.ForbidAll = true
			default:
				for _, f := range backticked.FindAllStringSubmatch(c[2], -1) {
					r.Forbid = append(r.Forbid, f[1])
				}
				if r.Forbid == nil {
					return nil, fmt.Errorf("line %d: %q: packages in backquotes, %q or —", i+1, c[2], anyOfModule)
				}
			}
			rows = append(rows, r)
		}
	}
	if rows == nil {
		return nil, fmt.Errorf("no table with the header %q", tableHeader)
	}
	return rows, nil
}

// Violations compares the table with the module's packages and what each
// depends on (relative paths, dependencies of this module only). It
// returns one line per package missing from the table, row naming no
// package, forbidden import, and test-only package a non-test package
// imports.
func Violations(rows []Row, deps map[string][]string, testOnly []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, r := range rows {
		if seen[r.Package] {
			out = append(out, fmt.Sprintf("docs/architecture.md:%d: %s has two rows", r.Line, r.Package))
		}
		seen[r.Package] = true
		d, ok := deps[r.Package]
		if !ok {
			out = append(out, fmt.Sprintf("docs/architecture.md:%d: %s is not a package of the module (go list ./...)", r.Line, r.Package))
			continue
		}
		for _, f := range r.Forbid {
			if _, ok := deps[f]; !ok {
				out = append(out, fmt.Sprintf("docs/architecture.md:%d: %s's row forbids %s, which is not a package of the module", r.Line, r.Package, f))
			}
		}
		for _, dep := range d {
			if r.ForbidAll || slices.Contains(r.Forbid, dep) {
				out = append(out, fmt.Sprintf("%s imports %s (directly or through another), which docs/architecture.md:%d forbids", r.Package, dep, r.Line))
			}
		}
	}
	for p, d := range deps {
		if !seen[p] {
			out = append(out, fmt.Sprintf("%s is missing from docs/architecture.md's package table", p))
		}
		for _, dep := range d {
			if slices.Contains(testOnly, dep) && !slices.Contains(testOnly, p) {
				out = append(out, fmt.Sprintf("%s imports %s, which only tests may import", p, dep))
			}
		}
	}
	slices.Sort(out)
	return out
}
