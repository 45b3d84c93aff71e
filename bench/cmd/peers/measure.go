package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/dnsstandby/dnsstandby/bench/internal/benchcmd"
	"github.com/dnsstandby/dnsstandby/bench/internal/dnsperf"
	"github.com/dnsstandby/dnsstandby/bench/internal/procstat"
	"github.com/dnsstandby/dnsstandby/bench/internal/testbed"
)

// mode is one way of driving dnsperf at a server.
type mode struct {
	name        string // "fixed" or "full"
	maxQPS      int    // dnsperf -Q; 0: as fast as it can
	outstanding int    // dnsperf -q
}

// point is one server measured in one mode: a row of the table and an
// object of peers.json.
type point struct {
	Name  string  `json:"name"`
	Mode  string  `json:"mode"`
	QPS   float64 `json:"qps"`              // answers per second (dnsperf's "Queries per second")
	CPUUs float64 `json:"cpu_us_per_query"` // server utime+stime over the window ÷ answers
	P50Us uint32  `json:"p50_us"`           // latency percentiles of the answered queries (dnsperf -v)
	P99Us uint32  `json:"p99_us"`
	Lost  uint64  `json:"lost"` // sent − answered: dnsperf waits up to its timeout for late answers

	Sent            uint64  `json:"sent"`
	Answered        uint64  `json:"answered"`
	NotNoerror      uint64  `json:"answers_not_noerror"`
	OtherRcodes     string  `json:"other_rcodes,omitempty"` // e.g. "SERVFAIL 3"
	RxDrops         uint64  `json:"rx_drops"`               // queries the kernel dropped at the server's full socket buffer
	ClientRxDrops   uint64  `json:"client_rx_drops"`        // answers dropped at other sockets in the namespace: dnsperf's
	ServerCPUPct    float64 `json:"server_cpu_pct"`         // server process CPU over the window, % of one core
	ClientCPUPct    float64 `json:"client_cpu_pct"`         // dnsperf's CPU over its life, % of one core
	UpstreamQueries uint64  `json:"upstream_queries"`       // A queries that reached the upstream during the window (cache misses)
	LatencySamples  int     `json:"latency_samples"`        // answers whose latency went into p50/p99
	Seconds         float64 `json:"seconds"`                // dnsperf's run time
	Profiled        bool    `json:"profiled,omitempty"`     // perf record ran beside it: numbers perturbed
	Dnsperf         string  `json:"dnsperf"`                // the command line
}

// settings are the measurement parameters from the command line.
type settings struct {
	duration  time.Duration
	modes     []mode
	serverCPU int
	clientCPU int
	latency   bool   // dnsperf -v for per-answer latencies
	perfDir   string // if set, perf record each server's full-rate point here
}

// warmPasses bounds the passes over the query file before measuring: one
// fills every cache; the next must reach the upstream zero times.
const warmPasses = 3

// measureServer starts s, warms its cache, measures it in every mode and
// stops it.
func measureServer(ctx context.Context, bed *testbed.Bed, b binaries, s server, st settings) (points []point, err error) {
	inst, err := launch(ctx, bed, b, s, st.serverCPU)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := inst.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("stop %s: %w", s.name, cerr)
		}
	}()
	// A failing server's own output usually says why; an interrupted one's
	// does not.
	withOutput := func(what string, err error) error {
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return fmt.Errorf("%s: %w\noutput:\n%s", what, err, inst.Output())
	}
	if err := warm(ctx, bed, s, st); err != nil {
		return nil, withOutput(s.name, err)
	}
	for _, m := range st.modes {
		p, err := measure(ctx, bed, s, inst, m, st)
		if err != nil {
			return nil, withOutput(s.name+", "+m.name+" rate", err)
		}
		points = append(points, p)
	}
	return points, nil
}

// warm sends every query name once, and again until a pass reaches the
// upstream no more (at most warmPasses): from then on every query of the
// measurement is a cache hit.
func warm(ctx context.Context, bed *testbed.Bed, s server, st settings) error {
	for pass := 1; pass <= warmPasses; pass++ {
		upstream, err := bed.WarmPass(ctx, s.addr, st.clientCPU)
		if err != nil {
			return fmt.Errorf("warm-up pass %d: %w", pass, err)
		}
		if !s.caches || (pass > 1 && upstream == 0) {
			return nil
		}
	}
	fmt.Fprintf(os.Stderr, "warning: %s still sends queries upstream after %d warm-up passes\n", s.name, warmPasses)
	return nil
}

// counters are what is sampled before and after a measurement.
type counters struct {
	at       time.Time
	server   uint64 // server process ticks
	drops    uint64 // at the server's socket
	nsDrops  uint64 // at every UDP socket in the namespace
	upstream uint64
}

func sample(ctx context.Context, bed *testbed.Bed, s server, pid int) (c counters, err error) {
	c.at = time.Now()
	if c.server, err = procstat.CPUTicks(pid); err != nil {
		return c, err
	}
	if c.drops, err = procstat.UDPDrops(pid, s.addr); err != nil {
		return c, err
	}
	if c.nsDrops, err = procstat.UDPRcvbufErrors(pid); err != nil {
		return c, err
	}
	c.upstream, err = bed.UpstreamQueries(ctx)
	return c, err
}

// measure runs dnsperf at s in mode m for st.duration and turns the
// counters' differences into a point.
func measure(ctx context.Context, bed *testbed.Bed, s server, inst instance, m mode, st settings) (point, error) {
	run := dnsperf.Run{Server: s.addr, QueryFile: bed.QueryFile, Duration: st.duration,
		Outstanding: m.outstanding, MaxQPS: m.maxQPS, Verbose: st.latency, CPU: st.clientCPU}
	var perf *exec.Cmd
	if st.perfDir != "" && m.maxQPS == 0 {
		var err error
		if perf, err = benchcmd.StartPerf(st.perfDir, s.name, st.clientCPU, inst.Pid()); err != nil {
			return point{}, err
		}
		defer benchcmd.StopPerf(perf)
	}
	before, err := sample(ctx, bed, s, inst.Pid())
	if err != nil {
		return point{}, err
	}
	res, err := dnsperf.Exec(ctx, bed.NS, bed.Scratch, run)
	if err != nil {
		return point{}, err
	}
	after, err := sample(ctx, bed, s, inst.Pid())
	if err != nil {
		return point{}, err
	}
	if err := procstat.CheckPinned(inst.Pid(), st.serverCPU); err != nil {
		return point{}, err
	}
	p := newPoint(s.name, m.name, res, before, after)
	p.Dnsperf = strings.Join(run.Args(), " ")
	p.Profiled = perf != nil
	return p, nil
}

// newPoint computes a point from dnsperf's result and the counters around it.
func newPoint(name, mode string, res *dnsperf.Result, before, after counters) point {
	p := point{
		Name: name, Mode: mode, QPS: res.QPS, Lost: res.Lost,
		Sent: res.Sent, Answered: res.Completed,
		RxDrops:         after.drops - before.drops,
		ClientRxDrops:   (after.nsDrops - before.nsDrops) - min(after.nsDrops-before.nsDrops, after.drops-before.drops),
		UpstreamQueries: after.upstream - before.upstream,
		LatencySamples:  len(res.Latencies),
		Seconds:         res.RunTime.Seconds(),
	}
	p.NotNoerror = res.Completed - res.Rcodes["NOERROR"]
	var other []string
	for rc, n := range res.Rcodes {
		if rc != "NOERROR" {
			other = append(other, rc+" "+strconv.FormatUint(n, 10))
		}
	}
	p.OtherRcodes = strings.Join(other, ", ")
	if res.Completed > 0 {
		p.CPUUs = float64(after.server-before.server) * procstat.UsPerTick / float64(res.Completed)
	}
	if window := after.at.Sub(before.at); window > 0 {
		p.ServerCPUPct = 100 * float64(after.server-before.server) * procstat.UsPerTick / float64(window.Microseconds())
	}
	if res.ClientWall > 0 {
		p.ClientCPUPct = 100 * res.ClientCPU.Seconds() / res.ClientWall.Seconds()
	}
	p.P50Us, p.P99Us = dnsperf.LatencyPercentiles(res.Latencies)
	return p
}
