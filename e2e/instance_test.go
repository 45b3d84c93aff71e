package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestOneInstanceAndCleanup: a second `dnsstandby run` on a node where one
// runs exits 1 with one line and changes nothing (the first keeps
// answering, its anchor stays); `dnsstandby cleanup` refuses while one
// runs, and after it stopped deletes the anchor link it left.
func TestOneInstanceAndCleanup(t *testing.T) {
	l := newLab(t)
	lock := t.TempDir() + "/dnsstandby.lock"
	first := l.startStandby(t, "--lock-file", lock)
	ask := func() error {
		m := new(dns.Msg)
		m.SetQuestion("kubernetes.default.svc.cluster.local.", dns.TypeA)
		_, err := l.node.Exchange("udp", "", standbyAddr, m, time.Second)
		return err
	}
	if err := ask(); err != nil {
		t.Fatalf("the first dnsstandby does not answer: %v", err)
	}
	run := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		return l.node.Run(ctx, binary, args...)
	}

	_, err := run("run", "--listen", standbyAddr, "--upstream", kubeDNS, "--metrics-addr", "127.0.0.1:9356",
		"--anchor-kind", "bridge", "--admin-socket", "", "--state-dir", t.TempDir(), "--lock-file", lock)
	if err == nil || !strings.Contains(err.Error(), "exit status 1") || !strings.Contains(err.Error(), "another dnsstandby is running on this node") {
		t.Fatalf("second run: %v, want exit 1 saying another runs", err)
	}
	if err := ask(); err != nil {
		t.Fatalf("the first dnsstandby after the second's attempt: %v", err)
	}
	if _, err := run("cleanup", "--lock-file", lock); err == nil || !strings.Contains(err.Error(), "another dnsstandby is running") {
		t.Fatalf("cleanup while one runs: %v, want a refusal", err)
	}
	if links, err := l.node.Links(); err != nil || !slices.Contains(links, "dnsstandby") {
		t.Fatalf("links while running: %v %v, want the anchor dnsstandby", links, err)
	}

	if err := first.Stop(); err != nil {
		t.Logf("stop: %v", err)
	}
	if links, _ := l.node.Links(); !slices.Contains(links, "dnsstandby") {
		t.Fatalf("links after stop: %v, want the anchor kept", links)
	}
	out, err := run("cleanup", "--lock-file", lock)
	if err != nil || !strings.Contains(out, "deleted link dnsstandby") {
		t.Fatalf("cleanup: %q %v", out, err)
	}
	if links, _ := l.node.Links(); slices.Contains(links, "dnsstandby") {
		t.Fatalf("links after cleanup: %v", links)
	}
	if out, err := run("cleanup", "--lock-file", lock); err != nil || !strings.Contains(out, "nothing to clean up") {
		t.Fatalf("second cleanup: %q %v", out, err)
	}
}
