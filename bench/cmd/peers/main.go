// Command peers measures, side by side in one run, what four DNS servers
// spend answering the same cached queries: dnsstandby, CoreDNS with its
// cache plugin, dnsdist with its packet cache, and a bare Go UDP reflector
// (the I/O floor). Each runs alone, pinned to one CPU, with dnsperf pinned
// to another, at a fixed rate and at full rate; see bench/README.md.
//
// It needs root: everything runs inside a network namespace of its own,
// which it removes on exit, on error and on SIGINT/SIGTERM.
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
	"github.com/dnsstandby/dnsstandby/bench/internal/testbed"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

// options are the command line.
type options struct {
	out       string        // peers.json
	bins      binaries      // programs the servers run
	servers   string        // comma-separated subset of servers, in run order
	duration  time.Duration // dnsperf time limit per point
	rate      int           // the fixed rate, queries per second
	fixedQ    int           // dnsperf -q at the fixed rate
	fullQ     int           // dnsperf -q at full rate
	names     int           // distinct query names
	serverCPU int           // CPU every server is pinned to
	clientCPU int           // CPU dnsperf, the upstream and this program run on
	noLatency bool          // skip dnsperf -v
	perfDir   string        // perf record each server's full-rate point into this directory
}

func parseFlags() (*options, error) {
	o := &options{}
	flag.StringVar(&o.out, "out", "bench/out/peers.json", "where to write the results (JSON array)")
	flag.StringVar(&o.bins.dnsstandby, "dnsstandby", "bench/out/bin/dnsstandby", "dnsstandby binary")
	flag.StringVar(&o.bins.reflector, "reflector", "bench/out/bin/reflector", "reflector binary (bench/cmd/reflector)")
	flag.StringVar(&o.bins.coredns, "coredns", "", "coredns binary (default: $"+nstest.CoreDNSEnv+" or bin/coredns)")
	flag.StringVar(&o.bins.dnsdist, "dnsdist", "dnsdist", "dnsdist binary")
	flag.StringVar(&o.servers, "servers", "dnsstandby,dnsstandby-batch1,coredns,dnsdist,reflector", "servers to measure, in this order")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "length of each measurement (whole seconds)")
	flag.IntVar(&o.rate, "rate", 100_000, "queries per second of the fixed-rate measurement")
	flag.IntVar(&o.fixedQ, "fixed-outstanding", 100, "dnsperf -q (outstanding queries) at the fixed rate")
	// 200 in flight keeps dnsperf, the limit at full rate on this 2-core
	// machine, busy: at ~270k qps and ~200 µs a round trip about 55 are in
	// flight. 500 added no throughput, only queueing latency and drops at
	// servers' default 208 KiB socket buffers.
	flag.IntVar(&o.fullQ, "full-outstanding", 200, "dnsperf -q (outstanding queries) at full rate")
	flag.IntVar(&o.names, "names", 1000, "distinct A names queried")
	flag.IntVar(&o.serverCPU, "server-cpu", 0, "CPU the server under test is pinned to")
	flag.IntVar(&o.clientCPU, "client-cpu", 1, "CPU dnsperf, the upstream and this program are pinned to")
	flag.BoolVar(&o.noLatency, "no-latency", false, "run dnsperf without -v (no p50/p99), to see what -v costs the client")
	flag.StringVar(&o.perfDir, "perf", "", "record each server's full-rate point with perf into this directory (perturbs the numbers)")
	flag.Parse()
	if flag.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	if err := benchcmd.CheckSplit(o.duration, o.serverCPU, o.clientCPU); err != nil {
		return nil, err
	}
	if o.names < 1 {
		return nil, errors.New("-names must be at least 1")
	}
	return o, nil
}

func main() {
	benchcmd.Main("peers", parseFlags, run)
}

func run(ctx context.Context, o *options) (err error) {
	chosen, err := pickServers(o.servers)
	if err != nil {
		return err
	}
	pre := benchcmd.Preflight{
		RootFor:  "it creates a network namespace and pins processes to CPUs",
		CPUs:     []int{o.serverCPU, o.clientCPU},
		CoreDNS:  &o.bins.coredns,
		Tools:    []string{"dnsperf", "taskset", o.bins.dnsdist},
		Packages: "dnsperf dnsdist util-linux",
		Binaries: []*string{&o.bins.dnsstandby, &o.bins.reflector, &o.bins.coredns},
		Make:     "bench-peers",
	}
	if o.perfDir != "" {
		pre.Tools = append(pre.Tools, "perf")
	}
	if err := pre.Check(); err != nil {
		return err
	}
	// This program, and the upstream it starts, stay off the server's CPU.
	if err := benchcmd.TakeClientCPU(o.clientCPU); err != nil {
		return err
	}
	st := settings{
		duration:  o.duration,
		serverCPU: o.serverCPU,
		clientCPU: o.clientCPU,
		latency:   !o.noLatency,
		perfDir:   o.perfDir,
		modes: []mode{
			{name: "fixed", maxQPS: o.rate, outstanding: o.fixedQ},
			{name: "full", maxQPS: 0, outstanding: o.fullQ},
		},
	}

	cfg := testbed.DefaultConfig()
	cfg.Name, cfg.CoreDNS, cfg.Names, cfg.UpstreamCPU = "peers", o.bins.coredns, o.names, o.clientCPU
	bed, err := testbed.New(cfg)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := bed.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("clean up: %w", cerr))
		}
	}()

	var points []point
	for _, s := range chosen {
		fmt.Printf("measuring %s on %s ...\n", s.name, s.addr)
		ps, err := measureServer(ctx, bed, o.bins, s, st)
		if err != nil {
			return err
		}
		points = append(points, ps...)
	}
	if err := benchcmd.WriteJSON(o.out, points); err != nil {
		return err
	}
	fmt.Println()
	printTable(os.Stdout, points)
	fmt.Println()
	printRatios(os.Stdout, ratios(points, st.modes))
	fmt.Printf("\nwritten to %s\n", o.out)
	return nil
}

// pickServers returns the named servers in the order given.
func pickServers(list string) ([]server, error) {
	var chosen []server
	for name := range strings.SplitSeq(list, ",") {
		i := slices.IndexFunc(servers, func(s server) bool { return s.name == strings.TrimSpace(name) })
		if i < 0 {
			return nil, fmt.Errorf("-servers: unknown server %q", name)
		}
		chosen = append(chosen, servers[i])
	}
	return chosen, nil
}
