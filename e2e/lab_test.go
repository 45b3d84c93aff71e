// Package e2e runs the dnsstandby binary against real CoreDNS servers in
// network namespaces the tests create: kube-dns at its ClusterIP, and a
// LocalDNS-shaped CoreDNS on the node, asked with Go clients, dig and kdig.
// The tests need root; they skip with a message without it.
package e2e

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

const (
	clusterIP = "10.0.0.10" // kube-dns's ClusterIP
	kubeDNS   = clusterIP + ":53"
	// standbyIP is the pods' nameserver, LocalDNS's pod listener: where
	// dnsstandby listens, and LocalDNS (the reference CoreDNS) too when
	// a test has both share it.
	standbyIP   = testkit.PodListener
	standbyAddr = standbyIP + ":53"
	// asideIP is another address of the same link, for a dnsstandby that
	// is asked the same questions as LocalDNS side by side.
	asideIP   = "169.254.10.12"
	asideAddr = asideIP + ":53"
	timeout   = 2 * time.Second
)

// binary is the dnsstandby built once for the package by TestMain.
var binary string

func TestMain(m *testing.M) {
	code := func() int {
		dir, err := os.MkdirTemp("", "dnsstandby-e2e-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		binary = filepath.Join(dir, "dnsstandby")
		build := exec.Command("go", "build", "-o", binary, "../cmd/dnsstandby")
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build dnsstandby: %v\n%s", err, out)
			return 1
		}
		return m.Run()
	}()
	os.Exit(code)
}

// lab is a node namespace holding LocalDNS's listeners (169.254.10.10 and
// .11) and 169.254.10.12 on a `localdns` link, joined by a veth to a kube-dns namespace where CoreDNS serves the
// generated zones at 10.0.0.10.
type lab struct {
	node, kube *nstest.Namespace
	zones      *nstest.Zones
	kubeDNS    *nstest.CoreDNS
}

func newLab(t *testing.T) *lab {
	t.Helper()
	return newLabWith(t, "", nil)
}

// newLabWith is newLab with more server blocks for kube-dns's CoreDNS
// (bound to its ClusterIP) and the files they read.
func newLabWith(t *testing.T, corefile string, files map[string]string) *lab {
	t.Helper()
	nstest.RequireRoot(t)
	nstest.CoreDNSBinary(t)
	l := &lab{
		node:  nstest.New(t, "node"),
		kube:  nstest.New(t, "kubedns"),
		zones: nstest.KubeDNSZones(nstest.ZoneOptions{Services: 50, Namespaces: []string{"default", "kube-system"}}),
	}
	must(t, l.kube.AddLink("kubedns", "", clusterIP+"/32"))
	must(t, l.node.AddLink("localdns", "", testkit.NodeListener+"/32", standbyIP+"/32", asideIP+"/32"))
	must(t, nstest.AddVeth(
		nstest.End{NS: l.node, Name: "to-kubedns", Addrs: []string{"10.200.0.1/30"}},
		nstest.End{NS: l.kube, Name: "to-node", Addrs: []string{"10.200.0.2/30"}},
	))
	must(t, l.node.AddRoute(nstest.Route{Dst: clusterIP + "/32", Via: "10.200.0.2"}))
	all := maps.Clone(l.zones.Files)
	maps.Copy(all, files)
	l.kubeDNS = nstest.StartCoreDNS(t, l.kube, nstest.CoreDNSConfig{
		Corefile: l.zones.Corefile(clusterIP) + corefile,
		Files:    all,
		Probe:    kubeDNS,
	})
	return l
}

// startReference runs LocalDNS: CoreDNS with the Corefile AgentBaker
// renders (testkit's fixture), its pod block forwarding to kube-dns with
// AKS's serve_stale, on LocalDNS's listeners.
func (l *lab) startReference(t *testing.T) *nstest.CoreDNS {
	t.Helper()
	return nstest.StartCoreDNS(t, l.node, nstest.CoreDNSConfig{
		Corefile: testkit.Corefile{KubeDNS: clusterIP, ServeStale: "72000s verify"}.String(),
		Probe:    standbyAddr,
	})
}

// standby is a running dnsstandby.
type standby struct {
	*nstest.Process
	metrics string // host:port of its HTTP endpoint, inside the node namespace
}

// startStandby runs dnsstandby in the node namespace on 169.254.10.11:53
// forwarding to kube-dns, with extra flags, and waits until /readyz says so.
func (l *lab) startStandby(t *testing.T, extra ...string) *standby {
	t.Helper()
	return l.startStandbyOn(t, standbyAddr, extra...)
}

// startStandbyOn is startStandby listening on addr.
func (l *lab) startStandbyOn(t *testing.T, addr string, extra ...string) *standby {
	t.Helper()
	return l.runStandby(t, append([]string{"--listen", addr, "--upstream", kubeDNS}, extra...)...)
}

// runStandby runs `dnsstandby run` in the node namespace with flags, its
// HTTP endpoint and state of the test's own, and waits until /readyz says
// it is ready.
func (l *lab) runStandby(t *testing.T, flags ...string) *standby {
	t.Helper()
	args := append([]string{"run", "--metrics-addr", "127.0.0.1:9355", "--log-format", "text",
		"--anchor-kind", "bridge", "--admin-socket", "", "--state-dir", t.TempDir(),
		"--lock-file", filepath.Join(t.TempDir(), "dnsstandby.lock")}, flags...)
	p := nstest.Start(t, l.node, binary, args...) // shows its output if the test fails
	s := &standby{Process: p, metrics: "127.0.0.1:9355"}
	testkit.Eventually(t, 10*time.Second, "dnsstandby ready", func() bool {
		select {
		case <-p.Done():
			t.Fatalf("dnsstandby exited: %v", p.Err())
		default:
		}
		code, _, err := l.get(s, "/readyz")
		return err == nil && code == http.StatusOK
	})
	return s
}

// get fetches path from dnsstandby's HTTP endpoint inside the node
// namespace.
func (l *lab) get(s *standby, path string) (int, string, error) {
	client := &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, addr string) (conn net.Conn, err error) {
				return l.node.Dial(network, "", addr, timeout)
			},
			DisableKeepAlives: true,
		},
	}
	resp, err := client.Get("http://" + s.metrics + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// metric returns the sum of the samples called name that carry the given
// labels (name, value pairs) on dnsstandby's /metrics — summed over the
// labels not given, such as the listen address — or -1 if there is none.
// Histograms come as their _bucket, _sum and _count samples.
func (l *lab) metric(t *testing.T, s *standby, name string, labels ...string) float64 {
	t.Helper()
	_, body, err := l.get(s, "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	samples, err := expfmt.ExtractSamples(&expfmt.DecodeOptions{}, slices.Collect(maps.Values(families))...)
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	want := model.Metric{model.MetricNameLabel: model.LabelValue(name)}
	for i := 0; i+1 < len(labels); i += 2 {
		want[model.LabelName(labels[i])] = model.LabelValue(labels[i+1])
	}
	sum, found := 0.0, false
	for _, x := range samples {
		if hasLabels(x.Metric, want) {
			sum, found = sum+float64(x.Value), true
		}
	}
	if !found {
		return -1
	}
	return sum
}

// hasLabels reports whether m has every label of want, with its value.
func hasLabels(m, want model.Metric) bool {
	for k, v := range want {
		if m[k] != v {
			return false
		}
	}
	return true
}

// eventuallyMetric waits until cond (which reads l.metric) holds; if it
// does not, the test log shows the lines of /metrics containing any of
// show.
func (l *lab) eventuallyMetric(t *testing.T, s *standby, within time.Duration, what string, cond func() bool, show ...string) {
	t.Helper()
	defer func() {
		if t.Failed() {
			_, body, _ := l.get(s, "/metrics")
			t.Logf("/metrics:\n%s", grepLines(body, show...))
		}
	}()
	testkit.Eventually(t, within, what, cond)
}

// grepLines is the lines of text that contain any of substrs.
func grepLines(text string, substrs ...string) string {
	var out []string
	for line := range strings.Lines(text) {
		if slices.ContainsFunc(substrs, func(s string) bool { return strings.Contains(line, s) }) {
			out = append(out, strings.TrimSuffix(line, "\n"))
		}
	}
	return strings.Join(out, "\n")
}

// ask sends m to server from the node namespace.
func (l *lab) ask(t *testing.T, network, server string, m *dns.Msg) *dns.Msg {
	t.Helper()
	r, err := l.node.Exchange(network, "", server, m, timeout)
	if err != nil {
		t.Fatalf("%s %s %v: %v", network, server, m.Question, err)
	}
	return r
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		_, file, line, _ := runtime.Caller(1)
		t.Fatalf("%s:%d: %v", filepath.Base(file), line, err)
	}
}
