package tests

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/dnsstandby/dnsstandby/deploy"
	"github.com/dnsstandby/dnsstandby/internal/gendoc"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// unitOptions returns the options deploy/systemd/dnsstandby.default gives
// `dnsstandby run`, split on white space as systemd splits
// $DNSSTANDBY_OPTS.
func unitOptions(t testing.TB) []string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^DNSSTANDBY_OPTS="([^"]*)"$`).FindStringSubmatch(deploy.SystemdDefaults)
	if m == nil {
		t.Fatalf("no DNSSTANDBY_OPTS=\"...\" line in dnsstandby.default:\n%s", deploy.SystemdDefaults)
	}
	return strings.Fields(m[1])
}

// optionValue returns the value of the last --name in opts.
func optionValue(opts []string, name string) (string, bool) {
	v, ok := "", false
	for i := 0; i+1 < len(opts); i++ {
		if opts[i] == "--"+name {
			v, ok = opts[i+1], true
		}
	}
	return v, ok
}

// The addresses of the veth between the node and the namespace that
// scrapes it, standing in for the node IP and a Prometheus pod.
const (
	nodeIP       = "10.201.0.1"
	prometheusIP = "10.201.0.2"
)

// unitNode is a node namespace with LocalDNS (CoreDNS on 169.254.10.10
// and .11, as AgentBaker renders its Corefile) and kube-dns, where
// dnsstandby runs with the unit's options, and a second namespace joined
// to it by a veth, where Prometheus would be.
type unitNode struct {
	node, prom *nstest.Namespace
	metrics    string // NODE_IP:PORT, the port the unit's --metrics-addr names
}

// startUnit runs dnsstandby with the options of dnsstandby.default,
// changed by change (nil: none), and waits until ready says its metrics,
// scraped from the other namespace, are as wanted. The node's paths are
// test directories: LocalDNS's Corefile (inLocalDNSDir), the state, the
// admin socket and the lock; the anchor is a bridge (this project's
// machines lack the dummy driver). Every other option is the file's.
func startUnit(t *testing.T, bin string, change func(opts []string, dir string) []string, ready func(fams map[string]*dto.MetricFamily) error) *unitNode {
	t.Helper()
	nstest.RequireRoot(t)
	nstest.CoreDNSBinary(t)
	opts := unitOptions(t)
	addr, ok := optionValue(opts, "metrics-addr")
	if !ok {
		t.Fatalf("dnsstandby.default gives no --metrics-addr: the binary's default (127.0.0.1) cannot be scraped")
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("--metrics-addr %q: %v", addr, err)
	}
	u := &unitNode{node: nstest.New(t, "node"), prom: nstest.New(t, "prom"), metrics: net.JoinHostPort(nodeIP, port)}
	must(t, u.node.AddLink("localdns", "", "169.254.10.10/32", "169.254.10.11/32"))
	const kubeDNS = "10.0.0.10"
	must(t, u.node.AddLink("kubedns", "", kubeDNS+"/32"))
	must(t, nstest.AddVeth(
		nstest.End{NS: u.node, Name: "to-prom", Addrs: []string{nodeIP + "/30"}},
		nstest.End{NS: u.prom, Name: "to-node", Addrs: []string{prometheusIP + "/30"}},
	))
	nstest.StartCoreDNS(t, u.node, nstest.CoreDNSConfig{Corefile: ".:53 {\n    bind " + kubeDNS + "\n    whoami\n}\n", Probe: kubeDNS + ":53"})
	corefile := testkit.Corefile{KubeDNS: kubeDNS, VnetDNS: kubeDNS}.String()
	nstest.StartCoreDNS(t, u.node, nstest.CoreDNSConfig{Corefile: corefile, Probe: testkit.PodListener + ":53"})

	opts, dir := inLocalDNSDir(t, opts)
	must(t, os.WriteFile(filepath.Join(dir, "updated.localdns.corefile"), []byte(corefile), 0o644))
	if change != nil {
		opts = change(opts, dir)
	}
	args := append(append([]string{"run"}, opts...),
		"--state-dir", filepath.Join(dir, "state"), "--admin-socket", filepath.Join(dir, "admin.sock"),
		"--lock-file", filepath.Join(dir, "dnsstandby.lock"), "--anchor-kind", "bridge", "--log-format", "text")
	// Without make docs' setting: dnsstandby refuses DNSSTANDBY_*
	// variables that are none of its settings.
	p := nstest.Start(t, u.node, "env", append([]string{"-u", gendoc.UpdateEnv, bin}, args...)...)
	t.Cleanup(func() {
		_ = p.Signal(syscall.SIGTERM) // detach the steering program
		select {
		case <-p.Done():
		case <-time.After(10 * time.Second):
		}
		_ = p.Stop()
	})
	var last error
	defer func() {
		if t.Failed() {
			t.Logf("the last scrape from %s of %s: %v", prometheusIP, u.metrics, last)
		}
	}()
	testkit.Eventually(t, 15*time.Second, "dnsstandby's metrics, scraped from another namespace", func() bool {
		select {
		case <-p.Done():
			t.Fatalf("dnsstandby exited: %v", p.Err())
		default:
		}
		var fams map[string]*dto.MetricFamily
		if fams, last = u.families(); last == nil {
			last = ready(fams)
		}
		return last == nil
	})
	return u
}

// get fetches path from dnsstandby's HTTP endpoint, from the Prometheus
// namespace.
func (u *unitNode) get(path string) (*http.Response, []byte, error) {
	client := &http.Client{
		Timeout: 2 * time.Second,
		Transport: &http.Transport{
			DialContext: func(_ context.Context, network, a string) (net.Conn, error) {
				return u.prom.Dial(network, "", a, 2*time.Second)
			},
			DisableKeepAlives: true,
		},
	}
	resp, err := client.Get("http://" + u.metrics + path)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return resp, b, err
}

// families scrapes /metrics from the Prometheus namespace.
func (u *unitNode) families() (map[string]*dto.MetricFamily, error) {
	_, body, err := u.get("/metrics")
	if err != nil {
		return nil, err
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(strings.NewReader(string(body)))
}

// steeringAdopted is ready when dnsstandby steers at level adopt, which
// the unit's --steering auto reaches beside a running LocalDNS, and its
// packet tap and hedger run: everything the alerts watch is exported.
func steeringAdopted(fams map[string]*dto.MetricFamily) error {
	if v, ok := sampleValue(fams, "dnsstandby_steer_level", "level", "adopt"); !ok || v != 1 {
		return fmt.Errorf("steering level not adopt (%v, %v)", v, ok)
	}
	for _, name := range []string{"dnsstandby_mirror_tap_enabled", "dnsstandby_hedge_tracking"} {
		if fams[name] == nil {
			return fmt.Errorf("no %s yet", name)
		}
	}
	return nil
}

// sampleValue returns the value of name's first series with the label.
func sampleValue(fams map[string]*dto.MetricFamily, name, label, value string) (float64, bool) {
	mf := fams[name]
	if mf == nil {
		return 0, false
	}
	for _, m := range mf.GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == label && lp.GetValue() == value {
				return m.GetGauge().GetValue() + m.GetCounter().GetValue(), true
			}
		}
	}
	return 0, false
}

// TestUnitMetrics starts dnsstandby with the unit's options and scrapes
// it from another network namespace, at the node's address, as a
// Prometheus in the cluster does. Its HTTP endpoints answer there (with
// the binary's default, or the file's former 127.0.0.1:9355, they could
// not), under the HTTP server's limits, and every series an alert or the dashboard reads with rate() or
// increase() is there at the first scrape, before any event: a counter
// that appears with its first event is a first event increase() misses.
func TestUnitMetrics(t *testing.T) {
	bin := buildDNSStandby(t)
	u := startUnit(t, bin, nil, steeringAdopted)

	t.Run("reachable from another namespace", func(t *testing.T) {
		for _, path := range []string{"/metrics", "/healthz", "/readyz"} {
			if _, _, err := u.get(path); err != nil {
				t.Errorf("from %s to %s: %v", prometheusIP, u.metrics, err)
			}
		}
	})

	// The limits that bound a client of a hostNetwork pod bound one of
	// the unit's: 8 connections per source address, the next closed at
	// once and counted.
	t.Run("connection limit per address", func(t *testing.T) {
		const perAddr = 8 // daemon.DefaultConfig().HTTP.MaxConnsPerAddr
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for range perAddr {
			c, err := u.prom.Dial("tcp", "", u.metrics, 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, c)
		}
		over, err := u.prom.Dial("tcp", "", u.metrics, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer over.Close()
		must(t, over.SetReadDeadline(time.Now().Add(2*time.Second)))
		if n, err := over.Read(make([]byte, 1)); err != io.EOF {
			t.Errorf("connection %d from one address: read %d bytes, %v; want it closed at once", perAddr+1, n, err)
		}
		for _, c := range held {
			c.Close()
		}
		held = nil
		testkit.Eventually(t, 5*time.Second, "the refusal counted", func() bool {
			fams, err := u.families()
			if err != nil {
				return false
			}
			ms := fams["dnsstandby_http_connections_refused_total"].GetMetric()
			return len(ms) == 1 && ms[0].GetCounter().GetValue() >= 1
		})
	})

	t.Run("series present from the start", func(t *testing.T) {
		fams, err := u.families()
		if err != nil {
			t.Fatal(err)
		}
		exprs := map[string]string{}
		for _, r := range loadAlerts(t).all() {
			exprs["alert "+r.Alert] = r.Expr
		}
		for where, e := range loadDashboard(t).exprs() {
			exprs["dashboard "+where] = e
		}
		checked := 0
		for where, e := range exprs {
			for _, sel := range countedSelectors(t, e) {
				checked++
				for _, err := range presentIn(fams, sel) {
					t.Errorf("%s: %v", where, err)
				}
			}
		}
		if checked < 40 {
			t.Errorf("only %d selectors under rate() or increase(): the expressions were not read", checked)
		}
	})
}

// countedSelectors returns the selectors expr reads with rate(), irate()
// or increase(): the ones for which a series that appears late loses its
// first increase.
func countedSelectors(t *testing.T, expr string) []*parser.VectorSelector {
	t.Helper()
	root, err := promParser.ParseExpr(grafanaIntervals.Replace(expr))
	if err != nil {
		t.Fatalf("parse %q: %v", expr, err)
	}
	var out []*parser.VectorSelector
	parser.Inspect(root, func(n parser.Node, _ []parser.Node) error {
		call, ok := n.(*parser.Call)
		if !ok || !slices.Contains([]string{"rate", "irate", "increase"}, call.Func.Name) {
			return nil
		}
		for _, a := range call.Args {
			if ms, ok := a.(*parser.MatrixSelector); ok {
				if vs, ok := ms.VectorSelector.(*parser.VectorSelector); ok {
					out = append(out, vs)
				}
			}
		}
		return nil
	})
	return out
}

// presentIn checks that fams hold a series for sel and, for each label
// value sel names (each word of a plain alternation on its own), a series
// with it. Target labels and Grafana variables are not dnsstandby's.
func presentIn(fams map[string]*dto.MetricFamily, sel *parser.VectorSelector) []error {
	if sel.Name == "up" {
		return nil // Prometheus's own
	}
	var series []map[string]string
	for _, name := range []string{sel.Name, strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(sel.Name, "_bucket"), "_sum"), "_count")} {
		mf := fams[name]
		if mf == nil {
			continue
		}
		for _, m := range mf.GetMetric() {
			ls := map[string]string{}
			for _, lp := range m.GetLabel() {
				ls[lp.GetName()] = lp.GetValue()
			}
			series = append(series, ls)
		}
		break
	}
	if len(series) == 0 {
		return []error{fmt.Errorf("%s: no series at the first scrape", sel.Name)}
	}
	var equal []*labels.Matcher
	var wanted [][2]string
	for _, m := range sel.LabelMatchers {
		if m.Name == labels.MetricName || targetLabels[m.Name] || strings.Contains(m.Value, "$") {
			continue
		}
		switch {
		case m.Type == labels.MatchEqual:
			equal = append(equal, m)
			wanted = append(wanted, [2]string{m.Name, m.Value})
		case m.Type == labels.MatchRegexp && plainAlternation.MatchString(m.Value):
			for _, v := range strings.Split(m.Value, "|") {
				wanted = append(wanted, [2]string{m.Name, v})
			}
		}
	}
	var errs []error
	for _, w := range wanted {
		found := slices.ContainsFunc(series, func(ls map[string]string) bool {
			for _, m := range equal {
				if m.Name != w[0] && ls[m.Name] != m.Value {
					return false
				}
			}
			return ls[w[0]] == w[1]
		})
		if !found {
			errs = append(errs, fmt.Errorf("%s{%s=%q}: no such series at the first scrape", sel.Name, w[0], w[1]))
		}
	}
	return errs
}

// TestMetricsDocs renders docs/metrics.md's table of every metric from
// dnsstandby's own /metrics: started with the unit's options (packet tap,
// hedging, steering), and once more with --mirror dnstap (on the pods'
// listener alone, as dnstap requires) for the dnstap receiver's. Every metric the sources define (the inventory the alert
// checks use) must be in it: one that appears only later is missing from
// the first scrape, and from the table.
func TestMetricsDocs(t *testing.T) {
	bin := buildDNSStandby(t)
	all := map[string]*dto.MetricFamily{}
	merge := func(fams map[string]*dto.MetricFamily) {
		for name, mf := range fams {
			if old, ok := all[name]; ok {
				old.Metric = append(old.Metric, mf.Metric...)
			} else {
				all[name] = mf
			}
		}
	}
	tapRun := startUnit(t, bin, nil, steeringAdopted)
	fams, err := tapRun.families()
	if err != nil {
		t.Fatal(err)
	}
	merge(fams)
	dnstapRun := startUnit(t, bin, func(opts []string, dir string) []string {
		out := slices.Clone(opts)
		i := slices.Index(out, "--mirror")
		if i < 0 || i+1 >= len(out) {
			t.Fatalf("no --mirror in %q", opts)
		}
		out[i+1] = "dnstap:" + filepath.Join(dir, "dnstap.sock")
		// dnstap serves one listener (a stream does not say which
		// listener a reply left from): the pods'.
		j := slices.Index(out, testkit.NodeListener+":53")
		if j < 1 || out[j-1] != "--listen" {
			t.Fatalf("no --listen %s:53 in %q", testkit.NodeListener, opts)
		}
		return slices.Delete(out, j-1, j+1)
	}, func(fams map[string]*dto.MetricFamily) error {
		if fams["dnsstandby_mirror_dnstap_connections"] == nil {
			return fmt.Errorf("no dnstap receiver yet")
		}
		return nil
	})
	if fams, err = dnstapRun.families(); err != nil {
		t.Fatal(err)
	}
	merge(fams)

	inv := loadInventory(t)
	for name, fam := range inv.families {
		if fam.pkgDir != "" && all[name] == nil {
			t.Errorf("%s (defined in %s) is not exported at start: initialise it, so that it is in the first scrape and in docs/metrics.md", name, fam.pkgDir)
		}
	}
	gendoc.Check(t, "../../docs/metrics.md", "metrics", metricsTable(all))
}

// metricsTable renders dnsstandby's own families (not go_* nor process_*)
// as a Markdown table: name, type, label names, help.
func metricsTable(fams map[string]*dto.MetricFamily) string {
	var names []string
	for name := range fams {
		if strings.HasPrefix(name, "dnsstandby_") {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("| metric | type | labels | help |\n|---|---|---|---|\n")
	cell := strings.NewReplacer("|", `\|`, "\n", " ")
	for _, name := range names {
		mf := fams[name]
		set := map[string]bool{}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				set[lp.GetName()] = true
			}
		}
		var ls []string
		for l := range set {
			ls = append(ls, "`"+l+"`")
		}
		sort.Strings(ls)
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", name, strings.ToLower(mf.GetType().String()), strings.Join(ls, ", "), cell.Replace(mf.GetHelp()))
	}
	return b.String()
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
