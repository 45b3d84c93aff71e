//go:build !race

package tap

// The tests here measure CPU time. Under the race detector they would
// measure the detector, so they are built without it only: `make test`
// runs them in a run of their own (`go test -run 'CPU$'`), after the
// -race one. Each is named Test...CPU.

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// cpuTime is the CPU (user+system) this process has used.
func cpuTime(t testing.TB) time.Duration {
	u, s := cpuTimes(t)
	return u + s
}

func cpuTimes(t testing.TB) (user, sys time.Duration) {
	var ru unix.Rusage
	must(t, unix.Getrusage(unix.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}

// procCPU is the CPU (user+system) process pid has used, from /proc.
func procCPU(t testing.TB, pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	must(t, err)
	// Fields after the command name in parentheses; utime and stime are
	// the 14th and 15th fields of the line.
	rest := b[bytes.LastIndexByte(b, ')')+2:]
	f := strings.Fields(string(rest))
	var ut, st int64
	fmt.Sscan(f[11], &ut)
	fmt.Sscan(f[12], &st)
	tick := int64(100) // USER_HZ on Linux
	return time.Duration((ut + st) * int64(time.Second) / tick)
}

// TestTapCPU measures what mirroring costs per reply: 20,000 queries from
// a pod (sent by a helper process, so this process holds only the tap),
// once without a tap, once with a tap whose sink does nothing, once with
// the tap inserting into a real cache. CoreDNS's CPU for the same traffic
// is the yardstick (issue 6: the mirror may cost at most 15% of it).
func TestTapCPU(t *testing.T) {
	if testing.Short() {
		t.Skip("CPU measurement; skipped with -short")
	}
	b := newBed(t, false)
	const n = 20000
	server := bedAddr4 + ":53"
	var tp *Tap // the tap measured, nil for none
	measure := func(prefix string) (self, coredns time.Duration, answered int) {
		cs0 := ctxSwitches()
		defer func() { t.Logf("%s: %d context switches", prefix, ctxSwitches()-cs0) }()
		u0, s0 := cpuTimes(t)
		d0 := procCPU(t, b.coredns.Pid())
		answered = runLoad(t, b.pod, server, n, prefix)
		if tp != nil {
			drained(t, tp)
		}
		u1, s1 := cpuTimes(t)
		t.Logf("%s: user %v, system %v", prefix, u1-u0, s1-s0)
		return u1 - u0 + s1 - s0, procCPU(t, b.coredns.Pid()) - d0, answered
	}
	perReply := func(d time.Duration, k int) float64 { return float64(d.Microseconds()) / float64(max(k, 1)) }

	idle, dnsIdle, got0 := measure("idle")

	var calls atomic.Int64
	tp = startTap(t, b.node, bedConfig(t), func([]byte) error { calls.Add(1); return nil })
	bare, dnsBare, got1 := measure("bare")
	st := tp.Stats()
	must(t, tp.Close())
	if st.Accepted != uint64(got1) || st.KernelDrops != 0 {
		t.Errorf("bare tap: %d answered, tap accepted %d, kernel drops %d", got1, st.Accepted, st.KernelDrops)
	}

	rec := newRecorder(t)
	c := rec.cache
	tp = startTap(t, b.node, bedConfig(t), c.Insert)
	full, dnsFull, got2 := measure("cache")
	st2 := tp.Stats()
	must(t, tp.Close())
	if st2.Accepted != uint64(got2) || st2.KernelDrops != 0 || c.Stats().Inserts != uint64(got2) {
		t.Errorf("tap into cache: %d answered, accepted %d, cache inserts %d, kernel drops %d",
			got2, st2.Accepted, c.Stats().Inserts, st2.KernelDrops)
	}
	t.Logf("CPU for %d queries from a pod (process CPU; CoreDNS's from /proc):", n)
	t.Logf("  no tap:           %6.2f µs/reply (this process idle), CoreDNS %6.2f µs/reply (%d answered)", perReply(idle, got0), perReply(dnsIdle, got0), got0)
	t.Logf("  tap, no-op sink:  %6.2f µs/reply, CoreDNS %6.2f µs/reply (%d answered, %d seen in %d reads)", perReply(bare, got1), perReply(dnsBare, got1), got1, st.Seen, st.Reads)
	t.Logf("  tap, cache.Insert:%6.2f µs/reply, CoreDNS %6.2f µs/reply (%d answered, %d accepted)", perReply(full, got2), perReply(dnsFull, got2), got2, st2.Accepted)
	t.Logf("  mirror cost / CoreDNS cost: %.1f%%", 100*perReply(full, got2)/perReply(dnsFull, got2))
}

// TestTapFloodCPU compares the CPU of a sender flooding the node with
// other datagrams (TestTapFloodIgnored's flood) without the tap and with
// it: the kernel clones each outgoing packet for an ETH_P_ALL socket and
// runs the filter on it, in the sender's context.
func TestTapFloodCPU(t *testing.T) {
	if testing.Short() {
		t.Skip("CPU measurement; skipped with -short")
	}
	b := newBed(t, false)
	const n = 50000
	measure := func() (time.Duration, int) {
		c0 := cpuTime(t)
		sent := flood(t, b, n)
		return cpuTime(t) - c0, sent
	}
	without, sent0 := measure()
	rec := newRecorder(t)
	tp := startTap(t, b.node, bedConfig(t), rec.sink)
	with, sent1 := measure()
	st := drained(t, tp)
	if st.Seen != 0 {
		t.Errorf("the flood reached the tap: seen %d", st.Seen)
	}
	per := func(d time.Duration, k int) float64 { return float64(d.Nanoseconds()) / 1000 / float64(max(k, 1)) }
	t.Logf("flood of other datagrams: sender CPU %.2f µs/datagram without the tap (%d sent), %.2f with (%d sent)",
		per(without, sent0), sent0, per(with, sent1), sent1)
}

// ctxSwitches sums the context switches of this process's threads: what
// the tap's cost per reply mostly is on a small VM.
func ctxSwitches() int {
	tasks, _ := os.ReadDir("/proc/self/task")
	n := 0
	for _, e := range tasks {
		b, _ := os.ReadFile("/proc/self/task/" + e.Name() + "/status")
		for _, line := range strings.Split(string(b), "\n") {
			var v int
			if _, err := fmt.Sscanf(line, "voluntary_ctxt_switches: %d", &v); err == nil {
				n += v
			}
			if _, err := fmt.Sscanf(line, "nonvoluntary_ctxt_switches: %d", &v); err == nil {
				n += v
			}
		}
	}
	return n
}
