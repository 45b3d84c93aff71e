package tests

import (
	"fmt"
	"go/ast"
	goparser "go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

// This file answers one question for the alert rules and the dashboard:
// does a PromQL expression name only metrics, labels and label values that
// dnsstandby exports? The inventory comes from the Go sources themselves
// (every prometheus.NewDesc and every *Opts{Name: ...}), so a metric that
// is renamed or removed fails the test instead of leaving a panel or an
// alert silently empty. The expressions are read by Prometheus's own
// PromQL parser.

// metricFamily is one exported metric.
type metricFamily struct {
	name   string
	kind   string          // "histogram", "summary" or "" (counter, gauge)
	labels map[string]bool // variable and constant labels
	pkgDir string          // the package that defines it, relative to the module root; "" for the runtime collectors
	// deprecated is a name kept for one release beside its new one (its
	// help starts "Deprecated:"): rules and dashboards use the new one.
	deprecated bool
}

// metricInventory is every metric dnsstandby exports.
type metricInventory struct {
	families map[string]*metricFamily
	// literals holds, per package directory, every string literal in its
	// non-test sources: a label value in an expression must be one of them
	// (mode="takeover" must be spelled somewhere in package takeover).
	literals map[string]map[string]bool
}

// targetLabels are added by Prometheus to every series it scrapes.
var targetLabels = map[string]bool{"instance": true, "job": true}

// moduleRoot is the main module's root, two levels above these tests.
func moduleRoot(t testing.TB) string {
	t.Helper()
	root, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

var (
	inventoryOnce sync.Once
	inventoryVal  *metricInventory
	inventoryErr  error
)

// loadInventory scans the module's non-test Go sources once.
func loadInventory(t testing.TB) *metricInventory {
	t.Helper()
	root := moduleRoot(t)
	inventoryOnce.Do(func() { inventoryVal, inventoryErr = scanMetrics(root) })
	if inventoryErr != nil {
		t.Fatal(inventoryErr)
	}
	return inventoryVal
}

// scanMetrics parses every non-test .go file of the main module (not
// bench/ nor these tests, modules of their own, nor deploy/) and collects
// the metrics defined there.
func scanMetrics(root string) (*metricInventory, error) {
	inv := &metricInventory{families: map[string]*metricFamily{}, literals: map[string]map[string]bool{}}
	type descVar struct{ dir, ident string }
	descs := map[descVar]*metricFamily{} // package-level desc variables
	histogramDescs := map[descVar]bool{} // passed to MustNewConstHistogram
	runtimeCollectors := map[string]bool{}
	fset := token.NewFileSet()

	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel != "." {
				base := d.Name()
				if strings.HasPrefix(base, ".") || base == "testdata" || base == "vendor" || rel == "deploy" {
					return filepath.SkipDir
				}
				if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
					return filepath.SkipDir // another module (bench/)
				}
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := goparser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		dir := filepath.Dir(rel)
		lits := inv.literals[dir]
		if lits == nil {
			lits = map[string]bool{}
			inv.literals[dir] = lits
		}
		var walkErr error
		ast.Inspect(f, func(n ast.Node) bool {
			if walkErr != nil {
				return false
			}
			switch n := n.(type) {
			case *ast.BasicLit:
				if s, ok := stringLit(n); ok {
					lits[s] = true
				}
			case *ast.ValueSpec:
				// var descX = prometheus.NewDesc(...)
				for i, v := range n.Values {
					if call, ok := v.(*ast.CallExpr); ok && isPromCall(call, "NewDesc") && i < len(n.Names) {
						fam, err := descFamily(call, dir)
						if err != nil {
							walkErr = fmt.Errorf("%s: %w", fset.Position(call.Pos()), err)
							return false
						}
						descs[descVar{dir, n.Names[i].Name}] = fam
					}
				}
			case *ast.CallExpr:
				switch {
				case isPromCall(n, "NewDesc"):
					// Descs made inline are registered too; the ValueSpec
					// case above only adds the variable name.
					fam, err := descFamily(n, dir)
					if err != nil {
						walkErr = fmt.Errorf("%s: %w", fset.Position(n.Pos()), err)
						return false
					}
					if err := inv.add(fam); err != nil {
						walkErr = fmt.Errorf("%s: %w", fset.Position(n.Pos()), err)
						return false
					}
				case isPromCall(n, "MustNewConstHistogram"), isPromCall(n, "NewConstHistogram"):
					if id, ok := n.Args[0].(*ast.Ident); ok {
						histogramDescs[descVar{dir, id.Name}] = true
					}
				case isPkgCall(n, "collectors", "NewGoCollector"), isPkgCall(n, "collectors", "NewProcessCollector"):
					runtimeCollectors[n.Fun.(*ast.SelectorExpr).Sel.Name] = true
				default:
					if fam, ok, err := optsFamily(n, dir); err != nil {
						walkErr = fmt.Errorf("%s: %w", fset.Position(n.Pos()), err)
						return false
					} else if ok {
						if err := inv.add(fam); err != nil {
							walkErr = fmt.Errorf("%s: %w", fset.Position(n.Pos()), err)
							return false
						}
					}
				}
			}
			return true
		})
		return walkErr
	})
	if err != nil {
		return nil, err
	}
	for v := range histogramDescs {
		fam, ok := descs[v]
		if !ok {
			return nil, fmt.Errorf("%s: %s is passed to MustNewConstHistogram but is no NewDesc variable", v.dir, v.ident)
		}
		inv.families[fam.name].kind = "histogram"
	}
	// The Go and process collectors, as cmd/dnsstandby registers them: their
	// families are gathered from the real collectors.
	if !runtimeCollectors["NewGoCollector"] || !runtimeCollectors["NewProcessCollector"] {
		return nil, fmt.Errorf("the Go and process collectors are no longer registered (found %v)", runtimeCollectors)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mfs, err := reg.Gather()
	if err != nil {
		return nil, err
	}
	for _, mf := range mfs {
		fam := &metricFamily{name: mf.GetName(), labels: map[string]bool{}}
		switch mf.GetType() {
		case dto.MetricType_HISTOGRAM:
			fam.kind = "histogram"
		case dto.MetricType_SUMMARY:
			fam.kind = "summary"
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				fam.labels[lp.GetName()] = true
			}
		}
		if err := inv.add(fam); err != nil {
			return nil, err
		}
	}
	return inv, nil
}

// add records fam; a second definition (two collectors sharing a name, as
// the tap and dnstap do) must agree on the kind and merges the labels.
func (inv *metricInventory) add(fam *metricFamily) error {
	old, ok := inv.families[fam.name]
	if !ok {
		inv.families[fam.name] = fam
		return nil
	}
	if old.kind != fam.kind {
		return fmt.Errorf("metric %s defined as %q and as %q", fam.name, old.kind, fam.kind)
	}
	for l := range fam.labels {
		old.labels[l] = true
	}
	if old.pkgDir != fam.pkgDir {
		old.pkgDir += "," + fam.pkgDir
	}
	return nil
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// isPkgCall reports whether call is pkg.name(...).
func isPkgCall(call *ast.CallExpr, pkg, name string) bool {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != name {
		return false
	}
	id, ok := sel.X.(*ast.Ident)
	return ok && id.Name == pkg
}

func isPromCall(call *ast.CallExpr, name string) bool { return isPkgCall(call, "prometheus", name) }

// stringSlice returns the elements of a []string{...} literal; nil is none.
func stringSlice(e ast.Expr) ([]string, error) {
	if id, ok := e.(*ast.Ident); ok && id.Name == "nil" {
		return nil, nil
	}
	cl, ok := e.(*ast.CompositeLit)
	if !ok {
		return nil, fmt.Errorf("label names %T are not a literal", e)
	}
	var out []string
	for _, el := range cl.Elts {
		s, ok := stringLit(el)
		if !ok {
			return nil, fmt.Errorf("label name %T is not a string literal", el)
		}
		out = append(out, s)
	}
	return out, nil
}

// labelKeys returns the keys of a prometheus.Labels{...} literal.
func labelKeys(e ast.Expr) ([]string, error) {
	if id, ok := e.(*ast.Ident); ok && id.Name == "nil" {
		return nil, nil
	}
	cl, ok := e.(*ast.CompositeLit)
	if !ok {
		return nil, fmt.Errorf("constant labels %T are not a literal", e)
	}
	var out []string
	for _, el := range cl.Elts {
		kv, ok := el.(*ast.KeyValueExpr)
		if !ok {
			return nil, fmt.Errorf("constant label %T is not key: value", el)
		}
		s, ok := stringLit(kv.Key)
		if !ok {
			return nil, fmt.Errorf("constant label name %T is not a string literal", kv.Key)
		}
		out = append(out, s)
	}
	return out, nil
}

// descFamily reads prometheus.NewDesc(name, help, labels, constLabels).
func descFamily(call *ast.CallExpr, dir string) (*metricFamily, error) {
	if len(call.Args) != 4 {
		return nil, fmt.Errorf("NewDesc with %d arguments", len(call.Args))
	}
	name, ok := stringLit(call.Args[0])
	if !ok {
		return nil, fmt.Errorf("NewDesc name %T is not a string literal", call.Args[0])
	}
	fam := &metricFamily{name: name, labels: map[string]bool{}, pkgDir: dir}
	if help, ok := stringLit(call.Args[1]); ok {
		fam.deprecated = strings.HasPrefix(help, "Deprecated:")
	}
	vl, err := stringSlice(call.Args[2])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	cl, err := labelKeys(call.Args[3])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	for _, l := range append(vl, cl...) {
		fam.labels[l] = true
	}
	return fam, nil
}

// optsFamily reads prometheus.New{Counter,Gauge,Histogram,Summary}[Vec](
// prometheus.XOpts{Name: ...}[, labels]).
func optsFamily(call *ast.CallExpr, dir string) (*metricFamily, bool, error) {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || !isPromCall(call, sel.Sel.Name) {
		return nil, false, nil
	}
	ctor := strings.TrimSuffix(strings.TrimPrefix(sel.Sel.Name, "New"), "Vec")
	kind, ok := map[string]string{"Counter": "", "Gauge": "", "Histogram": "histogram", "Summary": "summary"}[ctor]
	if !ok || len(call.Args) == 0 {
		return nil, false, nil
	}
	opts, ok := call.Args[0].(*ast.CompositeLit)
	if !ok {
		return nil, false, fmt.Errorf("%s with options %T that are not a literal", sel.Sel.Name, call.Args[0])
	}
	parts := map[string]string{}
	for _, el := range opts.Elts {
		kv, ok := el.(*ast.KeyValueExpr)
		if !ok {
			continue
		}
		key := kv.Key.(*ast.Ident).Name
		if key == "Name" || key == "Namespace" || key == "Subsystem" {
			s, ok := stringLit(kv.Value)
			if !ok {
				return nil, false, fmt.Errorf("%s: %s is not a string literal", sel.Sel.Name, key)
			}
			parts[key] = s
		}
	}
	if parts["Name"] == "" {
		return nil, false, fmt.Errorf("%s without a literal Name", sel.Sel.Name)
	}
	fam := &metricFamily{name: prometheus.BuildFQName(parts["Namespace"], parts["Subsystem"], parts["Name"]), kind: kind, labels: map[string]bool{}, pkgDir: dir}
	if strings.HasSuffix(sel.Sel.Name, "Vec") {
		if len(call.Args) != 2 {
			return nil, false, fmt.Errorf("%s with %d arguments", sel.Sel.Name, len(call.Args))
		}
		ls, err := stringSlice(call.Args[1])
		if err != nil {
			return nil, false, fmt.Errorf("%s: %w", fam.name, err)
		}
		for _, l := range ls {
			fam.labels[l] = true
		}
	}
	return fam, true, nil
}

// series resolves a name used in PromQL to its family: a histogram is used
// as NAME_bucket (with le), NAME_sum or NAME_count, a summary as NAME (with
// quantile), NAME_sum or NAME_count, anything else by its name. `up` is
// Prometheus's own.
func (inv *metricInventory) series(name string) (fam *metricFamily, extra map[string]bool, err error) {
	if name == "up" {
		return &metricFamily{name: "up", labels: map[string]bool{}}, nil, nil
	}
	if f, ok := inv.families[name]; ok {
		switch f.kind {
		case "histogram":
			return nil, nil, fmt.Errorf("%s is a histogram: use %[1]s_bucket, %[1]s_sum or %[1]s_count", name)
		case "summary":
			return f, map[string]bool{"quantile": true}, nil
		}
		return f, nil, nil
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		f, ok := inv.families[base]
		if !ok || f.kind == "" || (f.kind == "summary" && suffix == "_bucket") {
			break
		}
		if suffix == "_bucket" {
			return f, map[string]bool{"le": true}, nil
		}
		return f, nil, nil
	}
	return nil, nil, fmt.Errorf("metric %s is not exported by dnsstandby", name)
}

// promParser is Prometheus's own PromQL parser, with its default options
// (the functions and syntax a Prometheus server accepts by default).
var promParser = parser.NewParser(parser.Options{})

// grafanaIntervals stands Grafana's interval variables, which a dashboard
// writes where PromQL wants a duration, in for durations, so that the
// dashboard's expressions parse as written. Variables inside strings
// (instance=~"$node") are valid PromQL and are left alone.
var grafanaIntervals = strings.NewReplacer("$__rate_interval", "5m", "$__range", "6h", "$__interval", "1m")

// promRefs is what an expression refers to.
type promRefs struct {
	selectors []*parser.VectorSelector
	grouping  []string // labels in by, without, on, ignoring, group_left, group_right
	made      []string // labels label_replace writes
}

// parsePromQL parses expr and collects its selectors and grouping labels.
func parsePromQL(expr string) (promRefs, error) {
	var refs promRefs
	root, err := promParser.ParseExpr(grafanaIntervals.Replace(expr))
	if err != nil {
		return refs, fmt.Errorf("parse %q: %w", expr, err)
	}
	parser.Inspect(root, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			refs.selectors = append(refs.selectors, n)
		case *parser.AggregateExpr:
			refs.grouping = append(refs.grouping, n.Grouping...)
		case *parser.Call:
			if n.Func.Name == "label_replace" && len(n.Args) > 1 {
				if l, ok := n.Args[1].(*parser.StringLiteral); ok {
					refs.made = append(refs.made, l.Val)
				}
			}
		case *parser.BinaryExpr:
			if vm := n.VectorMatching; vm != nil {
				refs.grouping = append(refs.grouping, vm.MatchingLabels...)
				refs.grouping = append(refs.grouping, vm.Include...)
			}
		}
		return nil
	})
	return refs, nil
}

// plainAlternation matches a regex made only of literal words joined by |.
var plainAlternation = regexp.MustCompile(`^[A-Za-z0-9_-]+(\|[A-Za-z0-9_-]+)*$`)

// checkPromQL checks expr against the inventory: every metric exported,
// every label in a matcher one of its metric's, every grouping label one of
// the expression's metrics', every literal label value spelled in the
// package that defines the metric. It returns every problem found.
func (inv *metricInventory) checkPromQL(expr string) []error {
	refs, err := parsePromQL(expr)
	if err != nil {
		return []error{err}
	}
	if len(refs.selectors) == 0 {
		return []error{fmt.Errorf("no metric in %q", expr)}
	}
	var errs []error
	known := union(targetLabels, setOf(refs.made))
	for _, sel := range refs.selectors {
		if sel.Name == "" {
			errs = append(errs, fmt.Errorf("selector %s without a metric name: name the metric", sel))
			continue
		}
		fam, extra, err := inv.series(sel.Name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if fam.deprecated {
			errs = append(errs, fmt.Errorf("%s is deprecated: use its new name (docs/metrics.md, Renamed metrics)", sel.Name))
		}
		labelSet := union(targetLabels, fam.labels, extra)
		for l := range labelSet {
			known[l] = true
		}
		for _, m := range sel.LabelMatchers {
			if m.Name == labels.MetricName {
				continue // the name, checked above
			}
			if !labelSet[m.Name] {
				errs = append(errs, fmt.Errorf("%s has no label %q (it has %s)", sel.Name, m.Name, keys(labelSet)))
				continue
			}
			if targetLabels[m.Name] || fam.pkgDir == "" || m.Value == "" || strings.Contains(m.Value, "$") {
				continue
			}
			values := []string{m.Value}
			if m.Type == labels.MatchRegexp || m.Type == labels.MatchNotRegexp {
				if !plainAlternation.MatchString(m.Value) {
					continue // a real regex: not checked
				}
				values = strings.Split(m.Value, "|")
			}
			for _, v := range values {
				if !inv.spelled(fam.pkgDir, v) {
					errs = append(errs, fmt.Errorf("%s{%s}: %q is spelled nowhere in %s", sel.Name, m, v, fam.pkgDir))
				}
			}
		}
	}
	for _, l := range refs.grouping {
		if !known[l] {
			errs = append(errs, fmt.Errorf("grouping label %q belongs to none of the expression's metrics (%s)", l, keys(known)))
		}
	}
	return errs
}

// spelled reports whether s is a string literal in one of the packages
// (comma-separated directories) that define a metric.
func (inv *metricInventory) spelled(dirs, s string) bool {
	for _, dir := range strings.Split(dirs, ",") {
		if inv.literals[dir][s] {
			return true
		}
	}
	return false
}

func union(ms ...map[string]bool) map[string]bool {
	out := map[string]bool{}
	for _, m := range ms {
		for k := range m {
			out[k] = true
		}
	}
	return out
}

func keys(m map[string]bool) string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// TestMetricInventory pins what the inventory must find, so that a broken
// scan (no metrics, or labels lost) cannot make every check pass.
func TestMetricInventory(t *testing.T) {
	inv := loadInventory(t)
	if len(inv.families) < 60 {
		t.Fatalf("only %d metric families found: the source scan is broken", len(inv.families))
	}
	for _, tt := range []struct {
		name, kind string
		labels     []string
	}{
		{"dnsstandby_mode", "", []string{"mode"}},
		{"dnsstandby_mode_transitions_total", "", []string{"from", "to", "reason"}},
		{"dnsstandby_mode_duration_seconds", "histogram", []string{"mode"}},
		{"dnsstandby_mirror_records_total", "", []string{"source", "result", "reason"}},
		{"dnsstandby_upstream_duration_seconds", "histogram", []string{"server"}},
		{"dnsstandby_resolve_duration_seconds", "histogram", nil},
		{"dnsstandby_steer_level", "", []string{"level"}},
		{"dnsstandby_cache_entries", "", nil},
		{"go_goroutines", "", nil},
		{"go_gc_duration_seconds", "summary", nil},
		{"process_resident_memory_bytes", "", nil},
	} {
		fam, ok := inv.families[tt.name]
		if !ok {
			t.Errorf("%s not found", tt.name)
			continue
		}
		if fam.kind != tt.kind {
			t.Errorf("%s: kind %q, want %q", tt.name, fam.kind, tt.kind)
		}
		if got := keys(fam.labels); got != keys(union(setOf(tt.labels))) {
			t.Errorf("%s: labels %q, want %q", tt.name, got, keys(setOf(tt.labels)))
		}
	}
}

func setOf(ss []string) map[string]bool {
	m := map[string]bool{}
	for _, s := range ss {
		m[s] = true
	}
	return m
}

// TestPromQLChecker shows the checker accepts what dnsstandby exports and
// rejects each kind of mistake.
func TestPromQLChecker(t *testing.T) {
	inv := loadInventory(t)
	tests := []struct {
		expr    string
		wantErr string // "" for none
	}{
		{`dnsstandby_mode{mode="takeover"} == 1`, ""},
		{`sum by (instance) (increase(dnsstandby_mode_transitions_total{reason=~"peer-exit|peer-hung"}[30m])) >= 3`, ""},
		{`histogram_quantile(0.99, sum by (le, mode) (rate(dnsstandby_mode_duration_seconds_bucket{instance=~"$node"}[$__rate_interval])))`, ""},
		{`(dnsstandby_mode{mode="mirror"} == 1) unless on (instance) dnsstandby_mirror_records_total`, ""},
		{`rate(process_cpu_seconds_total[5m]) and on (instance) dnsstandby_mode{mode="mirror"}`, ""},
		{`up{job=~".*dnsstandby.*"} == 0`, ""},
		{`sum(rate(dnsstandby_mirror_records_total{source="tap",result='accepted'}[5m]))`, ""},
		{`dnstandby_mode{mode="takeover"} == 1`, "not exported"},
		{`rate(dnsstandby_hedges_total[5m])`, "dnsstandby_hedges_total is deprecated"},
		{`rate(dnsstandby_hedge_sent_total[5m])`, ""},
		{`dnsstandby_mode{state="takeover"} == 1`, `no label "state"`},
		{`dnsstandby_mode{mode="failover"} == 1`, `"failover" is spelled nowhere`},
		{`dnsstandby_mode_transitions_total{reason=~"peer-exit|peer-crash"}`, `"peer-crash" is spelled nowhere`},
		{`sum by (node) (dnsstandby_mode)`, `grouping label "node"`},
		{`rate(dnsstandby_mode_duration_seconds[5m])`, "is a histogram"},
		{`dnsstandby_cache_entries_bucket`, "not exported"},
		{`go_goroutines_sum`, "not exported"},
		{`sum({__name__="dnsstandby_mode"})`, "without a metric name"},
		{`vector(1)`, "no metric"},
		{`sum(rate(dnsstandby_mode_transitions_total[5m])`, "parse"},
		{`dnsstandby_mode{mode="takeover"} * on (instance) group_left (server) dnsstandby_upstream_healthy`, ""},
		{`dnsstandby_mode * on (instance) group_left (node) dnsstandby_upstream_healthy`, `grouping label "node"`},
		{`label_replace(dnsstandby_mode, "node", "$1", "instance", "(.+):[0-9]+") and on (node) label_replace(up, "node", "$1", "instance", "(.+):[0-9]+")`, ""},
		{`dnsstandby_mode and on (node) label_replace(up, "host", "$1", "instance", "(.+):[0-9]+")`, `grouping label "node"`},
	}
	for _, tt := range tests {
		t.Run(tt.expr, func(t *testing.T) {
			errs := inv.checkPromQL(tt.expr)
			switch {
			case tt.wantErr == "" && len(errs) > 0:
				t.Fatalf("unexpected: %v", errs)
			case tt.wantErr != "" && !slices.ContainsFunc(errs, func(e error) bool { return strings.Contains(e.Error(), tt.wantErr) }):
				t.Fatalf("errors %v, want one with %q", errs, tt.wantErr)
			}
		})
	}
}
