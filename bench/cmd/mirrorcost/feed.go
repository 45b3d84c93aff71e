package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/bench/internal/benchcmd"
	"github.com/dnsstandby/dnsstandby/bench/internal/dnsperf"
	"github.com/dnsstandby/dnsstandby/bench/internal/procstat"
	"github.com/dnsstandby/dnsstandby/bench/internal/testbed"
	"github.com/dnsstandby/dnsstandby/internal/cgroupv2"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

// localDNSCorefile is LocalDNS's pod-facing side as AgentBaker generates it
// (bench/lab/localdns.go has the whole file): the whoami health-check block
// dnsstandby probes, and the KubeDNS root block bound to 169.254.10.11 with
// AKS's forward, cache, nsid, prometheus and template settings. The
// upstream stands in for the kube-dns ClusterIP. With dnstapPath set,
// LocalDNS sends dnstap there (mirror/dnstap/README.md).
//
// The root block is internal/testkit's Corefile fixture's pod block
// (report_test.go holds it to that); the health-check block binds only
// 169.254.10.11, the one listener this node has. It is written out here
// because testkit is for tests only.
func localDNSCorefile(dnstapPath string) string {
	dnstapLine := ""
	if dnstapPath != "" {
		dnstapLine = "\n    dnstap unix://" + dnstapPath + " full"
	}
	return fmt.Sprintf(localDNSCorefileFormat, testbed.UpstreamAddr, localDNSReady, ":9253", dnstapLine)
}

// localDNSCorefileFormat is localDNSCorefile's text: %[1]s the upstream,
// %[2]s ready's address, %[3]s prometheus's, %[4]s the dnstap line or
// nothing.
const localDNSCorefileFormat = `health-check.localdns.local:53 {
    bind 169.254.10.11
    whoami
}
.:53 {
    errors
    bind 169.254.10.11
    forward . %[1]s {
        prefer_udp
        policy sequential
        max_concurrent 2000
    }
    ready %[2]s
    cache 3600 {
        success 9984
        denial 9984
        serve_stale 72000s verify
        servfail 0
    }
    loop
    nsid localdns-pod
    prometheus %[3]s
    template ANY ANY internal.cloudapp.net {
        match "^(?:[^.]+\.){4,}internal\.cloudapp\.net\.$"
        rcode NXDOMAIN
        fallthrough
    }
    template ANY ANY reddog.microsoft.com {
        rcode NXDOMAIN
    }%[4]s
}
`

// Timeouts of the set-up steps.
const (
	standbyUpTimeout = 15 * time.Second
	// mirrorTimeout covers dnsstandby's hold-down of a LocalDNS it saw
	// bind (5 probes over 4 s by default) and the adoption of its sockets.
	mirrorTimeout = 30 * time.Second
	// fillTimeout is how long dnsstandby's cache may take, after the last
	// warm-up pass, to show the names mirrored.
	fillTimeout = 10 * time.Second
	// stopTimeout bounds dnsstandby's clean exit on SIGTERM (its
	// --shutdown-timeout is 5 s) before it is killed.
	stopTimeout = 10 * time.Second
)

// warmPasses bounds the passes over the names before measuring: the first
// fills LocalDNS's cache, the next must reach the upstream zero times.
const warmPasses = 3

// nsidChecks is how many queries, each from a new socket (a new source
// port, so a new spot in the reuseport hash), must come back with
// LocalDNS's NSID before the warm-up: the proof that adopt steering sends
// LocalDNS everything.
const nsidChecks = 32

// nsidCheckName is asked by the NSID check: a name outside the load's
// names, so the check adds nothing to the warm-up's counts.
const nsidCheckName = "kubernetes.default.svc.cluster.local."

// localDNS is one LocalDNS process, in a cgroup of its own as in
// localdns.service on a node (the tap in ring mode reads its replies
// there), pinned to the servers' CPU.
type localDNS struct {
	*nstest.CoreDNS
	cgroup string
}

// startLocalDNS starts LocalDNS, sending dnstap to dnstapPath if set.
func (n *node) startLocalDNS(dnstapPath string) (*localDNS, error) {
	cg, err := cgroupv2.Make(fmt.Sprintf("dnsstandby-mirrorcost-localdns-%d", os.Getpid()))
	if err != nil {
		return nil, fmt.Errorf("LocalDNS: %w", err)
	}
	cd, err := nstest.LaunchCoreDNS(n.NS, nstest.CoreDNSConfig{
		Binary:   n.o.coredns,
		Corefile: localDNSCorefile(dnstapPath),
		Probe:    listenAddr,
		Cgroup:   cg,
	})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("LocalDNS: %w", err), cgroupv2.Remove(cg))
	}
	ld := &localDNS{CoreDNS: cd, cgroup: cg}
	if err := procstat.Pin(cd.Pid(), n.o.serverCPU); err != nil {
		return nil, errors.Join(err, ld.close())
	}
	return ld, nil
}

func (l *localDNS) close() error { return errors.Join(l.Close(), cgroupv2.Remove(l.cgroup)) }

// measureRound measures each feed once, in order, but dnstap last. Every
// feed but dnstap runs beside one LocalDNS process, started for the round
// and kept across its feeds, so that what a feed adds to LocalDNS's CPU is
// not mixed with how fast one LocalDNS process runs against another (a
// fresh one's CPU per query moved by a third between windows of one run).
// The dnstap feed gets a LocalDNS of its own, once the round's is gone,
// started after dnsstandby: CoreDNS 1.13.1 connects to its dnstap socket
// only at start-up.
func (n *node) measureRound(ctx context.Context, round int, feeds []string) (results []result, err error) {
	var shared *localDNS
	closeShared := func() {
		if shared != nil {
			err = errors.Join(err, shared.close())
			shared = nil
		}
	}
	defer closeShared()
	measure := func(f string, ld *localDNS) error {
		fmt.Printf("measuring --mirror %s (round %d of %d) ...\n", f, round, n.o.rounds)
		r, err := n.measureFeed(ctx, f, ld)
		if err != nil {
			return fmt.Errorf("--mirror %s, round %d: %w", f, round, err)
		}
		r.Round, r.SharedLocalDNS = round, ld != nil
		results = append(results, r)
		return nil
	}
	for _, f := range feeds {
		if f == "dnstap" {
			continue
		}
		if shared == nil {
			if shared, err = n.startLocalDNS(""); err != nil {
				return results, fmt.Errorf("round %d: %w", round, err)
			}
		}
		if err := measure(f, shared); err != nil {
			return results, err
		}
	}
	if slices.Contains(feeds, "dnstap") {
		closeShared()
		if err != nil {
			return results, err
		}
		if err := measure("dnstap", nil); err != nil {
			return results, err
		}
	}
	return results, nil
}

// measureFeed starts dnsstandby with the feed beside shared, or, with
// shared nil, beside a LocalDNS of its own started after it (and stopped
// after the measurement); waits until dnsstandby mirrors with LocalDNS's
// sockets adopted, warms up, measures, and stops dnsstandby.
func (n *node) measureFeed(ctx context.Context, feed string, shared *localDNS) (res result, err error) {
	mirrorArg, dnstapPath, hedge, ring := feed, "", "true", "true"
	switch feed {
	case "dnstap":
		dnstapPath = filepath.Join(n.Scratch, "dnstap.sock")
		mirrorArg = "dnstap:" + dnstapPath
	case tapNoHedge:
		mirrorArg, hedge = "tap", "false"
	case tapPacket:
		mirrorArg, ring = "tap", "false"
	}
	args := []string{"run", "--listen", listenAddr, "--upstream", testbed.UpstreamAddr,
		"--metrics-addr", standbyMetrics, "--anchor-link", "", "--admin-socket", "", "--state-dir", "", "--lock-file", "",
		"--steering", "adopt", "--mirror", mirrorArg, "--hedge=" + hedge, "--tap-ring=" + ring}

	// `ip netns exec` gives dnsstandby a fresh /sys, without the cgroup2
	// mount a node has at /sys/fs/cgroup, where the tap finds LocalDNS's
	// cgroup.
	sb, err := n.NS.Start("/bin/sh", append([]string{"-c", `mount -t cgroup2 cgroup2 /sys/fs/cgroup && exec "$0" "$@"`, n.o.dnsstandby}, args...)...)
	if err != nil {
		return res, fmt.Errorf("start dnsstandby: %w", err)
	}
	defer func() { err = errors.Join(err, stopStandby(sb)) }()
	ld := shared
	withOutput := func(err error) error {
		if err == nil || ctx.Err() != nil {
			return err
		}
		err = fmt.Errorf("%w\ndnsstandby output:\n%s", err, tail(sb.Output(), 40))
		if ld != nil {
			err = fmt.Errorf("%w\nLocalDNS output:\n%s", err, tail(ld.Output(), 20))
		}
		return err
	}
	if err := procstat.Pin(sb.Pid(), n.o.standbyCPU); err != nil {
		return res, withOutput(err)
	}
	if err := n.waitStandbyUp(ctx, sb, dnstapPath); err != nil {
		return res, withOutput(err)
	}
	if shared == nil {
		// The probe may be answered by dnsstandby, which holds the
		// traffic until LocalDNS passed its hold-down; waitMirror waits
		// for that.
		if ld, err = n.startLocalDNS(dnstapPath); err != nil {
			return res, withOutput(err)
		}
		defer func() { err = errors.Join(err, ld.close()) }()
	}
	if err := n.waitMirror(ctx, feed, sb, ld.CoreDNS); err != nil {
		return res, withOutput(err)
	}
	if err := n.checkNSID(); err != nil {
		return res, withOutput(err)
	}
	// Threads created since the first pin inherited it; this catches any
	// that raced with it.
	for pid, cpu := range n.pins(sb.Pid(), ld.Pid()) {
		if err := procstat.Pin(pid, cpu); err != nil {
			return res, withOutput(err)
		}
	}
	// What dnsstandby answers is counted from here: before LocalDNS passed
	// the hold-down it rightly answered (LaunchCoreDNS's probe).
	start, err := n.snapshot(ctx, sb.Pid(), ld.Pid())
	if err != nil {
		return res, withOutput(err)
	}
	w, err := n.warm(ctx, feed, sb)
	if err != nil {
		return res, withOutput(err)
	}
	res, err = n.measure(ctx, feed, sb, ld.CoreDNS, start, w)
	if err != nil {
		return res, withOutput(err)
	}
	res.StandbyCommand = "dnsstandby " + strings.Join(quoteEmpty(args), " ")
	return res, nil
}

// stopStandby asks dnsstandby to exit cleanly (it detaches its steering
// program from LocalDNS's reuseport group) and kills it if it does not.
func stopStandby(p *nstest.Process) error {
	if err := p.Signal(syscall.SIGTERM); err == nil {
		select {
		case <-p.Done():
		case <-time.After(stopTimeout):
		}
	}
	return p.Stop()
}

// waitStandbyUp waits for dnsstandby's metrics endpoint and, for the dnstap
// feed, its socket: LocalDNS must find it when it starts.
func (n *node) waitStandbyUp(ctx context.Context, sb *nstest.Process, dnstapPath string) error {
	return testbed.Poll(ctx, "dnsstandby up", standbyUpTimeout, sb.Done(), func() (bool, string) {
		s, err := n.Metrics(ctx, standbyMetrics)
		if err != nil {
			return false, err.Error()
		}
		if !s.Has("dnsstandby_mode") {
			return false, "no dnsstandby_mode metric"
		}
		if dnstapPath != "" {
			fi, err := os.Stat(dnstapPath)
			if err != nil {
				return false, err.Error()
			}
			if fi.Mode()&os.ModeSocket == 0 {
				return false, dnstapPath + " is not a socket"
			}
		}
		return true, ""
	})
}

// waitMirror waits until LocalDNS is ready and dnsstandby mirrors it: mode
// mirror, steering level adopt with LocalDNS's sockets adopted, and the
// feed running (the tap enabled, or a dnstap connection from LocalDNS).
func (n *node) waitMirror(ctx context.Context, feed string, sb *nstest.Process, ld *nstest.CoreDNS) error {
	err := testbed.Poll(ctx, "LocalDNS ready", mirrorTimeout, ld.Done(), func() (bool, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+localDNSReady+"/ready", nil)
		if err != nil {
			return false, err.Error()
		}
		resp, err := n.HTTP.Do(req)
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	if err != nil {
		return err
	}
	return testbed.Poll(ctx, "dnsstandby mirroring LocalDNS", mirrorTimeout, sb.Done(), func() (bool, string) {
		s, err := n.Metrics(ctx, standbyMetrics)
		if err != nil {
			return false, err.Error()
		}
		switch {
		case s.Sum("dnsstandby_mode", map[string]string{"mode": "mirror"}) != 1:
			return false, fmt.Sprintf("mode %v", s.By("dnsstandby_mode", "mode", nil))
		case s.Sum("dnsstandby_steer_level", map[string]string{"level": "adopt"}) != 1:
			return false, fmt.Sprintf("steering level %v", s.By("dnsstandby_steer_level", "level", nil))
		case s.Sum("dnsstandby_peer_sockets_adopted", nil) < 1:
			return false, "no LocalDNS socket adopted"
		case isTap(feed) && s.Sum("dnsstandby_mirror_tap_enabled", nil) != 1:
			return false, "tap not enabled"
		case isTap(feed) && (s.Sum("dnsstandby_mirror_tap_ring", nil) == 1) != (feed != tapPacket):
			return false, fmt.Sprintf("tap ring mode %v", s.Sum("dnsstandby_mirror_tap_ring", nil))
		case feed == "tap" && s.Sum("dnsstandby_hedge_tracking", nil) != 1:
			return false, "hedger not tracking"
		case feed == "tap" && s.Sum("dnsstandby_mirror_tap_queries_at_localdns", nil) != 1:
			return false, "tap not reading the queries at LocalDNS's cgroup"
		case feed == "dnstap" && s.Sum("dnsstandby_mirror_dnstap_connections", nil) < 1:
			return false, "no dnstap connection from LocalDNS"
		}
		return true, ""
	})
}

// checkNSID asks nsidChecks times, each from a new socket, with the EDNS
// NSID option: every reply must come from LocalDNS.
func (n *node) checkNSID() error {
	got := map[string]int{}
	for range nsidChecks {
		m := new(dns.Msg)
		m.SetQuestion(nsidCheckName, dns.TypeA)
		m.SetEdns0(1232, false)
		opt := m.IsEdns0()
		opt.Option = append(opt.Option, &dns.EDNS0_NSID{Code: dns.EDNS0NSID})
		r, err := n.NS.Exchange("udp", "", listenAddr, m, time.Second)
		if err != nil {
			got["error: "+err.Error()]++
			continue
		}
		got[replyNSID(r)]++
	}
	if got["localdns-pod"] != nsidChecks {
		return fmt.Errorf("NSID check: %d queries, answered by %v; want all by localdns-pod", nsidChecks, got)
	}
	return nil
}

// replyNSID is the NSID of r as text ("" without one).
func replyNSID(r *dns.Msg) string {
	opt := r.IsEdns0()
	if opt == nil {
		return ""
	}
	for _, o := range opt.Option {
		if n, ok := o.(*dns.EDNS0_NSID); ok {
			b, err := hex.DecodeString(n.Nsid)
			if err != nil {
				return "bad hex " + n.Nsid
			}
			return string(b)
		}
	}
	return ""
}

// warm sends every name once, and again until a pass reaches the upstream
// no more (LocalDNS's cache holds them all), then waits until dnsstandby's
// cache shows them mirrored: at least 99% of the names (with the feed
// none, it must show less than 1%: nothing fills it).
func (n *node) warm(ctx context.Context, feed string, sb *nstest.Process) (w warmup, err error) {
	before, err := n.Metrics(ctx, standbyMetrics)
	if err != nil {
		return w, err
	}
	for w.Passes = 1; w.Passes <= warmPasses; w.Passes++ {
		if w.UpstreamLastPass, err = n.WarmPass(ctx, listenAddr, n.o.clientCPU); err != nil {
			return w, fmt.Errorf("warm-up pass %d: %w", w.Passes, err)
		}
		if w.Passes > 1 && w.UpstreamLastPass == 0 {
			break
		}
	}
	w.Passes = min(w.Passes, warmPasses)
	if w.UpstreamLastPass != 0 {
		fmt.Fprintf(os.Stderr, "warning: LocalDNS still sent %d queries upstream in warm-up pass %d\n", w.UpstreamLastPass, w.Passes)
	}
	ldm, err := n.Metrics(ctx, localDNSMetrics)
	if err != nil {
		return w, fmt.Errorf("LocalDNS %w", err)
	}
	w.LocalDNSCacheEntries = uint64(ldm.Sum("coredns_cache_entries", map[string]string{"type": "success"}))

	want := uint64(len(n.Names)) * 99 / 100
	var after testbed.Metrics
	fill := func() (bool, string) {
		s, err := n.Metrics(ctx, standbyMetrics)
		if err != nil {
			return false, err.Error()
		}
		after = s
		w.StandbyCacheEntries = uint64(s.Sum("dnsstandby_cache_entries", nil))
		return w.StandbyCacheEntries >= want, fmt.Sprintf("%d cache entries, want %d", w.StandbyCacheEntries, want)
	}
	if feed == "none" {
		time.Sleep(time.Second) // what would arrive, would have
		if _, why := fill(); after == nil {
			return w, errors.New(why)
		}
		w.Filled = w.StandbyCacheEntries < uint64(len(n.Names))/100
	} else {
		err := testbed.Poll(ctx, "dnsstandby's cache filling from the mirror", fillTimeout, sb.Done(), fill)
		if err != nil && after == nil {
			return w, err
		}
		w.Filled = err == nil
		if err != nil {
			fmt.Fprintf(os.Stderr, "warning: %v\n", err)
		}
	}
	w.RecordsAccepted = uint64(after.Sum(recordsMetric, acceptedLabels) - before.Sum(recordsMetric, acceptedLabels))
	return w, nil
}

// Metric names and labels read from dnsstandby.
const (
	recordsMetric = "dnsstandby_mirror_records_total"
	queriesMetric = "dnsstandby_queries_total"
	tapDropMetric = "dnsstandby_mirror_tap_drops_total"
	programMetric = "dnsstandby_mirror_tap_program_seconds_total"
)

var (
	acceptedLabels = map[string]string{"result": "accepted"}
	rejectedLabels = map[string]string{"result": "rejected"}
)

// snapshot samples everything a measurement compares before and after.
func (n *node) snapshot(ctx context.Context, standbyPid, localDNSPid int) (s snapshot, err error) {
	s.at = time.Now()
	if s.localDNSTicks, err = procstat.CPUTicks(localDNSPid); err != nil {
		return s, err
	}
	if s.standbyTicks, err = procstat.CPUTicks(standbyPid); err != nil {
		return s, err
	}
	if s.listenDrops, err = procstat.UDPDrops(localDNSPid, listenAddr); err != nil {
		return s, err
	}
	if s.upstream, err = n.UpstreamQueries(ctx); err != nil {
		return s, err
	}
	m, err := n.Metrics(ctx, standbyMetrics)
	if err != nil {
		return s, fmt.Errorf("dnsstandby %w", err)
	}
	s.answered = uint64(m.Sum(queriesMetric, nil))
	s.accepted = uint64(m.Sum(recordsMetric, acceptedLabels))
	s.rejected = map[string]uint64{}
	for reason, v := range m.By(recordsMetric, "reason", rejectedLabels) {
		s.rejected[reason] = uint64(v)
	}
	s.tapDrops = uint64(m.Sum(tapDropMetric, nil))
	s.programNs = m.Sum(programMetric, nil) * 1e9
	return s, nil
}

// measure runs dnsperf at the fixed rate for the duration against
// LocalDNS's address and turns the differences into a result.
func (n *node) measure(ctx context.Context, feed string, sb *nstest.Process, ld *nstest.CoreDNS, start snapshot, w warmup) (result, error) {
	run := dnsperf.Run{Server: listenAddr, QueryFile: n.QueryFile, Duration: n.o.duration,
		Outstanding: n.o.outstanding, MaxQPS: n.o.qps, CPU: n.o.clientCPU, Verbose: n.o.latency}
	var perf *exec.Cmd
	if n.o.perfDir != "" {
		var err error
		if perf, err = benchcmd.StartPerf(n.o.perfDir, feed, n.o.clientCPU, sb.Pid(), ld.Pid()); err != nil {
			return result{}, err
		}
		defer func() {
			if perf != nil {
				benchcmd.StopPerf(perf)
			}
		}()
	}
	var sched *exec.Cmd
	if n.o.schedDir != "" {
		var err error
		if sched, err = benchcmd.StartPerfSched(n.o.schedDir, feed, n.o.clientCPU, n.o.serverCPU); err != nil {
			return result{}, err
		}
		defer func() {
			if sched != nil {
				benchcmd.StopPerf(sched)
			}
		}()
	}
	before, err := n.snapshot(ctx, sb.Pid(), ld.Pid())
	if err != nil {
		return result{}, err
	}
	r, err := dnsperf.Exec(ctx, n.NS, n.Scratch, run)
	if err != nil {
		return result{}, err
	}
	after, err := n.snapshot(ctx, sb.Pid(), ld.Pid())
	if err != nil {
		return result{}, err
	}
	for pid, cpu := range n.pins(sb.Pid(), ld.Pid()) {
		if err := procstat.CheckPinned(pid, cpu); err != nil {
			return result{}, err
		}
	}
	res := newResult(feed, r, start, before, after)
	if n.o.latency {
		res.LatencySamples = len(r.Latencies)
		res.P50Us, res.P99Us = dnsperf.LatencyPercentiles(r.Latencies)
	}
	if sched != nil {
		benchcmd.StopPerf(sched)
		sched = nil
		// Read before the next round's window writes the file again.
		if res.Sched, err = readSched(ctx, benchcmd.SchedFile(n.o.schedDir, feed), sb.Pid(), ld.Pid()); err != nil {
			return result{}, err
		}
	}
	if perf != nil {
		benchcmd.StopPerf(perf)
		perf = nil
		res.Profiled = true
		// Read before the next round's window writes the file again.
		if res.LocalDNSFeedShare, err = feedShare(ctx, benchcmd.PerfFile(n.o.perfDir, feed), ld.Pid()); err != nil {
			return result{}, err
		}
	}
	res.TargetQPS, res.Target = n.o.qps, n.o.target
	res.Met = feed != "none" && res.Ratio <= n.o.target
	res.RateShort = res.QPS < 0.98*float64(n.o.qps)
	res.Warmup = w
	res.Dnsperf = strings.Join(run.Args(), " ")
	return res, nil
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// quoteEmpty spells an empty argument as two single quotes, so that the
// command line can be copied into a shell.
func quoteEmpty(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == "" {
			a = "''"
		}
		out[i] = a
	}
	return out
}
