// Package e2e runs the dnsstandby binary against real CoreDNS servers in
// network namespaces the tests create: kube-dns at its ClusterIP, and a
// LocalDNS-shaped CoreDNS on the node, asked with Go clients, dig and kdig.
// The tests need root; they skip with a message without it.
package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

const (
	clusterIP   = "10.0.0.10" // kube-dns's ClusterIP
	kubeDNS     = clusterIP + ":53"
	standbyIP   = "169.254.10.11" // dnsstandby: the pods' nameserver
	standbyAddr = standbyIP + ":53"
	// refIP is a LocalDNS-shaped CoreDNS on another address of the same
	// link, so the two can be asked the same questions side by side.
	refIP   = "169.254.10.12"
	refAddr = refIP + ":53"
	timeout = 2 * time.Second
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

// lab is a node namespace holding 169.254.10.11 and .12 on a `localdns`
// link, joined by a veth to a kube-dns namespace where CoreDNS serves the
// generated zones at 10.0.0.10.
type lab struct {
	node, kube *nstest.Namespace
	zones      *nstest.Zones
	kubeDNS    *nstest.CoreDNS
}

func newLab(t *testing.T) *lab {
	t.Helper()
	nstest.RequireRoot(t)
	nstest.CoreDNSBinary(t)
	l := &lab{
		node:  nstest.New(t, "node"),
		kube:  nstest.New(t, "kubedns"),
		zones: nstest.KubeDNSZones(nstest.ZoneOptions{Services: 50, Namespaces: []string{"default", "kube-system"}}),
	}
	must(t, l.kube.AddLink("kubedns", "", clusterIP+"/32"))
	must(t, l.node.AddLink("localdns", "", standbyIP+"/32", refIP+"/32"))
	must(t, nstest.AddVeth(
		nstest.End{NS: l.node, Name: "to-kubedns", Addrs: []string{"10.200.0.1/30"}},
		nstest.End{NS: l.kube, Name: "to-node", Addrs: []string{"10.200.0.2/30"}},
	))
	must(t, l.node.AddRoute(nstest.Route{Dst: clusterIP + "/32", Via: "10.200.0.2"}))
	l.kubeDNS = nstest.StartCoreDNS(t, l.kube, nstest.CoreDNSConfig{
		Corefile: l.zones.Corefile(clusterIP),
		Files:    l.zones.Files,
		Probe:    kubeDNS,
	})
	return l
}

// localDNSCorefile is the .11 root block AgentBaker generates (forward to
// kube-dns with prefer_udp, LocalDNS's cache settings, nsid), bound to addr.
func localDNSCorefile(addr string) string {
	return fmt.Sprintf(`.:53 {
    errors
    bind %s
    forward . %s {
        prefer_udp
        policy sequential
        max_concurrent 1000
    }
    cache 3600 {
        success 9984
        denial 9984
        serve_stale 72000s verify
        servfail 0
    }
    nsid localdns-pod
}
`, addr, clusterIP)
}

// startReference runs the LocalDNS-shaped CoreDNS on addr.
func (l *lab) startReference(t *testing.T, addr string) *nstest.CoreDNS {
	t.Helper()
	return nstest.StartCoreDNS(t, l.node, nstest.CoreDNSConfig{
		Corefile: localDNSCorefile(addr),
		Probe:    addr + ":53",
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
	args := append([]string{"run", "--listen", standbyAddr, "--upstream", kubeDNS,
		"--metrics-addr", "127.0.0.1:9355", "--log-format", "text",
		"--anchor-kind", "bridge", "--admin-socket", "", "--state-dir", t.TempDir()}, extra...)
	p := nstest.Start(t, l.node, binary, args...)
	s := &standby{Process: p, metrics: "127.0.0.1:9355"}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if code, _, err := l.get(s, "/readyz"); err == nil && code == http.StatusOK {
			return s
		}
		select {
		case <-p.Done():
			t.Fatalf("dnsstandby exited: %v\n%s", p.Err(), p.Output())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("dnsstandby not ready after 10s:\n%s", p.Output())
		}
		time.Sleep(20 * time.Millisecond)
	}
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

// metric returns the value of one series from /metrics, or -1.
func (l *lab) metric(t *testing.T, s *standby, series string) float64 {
	t.Helper()
	_, body, err := l.get(s, "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	for _, line := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			var v float64
			if _, err := fmt.Sscan(rest, &v); err == nil {
				return v
			}
		}
	}
	return -1
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
