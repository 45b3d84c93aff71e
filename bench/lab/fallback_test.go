package lab_test

import (
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/bench/lab"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// TestLocalDNSNotrack: the stand-in sets AKS's NOTRACK rules (8: OUTPUT and
// PREROUTING, .10 and .11, udp and tcp) and its drop-in while it runs,
// inside the node's namespace; while they are in, the nat fallback's DNAT
// takes nothing (untracked packets skip nat); a stop removes rules and
// drop-in first, the link only after the cleanup's 5 s.
func TestLocalDNSNotrack(t *testing.T) {
	t.Parallel()
	n := localdnsTestBootWith(t, lab.LocalDNSPR9439, func(cfg *lab.GuestConfig) {
		cfg.Name += "-nt" // beside TestLocalDNSPR9439's guest
		maps.Copy(cfg.Units, lab.FallbackUnits(lab.FallbackNAT))
		maps.Copy(cfg.Files, lab.FallbackFiles(lab.FallbackNAT))
	})
	g := n.guest
	n.waitAnswering(t, lab.LocalDNSPodIP, 10*time.Second)
	ctx := t.Context()
	raw := func() string {
		out, err := g.Exec(ctx, "/usr/sbin/iptables", "-w", "-t", "raw", "-S")
		localdnsTestMust(t, err)
		return out
	}
	dropIn := "/run/systemd/network/10-eth0.network.d/70-localdns.conf"
	if got := strings.Count(raw(), `--comment "localdns: skip conntrack"`); got != 8 {
		t.Fatalf("%d NOTRACK rules while LocalDNS runs, want 8:\n%s", got, raw())
	}
	if _, err := g.Exec(ctx, "test", "-s", dropIn); err != nil {
		t.Errorf("drop-in %s missing while LocalDNS runs: %v", dropIn, err)
	}

	// The nat fallback in front of a running LocalDNS, its rules in.
	for _, args := range lab.KubeProxyRules(lab.LocalDNSKubeDNS, 53, []string{lab.LocalDNSKubeDNS}) {
		args = append([]string{"-w", "-t", "nat"}, args...)
		_, err := g.Exec(ctx, "/usr/sbin/iptables", args...)
		localdnsTestMust(t, err)
	}
	sh := func(cmd string) {
		t.Helper()
		out, err := g.Exec(ctx, "sh", "-c", cmd)
		if err != nil {
			t.Fatalf("%s: %v: %s", cmd, err, out)
		}
	}
	sh("mkdir -p /run/systemd/resolve && echo nameserver " + lab.LocalDNSVnetDNS + " >/run/systemd/resolve/resolv.conf")
	if out, err := g.Systemctl(ctx, "start", lab.FallbackUnitName); err != nil {
		t.Fatalf("start the nat fallback: %v: %s", err, out)
	}
	for i := range 20 {
		if err := n.answers(lab.LocalDNSPodIP, time.Second); err != nil {
			t.Errorf("query %d to .11 with the nat chain in: %v", i, err)
		}
	}
	nat, err := g.Exec(ctx, "/usr/sbin/iptables", "-w", "-t", "nat", "-L", lab.FallbackChain, "-v", "-x", "-n")
	localdnsTestMust(t, err)
	if p := packets(nat); p != 0 {
		t.Errorf("the nat chain took %d packets with NOTRACK in, want 0:\n%s", p, nat)
	}
	q := new(dns.Msg)
	q.SetQuestion("health-check.localdns.local.", dns.TypeA)
	// whoami answers in the additional section; kube-dns would say NXDOMAIN.
	if r, err := n.node.Exchange("udp", "", lab.LocalDNSPodIP+":53", q, time.Second); err != nil || r.Rcode != dns.RcodeSuccess || len(r.Extra) == 0 {
		t.Errorf("health-check with the nat chain in: %v %v, want LocalDNS's whoami answer", err, r)
	}

	// A stop: rules and drop-in go first, the link after the cleanup's 5 s
	// (ExecStartPre is not run on stop: the fallback stays; stop it too).
	if out, err := g.Systemctl(ctx, "stop", "--no-block", lab.LocalDNSUnitName); err != nil {
		t.Fatalf("stop: %v: %s", err, out)
	}
	testkit.Eventually(t, 5*time.Second, "NOTRACK rules removed", func() bool {
		return !strings.Contains(raw(), "localdns: skip conntrack")
	})
	if _, err := g.Exec(ctx, "ip", "link", "show", "dev", "localdns"); err != nil {
		t.Errorf("the localdns link is gone as soon as the rules: %v, want it kept through the cleanup's 5 s", err)
	}
	if _, err := g.Exec(ctx, "test", "-e", dropIn); err == nil {
		t.Errorf("drop-in %s still there once the rules are gone", dropIn)
	}
	testkit.Eventually(t, 15*time.Second, "localdns link deleted", func() bool {
		_, err := g.Exec(ctx, "ip", "link", "show", "dev", "localdns")
		return err != nil
	})
	sh("systemctl stop " + lab.FallbackUnitName)
}

// packets sums the packet counters of `iptables -L CHAIN -v -x -n`.
func packets(listing string) int {
	n := 0
	for _, l := range strings.Split(listing, "\n") {
		if f := strings.Fields(l); len(f) > 2 {
			if p, err := strconv.Atoi(f[0]); err == nil {
				n += p
			}
		}
	}
	return n
}
