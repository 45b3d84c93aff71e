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
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/dnsstandby/dnsstandby/bench/internal/procstat"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"golang.org/x/sys/unix"
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
	if o.duration < time.Second || o.duration%time.Second != 0 {
		return nil, fmt.Errorf("-duration %v: want whole seconds, at least 1 (dnsperf -l)", o.duration)
	}
	if o.serverCPU == o.clientCPU {
		return nil, errors.New("-server-cpu and -client-cpu must differ")
	}
	if o.names < 1 {
		return nil, errors.New("-names must be at least 1")
	}
	return o, nil
}

func main() {
	o, err := parseFlags()
	if err != nil {
		fmt.Fprintf(os.Stderr, "peers: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintf(os.Stderr, "peers: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o *options) (err error) {
	chosen, err := pickServers(o.servers)
	if err != nil {
		return err
	}
	if err := preflight(o); err != nil {
		return err
	}
	// This program, and the upstream it starts, stay off the server's CPU.
	if err := procstat.Pin(os.Getpid(), o.clientCPU); err != nil {
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
	if load, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Printf("load average before the run: %s", load)
	}

	l, closeLab, err := newLab(o.bins.coredns, o.names, o.clientCPU)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := closeLab(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("clean up: %w", cerr))
		}
	}()

	var points []point
	for _, s := range chosen {
		fmt.Printf("measuring %s on %s ...\n", s.name, s.addr)
		ps, err := measureServer(ctx, l, o.bins, s, st)
		if err != nil {
			return err
		}
		points = append(points, ps...)
	}
	if err := writeJSON(o.out, points); err != nil {
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

// preflight checks what the run needs before creating anything, so that a
// missing tool says so at once instead of after a minute of measuring.
func preflight(o *options) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root: it creates a network namespace and pins processes to CPUs")
	}
	var allowed unix.CPUSet
	if err := unix.SchedGetaffinity(0, &allowed); err != nil {
		return fmt.Errorf("CPU affinity: %w", err)
	}
	for _, cpu := range []int{o.serverCPU, o.clientCPU} {
		if !allowed.IsSet(cpu) {
			return fmt.Errorf("CPU %d is not available to this process (it may use %d CPUs)", cpu, allowed.Count())
		}
	}
	if o.bins.coredns == "" {
		p, err := nstest.FindCoreDNS()
		if err != nil {
			return err
		}
		o.bins.coredns = p
	}
	tools := []string{"dnsperf", "taskset", o.bins.dnsdist}
	if o.perfDir != "" {
		tools = append(tools, "perf")
	}
	for _, t := range tools {
		if _, err := exec.LookPath(t); err != nil {
			return fmt.Errorf("%s: %w (Debian: apt-get install dnsperf dnsdist util-linux)", t, err)
		}
	}
	for _, p := range []*string{&o.bins.dnsstandby, &o.bins.reflector, &o.bins.coredns} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return err
		}
		if _, err := os.Stat(abs); err != nil {
			return fmt.Errorf("%w (`make bench-peers` builds it)", err)
		}
		*p = abs
	}
	return nil
}
