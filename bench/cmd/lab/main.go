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

	"github.com/dnsstandby/dnsstandby/bench/lab"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

type options struct {
	scenarios string  // comma-separated names, or "all"
	setups    string  // comma-separated setups
	outDir    string  // where lab.json, lab.md and the pictures go
	qps       int     // load per node
	scale     float64 // multiplies baseline and observation times
	bins      binaries
}

func parseFlags() *options {
	o := &options{}
	flag.StringVar(&o.scenarios, "scenario", "all", "scenarios to run, comma-separated, or all")
	flag.StringVar(&o.outDir, "out", "bench/out", "output directory")
	flag.StringVar(&o.setups, "setups", strings.Join(defaultSetups, ","), "setups to run side by side, comma-separated: "+strings.Join(knownSetups, ", "))
	flag.IntVar(&o.qps, "qps", 2000, "queries per second each pod sends")
	flag.Float64Var(&o.scale, "scale", 1, "multiply every scenario's baseline and observation time by this (the faults' own timings are kept); a smoke run uses a small one")
	flag.StringVar(&o.bins.coredns, "coredns", "", "coredns binary (default: $"+nstest.CoreDNSEnv+" or bin/coredns)")
	flag.StringVar(&o.bins.dnsstandby, "dnsstandby", "bench/out/bin/dnsstandby", "dnsstandby binary")
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
	if err := os.MkdirAll(o.outDir, 0o755); err != nil {
		return err
	}
	// 5,000 services: the pods' name mix is big enough that a cache holds
	// it only if it was filled (the mirror issue's double-fault asks for
	// 5,000 distinct names); the load goes round the mix in order.
	zones := nstest.KubeDNSZones(nstest.ZoneOptions{Services: 5000, Namespaces: []string{"default", "kube-system", "shop"}})
	mix := nameMix(zones)

	var chosen []string
	for _, s := range strings.Split(o.setups, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(knownSetups, s) {
			return fmt.Errorf("unknown setup %q: want %s", s, strings.Join(knownSetups, ", "))
		}
		chosen = append(chosen, s)
	}

	var runs []lab.LabRun
	for _, sc := range list {
		setups := chosen
		if sc.standbyOnly {
			setups = slices.DeleteFunc(slices.Clone(chosen), func(s string) bool { return !isStandby(s) })
		}
		if len(setups) == 0 {
			continue
		}
		fmt.Printf("%s: %s ...\n", sc.name, sc.note)
		got, err := runScenario(ctx, sc, setups, o, zones, mix)
		if err != nil {
			return fmt.Errorf("%s: %w", sc.name, err)
		}
		runs = append(runs, got...)
		for _, r := range got {
			fmt.Printf("  %-18s sent %6d  first try %6d  after retry %5d  unanswered %5d  max gap %6.0f ms\n",
				r.Setup, r.Summary.Sent, r.Summary.AnsweredFirstTry, r.Summary.AnsweredAfterRetry, r.Summary.Unanswered, r.Summary.MaxGapMs)
		}
		if err := lab.PlotTimeline(filepath.Join(o.outDir, "timeline-"+sc.name+".svg"), sc.name, got); err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	if err := lab.WriteLabJSON(filepath.Join(o.outDir, "lab.json"), version, runs); err != nil {
		return err
	}
	if err := lab.WriteLabMarkdown(filepath.Join(o.outDir, "lab.md"), runs); err != nil {
		return err
	}
	fmt.Printf("written to %s/lab.json, lab.md and timeline-*.svg\n", o.outDir)
	return nil
}

// runScenario builds a node per setup, runs load and fault on all of them
// at once, and tears everything down.
func runScenario(ctx context.Context, sc scenario, setups []string, o *options, zones *nstest.Zones, mix []lab.LoadName) (runs []lab.LabRun, err error) {
	tops, err := buildAll(ctx, sc.name, setups, o.bins, zones)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, closeAll(tops)) }()

	scale := func(d time.Duration) time.Duration { return time.Duration(float64(d) * o.scale) }
	type live struct {
		load  *lab.Load
		probe *lab.GlibcProbe
		ev    *events
		down  *downTracker
	}
	lives := make([]live, len(tops))
	for i, t := range tops {
		load, err := lab.StartLoad(ctx, lab.LoadConfig{NS: t.pod, Server: netip.MustParseAddrPort(localDNS + ":53"), QPS: o.qps, Names: mix})
		if err != nil {
			return nil, fmt.Errorf("%s: load: %w", t.setup, err)
		}
		probe, err := lab.StartGlibcProbe(ctx, t.pod, zones.Services[1].FQDN, 200*time.Millisecond)
		if err != nil {
			load.Stop()
			return nil, fmt.Errorf("%s: glibc probe: %w", t.setup, err)
		}
		lives[i] = live{load: load, probe: probe, ev: &events{start: load.Start()}, down: startDownTracker(ctx, t, load.Start())}
	}
	sleep(ctx, scale(sc.baseline))

	var wg sync.WaitGroup
	errs := make([]error, len(tops))
	for i, t := range tops {
		wg.Go(func() { errs[i] = sc.fault(ctx, t, lives[i].ev) })
	}
	wg.Wait()
	sleep(ctx, scale(sc.observe))

	// Stop all at once: a glibc lookup still running in an outage takes up
	// to its resolver timeout to finish.
	runs = make([]lab.LabRun, len(tops))
	for i, t := range tops {
		wg.Go(func() {
			down := lives[i].down.stop() // first: the shading ends with the load
			res := lives[i].load.Stop()
			pr := lives[i].probe.Stop()
			run := lab.NewLabRun(sc.name, t.setup, res, pr)
			run.Down = down
			run.Events = lives[i].ev.list()
			run.Note = sc.note
			if errs[i] != nil {
				run.Note += "; fault error: " + errs[i].Error()
			}
			for _, note := range []string{warmNote(res, run.Events, down), restartNote(res, run.Events, t)} {
				if note != "" {
					run.Note += "; " + note
				}
			}
			runs[i] = run
		})
	}
	wg.Wait()
	return runs, ctx.Err()
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

// events records the fault's marks, relative to the run's start.
type events struct {
	start time.Time
	mu    sync.Mutex
	marks []lab.Event
}

func (e *events) mark(label string) {
	e.mu.Lock()
	e.marks = append(e.marks, lab.Event{At: time.Since(e.start), Label: label})
	e.mu.Unlock()
}

func (e *events) list() []lab.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]lab.Event(nil), e.marks...)
}

// downTracker polls LocalDNS's unit state and records when it was not
// active, for the timelines' shading.
type downTracker struct {
	cancel context.CancelFunc
	done   chan []lab.Interval
}

func startDownTracker(ctx context.Context, t *topology, start time.Time) *downTracker {
	ctx, cancel := context.WithCancel(ctx)
	d := &downTracker{cancel: cancel, done: make(chan []lab.Interval, 1)}
	go func() {
		var out []lab.Interval
		var downSince time.Duration = -1
		var state string
		for ctx.Err() == nil {
			st, err := t.guest.Show(ctx, localDNSUnit, "ActiveState")
			now := time.Since(start)
			if err == nil {
				state = st["ActiveState"]
				if state != "active" && downSince < 0 {
					downSince = now
				} else if state == "active" && downSince >= 0 {
					out = append(out, lab.Interval{From: downSince, To: now, Label: "LocalDNS not active"})
					downSince = -1
				}
			}
			sleep(ctx, 200*time.Millisecond)
		}
		if downSince >= 0 {
			out = append(out, lab.Interval{From: downSince, To: time.Since(start), Label: "LocalDNS " + state})
		}
		d.done <- out
	}()
	return d
}

func (d *downTracker) stop() []lab.Interval {
	d.cancel()
	return <-d.done
}
