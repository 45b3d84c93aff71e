package tests

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// capsRun is what one run of dnsstandby showed: its metrics while it ran,
// or that it exited and what it said.
type capsRun struct {
	metrics map[string]float64 // series (labels.Labels.String()) -> value
	exited  bool
	output  string // so far, if it runs
}

// value returns the value of a series written in PromQL's notation,
// name{label="value",...}, with all its labels.
func (r *capsRun) value(series string) (float64, bool) {
	ls, err := promParser.ParseMetric(series)
	if err != nil {
		panic(fmt.Sprintf("series %q: %v", series, err)) // a typo in the test
	}
	v, ok := r.metrics[ls.String()]
	return v, ok
}

// expect returns an error unless each series has its value.
func (r *capsRun) expect(want map[string]float64) error {
	if r.exited {
		return fmt.Errorf("dnsstandby exited:\n%s", r.output)
	}
	for s, v := range want {
		if got, ok := r.value(s); !ok || got != v {
			return fmt.Errorf("%s = %v (present %v), want %v", s, got, ok, v)
		}
	}
	return nil
}

// TestDaemonSetCapabilities runs dnsstandby with the DaemonSet's args and
// with exactly the capabilities its securityContext adds (as root, like the
// container), beside a real CoreDNS as LocalDNS on 169.254.10.10 and
// 169.254.10.11, and checks that it gets everything the args ask for:
// steering level adopt with LocalDNS's UDP sockets on both listeners
// adopted, the address anchor, the packet tap. Then it drops each
// capability in turn and checks the one thing that needs it breaks, so
// that none is spare. Needs root, CoreDNS (make bin/coredns) and setpriv
// (util-linux).
//
// The args read LocalDNS's Corefile from the node's
// /opt/azure/containers/localdns: here dnsstandby is given, in a test
// directory instead, the very Corefile the CoreDNS standing in for
// LocalDNS runs (caseArgs); every other arg is the manifest's.
func TestDaemonSetCapabilities(t *testing.T) {
	nstest.RequireRoot(t)
	nstest.CoreDNSBinary(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("setpriv (util-linux) not installed: cannot run dnsstandby with the DaemonSet's capabilities")
	}
	m := loadManifest(t, readFile(t, daemonSetFile))
	sc := m.container.SecurityContext
	if sc == nil || sc.Capabilities == nil {
		t.Fatal("no capabilities in the DaemonSet")
	}
	manifestCaps := sc.Capabilities.Add
	args, err := m.expandArgs("127.0.0.1") // the metrics listener on the namespace's loopback
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := ""
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--metrics-addr="); ok {
			metricsAddr = v
		}
	}
	bin := buildDNSStandby(t)

	ns, corefile := localDNSNode(t, "caps")

	full := map[string]float64{
		`dnsstandby_steer_level{level="adopt"}`:                                    1,
		`dnsstandby_steer_group_level{group="169.254.10.10:53/udp",level="adopt"}`: 1,
		`dnsstandby_steer_group_level{group="169.254.10.11:53/udp",level="adopt"}`: 1,
		`dnsstandby_steer_peers{group="169.254.10.10:53/udp"}`:                     1,
		`dnsstandby_steer_peers{group="169.254.10.11:53/udp"}`:                     1,
		`dnsstandby_mode{mode="mirror"}`:                                           1,
		`dnsstandby_anchor_ready`:                                                  1,
		`dnsstandby_anchor_addresses`:                                              2,
		`dnsstandby_mirror_tap_enabled{listener="169.254.10.10:53"}`:               1,
		`dnsstandby_mirror_tap_enabled{listener="169.254.10.11:53"}`:               1,
	}
	cases := []struct {
		name string
		drop []string
		want func(r *capsRun) error
	}{
		{"the DaemonSet's capabilities", nil, func(r *capsRun) error {
			// The tap's programs, kernel matching included, load under
			// the stricter verifier of a process without CAP_PERFMON.
			if strings.Contains(r.output, "the kernel cannot match queries") {
				return fmt.Errorf("no kernel matching with the DaemonSet's capabilities:\n%s", r.output)
			}
			return r.expect(full)
		}},
		{"without NET_BIND_SERVICE: no bind to port 53", []string{"NET_BIND_SERVICE"}, func(r *capsRun) error {
			if !r.exited || !strings.Contains(r.output, "bind: permission denied") {
				return fmt.Errorf("want an exit with bind: permission denied; exited %v:\n%s", r.exited, r.output)
			}
			return nil
		}},
		{"without NET_ADMIN: no anchor", []string{"NET_ADMIN"}, func(r *capsRun) error {
			return r.expect(map[string]float64{`dnsstandby_anchor_ready`: 0, `dnsstandby_steer_level{level="adopt"}`: 1})
		}},
		{"without NET_RAW: no packet tap", []string{"NET_RAW"}, func(r *capsRun) error {
			if _, ok := r.value(`dnsstandby_mirror_tap_enabled{listener="169.254.10.11:53"}`); ok {
				return fmt.Errorf("the tap runs")
			}
			return r.expect(map[string]float64{`dnsstandby_anchor_ready`: 1, `dnsstandby_steer_level{level="adopt"}`: 1})
		}},
		{"without SYS_PTRACE: no adopt", []string{"SYS_PTRACE"}, func(r *capsRun) error {
			return r.expect(map[string]float64{`dnsstandby_steer_level{level="own"}`: 1, `dnsstandby_anchor_ready`: 1})
		}},
		{"without BPF: no steering program", []string{"BPF"}, func(r *capsRun) error {
			return r.expect(map[string]float64{`dnsstandby_steer_level{level="off"}`: 1, `dnsstandby_anchor_ready`: 1})
		}},
	}
	// Every capability the DaemonSet adds is one some case shows needed.
	for _, c := range manifestCaps {
		if !slices.ContainsFunc(cases, func(tc struct {
			name string
			drop []string
			want func(r *capsRun) error
		}) bool {
			return slices.Contains(tc.drop, c)
		}) {
			t.Errorf("the DaemonSet adds %s, and no case shows what needs it", c)
		}
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var caps []string
			for _, c := range manifestCaps {
				if !slices.Contains(tc.drop, c) {
					caps = append(caps, c)
				}
			}
			for _, c := range tc.drop {
				if !slices.Contains(manifestCaps, c) {
					t.Fatalf("%s is not in the DaemonSet's capabilities %q", c, manifestCaps)
				}
			}
			runArgs := caseArgs(t, args, corefile)
			set := "-all"
			for _, c := range caps {
				set += ",+" + strings.ToLower(c)
			}
			p := nstest.Start(t, ns, setpriv, append([]string{"--bounding-set", set, "--inh-caps", set, "--no-new-privs", "--", bin}, runArgs...)...)
			t.Cleanup(func() {
				_ = p.Signal(syscall.SIGTERM) // detach the steering program
				select {
				case <-p.Done():
				case <-time.After(10 * time.Second):
				}
				_ = p.Stop()
				_ = ns.DelLink("dnsstandby") // the anchor stays by design: remove it for the next case
			})
			var last error
			defer func() {
				if t.Failed() { // nstest shows p's output
					t.Logf("with %q: %v", caps, last)
				}
			}()
			testkit.Eventually(t, 10*time.Second, "dnsstandby as the case wants", func() bool {
				r := &capsRun{output: p.Output()}
				select {
				case <-p.Done():
					r.exited, r.output = true, p.Output()
				default:
					if r.metrics, last = scrape(ns, metricsAddr); last != nil {
						return false
					}
				}
				last = tc.want(r)
				if last != nil && r.exited {
					t.Fatal("dnsstandby exited") // it will not get better
				}
				return last == nil
			})
		})
	}
}

// localDNSNode is a namespace standing in for a node: a real CoreDNS as
// LocalDNS on 169.254.10.10 and 169.254.10.11, running the Corefile
// AgentBaker renders (returned), both root blocks forwarding to a kube-dns
// CoreDNS in the same namespace (answering with whoami): nothing leaves it.
func localDNSNode(t *testing.T, name string) (*nstest.Namespace, string) {
	ns := nstest.New(t, name)
	if err := ns.AddLink("localdns", "", "169.254.10.10/32", "169.254.10.11/32"); err != nil {
		t.Fatal(err)
	}
	const kubeDNS = "10.0.0.10"
	if err := ns.AddLink("kubedns", "", kubeDNS+"/32"); err != nil {
		t.Fatal(err)
	}
	nstest.StartCoreDNS(t, ns, nstest.CoreDNSConfig{Corefile: ".:53 {\n    bind " + kubeDNS + "\n    whoami\n}\n", Probe: kubeDNS + ":53"})
	corefile := testkit.Corefile{KubeDNS: kubeDNS, VnetDNS: kubeDNS}.String()
	nstest.StartCoreDNS(t, ns, nstest.CoreDNSConfig{Corefile: corefile, Probe: testkit.PodListener + ":53"})
	return ns, corefile
}

// caseArgs adapts the DaemonSet's args to one run here: LocalDNS's
// Corefile (as updated.localdns.corefile), the state and the admin socket
// in a test directory instead of the node's paths, and a bridge anchor
// (this project's machines lack the dummy driver; AKS nodes have it).
func caseArgs(t *testing.T, args []string, corefile string) []string {
	args, dir := inLocalDNSDir(t, args)
	if err := os.WriteFile(filepath.Join(dir, "updated.localdns.corefile"), []byte(corefile), 0o644); err != nil {
		t.Fatal(err)
	}
	out := make([]string, 0, len(args)+1)
	for _, a := range args {
		switch {
		case strings.HasPrefix(a, "--state-dir="):
			a = "--state-dir=" + filepath.Join(dir, "state")
		case strings.HasPrefix(a, "--admin-socket="):
			a = "--admin-socket=" + filepath.Join(dir, "admin.sock")
		}
		out = append(out, a)
	}
	return append(out, "--anchor-kind=bridge", "--log-format=text")
}

// scrape reads dnsstandby's /metrics from inside ns.
func scrape(ns *nstest.Namespace, addr string) (map[string]float64, error) {
	client := &http.Client{
		Timeout: 2 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
				return ns.Dial(network, "", a, 2*time.Second)
			},
			DisableKeepAlives: true,
		},
	}
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	dec := &expfmt.SampleDecoder{
		Dec:  expfmt.NewDecoder(resp.Body, expfmt.ResponseFormat(resp.Header)),
		Opts: &expfmt.DecodeOptions{Timestamp: model.Now()},
	}
	out := map[string]float64{}
	for {
		var samples model.Vector // one family's
		if err := dec.Decode(&samples); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, err
		}
		for _, s := range samples {
			b := labels.NewScratchBuilder(len(s.Metric))
			for name, value := range s.Metric {
				b.Add(string(name), string(value))
			}
			b.Sort()
			out[b.Labels().String()] = float64(s.Value)
		}
	}
}
