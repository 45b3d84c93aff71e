package lab

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// loadTestServer is where the test responder listens, as LocalDNS does.
var loadTestServer = netip.MustParseAddrPort("169.254.10.11:53")

// loadTestBed is a pod namespace joined by a veth to a server namespace
// that holds 169.254.10.11 on a link of its own, with the test responder
// (TestLoadResponderHelper) listening there.
type loadTestBed struct {
	pod       *nstest.Namespace
	responder *exec.Cmd
}

func newLoadTestBed(t *testing.T) *loadTestBed {
	t.Helper()
	nstest.RequireRoot(t)
	pod, server := nstest.New(t, "pod"), nstest.New(t, "server")
	loadTestMust(t, server.AddLink("localdns", "", loadTestServer.Addr().String()+"/32"))
	loadTestMust(t, nstest.AddVeth(
		nstest.End{NS: pod, Name: "eth0", Addrs: []string{"10.211.0.2/30"}},
		nstest.End{NS: server, Name: "to-pod", Addrs: []string{"10.211.0.1/30"}}))
	loadTestMust(t, pod.AddRoute(nstest.Route{Dst: "169.254.10.0/24", Via: "10.211.0.1"}))

	ctx, cancel := context.WithCancel(context.Background())
	cmd := server.Command(ctx, os.Args[0], "-test.run=^TestLoadResponderHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), loadResponderEnv+"="+loadTestServer.String())
	out := &loadTestBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		cmd.Wait()
		if t.Failed() {
			t.Logf("responder output:\n%s", out)
		}
	})
	// Ready once it answers.
	q := new(dns.Msg)
	q.SetQuestion("ready.lab.test.", dns.TypeA)
	testkit.Eventually(t, 10*time.Second, "test responder answering", func() bool {
		r, err := pod.Exchange("udp", "", loadTestServer.String(), q, 200*time.Millisecond)
		return err == nil && r.Rcode == dns.RcodeSuccess
	})
	return &loadTestBed{pod: pod, responder: cmd}
}

// waitSilent returns once a query to the responder goes unanswered.
func (b *loadTestBed) waitSilent(t *testing.T) {
	t.Helper()
	q := new(dns.Msg)
	q.SetQuestion("silent.lab.test.", dns.TypeA)
	testkit.Eventually(t, 5*time.Second, "test responder silent after SIGUSR1", func() bool {
		_, err := b.pod.Exchange("udp", "", loadTestServer.String(), q, 100*time.Millisecond)
		return err != nil
	})
}

func (b *loadTestBed) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := b.responder.Process.Signal(sig); err != nil {
		t.Fatalf("signal responder: %v", err)
	}
}

func loadTestMust(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

type loadTestBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *loadTestBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *loadTestBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// loadTestNames is a mix like the lab's: services, external names, AAAA
// without records, NXDOMAIN, and one name that always gets SERVFAIL.
func loadTestNames() (names []LoadName, servfail int32) {
	for i := range 10 {
		names = append(names, LoadName{FQDN: "svc-" + string(rune('a'+i)) + ".default.svc.lab.test.", Type: dns.TypeA})
	}
	names = append(names,
		LoadName{FQDN: "www.lab.test.", Type: dns.TypeA},
		LoadName{FQDN: "www.lab.test.", Type: dns.TypeAAAA},
		LoadName{FQDN: "api.lab.test.", Type: dns.TypeAAAA},
		LoadName{FQDN: "WWW.Lab.Test.", Type: dns.TypeA},
		LoadName{FQDN: "missing.nx.lab.test.", Type: dns.TypeA, Rcode: dns.RcodeNameError},
		LoadName{FQDN: "other.nx.lab.test.", Type: dns.TypeAAAA, Rcode: dns.RcodeNameError},
		LoadName{FQDN: "a.b.nx.lab.test.", Type: dns.TypeA, Rcode: dns.RcodeNameError},
		LoadName{FQDN: "svc-z.nx.lab.test.", Type: dns.TypeA, Rcode: dns.RcodeNameError},
		LoadName{FQDN: "svc-y.default.svc.lab.test.", Type: dns.TypeA},
	)
	names = append(names, LoadName{FQDN: "servfail.lab.test.", Type: dns.TypeA})
	return names, int32(len(names) - 1)
}

func loadTestCPU(t *testing.T) time.Duration {
	t.Helper()
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// loadTestOut is where a test writes the files it makes: $LAB_TEST_OUT if
// set (to look at them), else a temporary directory.
func loadTestOut(t *testing.T) string {
	if dir := os.Getenv("LAB_TEST_OUT"); dir != "" {
		return dir
	}
	return t.TempDir()
}

// TestLoadRealRun runs loads and glibc probes from a pod namespace against
// the test responder in another.
func TestLoadRealRun(t *testing.T) {
	bed := newLoadTestBed(t)
	// Short glibc timeouts keep the test short: a lookup in the drop window
	// waits 1 s, then retries after it.
	loadTestMust(t, bed.pod.SetResolvConf("nameserver 169.254.10.11\noptions timeout:1 attempts:2\n"))
	t.Run("drop", func(t *testing.T) { testLoadDrop(t, bed) })
	t.Run("three-side-by-side", func(t *testing.T) { testLoadThreeSideBySide(t, bed) })
	t.Run("duplicates", func(t *testing.T) { testLoadDuplicates(t, bed) })
	// Last: the responder may still drop the first queries after it.
	t.Run("abort", func(t *testing.T) { testLoadAbort(t, bed) })
}

// testLoadDuplicates runs a load over names the responder answers twice,
// names it first answers for another name, plain names and fresh ones
// (each query its own name): every reply is checked, so each doubled
// answer counts one duplicate and each stray one mismatched, and neither
// changes how the query ended; each fresh name's answer counts for its
// query.
func testLoadDuplicates(t *testing.T, bed *loadTestBed) {
	names := []LoadName{
		{FQDN: "twice.lab.test.", Type: dns.TypeA},
		{FQDN: "wrongq.lab.test.", Type: dns.TypeA},
		{FQDN: "plain.lab.test.", Type: dns.TypeA},
		{FQDN: "fresh.lab.test.", Type: dns.TypeA, Fresh: true},
	}
	load, err := StartLoad(t.Context(), LoadConfig{NS: bed.pod, Server: loadTestServer, Names: names, QPS: 600})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	res := load.Stop()
	s := Summarize(res, ProbeResult{})
	perName := make([]int, len(names))
	for _, r := range res.Records {
		perName[r.Name]++
	}
	t.Logf("sent %d (%v per name): first try %d, duplicates %d, mismatched %d, late %d", s.Sent, perName, s.AnsweredFirstTry, s.Duplicates, s.Mismatched, s.Late)
	if s.Sent < 500 || s.AnsweredFirstTry != s.Sent {
		t.Errorf("sent %d, answered on the first try %d: want every query", s.Sent, s.AnsweredFirstTry)
	}
	if s.Duplicates != perName[0] || s.Mismatched != perName[1] || s.Late != 0 || s.Malformed != 0 {
		t.Errorf("duplicates %d, mismatched %d, late %d, malformed %d; want %d, %d, 0, 0",
			s.Duplicates, s.Mismatched, s.Late, s.Malformed, perName[0], perName[1])
	}
}

// testLoadDrop runs the load at 2,000 qps for 4 s while the responder
// drops everything for the second from 1.5 s to 2.5 s, with glibc probes
// beside it, and checks what they recorded.
func testLoadDrop(t *testing.T, bed *loadTestBed) {
	names, servfailName := loadTestNames()
	const (
		runFor    = 4 * time.Second
		dropAt    = 1500 * time.Millisecond
		dropUntil = 2500 * time.Millisecond
	)

	cpu0 := loadTestCPU(t)
	load, err := StartLoad(t.Context(), LoadConfig{NS: bed.pod, Server: loadTestServer, Names: names})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { load.Stop() })
	probe, err := StartGlibcProbe(t.Context(), bed.pod, "www.lab.test", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { probe.Stop() })
	// A name that does not exist: every lookup fails, quickly.
	probeNX, err := StartGlibcProbe(t.Context(), bed.pod, "missing.nx.lab.test.", 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { probeNX.Stop() })

	at := func(d time.Duration) time.Duration {
		time.Sleep(time.Until(load.Start().Add(d)))
		return time.Since(load.Start())
	}
	at(dropAt)
	bed.signal(t, syscall.SIGUSR1)
	dropFrom := time.Since(load.Start())
	at(dropUntil)
	bed.signal(t, syscall.SIGUSR2)
	dropTo := time.Since(load.Start())
	at(runFor)
	res := load.Stop()
	cpu := loadTestCPU(t) - cpu0
	pres := probe.Stop()
	presNX := probeNX.Stop()

	run := NewLabRun("drop-test", "test-responder", res, pres)
	run.Down = []Interval{{From: dropFrom, To: dropTo, Label: "responder dropping"}}
	run.Events = []Event{{At: dropFrom, Label: "SIGUSR1 (drop)"}, {At: dropTo, Label: "SIGUSR2"}}
	s := run.Summary
	window := dropTo - dropFrom
	t.Logf("sent %d in %.3f s = %.1f qps (max lag %.1f ms); first try %d, after retry %d, unanswered %d; max gap %.1f ms from %.1f ms (drop window %v from %v); by %+v; p50 %.3f ms p99 %.1f ms; servfail %d; late %d duplicates %d mismatched %d send errors %d",
		s.Sent, s.DurationS, s.QPS, s.MaxLagMs, s.AnsweredFirstTry, s.AnsweredAfterRetry, s.Unanswered,
		s.MaxGapMs, s.MaxGapFromMs, window, dropFrom, s.AnsweredBy, s.P50Ms, s.P99Ms, s.ServFail, s.Late, s.Duplicates, s.Mismatched, s.SendErrors)
	t.Logf("glibc: %d ok, %d failed, %d unfinished, %d skipped, slowest %.0f ms",
		s.GlibcOK, s.GlibcFail, s.GlibcUnfinished, s.GlibcSkipped, s.GlibcMaxMs)
	t.Logf("CPU of this process (load, probe's process starts, runtime) from start to Stop (incl. the drain): %v over %.2f s = %.1f%% of a core, %.2f%% of a core per 1,000 qps",
		cpu.Round(time.Millisecond), s.DurationS, 100*cpu.Seconds()/s.DurationS, 100*cpu.Seconds()/s.DurationS/(s.QPS/1000))

	// The rate.
	if s.Sent < 7900 || s.Sent > 8100 || s.QPS < 1980 || s.QPS > 2020 {
		t.Errorf("sent %d at %.1f qps, want about 8,000 at 2,000", s.Sent, s.QPS)
	}
	if s.AnsweredFirstTry+s.AnsweredAfterRetry+s.Unanswered != s.Sent {
		t.Errorf("outcomes add up to %d, sent %d", s.AnsweredFirstTry+s.AnsweredAfterRetry+s.Unanswered, s.Sent)
	}
	// The gap is the drop window: its first query lost at the start, the
	// first answered one at the end.
	if gap := time.Duration(s.MaxGapMs * float64(time.Millisecond)); gap < window-50*time.Millisecond || gap > window+50*time.Millisecond {
		t.Errorf("max gap %.1f ms, want the drop window %v ± 50 ms", s.MaxGapMs, window)
	}
	if from := time.Duration(s.MaxGapFromMs * float64(time.Millisecond)); from < dropFrom-50*time.Millisecond || from > dropFrom+50*time.Millisecond {
		t.Errorf("max gap from %.1f ms, want the drop's start %v ± 50 ms", s.MaxGapFromMs, dropFrom)
	}
	// Queries sent in the window are answered after their retry, 1 s later.
	inWindow := int(window.Seconds() * 2000)
	if s.AnsweredAfterRetry < inWindow*9/10 || s.AnsweredAfterRetry > inWindow*11/10 {
		t.Errorf("answered after retry %d, want about %d (the window's queries)", s.AnsweredAfterRetry, inWindow)
	}
	// Unanswered: the SERVFAIL name's queries, all of them, and a few
	// whose retry fell in the window too (sent in its first milliseconds).
	var servfailQueries, servfailNoReply, otherUnanswered int
	for _, r := range res.Records {
		switch {
		case r.Name == servfailName:
			servfailQueries++
			if r.Outcome != LoadUnanswered {
				t.Errorf("SERVFAIL query %+v: answered", r)
			}
			if r.Rcode == -1 {
				servfailNoReply++ // both tries dropped
			} else if r.Rcode != dns.RcodeServerFailure || r.BadReplies == 0 {
				t.Errorf("SERVFAIL query %+v: want a SERVFAIL reply recorded", r)
			}
		case r.Outcome == LoadUnanswered:
			otherUnanswered++
		}
	}
	if otherUnanswered+servfailNoReply > 40 {
		t.Errorf("%d queries unanswered with both tries in the drop window, want a few at most", otherUnanswered+servfailNoReply)
	}
	if s.ServFail < servfailQueries-servfailNoReply || s.ServFail > 2*servfailQueries {
		t.Errorf("%d SERVFAIL replies for %d queries (%d without any reply): want one per try that reached the responder",
			s.ServFail, servfailQueries, servfailNoReply)
	}
	// Both sockets of the responder answered, and every answer is
	// attributed.
	if s.AnsweredBy.LocalDNS == 0 || s.AnsweredBy.Standby == 0 ||
		s.AnsweredBy.LocalDNS+s.AnsweredBy.Standby != s.AnsweredFirstTry+s.AnsweredAfterRetry {
		t.Errorf("answered by %+v, want both, adding up to %d", s.AnsweredBy, s.AnsweredFirstTry+s.AnsweredAfterRetry)
	}
	if s.P50Ms <= 0 || s.P50Ms > 20 || s.P99Ms < 1000 {
		t.Errorf("p50 %.3f ms, p99 %.1f ms: want fast answers and retried ones over 1 s", s.P50Ms, s.P99Ms)
	}
	if s.Late != 0 || s.Duplicates != 0 || s.Mismatched != 0 || s.Malformed != 0 || s.SendErrors != 0 || s.NoTimestamp != 0 || s.Aborted {
		t.Errorf("late %d, duplicates %d, mismatched %d, malformed %d, send errors %d, replies without kernel time %d, aborted %v: want none",
			s.Late, s.Duplicates, s.Mismatched, s.Malformed, s.SendErrors, s.NoTimestamp, s.Aborted)
	}
	// Timeline: every query in a bin; the window's bins have no first-try
	// answers.
	tl := run.Timeline
	var total int
	for _, n := range tl.Sent {
		total += n
	}
	if total != s.Sent {
		t.Errorf("timeline holds %d queries, sent %d", total, s.Sent)
	}
	for b := int(dropFrom/tl.Step) + 1; b < int(dropTo/tl.Step); b++ {
		if tl.FirstTry[b] != 0 {
			t.Errorf("bin %d (in the drop window): %d answered on the first try", b, tl.FirstTry[b])
		}
	}
	// glibc: every 200 ms for 4 s; lookups in the window are slow, not
	// failed (the retry after 1 s gets through).
	if n := len(pres.Records); n < 18 || n > 23 {
		t.Errorf("%d glibc lookups, want about 20", n)
	}
	if s.GlibcOK < 15 || s.GlibcFail > 2 || s.GlibcMaxMs < 900 {
		t.Errorf("glibc %d ok, %d failed, slowest %.0f ms: want most ok, some slowed by the drop", s.GlibcOK, s.GlibcFail, s.GlibcMaxMs)
	}

	if ok, fail := presNX.Counts(); ok != 0 || fail < 7 || fail > 10 {
		t.Errorf("glibc lookups of a missing name: %d ok, %d failed; want about 8 failed", ok, fail)
	}

	out := loadTestOut(t)
	loadTestMust(t, WriteLabJSON(filepath.Join(out, "lab.json"), LabFile{CoreDNSVersion: "test", Runs: []LabRun{run}}))
	loadTestMust(t, WriteLabMarkdown(filepath.Join(out, "lab.md"), LabFile{Runs: []LabRun{run}}))
	loadTestMust(t, PlotTimeline(filepath.Join(out, "timeline-drop-test.svg"), "drop-test", []LabRun{run}))
}

// testLoadThreeSideBySide runs three loads at 2,000 qps at once, as the lab
// does on a 2-core machine, and checks each holds its rate and that they
// leave no goroutine behind.
func testLoadThreeSideBySide(t *testing.T, bed *loadTestBed) {
	if testing.Short() {
		t.Skip("-short")
	}
	goroutines := runtime.NumGoroutine()
	names, _ := loadTestNames()
	names = names[:len(names)-1] // no SERVFAIL name: every query should be answered
	const runFor = 3 * time.Second

	cpu0 := loadTestCPU(t)
	var loads []*Load
	for range 3 {
		l, err := StartLoad(t.Context(), LoadConfig{NS: bed.pod, Server: loadTestServer, Names: names})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Stop() })
		loads = append(loads, l)
	}
	time.Sleep(runFor)
	var results []LoadResult
	for _, l := range loads {
		results = append(results, l.Stop())
	}
	cpu := loadTestCPU(t) - cpu0
	var qps float64
	for i, res := range results {
		s := Summarize(res, ProbeResult{})
		qps += s.QPS
		t.Logf("load %d: sent %d at %.1f qps, max lag %.1f ms, first try %d, after retry %d, unanswered %d, p50 %.3f ms, p99 %.3f ms",
			i, s.Sent, s.QPS, s.MaxLagMs, s.AnsweredFirstTry, s.AnsweredAfterRetry, s.Unanswered, s.P50Ms, s.P99Ms)
		if s.QPS < 1980 || s.QPS > 2020 {
			t.Errorf("load %d: %.1f qps, want 2,000", i, s.QPS)
		}
		if s.Unanswered != 0 || s.AnsweredAfterRetry > s.Sent/1000 {
			t.Errorf("load %d: %d unanswered, %d after retry: want all (nearly all) on the first try", i, s.Unanswered, s.AnsweredAfterRetry)
		}
	}
	wall := results[0].Duration.Seconds()
	t.Logf("CPU of the three loads: %v over %.2f s = %.1f%% of a core for %.0f qps: %.2f%% of a core per 1,000 qps, %.1f µs per query",
		cpu.Round(time.Millisecond), wall, 100*cpu.Seconds()/wall, qps, 100*cpu.Seconds()/wall/(qps/1000),
		float64(cpu.Microseconds())/(qps*wall))
	testkit.Eventually(t, time.Second, fmt.Sprintf("no more than the %d goroutines from before the loads", goroutines), func() bool {
		return runtime.NumGoroutine() <= goroutines
	})
}

// testLoadAbort ends a load's context while queries are in flight: Stop
// returns at once, marked aborted.
func testLoadAbort(t *testing.T, bed *loadTestBed) {
	names, _ := loadTestNames()
	// Nothing is answered from the load's first query on: every query stays
	// in flight. The signal is handled asynchronously, so wait for a query
	// to go unanswered before starting.
	bed.signal(t, syscall.SIGUSR1)
	defer bed.signal(t, syscall.SIGUSR2)
	bed.waitSilent(t)
	ctx, cancel := context.WithCancel(t.Context())
	l, err := StartLoad(ctx, LoadConfig{NS: bed.pod, Server: loadTestServer, Names: names})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	cancel()
	began := time.Now()
	res := l.Stop()
	if took := time.Since(began); took > 200*time.Millisecond {
		t.Errorf("Stop after the context ended took %v", took)
	}
	s := Summarize(res, ProbeResult{})
	if !res.Aborted || s.Sent < 500 || s.Unanswered != s.Sent {
		t.Errorf("aborted %v, sent %d, unanswered %d: want aborted, every query unanswered", res.Aborted, s.Sent, s.Unanswered)
	}
	if again := l.Stop(); len(again.Records) != len(res.Records) {
		t.Errorf("second Stop returned %d records, first %d", len(again.Records), len(res.Records))
	}
}

func TestStartLoadConfig(t *testing.T) {
	ok := []LoadName{{FQDN: "a.example.", Type: dns.TypeA}}
	ns := &nstest.Namespace{} // never used: every case fails before it is
	tests := []struct {
		name string
		cfg  LoadConfig
		want string
	}{
		{"no pod", LoadConfig{Server: loadTestServer, Names: ok}, "no pod"},
		{"no server", LoadConfig{NS: ns, Names: ok}, "no server"},
		{"no names", LoadConfig{NS: ns, Server: loadTestServer}, "empty name mix"},
		{"relative name", LoadConfig{NS: ns, Server: loadTestServer, Names: []LoadName{{FQDN: "a.example", Type: dns.TypeA}}}, "trailing dot"},
		{"negative rate", LoadConfig{NS: ns, Server: loadTestServer, Names: ok, QPS: -1}, "positive"},
	}
	for _, tc := range tests {
		_, err := StartLoad(context.Background(), tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one saying %q", tc.name, err, tc.want)
		}
	}
	if _, err := StartGlibcProbe(context.Background(), nil, "a.example", 0); err == nil {
		t.Errorf("glibc probe without a namespace: no error")
	}
}
