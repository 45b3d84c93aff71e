package doccheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Event is one line dnsstandby can log at WARN or ERROR: what an operator
// alerts on. They are read from the source, so the list in
// docs/operating.md cannot miss one or keep one the code dropped.
type Event struct {
	Level   string   // WARN or ERROR
	Msg     string   // the message; a computed tail is "…"
	Attrs   []string // the attribute keys the call names
	Package string   // relative to the module
}

// loggerNames are the names a slog.Logger goes by in this tree (`log`,
// `d.log`, `cfg.Logger`, `base`): a Warn or Error call on anything else
// (t.Error, http.Error) is not a log line.
var loggerNames = map[string]bool{"log": true, "logger": true, "Logger": true, "base": true}

// Events parses the non-test Go files in dir and returns the WARN and
// ERROR lines they log, for the package pkg.
func Events(dir, pkg string) ([]Event, error) {
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	var out []Event
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, fmt.Errorf("events: %w", err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			if e, ok := logEvent(n); ok {
				e.Package = pkg
				out = append(out, e)
			}
			return true
		})
	}
	return out, nil
}

// logEvent reads a call such as d.log.Warn("msg", "key", v, slog.Any("err", err)).
func logEvent(n ast.Node) (Event, bool) {
	call, ok := n.(*ast.CallExpr)
	if !ok || len(call.Args) == 0 {
		return Event{}, false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || (sel.Sel.Name != "Warn" && sel.Sel.Name != "Error") || !loggerNames[lastName(sel.X)] {
		return Event{}, false
	}
	e := Event{Level: strings.ToUpper(sel.Sel.Name), Msg: message(call.Args[0])}
	for i := 1; i < len(call.Args); i++ {
		switch a := call.Args[i].(type) {
		case *ast.BasicLit: // "key", value
			if k, err := strconv.Unquote(a.Value); err == nil {
				e.Attrs = append(e.Attrs, k)
				i++
			}
		case *ast.CallExpr: // slog.Any("key", value) and its kind
			if len(a.Args) > 0 {
				if k, ok := a.Args[0].(*ast.BasicLit); ok {
					if s, err := strconv.Unquote(k.Value); err == nil {
						e.Attrs = append(e.Attrs, s)
					}
				}
			}
		}
	}
	return e, true
}

// lastName is the identifier an expression ends in: log for d.snap.log.
func lastName(x ast.Expr) string {
	switch x := x.(type) {
	case *ast.Ident:
		return x.Name
	case *ast.SelectorExpr:
		return x.Sel.Name
	}
	return ""
}

// message is a log call's message: a literal, or the literal head of a
// concatenation followed by "…".
func message(x ast.Expr) string {
	switch x := x.(type) {
	case *ast.BasicLit:
		if s, err := strconv.Unquote(x.Value); err == nil {
			return s
		}
	case *ast.BinaryExpr:
		return strings.TrimSuffix(message(x.X), "…") + "…"
	}
	return "…"
}

// EventTable renders events as a Markdown table, one row per package,
// level and message (the attribute keys of its calls merged).
func EventTable(events []Event) string {
	type key struct{ pkg, level, msg string }
	attrs := map[key][]string{}
	var keys []key
	for _, e := range events {
		k := key{e.Package, e.Level, e.Msg}
		if _, ok := attrs[k]; !ok {
			keys = append(keys, k)
		}
		for _, a := range e.Attrs {
			if !slices.Contains(attrs[k], a) {
				attrs[k] = append(attrs[k], a)
			}
		}
	}
	slices.SortFunc(keys, func(a, b key) int {
		return strings.Compare(a.pkg+"\x00"+a.level+"\x00"+a.msg, b.pkg+"\x00"+b.level+"\x00"+b.msg)
	})
	var b strings.Builder
	b.WriteString("| package | level | `msg` | attributes |\n|---|---|---|---|\n")
	for _, k := range keys {
		as := make([]string, len(attrs[k]))
		for i, a := range attrs[k] {
			as[i] = "`" + a + "`"
		}
		fmt.Fprintf(&b, "| `%s` | %s | `%s` | %s |\n", k.pkg, k.level, strings.ReplaceAll(k.msg, "|", `\|`), strings.Join(as, ", "))
	}
	return b.String()
}
