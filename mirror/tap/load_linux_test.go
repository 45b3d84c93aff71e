package tap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

// blastWindow is how many queries the load helper keeps in flight: enough
// to keep CoreDNS busy on both of this machine's CPUs without losing many
// to its socket buffer.
const blastWindow = 64

// blast sends count queries for PREFIX-i.tap.test from one UDP socket,
// with at most blastWindow unanswered, and returns how many were answered.
func blast(server string, count int, prefix string) (int, error) {
	conn, err := net.Dial("udp", server)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	window := make(chan struct{}, blastWindow)
	var answered atomic.Int64
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 1500)
		for answered.Load() < int64(count) {
			conn.SetReadDeadline(time.Now().Add(time.Second))
			if _, err := conn.Read(buf); err != nil {
				done <- err
				return
			}
			answered.Add(1)
			select {
			case <-window:
			default:
			}
		}
		done <- nil
	}()
	q := new(dns.Msg)
	for i := range count {
		select {
		case window <- struct{}{}:
		case <-time.After(time.Second): // a lost query: let another go
		}
		q.SetQuestion(fmt.Sprintf("%s-%d.%s", prefix, i, bedZone), dns.TypeA)
		q.Id = uint16(i)
		b, err := q.Pack()
		if err != nil {
			return 0, err
		}
		if _, err := conn.Write(b); err != nil {
			return int(answered.Load()), err
		}
	}
	err = <-done
	if errors.Is(err, os.ErrDeadlineExceeded) {
		err = nil // some were lost; the count says how many
	}
	return int(answered.Load()), err
}

// runLoad runs the load helper in ns and returns how many queries were
// answered.
func runLoad(t *testing.T, ns *nstest.Namespace, server string, count int, prefix string) int {
	got, _ := runLoadTimed(t, ns, server, count, prefix)
	return got
}

// runLoadTimed is runLoad that also returns how long the helper took to
// send the queries and get the answers.
func runLoadTimed(t *testing.T, ns *nstest.Namespace, server string, count int, prefix string) (int, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := ns.Command(ctx, os.Args[0], "-test.run=^TestTapLoadHelper$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d %s", loadEnv, server, count, prefix))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("load helper: %v\n%s", err, out.String())
	}
	var got, want int
	var us int64
	for _, line := range strings.Split(out.String(), "\n") {
		if _, err := fmt.Sscanf(line, "answered %d of %d in %d µs", &got, &want, &us); err == nil {
			return got, time.Duration(us) * time.Microsecond
		}
	}
	t.Fatalf("load helper said nothing useful:\n%s", out.String())
	return 0, 0
}

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

// TestTapFloodIgnored sends a flood of other UDP traffic out of the node
// (to a closed port of the pod, which answers with ICMP) and checks that
// none of it reaches the tap's user space: the kernel filter drops it all.
// It also compares the sender's CPU with and without the tap: the kernel
// clones each outgoing packet for an ETH_P_ALL socket and runs the filter
// on it, in the sender's context.
func TestTapFloodIgnored(t *testing.T) {
	b := newBed(t, false)
	const n = 50000
	flood := func() (time.Duration, int) {
		var sent int
		c0 := cpuTime(t)
		must(t, b.node.Do(func() error {
			conn, err := net.Dial("udp", "10.211.0.2:9")
			if err != nil {
				return err
			}
			defer conn.Close()
			msg := bytes.Repeat([]byte{0xab}, 100)
			for range n {
				if _, err := conn.Write(msg); err == nil {
					sent++
				} else if !errors.Is(err, syscall.ECONNREFUSED) {
					return err
				}
			}
			return nil
		}))
		return cpuTime(t) - c0, sent
	}
	without, sent0 := flood()
	rec := newRecorder(t)
	tp := startTap(t, b.node, bedConfig(t), rec.sink)
	with, sent1 := flood()
	st := drained(t, tp)
	if st.Seen != 0 || st.KernelPackets != 0 {
		t.Errorf("the flood reached the tap: seen %d, kernel passed %d", st.Seen, st.KernelPackets)
	}
	per := func(d time.Duration, k int) float64 { return float64(d.Nanoseconds()) / 1000 / float64(max(k, 1)) }
	t.Logf("flood of other datagrams: tap seen %d, kernel passed %d; sender CPU %.2f µs/datagram without the tap (%d sent), %.2f with (%d sent)",
		st.Seen, st.KernelPackets, per(without, sent0), sent0, per(with, sent1), sent1)
}

// TestTapBurstDrops fills the tap's receive buffer on purpose (a tiny
// buffer and a sink that sleeps) and checks that the kernel's drops are
// counted; then measures the default buffer under the same burst with a
// real cache.
func TestTapBurstDrops(t *testing.T) {
	if testing.Short() {
		t.Skip("burst measurement; skipped with -short")
	}
	b := newBed(t, false)
	const n = 20000
	server := bedAddr4 + ":53"

	cfg := bedConfig(t)
	cfg.RcvBuf = 64 << 10
	// The sink's sleep is the load, not a wait: a slow consumer.
	slow := startTap(t, b.node, cfg, func([]byte) error { time.Sleep(50 * time.Microsecond); return nil })
	got, took := runLoadTimed(t, b.pod, server, n, "slow")
	drained(t, slow)
	must(t, slow.Close())
	st := slow.Stats()
	if st.KernelDrops == 0 || st.Seen+st.KernelDrops != uint64(got) || st.KernelPackets != uint64(got) {
		t.Errorf("slow tap, 64 KiB buffer: %d answered, seen %d, kernel passed %d, dropped %d; want drops, and seen+dropped = answered",
			got, st.Seen, st.KernelPackets, st.KernelDrops)
	}
	rate := func(k int, d time.Duration) int { return int(float64(k) / d.Seconds()) }
	t.Logf("burst of %d replies (%d/s) into a 64 KiB buffer, a sink sleeping 50 µs: seen %d, kernel drops %d", got, rate(got, took), st.Seen, st.KernelDrops)

	rec := newRecorder(t)
	tp := startTap(t, b.node, bedConfig(t), rec.cache.Insert)
	got, took = runLoadTimed(t, b.pod, server, n, "burst")
	st = drained(t, tp)
	if st.Accepted+st.KernelDrops != uint64(got) {
		t.Errorf("default buffer: %d answered, accepted %d, drops %d, rejected %v", got, st.Accepted, st.KernelDrops, st.Rejected)
	}
	t.Logf("burst of %d replies (%d/s), default %d MiB buffer, cache.Insert: accepted %d, kernel drops %d",
		got, rate(got, took), DefaultConfig().RcvBuf>>20, st.Accepted, st.KernelDrops)
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
