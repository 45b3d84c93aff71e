// Command lab is the crash-storm lab: for each scenario it builds one node
// per setup — a real systemd running LocalDNS (a real CoreDNS) in network
// namespaces, a pod, and a kube-dns CoreDNS — drives the same load and the
// same fault through all of them side by side, and writes what the pods
// saw: bench/out/lab.json, lab.md and a timeline picture per scenario.
// It needs root. See bench/README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/bench/internal/testbed"
	"github.com/dnsstandby/dnsstandby/bench/lab"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

type options struct {
	scenarios string  // comma-separated names, or "all"
	setups    string  // comma-separated setups
	outDir    string  // where lab.json, lab.md and the pictures go
	qps       int     // the pods' load per node, through 169.254.10.11
	nodeQPS   int     // the node's own load, through 169.254.10.10; 0: none
	scale     float64 // multiplies baseline and observation times
	hedges    bool    // apply the hedge checks (hedgeRules)
	alone     bool    // every scenario runs each setup's node alone, one after the other
	rounds    int     // run the scenarios this many times, the setups' order reversed every other round
	fallback  string  // auto, on, off: give dnsstandby --fallback-upstream (standbyOptions)
	bins      binaries
}

func parseFlags() *options {
	o := &options{}
	flag.StringVar(&o.scenarios, "scenario", "all", "scenarios to run, comma-separated, or all")
	flag.StringVar(&o.outDir, "out", "bench/out", "output directory")
	flag.StringVar(&o.setups, "setups", strings.Join(defaultSetups, ","), "setups to run side by side, comma-separated: "+strings.Join(knownSetups, ", "))
	// Three nodes side by side at 1,000 + 250 qps each are what a 2-core
	// machine carries with LocalDNS healthy when no fault is injected: at
	// 2,000 + 500, LocalDNS alone answered the node's queries with a p99
	// of 450 ms in "healthy", the machine being its fault.
	flag.IntVar(&o.qps, "qps", 1000, "queries per second the pods of each node send to 169.254.10.11")
	flag.IntVar(&o.nodeQPS, "node-qps", 250, "queries per second each node itself (kubelet, hostNetwork pods) sends to 169.254.10.10; 0: no node load or probe")
	flag.Float64Var(&o.scale, "scale", 1, "multiply every scenario's baseline and observation time by this (the faults' own timings are kept); a smoke run uses a small one")
	flag.BoolVar(&o.alone, "alone", false, "run each setup's node alone, one after the other, in every scenario (upstream-blackhole and kube-dns-backend-dead always do): on a machine too small for the nodes side by side, which shows as senders seconds behind")
	flag.IntVar(&o.rounds, "rounds", 1, "run the scenarios this many times, the setups' order reversed every other round (with -alone, which node runs first), and compare the setups' latency from the fault on over all rounds pooled")
	flag.BoolVar(&o.hedges, "hedge-checks", true, "check the dnsstandby setup against the hedged-answer rules in hang, lossy, brownout and healthy (a dnsstandby that does not hedge fails the first three)")
	flag.StringVar(&o.fallback, "standby-fallback", "auto", "give dnsstandby --fallback-upstream "+clusterIP+":53: on, off, or auto (when the dnsstandby binary has the option)")
	flag.StringVar(&o.bins.coredns, "coredns", "", "coredns binary (default: $"+nstest.CoreDNSEnv+" or bin/coredns)")
	flag.StringVar(&o.bins.dnsstandby, "dnsstandby", "bench/out/bin/dnsstandby", "dnsstandby binary")
	flag.StringVar(&o.bins.next, "dnsstandby-next", "bench/out/bin/dnsstandby-next", "the build standby-upgrade upgrades to: the same source stamped with another version (make lab builds it)")
	flag.Parse()
	return o
}

func main() {
	o := parseFlags()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "lab:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o *options) error {
	if os.Geteuid() != 0 {
		return errors.New("the lab needs root (network namespaces, a systemd guest)")
	}
	if o.rounds < 1 {
		return fmt.Errorf("-rounds %d: want at least 1", o.rounds)
	}
	if o.bins.coredns == "" {
		p, err := nstest.FindCoreDNS()
		if err != nil {
			return err
		}
		o.bins.coredns = p
	}
	for _, p := range []*string{&o.bins.coredns, &o.bins.dnsstandby} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return err
		}
		if _, err := os.Stat(abs); err != nil {
			return fmt.Errorf("binary: %w", err)
		}
		*p = abs // the guest sees the host's file system under the same paths
	}
	version, err := corednsVersion(o.bins.coredns)
	if err != nil {
		return err
	}
	if o.bins.fallback, err = useFallback(ctx, o.fallback, o.bins.dnsstandby); err != nil {
		return err
	}
	// A run's numbers depend on it: say which.
	if o.bins.fallback {
		fmt.Printf("dnsstandby runs with %s %s:53\n", fallbackFlag, clusterIP)
	} else {
		fmt.Printf("dnsstandby runs without %s (-standby-fallback %s)\n", fallbackFlag, o.fallback)
	}
	var list []scenario
	if o.scenarios == "all" {
		list = scenarios
	} else {
		for _, name := range strings.Split(o.scenarios, ",") {
			s, ok := findScenario(strings.TrimSpace(name))
			if !ok {
				return fmt.Errorf("unknown scenario %q", name)
			}
			list = append(list, s)
		}
	}
	if slices.ContainsFunc(list, func(s scenario) bool { return s.next }) {
		if err := o.bins.readNext(ctx); err != nil {
			return err
		}
	} else {
		o.bins.next = "" // nothing to bind into the nodes
	}
	if err := os.MkdirAll(o.outDir, 0o755); err != nil {
		return err
	}
	// 5,000 services: the pods' name mix is big enough that a cache holds
	// it only if it was filled (the mirror issue's double-fault asks for
	// 5,000 distinct names); the load goes round the mix in order.
	zones := nstest.KubeDNSZones(nstest.ZoneOptions{Services: 5000, Namespaces: []string{"default", "kube-system", "shop"}})
	mixes := nameMixes{pod: nameMix(zones), node: nodeNameMix(zones)}

	var chosen []string
	for _, s := range strings.Split(o.setups, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(knownSetups, s) {
			return fmt.Errorf("unknown setup %q: want %s", s, strings.Join(knownSetups, ", "))
		}
		chosen = append(chosen, s)
	}

	file := lab.LabFile{CoreDNSVersion: version}
	for round := 1; round <= o.rounds; round++ {
		order, label := chosen, 0 // runs carry no round without -rounds
		if o.rounds > 1 {
			fmt.Printf("round %d of %d\n", round, o.rounds)
			label = round
			if round%2 == 0 {
				order = slices.Clone(chosen)
				slices.Reverse(order)
			}
		}
		if err := runRound(ctx, o, list, order, label, zones, mixes, &file); err != nil {
			return err
		}
	}
	file.Latency = lab.CompareLatency(file.Runs)
	printLatency(file.Latency)
	if err := lab.WriteLabJSON(filepath.Join(o.outDir, "lab.json"), file); err != nil {
		return err
	}
	if err := lab.WriteLabMarkdown(filepath.Join(o.outDir, "lab.md"), file); err != nil {
		return err
	}
	fmt.Printf("written to %s/lab.json, lab.md and timeline-*.svg\n", o.outDir)
	if failed := file.Failed(); len(failed) > 0 {
		return fmt.Errorf("%d of %d checks failed", len(failed), len(file.Checks))
	}
	return nil
}

// runRound runs each scenario of list once on the setups, in their order,
// and adds the runs and checks to file; round is 0 without -rounds.
func runRound(ctx context.Context, o *options, list []scenario, chosen []string, round int, zones *nstest.Zones, mixes nameMixes, file *lab.LabFile) error {
	for _, sc := range list {
		sc.round = round
		setups := chosen
		if sc.standbyOnly {
			setups = slices.DeleteFunc(slices.Clone(chosen), func(s string) bool { return !isStandby(s) })
		}
		if sc.setups != nil {
			setups = slices.DeleteFunc(slices.Clone(setups), func(s string) bool { return !slices.Contains(sc.setups, s) })
		}
		if len(setups) == 0 {
			continue
		}
		fmt.Printf("%s: %s ...\n", sc.name, sc.note)
		m := mixes
		if sc.fresh {
			m = mixes.withFresh()
		}
		got, err := runSetups(ctx, sc, setups, o, zones, m)
		if err != nil {
			return fmt.Errorf("%s: %w", sc.name, err)
		}
		for i := range got {
			got[i].Round = sc.round
			printRun(got[i])
		}
		file.Runs = append(file.Runs, got...)
		checks := checkRuns(sc.name, setups, clientNames(o), got, o.hedges)
		for i := range checks {
			checks[i].Round = sc.round
			fmt.Printf("  %s\n", checks[i])
		}
		file.Checks = append(file.Checks, checks...)
		if err := lab.PlotTimeline(filepath.Join(o.outDir, sc.fileName("timeline", ".svg")), sc.name, got); err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}

// printLatency prints each comparison over rounds: a line per setup, the
// first the others are compared with.
func printLatency(comps []lab.LatencyComparison) {
	for _, c := range comps {
		fmt.Printf("%s %s → %s, latency from the fault on, every round pooled:\n", c.Scenario, c.Client, c.Listener)
		for i, s := range c.Setups {
			fmt.Printf("  %-18s %7d answered  p50 %.3f ms  p99 %.3f ms", s.Setup, s.Answered, s.P50Ms, s.P99Ms)
			if i > 0 {
				fmt.Printf("  p99 %+.3f ms against %s (90%%: %+.3f to %+.3f; median of the rounds' own %+.3f)",
					s.P99DiffMs, c.Setups[0].Setup, s.P99DiffLowMs, s.P99DiffHighMs, s.RoundDiffMedianMs)
			}
			fmt.Printf("\n  %-18s rounds' p99 (ms): %v\n", "", s.RoundP99Ms)
		}
	}
}

// useFallback says whether dnsstandby gets its fallback upstream, from the
// -standby-fallback value: on, off, or auto, which asks the binary whether
// it has the option (the builds before it refuse to start with it).
func useFallback(ctx context.Context, mode, bin string) (bool, error) {
	switch mode {
	case "on":
		return true, nil
	case "off":
		return false, nil
	case "auto":
		use, err := knowsFlag(ctx, bin, fallbackFlag)
		if err != nil {
			return false, fmt.Errorf("-standby-fallback auto: %w", err)
		}
		return use, nil
	}
	return false, fmt.Errorf("-standby-fallback %q: want on, off or auto", mode)
}

// printRun prints a run's numbers on one line.
func printRun(r lab.LabRun) {
	after := ""
	if a := r.AfterFault; a != nil {
		after = fmt.Sprintf("  after fault: unanswered %d, glibc fail %d", a.Unanswered, a.GlibcFail)
	}
	// The sender's lag tells a starved machine: the load itself could not
	// keep its schedule.
	hedges := "n/a"
	if r.Hedges != nil {
		hedges = fmt.Sprint(r.Hedges.Total)
	}
	fmt.Printf("  %-18s %-20s sent %6d  first try %6d  after retry %5d  unanswered %5d  max gap %6.0f ms  p99 %6.1f ms  glibc ok %3d fail %3d max %5.0f ms  hedges %s dup %d mismatched %d  sender lag %4.0f ms%s\n",
		r.Setup, r.ListenerName(), r.Sent, r.AnsweredFirstTry, r.AnsweredAfterRetry, r.Unanswered, r.MaxGapMs, r.P99Ms, r.GlibcOK, r.GlibcFail, r.GlibcMaxMs,
		hedges, r.Duplicates, r.Mismatched, r.MaxLagMs, after)
}

// runSetups runs sc on the setups' nodes together, or, for a scenario
// that runs each alone (or with -alone), on one node after the other.
func runSetups(ctx context.Context, sc scenario, setups []string, o *options, zones *nstest.Zones, mixes nameMixes) ([]lab.LabRun, error) {
	if !sc.alone && !o.alone {
		return runScenario(ctx, sc, setups, o, zones, mixes)
	}
	var runs []lab.LabRun
	for _, s := range setups {
		got, err := runScenario(ctx, sc, []string{s}, o, zones, mixes)
		if err != nil {
			return nil, err
		}
		runs = append(runs, got...)
	}
	return runs, nil
}

// runScenario builds a node per setup, runs its clients' loads and the
// fault on all of them at once, and tears everything down.
func runScenario(ctx context.Context, sc scenario, setups []string, o *options, zones *nstest.Zones, mixes nameMixes) (runs []lab.LabRun, err error) {
	tops, err := buildAll(ctx, sc.name, setups, o.bins, zones, sc.spec)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, closeAll(tops)) }()

	scale := func(d time.Duration) time.Duration { return time.Duration(float64(d) * o.scale) }
	nodes := make([]*liveNode, len(tops))
	// Whatever was started is stopped on the way out, also on error (and
	// before the nodes are torn down); on success results has already
	// stopped everything, and stop is a no-op.
	defer func() {
		for _, n := range nodes {
			if n != nil {
				n.stop()
			}
		}
	}()
	for i, t := range tops {
		if nodes[i], err = startNode(ctx, t, t.clients(o, mixes)); err != nil {
			return nil, fmt.Errorf("%s: %w", t.setup, err)
		}
	}
	sleep(ctx, scale(sc.baseline))

	// The hedge and upstream counters at the fault, so that the checks
	// count from it on.
	atFault := make([]map[string]*lab.Hedges, len(tops))
	upAtFault := make([]*lab.UpstreamCounts, len(tops))
	for i, t := range tops {
		var m testbed.Metrics
		if isStandby(t.setup) {
			mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			// Unread, the runs count hedges over the whole run and the
			// upstream checks fail.
			if got, err := t.standbyMetrics(mctx); err == nil {
				m, atFault[i] = got, hedgeCounts(got)
			}
			cancel()
		}
		upAtFault[i] = t.upstreamCounts(m)
	}
	faultAt := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, len(tops))
	for i, t := range tops {
		wg.Go(func() { errs[i] = sc.fault(ctx, t, nodes[i].ev) })
	}
	wg.Wait()
	sleep(ctx, scale(sc.observe))

	// Stop all at once: a glibc lookup still running in an outage takes up
	// to its resolver timeout to finish.
	perNode := make([][]lab.LabRun, len(tops))
	for i, t := range tops {
		wg.Go(func() { perNode[i] = nodes[i].results(sc, t, faultAt, atFault[i], upAtFault[i], errs[i]) })
	}
	wg.Wait()
	for i, t := range tops {
		if t.fallback == "" {
			continue
		}
		fc, err := t.fallbackCounts()
		if err != nil {
			// The checks fail on it: -1 is "not read".
			fmt.Fprintf(os.Stderr, "lab: %s %s: %v\n", sc.name, t.setup, err)
			fc = &lab.FallbackCounts{Design: t.fallback, Starts: -1}
		}
		for j := range perNode[i] {
			perNode[i][j].Fallback = fc
		}
	}
	for _, r := range perNode {
		runs = append(runs, r...)
	}
	for _, t := range tops {
		// Evidence for whoever reads a failed check; the runs stand
		// without it.
		if err := saveJournal(o.outDir, sc, t); err != nil {
			fmt.Fprintf(os.Stderr, "lab: %s %s: %v\n", sc.name, t.setup, err)
		}
	}
	return runs, ctx.Err()
}

// Lines dnsstandby logs when it sees AKS's LocalDNS fallback come and go.
const (
	standbyFallbackSeen = "AKS LocalDNS fallback seen"
	standbyFallbackGone = "AKS LocalDNS fallback gone"
)

// fallbackCounts reads what AKS's fallback did, and what dnsstandby said
// of it, from the node's journal.
func (t *topology) fallbackCounts() (*lab.FallbackCounts, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	journal, err := t.guest.Journal(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("fallback counts: %w", err)
	}
	return &lab.FallbackCounts{Design: t.fallback, Starts: lab.FallbackTakeovers(journal), Declines: lab.FallbackDeclines(journal),
		Seen: strings.Count(journal, standbyFallbackSeen), Gone: strings.Count(journal, standbyFallbackGone)}, nil
}

// saveJournal writes the journal of a node that runs dnsstandby (all its
// units: localdns, dnsstandby, systemd) to dir/journal-SCENARIO-SETUP.log
// and dnsstandby's metrics page to dir/metrics-SCENARIO-SETUP.txt (with
// -rounds, SCENARIO-roundN), before the node is torn down.
func saveJournal(dir string, sc scenario, t *topology) error {
	if !isStandby(t.setup) || dir == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	journal, err := t.guest.Journal(ctx, "")
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	path := filepath.Join(dir, sc.fileName("journal", "-"+t.setup+".log"))
	if err := os.WriteFile(path, []byte(journal), 0o644); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	// Its counters at the end, for what the journal's events leave out
	// (hedges delayed or skipped, speculative attempts skipped by cap).
	page, err := t.metricsPage(ctx, standbyMetricsURL)
	if err != nil {
		return fmt.Errorf("dnsstandby metrics: %w", err)
	}
	path = filepath.Join(dir, sc.fileName("metrics", "-"+t.setup+".txt"))
	if err := os.WriteFile(path, []byte(page), 0o644); err != nil {
		return fmt.Errorf("dnsstandby metrics: %w", err)
	}
	return nil
}

// liveNode is what runs on one node during a scenario: its clients, the
// fault's marks and the tracker of LocalDNS's state.
type liveNode struct {
	clients []*liveClient
	ev      *events
	down    *downTracker

	stopOnce sync.Once
	spans    []span // LocalDNS's down spans, once stopped
}

// liveClient is one client's load and glibc probe.
type liveClient struct {
	client
	load  *lab.Load
	probe *lab.GlibcProbe
}

// startNode starts the node's down tracker and its clients' loads and
// probes; on error it stops what it started.
func startNode(ctx context.Context, t *topology, clients []client) (n *liveNode, err error) {
	n = &liveNode{ev: &events{}, down: startDownTracker(ctx, t)}
	defer func() {
		if err != nil {
			n.stop()
			n = nil
		}
	}()
	for _, c := range clients {
		lc, err := startClient(ctx, c)
		if err != nil {
			return n, err
		}
		n.clients = append(n.clients, lc)
	}
	return n, nil
}

// startClient starts a client's load and glibc probe; on error it stops
// what it started.
func startClient(ctx context.Context, c client) (*liveClient, error) {
	load, err := lab.StartLoad(ctx, lab.LoadConfig{NS: c.ns, Server: netip.AddrPortFrom(netip.MustParseAddr(c.listener), 53), QPS: c.qps, Names: c.names})
	if err != nil {
		return nil, fmt.Errorf("%s load: %w", c.name, err)
	}
	probe, err := lab.StartGlibcProbe(ctx, c.ns, c.probeName, lab.ProbeDefaultEvery)
	if err != nil {
		load.Stop()
		return nil, fmt.Errorf("%s glibc probe: %w", c.name, err)
	}
	return &liveClient{client: c, load: load, probe: probe}, nil
}

// stop stops the down tracker first (the shading ends with the load), then
// every client, all at once. Safe to call more than once; Load.Stop and
// GlibcProbe.Stop keep their results for results to read.
func (n *liveNode) stop() {
	n.stopOnce.Do(func() {
		n.spans = n.down.stop()
		var wg sync.WaitGroup
		for _, c := range n.clients {
			wg.Go(func() {
				c.load.Stop()
				c.probe.Stop()
			})
		}
		wg.Wait()
	})
}

// results stops the node and makes a run of each client, on the client's
// own clock, with the scenario's note, the fault's error and the notes that
// apply.
func (n *liveNode) results(sc scenario, t *topology, faultAt time.Time, atFault map[string]*lab.Hedges, upAtFault *lab.UpstreamCounts, faultErr error) []lab.LabRun {
	n.stop()
	var hedges map[string]*lab.Hedges
	var metrics testbed.Metrics
	if isStandby(t.setup) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var err error
		if metrics, err = t.standbyMetrics(ctx); err != nil {
			// The runs stand without it; the report says n/a.
			fmt.Fprintf(os.Stderr, "lab: %s %s: %v\n", sc.name, t.setup, err)
		} else {
			hedges = hedgeCounts(metrics)
		}
		cancel()
	}
	upstream := t.upstreamCounts(metrics).Since(upAtFault)
	var runs []lab.LabRun
	for _, c := range n.clients {
		res, pr := c.load.Stop(), c.probe.Stop()
		run := lab.NewLabRun(sc.name, t.setup, res, pr)
		run.Listener, run.Client = c.listener, c.name
		if h, ok := hedges[c.listener+":53"]; ok {
			run.Hedges = h
		} else if hedges != nil {
			run.Hedges = &lab.Hedges{} // reported, none on this listener
		}
		after := lab.CountAfterFault(res, pr, faultAt.Sub(res.Start))
		if run.Hedges != nil {
			n := run.Hedges.Total
			if h, ok := atFault[c.listener+":53"]; ok {
				n -= h.Total
			}
			after.Hedges = &n
		}
		run.AfterFault = &after
		run.Upstream = upstream
		run.Down = intervals(n.spans, res.Start)
		run.Events = n.ev.list(res.Start)
		run.Recovered = recovered(res, pr, run.Events)
		if from, to, ok := stoppedSpan(run.Events); ok {
			w := lab.CountGlibc(pr, res.Start, from, to)
			after.GlibcWhileStopped = &w
		}
		run.Note = sc.note
		if faultErr != nil {
			run.FaultError = faultErr.Error()
			run.Note += "; fault error: " + faultErr.Error()
		}
		for _, note := range []string{warmNote(res, run.Events, run.Down), restartNote(res, run.Events, t), readTestNote(metrics, c.listener+":53"), badCorefileNote(res, run.Events, t)} {
			if note != "" {
				run.Note += "; " + note
			}
		}
		runs = append(runs, run)
	}
	return runs
}

// recoverySettle is how long after LocalDNS is back (localDNSBackMark) its
// recovery is counted from: dnsstandby hands the traffic back once
// LocalDNS has passed its hold-down, 5 probes 1 s apart spanning 4 s by
// default, so 10 s leaves it room.
const recoverySettle = 10 * time.Second

// recovered counts what was sent and looked up from recoverySettle after
// LocalDNS came back on, or nil where the run has no such mark or ended
// before.
func recovered(res lab.LoadResult, pr lab.ProbeResult, evs []lab.Event) *lab.AfterFault {
	for _, e := range evs {
		if e.Label == localDNSBackMark && e.At+recoverySettle < res.Duration {
			a := lab.CountAfterFault(res, pr, e.At+recoverySettle)
			return &a
		}
	}
	return nil
}

// stoppedSpan is when, on the load's clock, the scenario had dnsstandby
// stopped for a cold start: from coldStartMark to coldStartedMark (its
// READY), if both were marked.
func stoppedSpan(evs []lab.Event) (from, to time.Duration, ok bool) {
	from, to = -1, -1
	for _, e := range evs {
		switch {
		case e.Label == coldStartMark && from < 0:
			from = e.At
		case e.Label == coldStartedMark && to < 0:
			to = e.At
		}
	}
	return from, to, from >= 0 && to >= from
}

// nameMix is what the pods ask: every cluster service, the external names
// that resolve, and some that do not.
func nameMix(z *nstest.Zones) []lab.LoadName {
	var mix []lab.LoadName
	perService := map[string]bool{}
	for i, s := range z.Services {
		mix = append(mix, lab.LoadName{FQDN: s.FQDN, Type: dns.TypeA, Rcode: dns.RcodeSuccess})
		if i%50 == 0 { // some SRV lookups, as pods make them
			mix = append(mix, lab.LoadName{FQDN: s.SRV, Type: dns.TypeSRV, Rcode: dns.RcodeSuccess})
		}
		perService[s.FQDN], perService[s.SRV] = true, true
	}
	// Every other case, weighed up a little: external names, NXDOMAIN,
	// NODATA. The per-service cases are the services above: taking them
	// all again would make the mix longer than a warm-up covers.
	for _, c := range z.Cases {
		if c.Large || c.Rcode == dns.RcodeRefused || perService[c.Name] && (c.Type == dns.TypeA || c.Type == dns.TypeSRV) {
			continue
		}
		if c.Name == nstest.DanglingName {
			// Its NXDOMAIN carries no SOA, so no cache keeps it (CoreDNS's
			// does not, nor dnsstandby's): with kube-dns down no setup can
			// answer it, and it would say nothing of a standby.
			continue
		}
		for range 5 {
			mix = append(mix, lab.LoadName{FQDN: c.Name, Type: c.Type, Rcode: c.Rcode})
		}
	}
	return mix
}

func corednsVersion(bin string) (string, error) {
	out, err := exec.Command(bin, "-version").Output()
	if err != nil {
		return "", fmt.Errorf("%s -version: %w", bin, err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "CoreDNS-") {
			return strings.TrimPrefix(line, "CoreDNS-"), nil
		}
	}
	return "", fmt.Errorf("%s -version: no version in %q", bin, out)
}

// events records the fault's marks.
type events struct {
	mu    sync.Mutex
	marks []mark
}

type mark struct {
	at    time.Time
	label string
}

func (e *events) mark(label string) {
	e.mu.Lock()
	e.marks = append(e.marks, mark{time.Now(), label})
	e.mu.Unlock()
}

// list returns the marks on the clock that starts at origin (a load's).
func (e *events) list(origin time.Time) []lab.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]lab.Event, 0, len(e.marks))
	for _, m := range e.marks {
		out = append(out, lab.Event{At: m.at.Sub(origin), Label: m.label})
	}
	return out
}

// span is a stretch of wall-clock time when LocalDNS was not active.
type span struct {
	from, to time.Time
	label    string
}

// intervals returns the spans on the clock that starts at origin.
func intervals(spans []span, origin time.Time) []lab.Interval {
	var out []lab.Interval
	for _, s := range spans {
		out = append(out, lab.Interval{From: s.from.Sub(origin), To: s.to.Sub(origin), Label: s.label})
	}
	return out
}

// downTracker polls LocalDNS's unit state and records when it was not
// active, for the timelines' shading.
type downTracker struct {
	cancel context.CancelFunc
	done   chan []span
}

func startDownTracker(ctx context.Context, t *topology) *downTracker {
	ctx, cancel := context.WithCancel(ctx)
	d := &downTracker{cancel: cancel, done: make(chan []span, 1)}
	go func() {
		var out []span
		var downSince time.Time
		var state string
		for ctx.Err() == nil {
			st, err := t.guest.Show(ctx, localDNSUnit, "ActiveState")
			now := time.Now()
			if err == nil {
				state = st["ActiveState"]
				if state != "active" && downSince.IsZero() {
					downSince = now
				} else if state == "active" && !downSince.IsZero() {
					out = append(out, span{from: downSince, to: now, label: "LocalDNS not active"})
					downSince = time.Time{}
				}
			}
			sleep(ctx, 200*time.Millisecond)
		}
		if !downSince.IsZero() {
			out = append(out, span{from: downSince, to: time.Now(), label: "LocalDNS " + state})
		}
		d.done <- out
	}()
	return d
}

func (d *downTracker) stop() []span {
	d.cancel()
	return <-d.done
}
