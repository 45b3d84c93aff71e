// Command mirrorcost measures what dnsstandby's mirror feed costs beside
// LocalDNS (issue 6: "at 20k qps of LocalDNS traffic, dnsstandby's CPU in
// mirror mode is at most 15% of LocalDNS's CPU for the same traffic").
//
// In a network namespace of its own it runs an upstream CoreDNS (the
// kube-dns stand-in), LocalDNS (CoreDNS 1.13.1 with the AKS pod block) on
// 169.254.10.11:53 and dnsstandby on the same address with --steering
// adopt, so that LocalDNS answers every query and dnsstandby only mirrors.
// For each mirror feed (tap, dnstap, none) it starts a fresh pair, warms
// both caches, sends a fixed query rate for a fixed time, and compares the
// two processes' CPU. LocalDNS and dnsstandby share one CPU, dnsperf has
// the other. See bench/README.md.
//
// It needs root, and removes the namespace on exit, on error and on
// SIGINT/SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/dnsstandby/dnsstandby/bench/internal/benchcmd"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

// options are the command line.
type options struct {
	out         string        // mirror.json
	coredns     string        // CoreDNS binary (upstream and LocalDNS)
	dnsstandby  string        // dnsstandby binary
	mirrors     string        // comma-separated feeds, in run order
	rounds      int           // how many times the feeds are measured, in turn
	qps         int           // dnsperf -Q of the measurement
	outstanding int           // dnsperf -q of the measurement
	duration    time.Duration // dnsperf -l of the measurement
	names       int           // distinct names served and queried
	serverCPU   int           // CPU LocalDNS (and dnsstandby, unless standbyCPU) is pinned to
	standbyCPU  int           // CPU dnsstandby is pinned to; -1: serverCPU
	clientCPU   int           // CPU dnsperf, the upstream and this program run on
	target      float64       // the ratio dnsstandby ÷ LocalDNS must not exceed
	perfDir     string        // perf record both servers during each measurement into this directory
	latency     bool          // dnsperf -v: each answer's latency, for p50 and p99
	schedDir    string        // perf sched record the servers' CPU during each measurement into this directory
}

func parseFlags() (*options, error) {
	o := &options{}
	flag.StringVar(&o.out, "out", "bench/out/mirror.json", "where to write the results (JSON array, one object per mirror feed)")
	flag.StringVar(&o.coredns, "coredns", "", "coredns binary (default: $"+nstest.CoreDNSEnv+" or bin/coredns)")
	flag.StringVar(&o.dnsstandby, "dnsstandby", "bench/out/bin/dnsstandby", "dnsstandby binary")
	flag.StringVar(&o.mirrors, "mirrors", "tap,dnstap,none", "mirror feeds to measure, in this order: tap (with hedging, the default: the tap also reads every query; in ring mode), "+tapNoHedge+" (--hedge=false), "+tapPacket+" (--tap-ring=false: the packet socket reads every query and reply), dnstap, none")
	flag.IntVar(&o.qps, "qps", 20_000, "queries per second sent to LocalDNS while measuring (dnsperf -Q)")
	flag.IntVar(&o.outstanding, "outstanding", 100, "dnsperf -q (outstanding queries) while measuring")
	flag.DurationVar(&o.duration, "duration", 20*time.Second, "length of each measurement (whole seconds)")
	flag.IntVar(&o.names, "names", 5000, "distinct A names the upstream serves and the load asks for")
	flag.IntVar(&o.serverCPU, "server-cpu", 0, "CPU LocalDNS and dnsstandby are pinned to")
	flag.IntVar(&o.standbyCPU, "standby-cpu", -1, "CPU dnsstandby is pinned to; -1: LocalDNS's (-server-cpu). A CPU of its own shows what dnsstandby costs LocalDNS through the kernel alone, not through sharing its CPU; the client's CPU also mixes in what dnsstandby does to the load")
	flag.IntVar(&o.clientCPU, "client-cpu", 1, "CPU dnsperf, the upstream and this program are pinned to")
	flag.Float64Var(&o.target, "target", 0.15, "the most dnsstandby's CPU may be, as a fraction of LocalDNS's")
	flag.IntVar(&o.rounds, "rounds", 1, "measure the feeds this many times over (every other round in reverse order; each round's feeds but dnstap beside one LocalDNS process, dnstap last with its own), and report each feed's medians: LocalDNS's own CPU per query moves by several percent from one measurement to the next")
	flag.StringVar(&o.perfDir, "perf", "", "record dnsstandby and LocalDNS with perf during each measurement into DIR/FEED.perf.data, and count LocalDNS's samples in the feeds' code (perturbs the numbers)")
	flag.BoolVar(&o.latency, "latency", false, "run dnsperf with -v and report each feed's p50 and p99 answer latency, and the p99 over the round's baseline (dnsperf then does more on its own CPU; the servers' does not change)")
	flag.StringVar(&o.schedDir, "sched", "", "record the scheduling of LocalDNS's CPU with perf sched during each measurement into DIR/FEED.sched.data, and report how long dnsstandby held that CPU at a time and how long LocalDNS's threads waited for it (perturbs the numbers)")
	flag.Parse()
	if flag.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	if err := benchcmd.CheckSplit(o.duration, o.serverCPU, o.clientCPU); err != nil {
		return nil, err
	}
	if o.standbyCPU < 0 {
		o.standbyCPU = o.serverCPU
	}
	if o.names < 1 || o.qps < 1 || o.outstanding < 1 || o.rounds < 1 {
		return nil, errors.New("-names, -qps, -outstanding and -rounds must be at least 1")
	}
	return o, nil
}

func main() {
	benchcmd.Main("mirrorcost", parseFlags, run)
}

func run(ctx context.Context, o *options) (err error) {
	feeds, err := parseMirrors(o.mirrors)
	if err != nil {
		return err
	}
	pre := benchcmd.Preflight{
		RootFor:  "it creates a network namespace, pins processes to CPUs, and dnsstandby steers with eBPF",
		CPUs:     []int{o.serverCPU, o.standbyCPU, o.clientCPU},
		CoreDNS:  &o.coredns,
		Tools:    []string{"dnsperf", "taskset"},
		Packages: "dnsperf util-linux",
		Binaries: []*string{&o.dnsstandby, &o.coredns},
		Make:     "bench-mirror",
	}
	if o.perfDir != "" || o.schedDir != "" {
		pre.Tools = append(pre.Tools, "perf")
	}
	if err := pre.Check(); err != nil {
		return err
	}
	// This program, and the upstream it starts, stay off the servers' CPU.
	if err := benchcmd.TakeClientCPU(o.clientCPU); err != nil {
		return err
	}
	n, err := newNode(o)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := n.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("clean up: %w", cerr))
		}
	}()

	var results []result
	for round := 1; round <= o.rounds; round++ {
		// Every other round in reverse order, so that a drift over the run
		// (the machine, LocalDNS's heap) does not always favour one feed.
		order := slices.Clone(feeds)
		if round%2 == 0 {
			slices.Reverse(order)
		}
		rs, err := n.measureRound(ctx, round, order)
		if err != nil {
			return err
		}
		results = append(results, rs...)
	}
	if err := benchcmd.WriteJSON(o.out, results); err != nil {
		return err
	}
	fmt.Println()
	printTable(os.Stdout, results, o.target)
	fmt.Printf("\nwritten to %s\n", o.out)
	return nil
}

// tapNoHedge is the tap without hedging: replies only, as before the tap
// also read the queries LocalDNS receives.
const tapNoHedge = "tap-nohedge"

// tapPacket is the tap with hedging and without ring mode: its packet
// socket reads every query and reply, as before ring mode.
const tapPacket = "tap-packet"

// isTap reports whether feed is one of the tap's.
func isTap(feed string) bool { return feed == "tap" || feed == tapNoHedge || feed == tapPacket }

// parseMirrors reads -mirrors.
func parseMirrors(list string) ([]string, error) {
	var feeds []string
	for f := range strings.SplitSeq(list, ",") {
		f = strings.TrimSpace(f)
		switch f {
		case "tap", tapNoHedge, tapPacket, "dnstap", "none":
		default:
			return nil, fmt.Errorf("-mirrors: unknown feed %q (tap, %s, %s, dnstap, none)", f, tapNoHedge, tapPacket)
		}
		for _, g := range feeds {
			if g == f {
				return nil, fmt.Errorf("-mirrors: %q twice", f)
			}
		}
		feeds = append(feeds, f)
	}
	return feeds, nil
}
