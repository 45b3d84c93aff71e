// Package dnsperf runs dnsperf (DNS-OARC's, 2.10) pinned to a CPU inside a
// network namespace and parses what it reports.
package dnsperf

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dnsstandby/dnsstandby/bench/internal/stats"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

// Run is one dnsperf invocation.
type Run struct {
	Server      string        // ADDR:PORT
	QueryFile   string        // "NAME TYPE" lines
	Duration    time.Duration // -l; 0 means one pass through the file (-n 1)
	Outstanding int           // -q
	MaxQPS      int           // -Q; 0 means as fast as it can
	Verbose     bool          // -v: one line per answer, with its latency
	CPU         int           // taskset -c
}

// timeout is -t: an answer later than this counts as lost. Every
// server here answers from memory in microseconds, and even at full rate
// with Outstanding queries queued the wait is milliseconds; the default 5 s
// would only make each run wait longer for answers that never come.
const timeout = "1"

// bufferKB is -b, dnsperf's socket buffer size. Without it dnsperf
// keeps the system default (208 KiB here), and replies that arrive in a burst
// (sendmmsg batches, or 500 outstanding at full rate) overflow it: dnsperf
// would count its own drops as the server's lost queries. The kernel caps the
// size at net.core.rmem_max (4 MiB here).
const bufferKB = "2048"

// Args is dnsperf's command line, taskset in front.
func (r Run) Args() []string {
	host, port, _ := strings.Cut(r.Server, ":")
	a := []string{"taskset", "-c", strconv.Itoa(r.CPU), "dnsperf",
		"-s", host, "-p", port, "-d", r.QueryFile,
		"-c", "1", "-T", "1", // one socket, one send and one receive thread
		"-b", bufferKB, "-t", timeout, "-q", strconv.Itoa(r.Outstanding)}
	if r.Duration > 0 {
		a = append(a, "-l", strconv.Itoa(int(r.Duration/time.Second)))
	} else {
		a = append(a, "-n", "1")
	}
	if r.MaxQPS > 0 {
		a = append(a, "-Q", strconv.Itoa(r.MaxQPS))
	}
	if r.Verbose {
		a = append(a, "-v")
	}
	return a
}

// Result is what one run reported.
type Result struct {
	Sent, Completed, Lost uint64
	RunTime               time.Duration
	QPS                   float64
	Rcodes                map[string]uint64 // "NOERROR" → count
	Latencies             []uint32          // µs, one per answer (Verbose only)
	ClientCPU             time.Duration     // dnsperf's own user+system time
	ClientWall            time.Duration     // dnsperf's whole life, its wait for late answers included
}

// Exec runs dnsperf in ns to completion; its output goes to a temporary
// file in scratch (best a tmpfs), removed afterwards. Its output
// goes to a file, not a pipe: with -v it is a line per answer, and parsing
// it while dnsperf runs would take CPU from dnsperf's own core.
func Exec(ctx context.Context, ns *nstest.Namespace, scratch string, r Run) (*Result, error) {
	out, err := os.CreateTemp(scratch, "dnsperf-*.out")
	if err != nil {
		return nil, fmt.Errorf("dnsperf: %w", err)
	}
	defer os.Remove(out.Name())
	defer out.Close()

	args := r.Args()
	var stderr bytes.Buffer
	cmd := ns.Command(ctx, args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = out, &stderr
	start := time.Now()
	err = cmd.Run()
	wall := time.Since(start)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	if _, err := out.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("dnsperf output: %w", err)
	}
	res, err := Parse(out)
	if err != nil {
		return nil, fmt.Errorf("%s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	// ip netns exec and taskset exec dnsperf in their own place: the
	// process's resource usage is dnsperf's.
	res.ClientCPU = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	res.ClientWall = wall
	return res, nil
}

// Parse reads dnsperf's output: the "> RCODE NAME TYPE SECONDS" lines
// of -v ("> T NAME TYPE" for a query that timed out) and the statistics
// block at the end.
func Parse(r io.Reader) (*Result, error) {
	res := &Result{Rcodes: map[string]uint64{}}
	seen := map[string]bool{}
	s := bufio.NewScanner(r)
	for s.Scan() {
		line := s.Text()
		if strings.HasPrefix(line, "> T ") {
			continue // timed out: lost, no latency
		}
		if strings.HasPrefix(line, "> ") {
			us, err := parseVerboseLatency(line)
			if err != nil {
				return nil, err
			}
			res.Latencies = append(res.Latencies, us)
			continue
		}
		key, val, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		val = strings.TrimSpace(val)
		var err error
		switch key {
		case "Queries sent":
			res.Sent, err = firstUint(val)
		case "Queries completed":
			res.Completed, err = firstUint(val)
		case "Queries lost":
			res.Lost, err = firstUint(val)
		case "Run time (s)":
			var sec float64
			sec, err = strconv.ParseFloat(val, 64)
			res.RunTime = time.Duration(sec * float64(time.Second))
		case "Queries per second":
			res.QPS, err = strconv.ParseFloat(val, 64)
		case "Response codes":
			res.Rcodes, err = parseRcodes(val)
		default:
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("parse dnsperf %q: %w", line, err)
		}
		seen[key] = true
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("read dnsperf output: %w", err)
	}
	for _, k := range []string{"Queries sent", "Queries completed", "Queries lost", "Run time (s)", "Queries per second"} {
		if !seen[k] {
			return nil, fmt.Errorf("dnsperf output has no %q line", k)
		}
	}
	return res, nil
}

// parseVerboseLatency returns the latency, in µs, of a -v line such as
// "> NOERROR svc-1.default.svc.cluster.local A 0.000123". dnsperf prints it
// as seconds with exactly six decimals: microseconds, exactly.
func parseVerboseLatency(line string) (uint32, error) {
	f := strings.Fields(line)
	if len(f) < 3 {
		return 0, fmt.Errorf("parse dnsperf -v line %q: too few fields", line)
	}
	sec, frac, ok := strings.Cut(f[len(f)-1], ".")
	if !ok || len(frac) != 6 {
		return 0, fmt.Errorf("parse dnsperf -v line %q: latency not in seconds.micros", line)
	}
	s, err1 := strconv.ParseUint(sec, 10, 32)
	us, err2 := strconv.ParseUint(frac, 10, 32)
	// 4294 s and more would overflow the µs count; the timeout is 1 s.
	if err := errors.Join(err1, err2); err != nil || s >= 4294 {
		return 0, fmt.Errorf("parse dnsperf -v line %q: bad latency", line)
	}
	return uint32(s*1e6 + us), nil
}

// parseRcodes reads "NOERROR 999 (99.90%), SERVFAIL 1 (0.10%)".
func parseRcodes(val string) (map[string]uint64, error) {
	m := map[string]uint64{}
	for part := range strings.SplitSeq(val, ",") {
		f := strings.Fields(part)
		if len(f) < 2 {
			continue
		}
		n, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return nil, err
		}
		m[f[0]] = n
	}
	return m, nil
}

// firstUint reads the count at the start of "999 (99.90%)".
func firstUint(val string) (uint64, error) {
	f := strings.Fields(val)
	if len(f) == 0 {
		return 0, errors.New("empty")
	}
	return strconv.ParseUint(f[0], 10, 64)
}

// LatencyPercentiles sorts lat in place and returns its p50 and p99.
func LatencyPercentiles(lat []uint32) (p50, p99 uint32) {
	slices.Sort(lat)
	return stats.Percentile(lat, 0.50), stats.Percentile(lat, 0.99)
}
