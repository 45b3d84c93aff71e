package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dnsstandby/dnsstandby/bench/lab"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// scenario is one fault, applied the same way to every setup's node.
type scenario struct {
	name        string
	round       int  // with -rounds, which one this run is (from 1); 0 without
	standbyOnly bool // only setups that run dnsstandby
	next        bool // installs the next build (binaries.next) in the nodes
	// baseline is how long the load runs before the fault; observe is how
	// long it runs after the fault function returns.
	baseline, observe time.Duration
	fault             func(ctx context.Context, t *topology, ev *events) error
	// corefile, if not nil, rewrites LocalDNS's Corefile before the
	// scenario's nodes start.
	corefile func(string) string
	// upstreams, if not nil, adds to each node's upstreams before
	// LocalDNS starts.
	upstreams func(context.Context, *topology) error
	// fresh adds names never asked before to the clients' loads
	// (nameMixes.withFresh).
	fresh bool
	// note is printed with the results (what the run does and does not
	// show).
	note string
	// fallback gives the nodes AKS's LocalDNS fallback in this design
	// (lab.FallbackDesigns), "" for none; with fallbackStandbyOnly only
	// the nodes that run dnsstandby get it.
	fallback            string
	fallbackStandbyOnly bool
	// setups, if not nil, are the only setups the scenario runs (of those
	// chosen).
	setups []string
	// alone runs each setup's node by itself, one after the other, where
	// the checks hold a latency tail to a bound: two nodes, each with
	// LocalDNS, three kube-dns pods and two VNet DNS servers, share two
	// CPUs badly when kube-dns's 30 s TTLs expire together in both.
	alone bool
}

// fileName names a file of the run's evidence: prefix, the scenario and,
// with -rounds, its round, then rest ("-SETUP.log", ".svg").
func (sc scenario) fileName(prefix, rest string) string {
	if sc.round > 0 {
		return fmt.Sprintf("%s-%s-round%d%s", prefix, sc.name, sc.round, rest)
	}
	return prefix + "-" + sc.name + rest
}

// spec is what the scenario asks of setup's node.
func (sc scenario) spec(setup string) nodeSpec {
	n := nodeSpec{corefile: sc.corefile, upstreams: sc.upstreams}
	if !sc.fallbackStandbyOnly || isStandby(setup) {
		n.fallback = sc.fallback
	}
	return n
}

// scenarios, in the order `make lab` runs them; names are part of the
// output format.
var scenarios = []scenario{
	{
		// The baseline is LocalDNS's warm-up: started with an empty cache
		// under the three nodes' load, it loses queries at first on this
		// lab's two CPUs, as every setup shows; the checks count from the
		// (empty) fault on. Names never asked before keep upstream
		// queries flowing once the cache is warm, for the upstream checks.
		name: "healthy", baseline: 10 * time.Second, observe: 20 * time.Second, fresh: true,
		fault: func(context.Context, *topology, *events) error { return nil },
		note:  "no fault: who answers while all is well, once LocalDNS has warmed its cache for 10 s",
	},
	{
		// The baseline outlasts systemd's 10 s start-limit interval, so the
		// unit's own start does not count against the storm's budget, as on
		// a node where LocalDNS has been up for days.
		name: "crash-storm", baseline: 11 * time.Second, observe: 60 * time.Second,
		fault: crashStorm,
		// Where dnsstandby runs, AKS's fallback (PR 9486) stands by too:
		// its probe and OnFailure= must not start it while dnsstandby
		// answers (fallbackRules).
		fallback: lab.FallbackCoreDNS, fallbackStandbyOnly: true,
		note: "the reported harness: 8 attempts 300 ms apart, MainPID read before each, SIGKILL when live; the dnsstandby node also has AKS's LocalDNS fallback (PR 9486, design coredns)",
	},
	{
		name: "permanent-failure", baseline: 5 * time.Second, observe: 60 * time.Second,
		fault: permanentFailure,
		note:  "LocalDNS killed, its cleanup left to run, then the unit stopped and kept down",
	},
	{
		// hang, lossy and brownout leave LocalDNS running: their baseline
		// lets it warm its cache first (as healthy's does), so that the
		// fault is the only one.
		name: "hang", baseline: 10 * time.Second, observe: 10 * time.Second,
		fault: hang,
		note:  "CoreDNS SIGSTOPped for 20 s (bound, not answering), then SIGCONT",
	},
	{
		// The loss is switched on and off through a file, not by reloading
		// CoreDNS: a reload (SIGUSR1) keeps the sockets but starts every
		// plugin afresh, and so empties LocalDNS's cache twice.
		name: "lossy", baseline: 10 * time.Second, observe: 5 * time.Second,
		fault: lossy, corefile: lossyCorefile,
		note: "LocalDNS's CoreDNS drops 1 query in 10 on both listeners (bin/coredns's lossy plugin, ahead of cache, in every block from LocalDNS's start, switched on by a file) for 30 s, then answers all again",
	},
	{
		name: "brownout", baseline: 10 * time.Second, observe: 5 * time.Second,
		fault: brownout,
		note:  "CoreDNS SIGSTOPped 300 ms of every second for 20 s (bound, answering late), then SIGCONT",
	},
	{
		name: "planned-restart", baseline: 5 * time.Second, observe: 15 * time.Second,
		fault: plannedRestart,
		note:  "systemctl restart localdns, with the cleanup's 5 s delay",
	},
	{
		name: "planned-restart-hold", standbyOnly: true, baseline: 5 * time.Second, observe: 15 * time.Second,
		fault: plannedRestartHold,
		note:  "dnsstandby hold, systemctl restart localdns, dnsstandby release",
	},
	{
		name: "double-fault", baseline: 10 * time.Second, observe: 10 * time.Second,
		fault: doubleFault,
		note:  "after a 10 s warm-up through LocalDNS: kube-dns unreachable and LocalDNS stopped for 30 s, then both back",
	},
	{
		name: "standby-restart", standbyOnly: true, baseline: 10 * time.Second, observe: 15 * time.Second,
		fault: standbyRestart,
		note:  "after a 10 s warm-up through LocalDNS: kube-dns unreachable and LocalDNS stopped (takeover, answers only from cache), then systemctl restart dnsstandby; both back after 20 s",
	},
	{
		name: "standby-upgrade", standbyOnly: true, next: true, baseline: 10 * time.Second, observe: 15 * time.Second,
		fault: standbyUpgrade,
		note:  "after a 10 s warm-up through LocalDNS: kube-dns unreachable and LocalDNS stopped (takeover, answers only from cache), then another build of dnsstandby renamed over the unit's binary, as dpkg installs it, and systemctl restart dnsstandby; both back after 20 s",
	},
	{
		name: "standby-surge", standbyOnly: true, baseline: 10 * time.Second, observe: 15 * time.Second,
		fault: standbySurge,
		note:  "after a 10 s warm-up through LocalDNS: kube-dns unreachable and LocalDNS stopped (takeover, answers only from cache), then a second dnsstandby started beside the first with --handover-from (a DaemonSet rollout's surge): it takes the first's sockets, caches and lock, and the first exits; both back after 20 s",
	},
	{
		name: "standby-kill", standbyOnly: true, baseline: 5 * time.Second, observe: 15 * time.Second,
		fault: standbyKill,
		note:  "SIGKILL dnsstandby while LocalDNS is healthy; systemd restarts it",
	},
	{
		name: "standby-stall", standbyOnly: true, baseline: 5 * time.Second, observe: 10 * time.Second,
		fault: standbyStall,
		note:  "dnsstandby hold, then SIGSTOP dnsstandby while it holds the traffic; the watchdog restarts it; release",
	},
	{
		name: "interface-teardown", baseline: 5 * time.Second, observe: 15 * time.Second,
		fault: interfaceTeardown,
		note:  "CoreDNS and its supervisor killed, the localdns link deleted as the cleanup does, 30 s, then LocalDNS started again",
	},
	{
		// The observation outlasts dnsstandby's hold-down (5 probes over
		// 4 s) by recoverySettle and more, so that the recovery check
		// counts LocalDNS with its traffic back.
		name: "bad-corefile", baseline: 10 * time.Second, observe: 20 * time.Second, fresh: true,
		fault: badCorefile,
		note:  "after a 10 s warm-up through LocalDNS: its Corefile replaced by one CoreDNS refuses (forward misspelt froward in the pods' root block) and LocalDNS restarted, failing every start from then on; 15 s later systemctl restart dnsstandby (the fd-store handover), 15 s later a cold start (stopped; /run/dnsstandby and its anchor link gone; started: only its state directory left), 15 s later the good Corefile back and LocalDNS restarted (reset-failed first); the loads ask names never asked before throughout",
	},
	{
		name: scenarioBlackhole, baseline: 10 * time.Second, observe: 60 * time.Second, fresh: true, alone: true,
		fault: upstreamBlackhole, corefile: customVnetCorefile, upstreams: addVnetDNS2,
		note: "a custom VNet with two DNS servers (the node's root block forwards to both, policy sequential); after a 10 s warm-up the first drops every packet (no reply, no ICMP) for the rest of the run; the loads ask names never asked before throughout; each setup's node runs alone, one after the other",
	},
	{
		name: scenarioBackendDead, baseline: 10 * time.Second, observe: 60 * time.Second, fresh: true, alone: true,
		fault: kubeDNSBackendDead, upstreams: addClusterIP,
		note: "kube-dns as three CoreDNS pods behind the ClusterIP, a backend picked per flow by kube-proxy's nat rules; after a 10 s warm-up the first pod drops every packet (a dead node: no reply, no ICMP), the rules unchanged (the EndpointSlice not yet updated) for the rest of the run; the loads ask names never asked before throughout; each setup's node runs alone, one after the other",
	},
	aksFallbackScenario(lab.FallbackCoreDNS, "a second CoreDNS binding .11, forwarding to kube-dns"),
	aksFallbackScenario(lab.FallbackKubelet, "a second CoreDNS running LocalDNS's own .11 blocks, kubelet's --cluster-dns repointed to kube-dns"),
	aksFallbackScenario(lab.FallbackNAT, "nat chain LOCALDNS-FALLBACK: .11 DNATed to kube-dns, .10 to the VNet DNS"),
}

// aksFallbackScenario is aks-fallback-DESIGN: LocalDNS fails every start
// until its budget (5 starts in 720 s) runs out, AKS's fallback takes
// over, LocalDNS is fixed and started again (its ExecStartPre stops the
// fallback). Only the setups with PR 9439's unit: the fallback needs a unit
// that ends in failed.
func aksFallbackScenario(design, what string) scenario {
	return scenario{
		name: "aks-fallback-" + design, baseline: 10 * time.Second, observe: 10 * time.Second,
		fault: aksFallback, fallback: design, setups: []string{setupPR9439, setupStandby},
		note: "AKS's LocalDNS fallback (PR 9486, design " + design + ": " + what + "): LocalDNS's Corefile refused (froward in the node's root block) and LocalDNS restarted: every start fails until its budget runs out (failed), OnFailure= starts the fallback; 10 s later the good Corefile back, reset-failed, LocalDNS restarted (ExecStartPre stops the fallback)",
	}
}

// Marks of aks-fallback-*.
const (
	fallbackStartedMark = "AKS fallback took over"
	fallbackStoppedMark = "AKS fallback stopped"
)

// aksFallbackWait bounds the wait for LocalDNS's budget to run out: the
// boot's start and 4 failed ones, each the stand-in's 10 s wait for a
// pidfile and RestartSec 2 s.
const aksFallbackWait = 120 * time.Second

// aksFallback fails LocalDNS for good with a Corefile CoreDNS refuses (the
// typo in the node's root block, so that LocalDNS's own .11 blocks, which
// the kubelet design runs, stay good), waits for AKS's fallback to take
// over, lets it serve 10 s, then repairs LocalDNS (localDNSBack) and waits
// for the fallback to stop. For the nat design it records the packets the
// LOCALDNS-FALLBACK chain took and the NOTRACK rules in place meanwhile.
func aksFallback(ctx context.Context, t *topology, ev *events) error {
	good, err := t.guest.Exec(ctx, "cat", lab.LocalDNSCorefilePath)
	if err != nil {
		return fmt.Errorf("aks fallback: read the good Corefile: %w", err)
	}
	refused, err := lab.LocalDNSRefusedCorefileOn(good, nodeDNS)
	if err != nil {
		return fmt.Errorf("aks fallback: %w", err)
	}
	before, err := t.guest.Show(ctx, localDNSUnit, "ActiveEnterTimestampMonotonic")
	if err != nil {
		return fmt.Errorf("aks fallback: %w", err)
	}
	if err := t.writeFile(ctx, lab.LocalDNSCorefilePath, refused); err != nil {
		return fmt.Errorf("aks fallback: %w", err)
	}
	ev.mark(refusedMark)
	var errs []error
	if out, err := t.guest.Systemctl(ctx, "restart", "--no-block", localDNSUnit); err != nil {
		errs = append(errs, fmt.Errorf("aks fallback: restart LocalDNS: %w: %s", err, out))
	}
	if err := waitTakeover(ctx, t, ev); err != nil {
		errs = append(errs, fmt.Errorf("aks fallback: %w", err))
	}
	sleep(ctx, 3*time.Second)
	t.markStandbyFallback(ctx, ev)
	sleep(ctx, 10*time.Second)
	if t.fallback == lab.FallbackNAT {
		ev.mark(natCounters(ctx, t))
	}
	errs = append(errs, t.localDNSBack(good, before["ActiveEnterTimestampMonotonic"], ev))
	if err := waitUnit(context.Background(), t, lab.FallbackUnitName, 10*time.Second, "inactive", "failed"); err != nil {
		errs = append(errs, fmt.Errorf("aks fallback: hand-back: %w", err))
	} else {
		ev.mark(fallbackStoppedMark)
	}
	sleep(ctx, 3*time.Second)
	if t.fallback == lab.FallbackNAT {
		ev.mark(natEvidence(context.Background(), t))
	}
	t.markStandbyFallback(context.Background(), ev)
	return errors.Join(errs...)
}

// natEvidence says, 3 s after the nat fallback handed the listen
// addresses back, what could keep one client's replies from it (a glibc
// lookup has failed there in about one run in three, while every other
// client was answered): the node's conntrack entries for port 53 on
// 169.254.10.10/.11, those made by a reply whose port was rewritten, and
// the UDP datagrams the node's kernel found no socket for (NoPorts) or
// dropped (InErrors) so far.
func natEvidence(ctx context.Context, t *topology) string {
	ct, err1 := t.guest.Exec(ctx, "cat", "/proc/net/nf_conntrack")
	snmp, err2 := t.guest.Exec(ctx, "cat", "/proc/net/snmp")
	if err := errors.Join(err1, err2); err != nil {
		return "nat evidence: " + err.Error()
	}
	entries, rewritten := conntrackDNS(ct)
	return fmt.Sprintf("after the hand-back: %d conntrack entries for 169.254.10.10/.11:53, %d of them a reply whose port was rewritten; udp %s",
		entries, rewritten, udpCounters(snmp, "NoPorts", "InErrors"))
}

// conntrackDNS counts the entries of /proc/net/nf_conntrack that involve
// port 53 of 169.254.10.10 or .11, and of those the ones a reply from it
// started (original source the listen address, port 53) whose reply
// direction expects another port: netfilter rewrote the reply's source
// port, and a client's connected socket drops it.
func conntrackDNS(table string) (entries, rewritten int) {
	listen := func(a string) bool { return a == lab.LocalDNSNodeIP || a == lab.LocalDNSPodIP }
	for _, l := range strings.Split(table, "\n") {
		var src, dst, sport, dport []string
		for _, f := range strings.Fields(l) {
			k, v, ok := strings.Cut(f, "=")
			if !ok {
				continue
			}
			switch k {
			case "src":
				src = append(src, v)
			case "dst":
				dst = append(dst, v)
			case "sport":
				sport = append(sport, v)
			case "dport":
				dport = append(dport, v)
			}
		}
		if len(src) < 2 || len(dst) < 2 || len(sport) < 2 || len(dport) < 2 {
			continue
		}
		switch {
		case listen(dst[0]) && dport[0] == "53":
			entries++
		case listen(src[0]) && sport[0] == "53":
			entries++
			if dport[1] != "53" {
				rewritten++
			}
		}
	}
	return entries, rewritten
}

// udpCounters picks the named counters of /proc/net/snmp's Udp lines.
func udpCounters(snmp string, names ...string) string {
	var head, vals []string
	for _, l := range strings.Split(snmp, "\n") {
		f := strings.Fields(l)
		if len(f) == 0 || f[0] != "Udp:" {
			continue
		}
		if head == nil {
			head = f
		} else {
			vals = f
		}
	}
	var out []string
	for _, n := range names {
		for i := range head {
			if head[i] == n && i < len(vals) {
				out = append(out, n+" "+vals[i])
			}
		}
	}
	return strings.Join(out, ", ")
}

// markStandbyFallback marks what `dnsstandby status --json` says of AKS's
// fallback (its localdns_fallback field), where the node runs dnsstandby:
// evidence on the timeline, not a check (the log lines are checked).
func (t *topology) markStandbyFallback(ctx context.Context, ev *events) {
	if !isStandby(t.setup) {
		return
	}
	out, err := t.guest.Exec(ctx, standbyPath, "status", "--json")
	if err != nil {
		ev.mark("dnsstandby status: " + err.Error())
		return
	}
	var st map[string]any
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		ev.mark("dnsstandby status --json: " + err.Error())
		return
	}
	v, ok := st["localdns_fallback"]
	if !ok {
		ev.mark("dnsstandby status: no localdns_fallback field")
		return
	}
	ev.mark(fmt.Sprintf("dnsstandby status: localdns_fallback %q", v))
}

// waitTakeover waits (aksFallbackWait at most) until LocalDNS is failed
// (its budget spent) and the fallback active, marking when the fallback
// first took over and when LocalDNS failed: the probe may start the
// fallback before the budget runs out, and LocalDNS's next start stop it.
func waitTakeover(ctx context.Context, t *topology, ev *events) error {
	start := time.Now()
	var fellBack, failed bool
	var fb, ld map[string]string
	err := testkit.PollEvery(ctx, aksFallbackWait, 200*time.Millisecond, func() (bool, error) {
		var err1, err2 error
		fb, err1 = t.guest.Show(ctx, lab.FallbackUnitName, "ActiveState")
		ld, err2 = t.guest.Show(ctx, localDNSUnit, "ActiveState")
		if err := errors.Join(err1, err2); err != nil {
			return false, err
		}
		if fb["ActiveState"] == "active" && !fellBack {
			fellBack = true
			ev.mark(fmt.Sprintf("%s (%.0f s)", fallbackStartedMark, time.Since(start).Seconds()))
		}
		if ld["ActiveState"] == "failed" && !failed {
			failed = true
			ev.mark(fmt.Sprintf("LocalDNS failed (%.0f s)", time.Since(start).Seconds()))
		}
		return fb["ActiveState"] == "active" && failed, nil
	})
	if errors.Is(err, testkit.ErrNotWithin) {
		return fmt.Errorf("after %v: LocalDNS %s, %s %s", aksFallbackWait, ld["ActiveState"], lab.FallbackUnitName, fb["ActiveState"])
	}
	return err
}

// natCounters says how many packets the LOCALDNS-FALLBACK chain's rules
// took and how many NOTRACK rules (LocalDNS's) are in the raw table.
func natCounters(ctx context.Context, t *topology) string {
	nat, err1 := t.guest.Exec(ctx, "/usr/sbin/iptables", "-w", "-t", "nat", "-L", lab.FallbackChain, "-v", "-x", "-n")
	if err1 != nil { // once more: iptables-nft may read the chain while the fallback writes it
		sleep(ctx, 500*time.Millisecond)
		nat, err1 = t.guest.Exec(ctx, "/usr/sbin/iptables", "-w", "-t", "nat", "-L", lab.FallbackChain, "-v", "-x", "-n")
	}
	raw, err2 := t.guest.Exec(ctx, "/usr/sbin/iptables", "-w", "-t", "raw", "-S")
	if err := errors.Join(err1, err2); err != nil {
		return "nat counters: " + err.Error()
	}
	return fmt.Sprintf("%s took %d packets; %d NOTRACK rules", lab.FallbackChain, chainPackets(nat), strings.Count(raw, "-j NOTRACK")+strings.Count(raw, "--notrack"))
}

// chainPackets sums the packet counters of `iptables -L CHAIN -v -x -n`.
func chainPackets(listing string) int {
	n := 0
	for _, l := range strings.Split(listing, "\n") {
		f := strings.Fields(l)
		if len(f) < 3 {
			continue
		}
		if p, err := strconv.Atoi(f[0]); err == nil {
			n += p
		}
	}
	return n
}

// pollUnit reads properties props of unit in the guest every `every`
// until done says so or fails, within passes (testkit.ErrNotWithin) or
// ctx ends: the lab's one wait on a unit's state. done gets each read's
// error too, and decides whether it ends the wait. It returns the last
// properties read.
func pollUnit(ctx context.Context, t *topology, unit string, within, every time.Duration, props []string,
	done func(p map[string]string, err error) (bool, error)) (map[string]string, error) {
	var last map[string]string
	err := testkit.PollEvery(ctx, within, every, func() (bool, error) {
		p, err := t.guest.Show(ctx, unit, props...)
		if err == nil {
			last = p
		}
		return done(p, err)
	})
	return last, err
}

// waitUnit waits until unit's ActiveState is one of states.
func waitUnit(ctx context.Context, t *topology, unit string, within time.Duration, states ...string) error {
	var readErr error
	last, err := pollUnit(ctx, t, unit, within, 200*time.Millisecond, []string{"ActiveState"}, func(p map[string]string, err error) (bool, error) {
		readErr = err
		return err == nil && slices.Contains(states, p["ActiveState"]), nil
	})
	if err != nil {
		return fmt.Errorf("%s not %v after %v (%v, %v)", unit, states, within, last, readErr)
	}
	return nil
}

func findScenario(name string) (scenario, bool) {
	for _, s := range scenarios {
		if s.name == name {
			return s, true
		}
	}
	return scenario{}, false
}

const localDNSUnit = "localdns.service"

// crashStorm is the reported harness: up to eight attempts, 300 ms apart,
// reading MainPID before each and sending SIGKILL when a live PID exists.
func crashStorm(ctx context.Context, t *topology, ev *events) error {
	for range 8 {
		pid, err := t.guest.KillMain(ctx, localDNSUnit, syscall.SIGKILL)
		if err != nil {
			return fmt.Errorf("crash storm: %w", err)
		}
		if pid > 0 {
			ev.mark("SIGKILL")
		}
		sleep(ctx, 300*time.Millisecond)
	}
	return nil
}

// permanentFailure kills LocalDNS, lets its cleanup run (the ExecStopPost
// of the pr9439 unit), then stops the unit so that it stays down.
func permanentFailure(ctx context.Context, t *topology, ev *events) error {
	if _, err := t.guest.KillMain(ctx, localDNSUnit, syscall.SIGKILL); err != nil {
		return err
	}
	ev.mark("SIGKILL")
	waitState(ctx, t, 15*time.Second, func(active, sub string) bool { return active != "deactivating" })
	if _, err := t.guest.Systemctl(ctx, "stop", localDNSUnit); err != nil {
		return err
	}
	ev.mark("stopped")
	return nil
}

// hang stops CoreDNS (not its supervisor) for 20 s: its socket stays bound
// and takes its share of queries, which nobody answers.
func hang(ctx context.Context, t *topology, ev *events) error {
	pid, err := t.corednsPID(ctx)
	if err != nil {
		return err
	}
	if _, err := t.guest.Exec(ctx, "kill", "-STOP", pid); err != nil {
		return err
	}
	ev.mark("SIGSTOP")
	sleep(ctx, 20*time.Second)
	if _, err := t.guest.Exec(context.Background(), "kill", "-CONT", pid); err != nil {
		return err
	}
	ev.mark("SIGCONT")
	return nil
}

// lossySwitch is the file whose presence (inside the node) turns
// LocalDNS's loss on: the lossy plugin looks for it every 50 ms.
const lossySwitch = "/run/localdns-lossy"

// lossyEvery is the share LocalDNS drops while lossy: 1 query in 10.
const lossyEvery = 10

// lossyCorefile puts `lossy 10 /run/localdns-lossy` in every server block
// of LocalDNS's Corefile, after its bind line (every block of AgentBaker's
// Corefile has one): CoreDNS orders plugins itself, so where the line goes
// in a block does not matter.
func lossyCorefile(corefile string) string {
	lines := strings.SplitAfter(corefile, "\n")
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(l)
		if trimmed := strings.TrimSpace(l); strings.HasPrefix(trimmed, "bind ") {
			indent := l[:len(l)-len(strings.TrimLeft(l, " \t"))]
			fmt.Fprintf(&b, "%slossy %d %s\n", indent, lossyEvery, lossySwitch)
		}
	}
	return b.String()
}

// lossy makes LocalDNS drop 1 query in 10 for 30 s.
func lossy(ctx context.Context, t *topology, ev *events) error {
	if _, err := t.guest.Exec(ctx, "touch", lossySwitch); err != nil {
		return fmt.Errorf("lossy on: %w", err)
	}
	ev.mark("lossy on")
	sleep(ctx, 30*time.Second)
	// Whatever ctx says: the node is whole again.
	if _, err := t.guest.Exec(context.Background(), "rm", "-f", lossySwitch); err != nil {
		return fmt.Errorf("lossy off: %w", err)
	}
	ev.mark("lossy off")
	return nil
}

// brownout stops CoreDNS 300 ms out of every second for 20 s: it stays
// bound and answers what waited when it runs again, 0 to 300 ms late. The
// cycle runs in one shell inside the node, so its timing does not hang on
// starting a process per signal.
func brownout(ctx context.Context, t *topology, ev *events) error {
	pid, err := t.corednsPID(ctx)
	if err != nil {
		return err
	}
	ev.mark("brownout")
	const cycle = `for i in $(seq 20); do kill -STOP "$1"; sleep 0.3; kill -CONT "$1"; sleep 0.7; done`
	_, runErr := t.guest.Exec(ctx, "sh", "-c", cycle, "sh", pid)
	// A cycle cut short may leave CoreDNS stopped.
	if _, err := t.guest.Exec(context.Background(), "kill", "-CONT", pid); err != nil {
		return errors.Join(runErr, fmt.Errorf("brownout: SIGCONT: %w", err))
	}
	ev.mark("brownout over")
	if runErr != nil {
		return fmt.Errorf("brownout: %w", runErr)
	}
	return nil
}

// standby runs a dnsstandby command (hold, release) inside the node.
func (t *topology) standby(ctx context.Context, args ...string) error {
	out, err := t.guest.Exec(ctx, standbyPath, args...)
	if err != nil {
		return fmt.Errorf("dnsstandby %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

func plannedRestartHold(ctx context.Context, t *topology, ev *events) error {
	if err := t.standby(ctx, "hold"); err != nil {
		return err
	}
	ev.mark("hold")
	if err := plannedRestart(ctx, t, ev); err != nil {
		return err
	}
	if err := t.standby(ctx, "release"); err != nil {
		return err
	}
	ev.mark("release")
	return nil
}

func plannedRestart(ctx context.Context, t *topology, ev *events) error {
	ev.mark("restart")
	if out, err := t.guest.Systemctl(ctx, "restart", localDNSUnit); err != nil {
		return fmt.Errorf("restart: %w: %s", err, out)
	}
	ev.mark("restarted")
	return nil
}

// doubleFault takes kube-dns away (the node's link to it goes down) and
// stops LocalDNS, for 30 s: only a cache can answer.
func doubleFault(ctx context.Context, t *topology, ev *events) error {
	if err := t.cutKubeDNS(ctx, ev); err != nil {
		return err
	}
	if _, err := t.guest.Systemctl(ctx, "stop", "--no-block", localDNSUnit); err != nil {
		return err
	}
	ev.mark("LocalDNS stop")
	sleep(ctx, 30*time.Second)
	return t.bothBack(ev)
}

// standbyRestart restarts dnsstandby while it is the only one answering
// and only from its cache: the new process must come up warm (snapshot).
func standbyRestart(ctx context.Context, t *topology, ev *events) error {
	if err := t.cutKubeDNS(ctx, ev); err != nil {
		return err
	}
	if _, err := t.guest.Systemctl(ctx, "stop", localDNSUnit); err != nil {
		return err
	}
	ev.mark("LocalDNS stopped")
	sleep(ctx, 5*time.Second)
	ev.mark(restartMark)
	if out, err := t.guest.Systemctl(ctx, "restart", "dnsstandby.service"); err != nil {
		return fmt.Errorf("restart dnsstandby: %w: %s", err, out)
	}
	ev.mark("dnsstandby restarted")
	sleep(ctx, 15*time.Second)
	return t.bothBack(ev)
}

// installScript puts the file $1 at the path $2 as dpkg unpacks a
// package: written beside it as $2.dpkg-new, then renamed over it, so
// that the path never lacks a whole binary and the running process keeps
// the inode it runs. The lab binds the first build over the path (an
// installed package has a plain file there, and nothing renames over a
// mount point): the bind is detached lazily first, which leaves the
// running process its file as the rename would.
const installScript = `set -eu
cp "$1" "$2.dpkg-new"
chmod 0755 "$2.dpkg-new"
umount -l "$2"
mv -f "$2.dpkg-new" "$2"
`

// upgradeMark labels the moment the next build is in place.
const upgradeMark = "next build installed"

// standbyUpgrade is standbyRestart with another build of dnsstandby
// installed before the restart, as a package upgrade does it: the new
// process, of the new build, must take the old one's sockets and caches
// (the fd store's handover across builds). It fails unless the unit's
// binary says the new version afterwards and the running process is the
// new build; the node is left as standbyRestart leaves it, the new build
// in place.
func standbyUpgrade(ctx context.Context, t *topology, ev *events) error {
	b := t.bins
	if b.next == "" {
		return errors.New("upgrade: no next build bound in the node (-dnsstandby-next)")
	}
	if err := t.runsBuild(ctx, b.version); err != nil {
		return fmt.Errorf("upgrade: before: %w", err)
	}
	if err := t.cutKubeDNS(ctx, ev); err != nil {
		return err
	}
	if _, err := t.guest.Systemctl(ctx, "stop", localDNSUnit); err != nil {
		return err
	}
	ev.mark("LocalDNS stopped")
	sleep(ctx, 5*time.Second)
	if err := t.installNext(ctx); err != nil {
		return err
	}
	ev.mark(upgradeMark)
	// Installing replaced a file and nothing else: the old build answers.
	if err := t.runsBuild(ctx, b.version); err != nil {
		return fmt.Errorf("upgrade: installed, before the restart: %w", err)
	}
	ev.mark(restartMark)
	if out, err := t.guest.Systemctl(ctx, "restart", "dnsstandby.service"); err != nil {
		return errors.Join(fmt.Errorf("upgrade: restart dnsstandby: %w: %s", err, out), t.bothBack(ev))
	}
	ev.mark("dnsstandby restarted")
	// The observation and bothBack run even when the check fails: the
	// runs' numbers are the same evidence either way.
	checkErr := t.upgraded(ctx)
	if checkErr == nil {
		ev.mark("next build running")
	}
	sleep(ctx, 15*time.Second)
	return errors.Join(checkErr, t.bothBack(ev))
}

// installNext installs the next build over the unit's binary
// (installScript).
func (t *topology) installNext(ctx context.Context) error {
	if out, err := t.guest.Exec(ctx, "sh", "-c", installScript, "sh", nextPath, standbyPath); err != nil {
		return fmt.Errorf("upgrade: install %s over %s: %w: %s", nextPath, standbyPath, err, out)
	}
	return nil
}

// upgraded checks, after the restart, that the unit's binary says the next
// build's version and that the unit's process is that build.
func (t *topology) upgraded(ctx context.Context) error {
	out, err := t.guest.Exec(ctx, standbyPath, "version")
	if err != nil {
		return fmt.Errorf("upgrade: %s version: %w", standbyPath, err)
	}
	if got := strings.TrimSpace(out); got != t.bins.nextVersion {
		return fmt.Errorf("upgrade: %s version says %q, want %q", standbyPath, got, t.bins.nextVersion)
	}
	if err := t.runsBuild(ctx, t.bins.nextVersion); err != nil {
		return fmt.Errorf("upgrade: after the restart: %w", err)
	}
	return nil
}

// runsBuild checks that the unit's running process is the build whose
// `dnsstandby version` line is want, by its status: the status's version,
// and its PID the unit's main PID. A process just started may not have
// its admin socket yet: it is asked for up to 5 s.
func (t *topology) runsBuild(ctx context.Context, want string) error {
	var last error
	for end := time.Now().Add(5 * time.Second); ; sleep(ctx, 100*time.Millisecond) {
		last = t.checkBuild(ctx, want)
		if last == nil || time.Now().After(end) || ctx.Err() != nil {
			return last
		}
	}
}

func (t *topology) checkBuild(ctx context.Context, want string) error {
	out, err := t.guest.Exec(ctx, standbyPath, "status", "--json")
	if err != nil {
		return fmt.Errorf("dnsstandby status: %w", err)
	}
	var st struct {
		Version string `json:"version"`
		PID     int    `json:"pid"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return fmt.Errorf("dnsstandby status --json: %w", err)
	}
	pid, err := t.guest.MainPID(ctx, "dnsstandby.service")
	if err != nil {
		return err
	}
	return runningBuild(st.Version, st.PID, pid, want)
}

// runningBuild says whether a status (version, pid) is the unit's main
// process (mainPID) running the build want.
func runningBuild(version string, pid, mainPID int, want string) error {
	switch {
	case version != want:
		return fmt.Errorf("the running dnsstandby (PID %d) says %q, want %q", pid, version, want)
	case pid == 0 || pid != mainPID:
		return fmt.Errorf("the status comes from PID %d, the unit's main PID is %d", pid, mainPID)
	}
	return nil
}

// surgeMark labels the moment the second dnsstandby is started.
const surgeMark = "surge dnsstandby"

// surgeUnit runs the second dnsstandby of standby-surge, as a DaemonSet
// rollout's new pod runs beside the old.
const surgeUnit = "dnsstandby-surge.service"

// standbySurge starts a second dnsstandby with --handover-from while the
// first is the only one answering, from its cache alone: the second must
// take the first's sockets and caches without a query lost, and the first
// must go. The shipped unit needs nothing for it: the first exits 75
// (another dnsstandby serves the node), which the unit neither restarts
// nor counts as a failure, and /run/dnsstandby (the second's admin socket
// and lock) stays when the unit stops.
func standbySurge(ctx context.Context, t *topology, ev *events) error {
	if err := t.cutKubeDNS(ctx, ev); err != nil {
		return err
	}
	if _, err := t.guest.Systemctl(ctx, "stop", localDNSUnit); err != nil {
		return err
	}
	ev.mark("LocalDNS stopped")
	sleep(ctx, 5*time.Second)
	ev.mark(surgeMark)
	// Type=notify: systemd-run returns once the second is ready, that is
	// once the first has handed over and stopped.
	args := append([]string{"--unit=" + surgeUnit, "--property=Type=notify", "--property=NotifyAccess=main",
		"--property=TimeoutStartSec=60s", "--setenv=GOMEMLIMIT=200MiB", standbyPath, "run"}, standbyOptions(t.setup, t.bins.fallback)...)
	args = append(args, "--handover-from", "/run/dnsstandby/admin.sock")
	if out, err := t.guest.Exec(ctx, "systemd-run", args...); err != nil {
		return fmt.Errorf("start the second dnsstandby: %w: %s", err, out)
	}
	ev.mark("dnsstandby surged")
	if err := waitInactive(ctx, t, "dnsstandby.service", 10*time.Second); err != nil {
		return err
	}
	ev.mark("first dnsstandby gone")
	sleep(ctx, 15*time.Second)
	return t.bothBack(ev)
}

// waitInactive waits until unit is no longer active, and ended well.
func waitInactive(ctx context.Context, t *topology, unit string, within time.Duration) error {
	last, err := pollUnit(ctx, t, unit, within, 50*time.Millisecond, []string{"ActiveState", "Result"}, func(p map[string]string, err error) (bool, error) {
		if err != nil {
			return false, err
		}
		if p["ActiveState"] != "inactive" && p["ActiveState"] != "failed" {
			return false, nil
		}
		if p["Result"] != "success" {
			return false, fmt.Errorf("%s ended with %s", unit, p["Result"])
		}
		return true, nil
	})
	if errors.Is(err, testkit.ErrNotWithin) {
		return fmt.Errorf("%s still %s %v after the handover", unit, last["ActiveState"], within)
	}
	return err
}

// cutKubeDNS takes the node's link to kube-dns down: the ClusterIP stops
// answering, as in a cluster-wide CoreDNS outage.
func (t *topology) cutKubeDNS(ctx context.Context, ev *events) error {
	if _, err := t.node.Run(ctx, "ip", "link", "set", lab.KubeDNSLink, "down"); err != nil {
		return err
	}
	ev.mark("kube-dns unreachable")
	return nil
}

// bothBack undoes cutKubeDNS (the link's route went with it) and starts
// LocalDNS. It runs even after ctx ended, so the node is whole again.
func (t *topology) bothBack(ev *events) error {
	ctx := context.Background()
	if _, err := t.node.Run(ctx, "ip", "link", "set", lab.KubeDNSLink, "up"); err != nil {
		return err
	}
	if _, err := t.node.Run(ctx, "ip", "route", "replace", clusterIP+"/32", "via", lab.KubeDNSGateway); err != nil {
		return err
	}
	if _, err := t.guest.Systemctl(ctx, "start", localDNSUnit); err != nil {
		return err
	}
	ev.mark(faultBackMark)
	return nil
}

// restartMark labels the moment dnsstandby is told to restart.
const restartMark = "restart dnsstandby"

func standbyKill(ctx context.Context, t *topology, ev *events) error {
	pid, err := t.guest.KillMain(ctx, "dnsstandby.service", syscall.SIGKILL)
	if err != nil {
		return err
	}
	if pid == 0 {
		return fmt.Errorf("dnsstandby not running")
	}
	ev.mark("SIGKILL dnsstandby")
	return nil
}

func standbyStall(ctx context.Context, t *topology, ev *events) error {
	if err := t.standby(ctx, "hold"); err != nil {
		return err
	}
	ev.mark("hold")
	sleep(ctx, 2*time.Second)
	defer func() {
		if err := t.standby(context.Background(), "release"); err == nil {
			ev.mark("release")
		}
	}()
	pid, err := t.guest.MainPID(ctx, "dnsstandby.service")
	if err != nil || pid == 0 {
		return fmt.Errorf("dnsstandby main PID: %d, %v", pid, err)
	}
	p := strconv.Itoa(pid)
	if _, err := t.guest.Exec(ctx, "kill", "-STOP", p); err != nil {
		return err
	}
	ev.mark("SIGSTOP dnsstandby")
	// The unit's watchdog (WatchdogSec=10s, deploy/systemd) restarts the
	// stalled process within the window; mark when it did.
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end) && ctx.Err() == nil; sleep(ctx, 200*time.Millisecond) {
		if now, err := t.guest.MainPID(ctx, "dnsstandby.service"); err == nil && now != pid && now != 0 {
			ev.mark("watchdog restarted dnsstandby")
			sleep(ctx, time.Until(end))
			return nil
		}
	}
	if _, err := t.guest.Exec(context.Background(), "kill", "-CONT", p); err != nil {
		return err
	}
	ev.mark("SIGCONT dnsstandby (no watchdog restart)")
	return nil
}

// interfaceTeardown leaves the node as LocalDNS's cleanup leaves it:
// CoreDNS dead and the localdns link (with 169.254.10.11) gone, for 30 s.
func interfaceTeardown(ctx context.Context, t *topology, ev *events) error {
	if _, err := t.guest.Systemctl(ctx, "kill", "--signal=SIGKILL", localDNSUnit); err != nil {
		return err
	}
	ev.mark("SIGKILL unit")
	// Keep it from restarting; the pr9439 unit's ExecStopPost runs here.
	if _, err := t.guest.Systemctl(ctx, "stop", localDNSUnit); err != nil {
		return err
	}
	// The shipped unit has no ExecStopPost: do what its cleanup would.
	_, _ = t.node.Run(ctx, "ip", "link", "del", "localdns")
	ev.mark("link deleted")
	sleep(ctx, 30*time.Second)
	if _, err := t.guest.Systemctl(context.Background(), "start", localDNSUnit); err != nil {
		return err
	}
	ev.mark("LocalDNS started")
	return nil
}

// Marks of bad-corefile.
const (
	refusedMark      = "refused Corefile"
	coldStartMark    = "cold start dnsstandby"
	coldStartedMark  = "dnsstandby cold-started"
	localDNSBackMark = "LocalDNS back"
)

// badCorefileStep is how long each stage of bad-corefile lasts: LocalDNS
// down on the refused Corefile (its stop's 5 s, then a start that fails
// after localdns.sh's 10 s wait for CoreDNS's pidfile), then dnsstandby
// restarted, then dnsstandby cold-started, each answering alone for it.
const badCorefileStep = 15 * time.Second

// coldStartScript starts dnsstandby as after a reboot: stopped, which
// drops its file descriptor store (the unit keeps it only across a
// restart), with everything a reboot takes gone too — /run/dnsstandby
// (admin socket, lock) and its anchor link — and only its state directory
// left; then started.
const coldStartScript = `set -eu
systemctl stop dnsstandby.service
rm -rf /run/dnsstandby
if ip link show dev dnsstandby >/dev/null 2>&1; then ip link del dev dnsstandby; fi
systemctl start dnsstandby.service
`

// badCorefile gives LocalDNS a Corefile CoreDNS refuses and restarts it, so
// that it fails every start until someone repairs the file; meanwhile
// dnsstandby (where the setup runs it) is restarted, then cold-started,
// each time reading the refused file from disk; then the good Corefile
// comes back and LocalDNS is restarted. The setup's own stand-in script
// reads the Corefile it runs (lab.LocalDNSCorefilePath) as it is, so that
// file is the one replaced (AKS's localdns.sh regenerates it from
// localdns.corefile at every start: there that file would be the bad one).
// The fault fails when LocalDNS ran on the refused file, or did not run
// again on the good one, or dnsstandby could not be restarted.
func badCorefile(ctx context.Context, t *topology, ev *events) error {
	good, err := t.guest.Exec(ctx, "cat", lab.LocalDNSCorefilePath)
	if err != nil {
		return fmt.Errorf("bad Corefile: read the good one: %w", err)
	}
	refused, err := lab.LocalDNSRefusedCorefile(good)
	if err != nil {
		return fmt.Errorf("bad Corefile: %w", err)
	}
	before, err := t.guest.Show(ctx, localDNSUnit, "ActiveEnterTimestampMonotonic")
	if err != nil {
		return fmt.Errorf("bad Corefile: %w", err)
	}
	if err := t.writeFile(ctx, lab.LocalDNSCorefilePath, refused); err != nil {
		return fmt.Errorf("bad Corefile: %w", err)
	}
	ev.mark(refusedMark)
	var errs []error
	// --no-block: the start after the stop fails only after localdns.sh's
	// 10 s wait for the pidfile, and the restarts go on from there.
	if out, err := t.guest.Systemctl(ctx, "restart", "--no-block", localDNSUnit); err != nil {
		errs = append(errs, fmt.Errorf("bad Corefile: restart LocalDNS: %w: %s", err, out))
	} else {
		ev.mark("restart LocalDNS")
	}
	sleep(ctx, badCorefileStep)
	if isStandby(t.setup) {
		ev.mark(restartMark)
		if out, err := t.guest.Systemctl(ctx, "restart", "dnsstandby.service"); err != nil {
			errs = append(errs, fmt.Errorf("bad Corefile: restart dnsstandby: %w: %s", err, out))
		} else {
			ev.mark("dnsstandby restarted")
		}
	}
	sleep(ctx, badCorefileStep)
	if isStandby(t.setup) {
		ev.mark(coldStartMark)
		if out, err := t.guest.Exec(ctx, "sh", "-c", coldStartScript); err != nil {
			errs = append(errs, fmt.Errorf("bad Corefile: cold start dnsstandby: %w: %s", err, out))
		} else {
			ev.mark(coldStartedMark)
		}
	}
	sleep(ctx, badCorefileStep)
	return errors.Join(append(errs, t.localDNSBack(good, before["ActiveEnterTimestampMonotonic"], ev))...)
}

// localDNSBack ends bad-corefile: it checks that LocalDNS did not run on
// the refused Corefile (it entered the active state last at
// activeBefore, before the fault), puts the good Corefile back and
// restarts LocalDNS, after a reset-failed as an operator would: restart
// rather than start, because a unit still in its restart loop may be
// half-way through a start that waits for a pidfile that never comes. It
// runs even after ctx ended, so the node is whole again.
func (t *topology) localDNSBack(good, activeBefore string, ev *events) error {
	ctx := context.Background()
	var errs []error
	st, err := t.guest.Show(ctx, localDNSUnit, "ActiveState", "SubState", "Result", "NRestarts", "ActiveEnterTimestampMonotonic")
	if err != nil {
		errs = append(errs, err)
	} else {
		ev.mark(fmt.Sprintf("LocalDNS %s/%s, %s restarts", st["ActiveState"], st["SubState"], st["NRestarts"]))
		if st["ActiveEnterTimestampMonotonic"] != activeBefore {
			errs = append(errs, fmt.Errorf("bad Corefile: LocalDNS became active on the refused Corefile (%v)", st))
		}
	}
	if err := t.writeFile(ctx, lab.LocalDNSCorefilePath, good); err != nil {
		return errors.Join(append(errs, fmt.Errorf("bad Corefile: put the good one back: %w", err))...)
	}
	ev.mark("good Corefile")
	if out, err := t.guest.Systemctl(ctx, "reset-failed", localDNSUnit); err != nil {
		errs = append(errs, fmt.Errorf("bad Corefile: reset-failed LocalDNS: %w: %s", err, out))
	}
	if out, err := t.guest.Systemctl(ctx, "restart", localDNSUnit); err != nil {
		return errors.Join(append(errs, fmt.Errorf("bad Corefile: LocalDNS on the good Corefile: %w: %s", err, out))...)
	}
	ev.mark(localDNSBackMark)
	return errors.Join(errs...)
}

// writeFile writes data to path inside the node, in place (truncated and
// rewritten, as localdns.sh's cp writes the Corefile).
func (t *topology) writeFile(ctx context.Context, path, data string) error {
	if out, err := t.guest.Exec(ctx, "sh", "-c", `printf '%s' "$1" >"$2"`, "sh", data, path); err != nil {
		return fmt.Errorf("write %s: %w: %s", path, err, out)
	}
	return nil
}

// corednsPID reads LocalDNS's CoreDNS PID (inside the guest) from its
// pidfile.
func (t *topology) corednsPID(ctx context.Context) (string, error) {
	out, err := t.guest.Exec(ctx, "cat", "/run/localdns.pid")
	if err != nil {
		return "", fmt.Errorf("CoreDNS pidfile: %w", err)
	}
	pid := strings.TrimSpace(out)
	if _, err := strconv.Atoi(pid); err != nil {
		return "", fmt.Errorf("CoreDNS pidfile holds %q", pid)
	}
	return pid, nil
}

// waitState polls the LocalDNS unit until done says so or limit passes.
func waitState(ctx context.Context, t *topology, limit time.Duration, done func(active, sub string) bool) {
	_, _ = pollUnit(ctx, t, localDNSUnit, limit, 100*time.Millisecond, []string{"ActiveState", "SubState"}, func(p map[string]string, err error) (bool, error) {
		return err == nil && done(p["ActiveState"], p["SubState"]), nil
	})
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
