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

// TestTapFloodIgnored sends a flood of other UDP traffic out of the node
// (to a closed port of the pod, which answers with ICMP) and checks that
// none of it reaches the tap's user space: the kernel filter drops it all.
// What the flood costs the sender with the tap is TestTapFloodCPU's.
func TestTapFloodIgnored(t *testing.T) {
	b := newBed(t, false)
	rec := newRecorder(t)
	tp := startTap(t, b.node, bedConfig(t), rec.sink)
	sent := flood(t, b, 50000)
	st := drained(t, tp)
	if st.Seen != 0 || st.KernelPackets != 0 {
		t.Errorf("the flood reached the tap: seen %d of %d sent, kernel passed %d", st.Seen, sent, st.KernelPackets)
	}
}

// flood sends n datagrams of other UDP traffic out of the node, to a
// closed port of the pod, and returns how many were sent.
func flood(t *testing.T, b *bed, n int) int {
	var sent int
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
	return sent
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
