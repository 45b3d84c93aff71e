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
// runs exits 75 with one line and changes nothing (the first keeps
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
	if err == nil || !strings.Contains(err.Error(), "exit status 75") || !strings.Contains(err.Error(), "another dnsstandby is running on this node") {
		t.Fatalf("second run: %v, want exit 75 saying another runs", err)
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

// TestSecondInstanceLeavesMirror: a second `dnsstandby run` started
// without --handover-from beside one that mirrors a healthy LocalDNS at
// level adopt exits 75 and changes nothing: the first stays in mirror at
// adopt with its tap inserting, and LocalDNS still gets every query (a
// second instance used to attach its own steering program before it failed,
// and dnsstandby then answered everything).
func TestSecondInstanceLeavesMirror(t *testing.T) {
	l := newLab(t)
	l.startReference(t)
	lock := t.TempDir() + "/dnsstandby.lock"
	s := l.startStandby(t, "--steering", "adopt", "--mirror", "tap", "--lock-file", lock)
	mirroring := func() bool {
		return l.metric(t, s, "dnsstandby_mode", "mode", "mirror") == 1 &&
			l.metric(t, s, "dnsstandby_steer_level", "level", "adopt") == 1 &&
			l.metric(t, s, "dnsstandby_mirror_tap_enabled") == 1
	}
	l.eventuallyMetric(t, s, 10*time.Second, "mirror at adopt, tap inserting", mirroring, "dnsstandby_mode", "dnsstandby_steer_level", "tap_enabled")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := l.node.Run(ctx, binary, "run", "--listen", standbyAddr, "--upstream", kubeDNS, "--metrics-addr", "127.0.0.1:9356",
		"--anchor-kind", "bridge", "--admin-socket", "", "--state-dir", t.TempDir(), "--lock-file", lock, "--steering", "adopt")
	if err == nil || !strings.Contains(err.Error(), "exit status 75") || !strings.Contains(err.Error(), "another dnsstandby is running on this node") {
		t.Fatalf("second run: %v, want exit 75 saying another runs", err)
	}
	if !mirroring() {
		t.Fatal("the first dnsstandby left mirror at adopt after the second's attempt")
	}
	byLocalDNS, total := 0, 400
	for i := range total {
		m := svcQuery(l.zones.Services[i%len(l.zones.Services)].FQDN)
		m.SetEdns0(1232, false)
		m.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_NSID{Code: dns.EDNS0NSID}}
		r, err := l.node.Exchange("udp", "", standbyAddr, m, time.Second)
		if err == nil && strings.HasPrefix(nsid(r), "localdns") {
			byLocalDNS++
		}
	}
	if byLocalDNS*1000 < total*999 {
		t.Errorf("after the second's attempt LocalDNS answered %d of %d queries, want at least 99.9%%", byLocalDNS, total)
	}
}
