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
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/dnsstandby/dnsstandby/bench/internal/procstat"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"golang.org/x/sys/unix"
)

// options are the command line.
type options struct {
	out         string        // mirror.json
	coredns     string        // CoreDNS binary (upstream and LocalDNS)
	dnsstandby  string        // dnsstandby binary
	mirrors     string        // comma-separated feeds, in run order
	qps         int           // dnsperf -Q of the measurement
	outstanding int           // dnsperf -q of the measurement
	duration    time.Duration // dnsperf -l of the measurement
	names       int           // distinct names served and queried
	serverCPU   int           // CPU LocalDNS and dnsstandby share
	clientCPU   int           // CPU dnsperf, the upstream and this program run on
	target      float64       // the ratio dnsstandby ÷ LocalDNS must not exceed
	perfDir     string        // perf record both servers during each measurement into this directory
}

func parseFlags() (*options, error) {
	o := &options{}
	flag.StringVar(&o.out, "out", "bench/out/mirror.json", "where to write the results (JSON array, one object per mirror feed)")
	flag.StringVar(&o.coredns, "coredns", "", "coredns binary (default: $"+nstest.CoreDNSEnv+" or bin/coredns)")
	flag.StringVar(&o.dnsstandby, "dnsstandby", "bench/out/bin/dnsstandby", "dnsstandby binary")
	flag.StringVar(&o.mirrors, "mirrors", "tap,dnstap,none", "mirror feeds to measure, in this order: tap, dnstap, none")
	flag.IntVar(&o.qps, "qps", 20_000, "queries per second sent to LocalDNS while measuring (dnsperf -Q)")
	flag.IntVar(&o.outstanding, "outstanding", 100, "dnsperf -q (outstanding queries) while measuring")
	flag.DurationVar(&o.duration, "duration", 20*time.Second, "length of each measurement (whole seconds)")
	flag.IntVar(&o.names, "names", 5000, "distinct A names the upstream serves and the load asks for")
	flag.IntVar(&o.serverCPU, "server-cpu", 0, "CPU LocalDNS and dnsstandby are pinned to")
	flag.IntVar(&o.clientCPU, "client-cpu", 1, "CPU dnsperf, the upstream and this program are pinned to")
	flag.Float64Var(&o.target, "target", 0.15, "the most dnsstandby's CPU may be, as a fraction of LocalDNS's")
	flag.StringVar(&o.perfDir, "perf", "", "record dnsstandby and LocalDNS with perf during each measurement into DIR/FEED.perf.data (perturbs the numbers)")
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
	if o.names < 1 || o.qps < 1 || o.outstanding < 1 {
		return nil, errors.New("-names, -qps and -outstanding must be at least 1")
	}
	return o, nil
}

func main() {
	o, err := parseFlags()
	if err != nil {
		fmt.Fprintf(os.Stderr, "mirrorcost: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintf(os.Stderr, "mirrorcost: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o *options) (err error) {
	feeds, err := parseMirrors(o.mirrors)
	if err != nil {
		return err
	}
	if err := preflight(o); err != nil {
		return err
	}
	// This program, and the upstream it starts, stay off the servers' CPU.
	if err := procstat.Pin(os.Getpid(), o.clientCPU); err != nil {
		return err
	}
	if load, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Printf("load average before the run: %s", load)
	}
	n, closeNode, err := newNode(o)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := closeNode(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("clean up: %w", cerr))
		}
	}()

	var results []result
	for _, f := range feeds {
		fmt.Printf("measuring --mirror %s ...\n", f)
		r, err := n.measureFeed(ctx, f)
		if err != nil {
			return fmt.Errorf("--mirror %s: %w", f, err)
		}
		results = append(results, r)
	}
	if err := writeJSON(o.out, results); err != nil {
		return err
	}
	fmt.Println()
	printTable(os.Stdout, results, o.target)
	fmt.Printf("\nwritten to %s\n", o.out)
	return nil
}

// parseMirrors reads -mirrors.
func parseMirrors(list string) ([]string, error) {
	var feeds []string
	for f := range strings.SplitSeq(list, ",") {
		f = strings.TrimSpace(f)
		switch f {
		case "tap", "dnstap", "none":
		default:
			return nil, fmt.Errorf("-mirrors: unknown feed %q (tap, dnstap, none)", f)
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

// preflight checks what the run needs before creating anything.
func preflight(o *options) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root: it creates a network namespace, pins processes to CPUs, and dnsstandby steers with eBPF")
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
	if o.coredns == "" {
		p, err := nstest.FindCoreDNS()
		if err != nil {
			return err
		}
		o.coredns = p
	}
	tools := []string{"dnsperf", "taskset"}
	if o.perfDir != "" {
		tools = append(tools, "perf")
	}
	for _, t := range tools {
		if _, err := exec.LookPath(t); err != nil {
			return fmt.Errorf("%s: %w (Debian: apt-get install dnsperf util-linux)", t, err)
		}
	}
	for _, p := range []*string{&o.dnsstandby, &o.coredns} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return err
		}
		if _, err := os.Stat(abs); err != nil {
			return fmt.Errorf("%w (`make bench-mirror` builds it)", err)
		}
		*p = abs
	}
	return nil
}
