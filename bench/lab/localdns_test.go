package lab_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/bench/lab"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// What the tests ask: the lab's upstreams (kube-dns and the VNet DNS,
// lab.StartUpstreams) both serve it.
const (
	// localdnsTestName is a name the zones answer with an A record.
	localdnsTestName = "www.example.com."
	localdnsTestAddr = "192.0.2.10"
)

// localdnsTestNode is a node for the tests: a guest running LocalDNS and
// the upstreams it forwards to.
type localdnsTestNode struct {
	guest    *lab.Guest
	node     *nstest.Namespace // the guest's network namespace
	bootTime time.Duration
}

// localdnsTestRequire skips the test without what a guest needs.
func localdnsTestRequire(t *testing.T) string {
	t.Helper()
	nstest.RequireRoot(t)
	coredns := nstest.CoreDNSBinary(t)
	for _, p := range []string{"/lib/systemd/systemd", "/usr/bin/nsenter", "/usr/bin/unshare", "/usr/bin/setpriv"} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("a systemd guest needs %s: %v", p, err)
		}
	}
	return coredns
}

// localdnsTestBoot boots a guest with LocalDNS (unit variant) enabled and
// wires its upstreams to it; everything goes when the test ends.
func localdnsTestBoot(t *testing.T, variant string) *localdnsTestNode {
	t.Helper()
	return localdnsTestBootWith(t, variant, nil)
}

// localdnsTestBootWith is localdnsTestBoot with more in the guest: edit,
// if not nil, changes its configuration first.
func localdnsTestBootWith(t *testing.T, variant string, edit func(*lab.GuestConfig)) *localdnsTestNode {
	t.Helper()
	coredns := localdnsTestRequire(t)
	cfg := lab.GuestConfig{
		Name:  fmt.Sprintf("labtest-%d-%s", os.Getpid(), variant),
		Units: map[string]string{lab.LocalDNSUnitName: lab.LocalDNSUnit(variant)},
		// CoreDNS is bound in where a node has it, so that a binary
		// under /tmp ($DNSSTANDBY_COREDNS) works too.
		Files:  lab.LocalDNSFiles(lab.LocalDNSCoreDNSPath),
		Binds:  map[string]string{lab.LocalDNSCoreDNSPath: coredns},
		Enable: []string{lab.LocalDNSUnitName},
	}
	if edit != nil {
		edit(&cfg)
	}
	start := time.Now()
	g, err := lab.BootGuest(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	n := &localdnsTestNode{guest: g, node: g.NetNS(), bootTime: time.Since(start)}
	t.Cleanup(func() {
		if t.Failed() {
			if j, err := g.Journal(context.Background(), ""); err == nil {
				t.Logf("guest journal:\n%s", localdnsTestTail(j, 80))
			}
		}
		if err := g.Close(); err != nil {
			t.Error(err)
		}
	})
	t.Logf("%s: booted with localdns.service up in %v", cfg.Name, n.bootTime.Round(time.Millisecond))

	up, err := lab.StartUpstreams(n.node, coredns, nstest.KubeDNSZones(nstest.ZoneOptions{Services: 10}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := up.Close(); err != nil {
			t.Error(err)
		}
	})
	return n
}

// answers asks LocalDNS's listener ip for localdnsTestName from the node
// and reports whether the right answer came.
func (n *localdnsTestNode) answers(ip string, timeout time.Duration) error {
	q := new(dns.Msg)
	q.SetQuestion(localdnsTestName, dns.TypeA)
	r, err := n.node.Exchange("udp", "", ip+":53", q, timeout)
	if err != nil {
		return err
	}
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || !strings.Contains(r.Answer[0].String(), localdnsTestAddr) {
		return fmt.Errorf("unexpected reply: %s %v", dns.RcodeToString[r.Rcode], r.Answer)
	}
	return nil
}

// waitAnswering polls until ip answers right, or limit passes.
func (n *localdnsTestNode) waitAnswering(t *testing.T, ip string, limit time.Duration) {
	t.Helper()
	var err error
	defer func() {
		if err != nil && t.Failed() {
			t.Logf("%s, asked last: %v", ip, err)
		}
	}()
	testkit.Eventually(t, limit, ip+" answering", func() bool {
		err = n.answers(ip, 200*time.Millisecond)
		return err == nil
	})
}

// crashStorm is the harness of AgentBaker PR 9439's reproduction: up to
// eight attempts, reading MainPID before each and sending SIGKILL when a
// live PID exists, 300 ms apart. It returns the PIDs killed.
func (n *localdnsTestNode) crashStorm(t *testing.T) []int {
	t.Helper()
	var killed []int
	for i := range 8 {
		pid, err := n.guest.KillMain(t.Context(), lab.LocalDNSUnitName, syscall.SIGKILL)
		if err != nil {
			t.Fatalf("attempt %d: %v", i+1, err)
		}
		if pid > 0 {
			killed = append(killed, pid)
		}
		time.Sleep(300 * time.Millisecond)
	}
	return killed
}

// waitState polls the unit until its ActiveState/SubState are want, or
// limit passes; it returns the properties last seen.
func (n *localdnsTestNode) waitState(t *testing.T, want string, limit time.Duration) map[string]string {
	t.Helper()
	var st map[string]string
	defer func() {
		if t.Failed() {
			t.Logf("localdns.service last seen: %v", st)
		}
	}()
	testkit.Eventually(t, limit, "localdns.service "+want, func() bool {
		var err error
		st, err = n.guest.Show(t.Context(), lab.LocalDNSUnitName, "ActiveState", "SubState", "Result", "NRestarts", "MainPID")
		if err != nil {
			t.Fatal(err)
		}
		return st["ActiveState"]+"/"+st["SubState"] == want
	})
	return st
}

var localdnsTestNSID = regexp.MustCompile(`; NSID: .*\("([^"]*)"\)`)

// TestLocalDNSShipped boots LocalDNS with the unit AKS ships, checks that
// both listeners answer through CoreDNS (NSIDs localdns-pod and localdns),
// drives the reported crash storm into the start limit and checks that the
// pods' listener stays dead; then that Close leaves nothing behind.
func TestLocalDNSShipped(t *testing.T) {
	t.Parallel()
	n := localdnsTestBoot(t, lab.LocalDNSShipped)
	g := n.guest

	links, err := n.node.Links()
	localdnsTestMust(t, err)
	if !strings.Contains(strings.Join(links, " "), "localdns") {
		t.Fatalf("no localdns link in the guest's namespace: %v", links)
	}
	addrs := nstest.Run(t, n.node, "ip", "-o", "addr", "show", "dev", "localdns")
	for _, a := range []string{lab.LocalDNSNodeIP + "/32", lab.LocalDNSPodIP + "/32"} {
		if !strings.Contains(addrs, a) {
			t.Errorf("localdns link lacks %s:\n%s", a, addrs)
		}
	}
	// The first query may come before the veth to kube-dns existed in
	// CoreDNS's eyes; SERVFAIL is not cached (servfail 0), so poll.
	n.waitAnswering(t, lab.LocalDNSPodIP, 10*time.Second)
	n.waitAnswering(t, lab.LocalDNSNodeIP, 10*time.Second)
	for ip, nsid := range map[string]string{lab.LocalDNSPodIP: "localdns-pod", lab.LocalDNSNodeIP: "localdns"} {
		out := nstest.Run(t, n.node, "dig", "+nsid", "+tries=1", "+time=5", "@"+ip, localdnsTestName, "A")
		rcode, answer, err := nstest.ParseDig(localdnsTestDigAnswer(out))
		if err != nil || rcode != dns.RcodeSuccess || len(answer) != 1 || !strings.Contains(answer[0].String(), localdnsTestAddr) {
			t.Errorf("dig @%s %s: rcode %d answer %v err %v\n%s", ip, localdnsTestName, rcode, answer, err, out)
		}
		if m := localdnsTestNSID.FindStringSubmatch(out); m == nil || m[1] != nsid {
			t.Errorf("dig @%s: NSID %v, want %q\n%s", ip, m, nsid, out)
		}
		// A name never asked before: each listener's root block forwards
		// it (to kube-dns, to the VNet DNS), and both answer it.
		fresh := "q" + strings.ReplaceAll(ip, ".", "-") + "." + lab.FreshZone
		out = nstest.Run(t, n.node, "dig", "+tries=1", "+time=5", "@"+ip, fresh, "A")
		rcode, answer, err = nstest.ParseDig(localdnsTestDigAnswer(out))
		if err != nil || rcode != dns.RcodeSuccess || len(answer) != 1 || !strings.Contains(answer[0].String(), lab.FreshAddr) {
			t.Errorf("dig @%s %s: rcode %d answer %v err %v\n%s", ip, fresh, rcode, answer, err, out)
		}
	}

	stormStart := time.Now()
	killed := n.crashStorm(t)
	st := n.waitState(t, "failed/failed", 10*time.Second)
	t.Logf("shipped: %d live PIDs killed %v before the start limit; failed %v after the storm began; %v",
		len(killed), killed, time.Since(stormStart).Round(time.Millisecond), st)
	// The boot's start counts against the limit when it was less than 10 s
	// before the storm: 5 kills then, 6 (the reported count) otherwise.
	if len(killed) < 5 || len(killed) > 6 {
		t.Errorf("%d kills before the unit failed, want 5 or 6", len(killed))
	}
	journal := localdnsTestWaitJournal(t, g, "Start request repeated too quickly", 5*time.Second)
	if !strings.Contains(journal, "Failed to start localdns.service") {
		t.Errorf("journal lacks the failed start:\n%s", localdnsTestTail(journal, 20))
	}
	// Nothing comes back: the unit stays failed once its start limit is
	// hit (systemd restarts it no more), and with no ExecStopPost the link
	// and its addresses stay, with nobody listening (connection refused,
	// as on the node).
	if err := n.answers(lab.LocalDNSPodIP, 500*time.Millisecond); err == nil {
		t.Errorf("%s answers with localdns.service failed", lab.LocalDNSPodIP)
	} else {
		t.Logf("shipped: %s after the storm: %v", lab.LocalDNSPodIP, err)
	}
	if st := n.waitState(t, "failed/failed", 0); st["MainPID"] != "0" {
		t.Errorf("failed unit has MainPID %s", st["MainPID"])
	}

	localdnsTestCloseAndCheck(t, g)
}

// TestLocalDNSPR9439 drives the same storm into LocalDNS with PR 9439's
// unit and measures how long the pods' listener stays dark until it
// recovers to active/running; then that Close leaves nothing behind.
func TestLocalDNSPR9439(t *testing.T) {
	t.Parallel()
	n := localdnsTestBoot(t, lab.LocalDNSPR9439)
	g := n.guest
	n.waitAnswering(t, lab.LocalDNSPodIP, 10*time.Second)

	// A prober asks .11 every 50 ms throughout, as a pod would.
	type probe struct {
		at time.Time
		ok bool
	}
	var (
		mu     sync.Mutex
		probes []probe
	)
	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			err := n.answers(lab.LocalDNSPodIP, 200*time.Millisecond)
			mu.Lock()
			probes = append(probes, probe{time.Now(), err == nil})
			mu.Unlock()
			time.Sleep(50 * time.Millisecond)
		}
	})
	defer func() { stop(); wg.Wait() }()

	stormStart := time.Now()
	killed := n.crashStorm(t)
	stormEnd := time.Now()
	st := n.waitState(t, "active/running", 30*time.Second)
	n.waitAnswering(t, lab.LocalDNSPodIP, 10*time.Second)
	// A few good probes after recovery: the outage has ended.
	testkit.Eventually(t, 5*time.Second, "5 good probes in a row", func() bool {
		mu.Lock()
		defer mu.Unlock()
		good := 0
		for i := len(probes) - 1; i >= 0 && probes[i].ok; i-- {
			good++
		}
		return good >= 5
	})
	stop()
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	var firstFail, lastFail, recovered time.Time
	failures := 0
	for _, p := range probes {
		if !p.ok {
			failures++
			if firstFail.IsZero() {
				firstFail = p.at
			}
			lastFail = p.at
		}
	}
	for _, p := range probes {
		if p.ok && p.at.After(lastFail) {
			recovered = p.at
			break
		}
	}
	if firstFail.IsZero() || recovered.IsZero() {
		t.Fatalf("no outage seen, or no recovery: %d probes, %d failed", len(probes), failures)
	}
	outage := recovered.Sub(firstFail)
	t.Logf("pr9439: %d live PIDs killed %v in %v; %v; .11 dark from +%v to +%v: outage %v (%d of %d probes failed)",
		len(killed), killed, stormEnd.Sub(stormStart).Round(time.Millisecond), st,
		firstFail.Sub(stormStart).Round(time.Millisecond), recovered.Sub(stormStart).Round(time.Millisecond),
		outage.Round(time.Millisecond), failures, len(probes))
	if st["Result"] != "success" {
		t.Errorf("recovered unit has Result=%s, want success", st["Result"])
	}
	if outage > 20*time.Second {
		t.Errorf("outage %v, want the few seconds of two RestartSec=2 cycles", outage)
	}
	journal, err := g.Journal(t.Context(), lab.LocalDNSUnitName)
	localdnsTestMust(t, err)
	if strings.Contains(journal, "Start request repeated too quickly") {
		t.Errorf("pr9439 unit hit its start limit:\n%s", localdnsTestTail(journal, 30))
	}
	// ExecStopPost (PR 9360) ran the cleanup after each crash.
	if !strings.Contains(journal, "Successfully cleanup localdns related configurations.") {
		t.Errorf("no ExecStopPost cleanup in the journal:\n%s", localdnsTestTail(journal, 30))
	}

	localdnsTestCloseAndCheck(t, g)
}

// localdnsTestCloseAndCheck closes the guest and checks that no cgroup
// directory, named namespace, state directory or process of it is left.
func localdnsTestCloseAndCheck(t *testing.T, g *lab.Guest) {
	t.Helper()
	name, pid := g.Name(), g.PID()
	var st syscall.Stat_t
	localdnsTestMust(t, syscall.Stat(g.NetNS().Path(), &st))
	netnsIno := st.Ino
	cgroup := localdnsTestCgroupOf(t, pid)

	start := time.Now()
	localdnsTestMust(t, g.Close())
	t.Logf("%s: closed in %v", name, time.Since(start).Round(time.Millisecond))
	localdnsTestMust(t, g.Close()) // twice is fine

	for _, p := range append(cgroup, "/run/netns/"+name, "/run/dnsstandby-guest/"+name) {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s still there (%v)", p, err)
		}
	}
	if out, err := exec.Command("ip", "netns", "list").CombinedOutput(); err != nil || strings.Contains(string(out), name) {
		t.Errorf("ip netns list (%v) still shows %s:\n%s", err, name, out)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("PID 1 (%d) still exists", pid)
	}
	// No process (or open descriptor) in the guest's network namespace.
	want := fmt.Sprintf("net:[%d]", netnsIno)
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		if link, err := os.Readlink(p + "/ns/net"); err == nil && link == want {
			comm, _ := os.ReadFile(p + "/comm")
			t.Errorf("process %s (%s) is still in the guest's network namespace", p, strings.TrimSpace(string(comm)))
		}
	}
}

// localdnsTestCgroupOf returns the host paths the cgroup PID 1 was placed
// in (the root of the guest's cgroup namespace) may have: under the cgroup2
// mount of a hybrid host and of a unified one.
func localdnsTestCgroupOf(t *testing.T, pid int) []string {
	t.Helper()
	// PID 1's cgroup as the host sees it: "0::/dnsstandby-guest/NAME/init.scope".
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	s := bufio.NewScanner(strings.NewReader(string(data)))
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "0::"); ok {
			parts := strings.Split(strings.Trim(rest, "/"), "/")
			if len(parts) >= 2 {
				rel := filepath.Join(parts[0], parts[1])
				return []string{filepath.Join("/sys/fs/cgroup/unified", rel), filepath.Join("/sys/fs/cgroup", rel)}
			}
		}
	}
	t.Fatalf("no cgroup2 path for PID 1 in /proc/%d/cgroup:\n%s", pid, data)
	return nil
}

// localdnsTestWaitJournal polls the unit's journal until it holds want.
func localdnsTestWaitJournal(t *testing.T, g *lab.Guest, want string, limit time.Duration) string {
	t.Helper()
	var j string
	defer func() {
		if t.Failed() {
			t.Logf("journal:\n%s", localdnsTestTail(j, 30))
		}
	}()
	testkit.Eventually(t, limit, fmt.Sprintf("journal holding %q", want), func() bool {
		var err error
		j, err = g.Journal(t.Context(), lab.LocalDNSUnitName)
		localdnsTestMust(t, err)
		return strings.Contains(j, want)
	})
	return j
}

// localdnsTestDigAnswer keeps what ParseDig reads from a full dig output.
func localdnsTestDigAnswer(out string) string {
	var b strings.Builder
	inAnswer := false
	for line := range strings.Lines(out) {
		switch {
		case strings.Contains(line, "->>HEADER<<-"):
			b.WriteString(line)
		case strings.HasPrefix(line, ";; ANSWER SECTION:"):
			inAnswer = true
		case inAnswer && strings.TrimSpace(line) == "":
			inAnswer = false
		case inAnswer:
			b.WriteString(line)
		}
	}
	return b.String()
}

func localdnsTestTail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func localdnsTestMust(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// localdnsTestSettings reads a unit file into section.Key -> values,
// skipping comments, as systemd reads the simple files here.
func localdnsTestSettings(unit string) map[string][]string {
	m := map[string][]string{}
	section := ""
	for line := range strings.Lines(unit) {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
		default:
			k, v, _ := strings.Cut(line, "=")
			m[section+"."+k] = append(m[section+"."+k], v)
		}
	}
	return m
}

// TestLocalDNSUnit pins the settings each variant has and lacks, and where
// they are.
func TestLocalDNSUnit(t *testing.T) {
	common := map[string]string{
		"Service.Type":            "notify",
		"Service.NotifyAccess":    "all",
		"Service.WatchdogSec":     "60",
		"Service.Restart":         "on-failure",
		"Service.KillMode":        "mixed",
		"Service.TimeoutStopSec":  "30",
		"Service.Slice":           "localdns.slice",
		"Service.ExecStart":       lab.LocalDNSScript,
		"Service.EnvironmentFile": "-" + lab.LocalDNSEnvironmentPath,
	}
	for _, tc := range []struct {
		variant string
		has     map[string]string
		lacks   []string
	}{
		{lab.LocalDNSShipped, nil, []string{"Unit.StartLimitIntervalSec", "Unit.StartLimitBurst",
			"Service.RestartSec", "Service.ExecStopPost", "Service.KillSignal"}},
		{lab.LocalDNSPR9439, map[string]string{
			"Unit.StartLimitIntervalSec": "720",
			"Unit.StartLimitBurst":       "5",
			"Service.RestartSec":         "2",
			"Service.KillSignal":         "SIGTERM",
			"Service.ExecStopPost":       lab.LocalDNSScript + " cleanup",
		}, nil},
	} {
		got := localdnsTestSettings(lab.LocalDNSUnit(tc.variant))
		for k, v := range common {
			if len(got[k]) != 1 || got[k][0] != v {
				t.Errorf("%s: %s = %v, want %q", tc.variant, k, got[k], v)
			}
		}
		for k, v := range tc.has {
			if len(got[k]) != 1 || got[k][0] != v {
				t.Errorf("%s: %s = %v, want %q", tc.variant, k, got[k], v)
			}
		}
		for _, k := range tc.lacks {
			if _, ok := got[k]; ok {
				t.Errorf("%s: has %s = %v, want none (systemd's default)", tc.variant, k, got[k])
			}
		}
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("LocalDNSUnit of an unknown variant did not panic")
			}
		}()
		lab.LocalDNSUnit("pr9999")
	}()
}

// TestDnsstandbyUnit: the lab runs deploy/'s unit, and its options file
// refuses what systemd's word splitting would mangle.
func TestDnsstandbyUnit(t *testing.T) {
	got := localdnsTestSettings(lab.DnsstandbyUnit())
	for k, v := range map[string]string{
		"Service.ExecStart":       "/usr/local/bin/dnsstandby run $DNSSTANDBY_OPTS",
		"Service.EnvironmentFile": "-" + lab.DnsstandbyDefaultsPath,
		"Service.Type":            "notify",
	} {
		if len(got[k]) != 1 || got[k][0] != v {
			t.Errorf("%s = %v, want %q", k, got[k], v)
		}
	}
	f, err := lab.DnsstandbyDefaults("--listen", "169.254.10.11:53", "--steering", "adopt")
	if err != nil || f.Data != "# dnsstandby lab node\nDNSSTANDBY_OPTS=\"--listen 169.254.10.11:53 --steering adopt\"\n" {
		t.Errorf("DnsstandbyDefaults: %q, %v", f.Data, err)
	}
	for _, bad := range []string{"", "a b", `"x"`, "$HOME", "100%"} {
		if _, err := lab.DnsstandbyDefaults("--nsid", bad); err == nil {
			t.Errorf("DnsstandbyDefaults accepted %q", bad)
		}
	}
}

// TestLocalDNSFiles checks the files' paths and modes, and that the
// environment points the script at the CoreDNS given.
func TestLocalDNSFiles(t *testing.T) {
	files := lab.LocalDNSFiles("/usr/local/bin/coredns")
	if f := files[lab.LocalDNSScript]; f.Mode != 0o755 || !strings.HasPrefix(f.Data, "#!/bin/bash\n") {
		t.Errorf("script: mode %v, starts %q", f.Mode, f.Data[:min(20, len(f.Data))])
	}
	env := files[lab.LocalDNSEnvironmentPath].Data
	for _, want := range []string{"COREDNS_BINARY_PATH=/usr/local/bin/coredns\n", "LINK_KIND=bridge\n",
		"UPDATED_LOCALDNS_CORE_FILE=" + lab.LocalDNSCorefilePath + "\n"} {
		if !strings.Contains(env, want) {
			t.Errorf("environment lacks %q:\n%s", want, env)
		}
	}
	if files[lab.LocalDNSCorefilePath].Data != lab.LocalDNSCorefile() {
		t.Error("Corefile file differs from LocalDNSCorefile()")
	}
	if !strings.Contains(lab.LocalDNSFiles("")[lab.LocalDNSEnvironmentPath].Data, "COREDNS_BINARY_PATH="+lab.LocalDNSCoreDNSPath+"\n") {
		t.Error(`LocalDNSFiles("") does not default to the node's CoreDNS path`)
	}
}

// TestLocalDNSCorefile holds the lab's Corefile to the AgentBaker rendering
// it is made from (corefile/testdata/agentbaker-node-controller.corefile):
// block for block the same, but for the documented differences — the VNet
// DNS address localdns.sh writes in, errors for log in the node's root
// block, no testdomain456.com.
func TestLocalDNSCorefile(t *testing.T) {
	root, err := nstest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "corefile", "testdata", "agentbaker-node-controller.corefile"))
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, block := range localdnsTestBlocks(strings.ReplaceAll(string(b), "168.63.129.16", lab.LocalDNSVnetDNS)) {
		switch {
		case strings.HasPrefix(block, "testdomain456.com:53 {"):
			continue
		case strings.HasPrefix(block, ".:53 {\n    log\n    bind "+lab.LocalDNSNodeIP+"\n"):
			block = strings.Replace(block, "    log\n", "    errors\n", 1)
		}
		want = append(want, block)
	}
	got := localdnsTestBlocks(lab.LocalDNSCorefile())
	if len(got) != 4 || len(got) != len(want) {
		t.Fatalf("%d blocks in the lab's Corefile, %d in the rendering's; want 4:\n%s", len(got), len(want), lab.LocalDNSCorefile())
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("block %d differs from the rendering's:\n got %s\nwant %s", i, got[i], want[i])
		}
	}
}

// TestLocalDNSCorefileListeners: each listener has its blocks, and every
// forward goes to an upstream inside the lab (never to Azure's
// 168.63.129.16): the node's root block to the VNet DNS, its cluster.local
// block and the pods' root block to kube-dns.
func TestLocalDNSCorefileListeners(t *testing.T) {
	tests := []struct {
		key, bind, forward string // forward "" for none
	}{
		{"health-check.localdns.local:53", lab.LocalDNSNodeIP + " " + lab.LocalDNSPodIP, ""},
		{".:53", lab.LocalDNSNodeIP, lab.LocalDNSVnetDNS},
		{"cluster.local:53", lab.LocalDNSNodeIP, lab.LocalDNSKubeDNS},
		{".:53", lab.LocalDNSPodIP, lab.LocalDNSKubeDNS},
	}
	cf := lab.LocalDNSCorefile()
	blocks := localdnsTestBlocks(cf)
	if len(blocks) != len(tests) {
		t.Fatalf("%d blocks, want %d:\n%s", len(blocks), len(tests), cf)
	}
	for i, tc := range tests {
		t.Run(tc.key+" "+tc.bind, func(t *testing.T) {
			b := blocks[i]
			if !strings.HasPrefix(b, tc.key+" {\n") || !strings.Contains(b, "    bind "+tc.bind+"\n") {
				t.Errorf("block %d is not %s bound to %s:\n%s", i, tc.key, tc.bind, b)
			}
			forwards := regexp.MustCompile(`(?m)^\s*forward \. (.*) \{$`).FindAllStringSubmatch(b, -1)
			switch {
			case tc.forward == "" && len(forwards) != 0:
				t.Errorf("forwards %v, want none", forwards)
			case tc.forward != "" && (len(forwards) != 1 || forwards[0][1] != tc.forward):
				t.Errorf("forwards %v, want one to %s", forwards, tc.forward)
			}
		})
	}
	if strings.Contains(cf, "168.63.129.16") {
		t.Errorf("the Corefile names Azure's DNS; the lab's traffic must stay inside the lab:\n%s", cf)
	}
}

// TestLocalDNSHosts checks the hosts file against the names it offers:
// every line is an address and a name, and every name is offered once.
func TestLocalDNSHosts(t *testing.T) {
	seen := map[string]bool{}
	for line := range strings.Lines(lab.LocalDNSHosts()) {
		if strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			t.Fatalf("hosts line %q: want an address and a name", line)
		}
		if _, err := netip.ParseAddr(f[0]); err != nil {
			t.Errorf("hosts line %q: %v", line, err)
		}
		seen[f[1]+"."] = true
	}
	names := lab.LocalDNSHostNames()
	if len(names) != len(seen) {
		t.Errorf("LocalDNSHostNames %v, hosts file has %v", names, seen)
	}
	for _, n := range names {
		if !seen[n] || !dns.IsFqdn(n) {
			t.Errorf("LocalDNSHostNames offers %q, not a name of the file or not absolute", n)
		}
	}
	if !slices.Contains(names, "mcr.microsoft.com.") {
		t.Errorf("no mcr.microsoft.com among %v: kubelet's image pulls ask it", names)
	}
}

// TestLocalDNSRefusedCorefile: the refused Corefile is the lab's but for
// one word, `forward` misspelt in the pods' root block, and CoreDNS
// 1.13.1 refuses it, exiting before it writes its pidfile (so
// localdns.sh waits its 10 s for the pidfile, then fails).
func TestLocalDNSRefusedCorefile(t *testing.T) {
	good := lab.LocalDNSCorefile()
	bad, err := lab.LocalDNSRefusedCorefile(good)
	if err != nil {
		t.Fatal(err)
	}
	gl, bl := strings.Split(good, "\n"), strings.Split(bad, "\n")
	if len(gl) != len(bl) {
		t.Fatalf("%d lines, the good Corefile %d", len(bl), len(gl))
	}
	var changed []string
	for i := range gl {
		if gl[i] != bl[i] {
			changed = append(changed, bl[i])
		}
	}
	if want := []string{"    froward . " + lab.LocalDNSKubeDNS + " {"}; !slices.Equal(changed, want) {
		t.Errorf("changed lines %q, want %q", changed, want)
	}
	blocks := localdnsTestBlocks(bad)
	if pods := blocks[len(blocks)-1]; !strings.Contains(pods, "bind "+lab.LocalDNSPodIP+"\n") || !strings.Contains(pods, "froward ") {
		t.Errorf("the misspelling is not in the pods' root block:\n%s", pods)
	}
	if _, err := lab.LocalDNSRefusedCorefile(strings.ReplaceAll(good, "forward . "+lab.LocalDNSKubeDNS, "# no forward")); err == nil {
		t.Error("a Corefile whose pods' block forwards nowhere: no error")
	}
	// On the node listener: its root block only (not cluster.local), so
	// the .11 blocks stay good.
	node, err := lab.LocalDNSRefusedCorefileOn(good, lab.LocalDNSNodeIP)
	if err != nil {
		t.Fatal(err)
	}
	if c := strings.Count(node, "froward "); c != 1 || !strings.Contains(node, "    froward . "+lab.LocalDNSVnetDNS+" {") {
		t.Errorf("refused on %s: %d misspellings, want 1, in the root block forwarding to %s", lab.LocalDNSNodeIP, c, lab.LocalDNSVnetDNS)
	}

	coredns := nstest.CoreDNSBinary(t)
	dir := t.TempDir()
	conf, pidfile := filepath.Join(dir, "Corefile"), filepath.Join(dir, "coredns.pid")
	localdnsTestMust(t, os.WriteFile(conf, []byte(bad), 0o644))
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, coredns, "-conf", conf, "-pidfile", pidfile).CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || ctx.Err() != nil || !strings.Contains(string(out), "Unknown directive 'froward'") {
		t.Errorf("CoreDNS on the refused Corefile: %v, want a quick exit saying Unknown directive 'froward':\n%s", err, out)
	}
	if _, err := os.Stat(pidfile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("CoreDNS refused the Corefile but wrote its pidfile (%v): localdns.sh would take it for started", err)
	}
}

// TestVnetDNSCorefile: the VNet DNS serves every zone of the lab but the
// cluster's, and the names of LocalDNS's hosts file, on its own address,
// and answers every other name NXDOMAIN.
func TestVnetDNSCorefile(t *testing.T) {
	zones := nstest.KubeDNSZones(nstest.ZoneOptions{Services: 3})
	got, err := lab.VnetDNSCorefile(zones)
	if err != nil {
		t.Fatal(err)
	}
	blocks := localdnsTestBlocks(got)
	if len(blocks) != len(zones.Origins)+2 {
		t.Fatalf("%d blocks for %d zones, want all but cluster.local, the fresh names', the hosts file's and the root:\n%s", len(blocks), len(zones.Origins), got)
	}
	for _, name := range lab.LocalDNSHostNames() {
		if !strings.Contains(got, name+":53") {
			t.Errorf("hosts file's %s not served:\n%s", name, got)
		}
	}
	if !strings.Contains(got, "203.0.113.71 mcr.microsoft.com\n") {
		t.Errorf("mcr.microsoft.com not given the hosts file's address:\n%s", got)
	}
	if !strings.Contains(got, lab.FreshZone+":53 {") {
		t.Errorf("no block for %s:\n%s", lab.FreshZone, got)
	}
	for _, o := range zones.Origins {
		has := strings.Contains(got, o+":53 {")
		if has != (o != "cluster.local.") {
			t.Errorf("zone %s served: %v", o, has)
		}
	}
	if n := strings.Count(got, "bind "+lab.LocalDNSVnetDNS+"\n"); n != len(blocks) {
		t.Errorf("%d of %d blocks bound to %s:\n%s", n, len(blocks), lab.LocalDNSVnetDNS, got)
	}
	root := blocks[len(blocks)-1]
	if !strings.HasPrefix(root, ".:53 {") || !strings.Contains(root, "rcode NXDOMAIN") {
		t.Errorf("root block does not answer NXDOMAIN:\n%s", root)
	}
}

// localdnsTestBlocks splits a Corefile into its server blocks, comments
// left out.
func localdnsTestBlocks(corefile string) []string {
	var blocks []string
	var b strings.Builder
	for line := range strings.Lines(corefile) {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		b.WriteString(line)
		if line == "}\n" {
			blocks = append(blocks, b.String())
			b.Reset()
		}
	}
	return blocks
}
