package main

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/bench/internal/dnsperf"
	"github.com/dnsstandby/dnsstandby/bench/internal/testbed"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

func TestNewResult(t *testing.T) {
	t0 := time.Unix(1000, 0)
	start := snapshot{answered: 3}
	before := snapshot{at: t0, localDNSTicks: 100, standbyTicks: 10, answered: 5, accepted: 5000,
		rejected: map[string]uint64{"have_fresh": 10, "duplicate": 1}, upstream: 7, tapDrops: 2}
	after := snapshot{at: t0.Add(20 * time.Second), localDNSTicks: 1100, standbyTicks: 110, answered: 5, accepted: 5004,
		rejected: map[string]uint64{"have_fresh": 399_010, "duplicate": 1, "malformed": 2}, upstream: 7, tapDrops: 2}
	r := &dnsperf.Result{Sent: 400_000, Completed: 400_000, QPS: 19_999.5, RunTime: 20 * time.Second,
		Rcodes: map[string]uint64{"NOERROR": 400_000}}
	res := newResult("tap", r, start, before, after)
	// 1000 ticks = 10 s over 400,000 answers = 25 µs; 100 ticks = 2.5 µs.
	if math.Abs(res.LocalDNSCPUUs-25) > 1e-9 || math.Abs(res.StandbyCPUUs-2.5) > 1e-9 || math.Abs(res.Ratio-0.1) > 1e-9 {
		t.Errorf("cpu %v / %v ratio %v", res.LocalDNSCPUUs, res.StandbyCPUUs, res.Ratio)
	}
	if math.Abs(res.LocalDNSCPUPct-50) > 1e-9 || math.Abs(res.StandbyCPUPct-5) > 1e-9 {
		t.Errorf("cpu %% %v / %v", res.LocalDNSCPUPct, res.StandbyCPUPct)
	}
	if res.RecordsAccepted != 4 || len(res.RecordsRejected) != 2 || res.RecordsRejected["have_fresh"] != 399_000 || res.RecordsRejected["malformed"] != 2 {
		t.Errorf("records %d %v", res.RecordsAccepted, res.RecordsRejected)
	}
	if res.StandbyAnswered != 2 || res.StandbyAnsweredWindow != 0 || res.UpstreamQueries != 0 {
		t.Errorf("answered %d/%d upstream %d", res.StandbyAnswered, res.StandbyAnsweredWindow, res.UpstreamQueries)
	}
	if got := reasons(res.RecordsRejected); got != "have_fresh 399000, malformed 2" {
		t.Errorf("reasons %q", got)
	}
}

// TestPrintTable: the table and the costs against the baseline; with more
// than one round, each feed is judged against its own round's baseline,
// and the medians are given.
func TestPrintTable(t *testing.T) {
	filled := warmup{Filled: true}
	for _, tc := range []struct {
		name    string
		results []result
		want    []string
	}{
		{
			name: "one round",
			results: []result{
				{Mirror: "tap", LocalDNSCPUUs: 25, StandbyCPUUs: 2.5, Ratio: 0.1, Met: true, Warmup: filled},
				{Mirror: "dnstap", LocalDNSCPUUs: 30, StandbyCPUUs: 6, Ratio: 0.2, Warmup: filled,
					QPS: 17000, TargetQPS: 20000, RateShort: true, LocalDNSCPUPct: 91, StandbyCPUPct: 8},
				{Mirror: "none", LocalDNSCPUUs: 24, StandbyCPUUs: 0.5, Ratio: 0.5 / 24, Warmup: filled},
			},
			want: []string{
				"| tap | 0 | 25.00 | 2.50 | 10.0% | ≤ 15%: met |",
				"| dnstap | 17000 | 30.00 | 6.00 | 20.0% | ≤ 15%: **MISSED** |",
				"dnstap: only 17000 of 20000 qps answered; the servers' shared CPU was 99% busy (LocalDNS 91%, dnsstandby 8%): that core was the limit",
				"| none | 0 | 24.00 | 0.50 | 2.1% | baseline (no feed) |",
				"- tap: the feed adds 2.00 µs/query to dnsstandby (8.3% of LocalDNS's baseline) and +1.00 µs/query to LocalDNS; all in, 14.6% of LocalDNS's baseline CPU",
			},
		},
		{
			name: "three rounds",
			results: []result{
				{Mirror: "tap", Round: 1, LocalDNSCPUUs: 61, StandbyCPUUs: 4, Warmup: filled},
				{Mirror: "none", Round: 1, LocalDNSCPUUs: 60, StandbyCPUUs: 1, Warmup: filled},
				{Mirror: "tap", Round: 2, LocalDNSCPUUs: 70, StandbyCPUUs: 5, Warmup: filled},
				{Mirror: "none", Round: 2, LocalDNSCPUUs: 75, StandbyCPUUs: 1, Warmup: filled},
				{Mirror: "tap", Round: 3, LocalDNSCPUUs: 62, StandbyCPUUs: 4, Warmup: filled},
				{Mirror: "none", Round: 3, LocalDNSCPUUs: 60, StandbyCPUUs: 1, Warmup: filled},
			},
			want: []string{
				"Round 1: against the baseline (--mirror none: dnsstandby idle at 1.00 µs/query, LocalDNS 60.00 µs/query):",
				// (4 + 1) / 60, (5 − 5) / 75, (4 + 2) / 60.
				"- tap: the feed adds 3.00 µs/query to dnsstandby (5.0% of LocalDNS's baseline) and +1.00 µs/query to LocalDNS; all in, 8.3% of LocalDNS's baseline CPU",
				"Round 2: against the baseline",
				"all in, 0.0% of LocalDNS's baseline CPU",
				"Medians over 3 rounds (each against its own round's baseline):",
				"- tap: the feed adds 3.00 µs/query to dnsstandby and +1.00 µs/query to LocalDNS; all in, 8.3% of LocalDNS's baseline CPU (rounds: 8.3%, 0.0%, 10.0%)",
			},
		},
		{
			name: "two rounds, profiled",
			results: []result{
				{Mirror: "tap", Round: 1, LocalDNSCPUUs: 64, StandbyCPUUs: 1.2, Profiled: true, LocalDNSFeedShare: 0.01, Warmup: filled},
				{Mirror: "none", Round: 1, LocalDNSCPUUs: 60, StandbyCPUUs: 0.4, Profiled: true, LocalDNSFeedShare: 0.001, Warmup: filled},
				{Mirror: "tap", Round: 2, LocalDNSCPUUs: 50, StandbyCPUUs: 1.0, Profiled: true, LocalDNSFeedShare: 0.02, Warmup: filled},
				{Mirror: "none", Round: 2, LocalDNSCPUUs: 50, StandbyCPUUs: 0.4, Profiled: true, Warmup: filled},
			},
			want: []string{
				// (1.2 + 4) / 60; 0.01 × 64 − 0.001 × 60 = 0.58, (1.2 + 0.58) / 60.
				"all in, 8.7% of LocalDNS's baseline CPU; LocalDNS's samples in the feed's code (perf) make +0.58 µs/query: with that as LocalDNS's extra, all in 3.0%",
				// 0.02 × 50 = 1.00; (1.0 + 1.0) / 50.
				"all in, 2.0% of LocalDNS's baseline CPU; LocalDNS's samples in the feed's code (perf) make +1.00 µs/query: with that as LocalDNS's extra, all in 4.0%",
				"LocalDNS's samples in the feed's code (perf) make +0.79 µs/query: with that as LocalDNS's extra, all in 3.5%",
				"(all in with LocalDNS's profiled share, rounds: 3.0%, 4.0%)",
			},
		},
		{
			name: "two rounds, latency",
			results: []result{
				{Mirror: "tap", Round: 1, LocalDNSCPUUs: 60, StandbyCPUUs: 1, P50Us: 90, P99Us: 400, LatencySamples: 1000, Warmup: filled},
				{Mirror: "none", Round: 1, LocalDNSCPUUs: 60, StandbyCPUUs: 0.4, P50Us: 88, P99Us: 380, LatencySamples: 1000, Warmup: filled},
				{Mirror: "none", Round: 2, LocalDNSCPUUs: 50, StandbyCPUUs: 0.4, P50Us: 85, P99Us: 350, LatencySamples: 1000, Warmup: filled},
				{Mirror: "tap", Round: 2, LocalDNSCPUUs: 50, StandbyCPUUs: 1, P50Us: 84, P99Us: 340, LatencySamples: 1000, Warmup: filled},
			},
			want: []string{
				"(--mirror none: dnsstandby idle at 0.40 µs/query, LocalDNS 60.00 µs/query; answers p50 88 µs, p99 380 µs)",
				"all in, 1.7% of LocalDNS's baseline CPU; p99 +20 µs over the baseline's",
				"all in, 2.0% of LocalDNS's baseline CPU; p99 -10 µs over the baseline's",
				"(p99 over the baseline's: +5 µs, rounds: +20, -10)",
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			printTable(&b, tc.results, 0.15)
			out := b.String()
			for _, want := range tc.want {
				if !strings.Contains(out, want) {
					t.Errorf("table lacks %q:\n%s", want, out)
				}
			}
		})
	}
}

// TestFeedSamples counts perf script's samples (blocks of a call chain),
// and those whose chain passes through a feed's code.
func TestFeedSamples(t *testing.T) {
	const script = `
	ffffffff8a1c2d30 __bpf_ringbuf_reserve
	ffffffff8a1c3e10 bpf_prog_6759baeccc7a5291_dnsstandby_egr
	ffffffff8a2f1a20 __cgroup_bpf_run_filter_skb
	ffffffff8a9b1c00 ip_finish_output
	00000000004a1b2c net.(*netFD).writeTo

	ffffffff8a9b1c00 ip_finish_output
	00000000004a1b2c net.(*netFD).writeTo

	ffffffff8a9c0000 packet_rcv
	ffffffff8a9b0000 __netif_receive_skb_core

	0000000001234567 github.com/coredns/coredns/plugin/dnstap.(*Dnstap).tapQuery
	0000000001234000 github.com/coredns/coredns/plugin/dnstap.(*ResponseWriter).WriteMsg
	00000000004a1b2c runtime.goexit
	00000000004a1b2c runtime.mcall
`
	tests := []struct {
		name          string
		in            string
		samples, feed int
	}{
		{"empty", "", 0, 0},
		{"four samples, three in a feed's code", script, 4, 3},
		{"no blank line at the end", "\tffffffff8a9c0000 packet_rcv", 1, 1},
		{"other code only", "\tffffffff8a9b1c00 ip_finish_output\n\n\tffffffff8a9b1c00 udp_sendmsg\n", 2, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			samples, feed, err := feedSamples(strings.NewReader(tt.in))
			if err != nil || samples != tt.samples || feed != tt.feed {
				t.Errorf("%d samples, %d in a feed's code, %v; want %d, %d", samples, feed, err, tt.samples, tt.feed)
			}
		})
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestParseMirrors(t *testing.T) {
	if f, err := parseMirrors("tap, tap-nohedge,dnstap,none"); err != nil || strings.Join(f, ",") != "tap,tap-nohedge,dnstap,none" {
		t.Errorf("%v %v", f, err)
	}
	for _, bad := range []string{"tap,tap", "pcap", ""} {
		if _, err := parseMirrors(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestReplyNSID(t *testing.T) {
	m := new(dns.Msg)
	if replyNSID(m) != "" {
		t.Error("NSID without EDNS")
	}
	m.SetEdns0(1232, false)
	opt := m.IsEdns0()
	opt.Option = append(opt.Option, &dns.EDNS0_NSID{Code: dns.EDNS0NSID, Nsid: "6c6f63616c646e732d706f64"})
	if got := replyNSID(m); got != "localdns-pod" {
		t.Errorf("NSID %q", got)
	}
}

// TestCorefile holds LocalDNS's Corefile to the AgentBaker-shaped fixture:
// its root block is the fixture's pod block with AKS's max_concurrent and
// serve_stale, forwarding to the upstream, with or without the dnstap
// line; its health-check block binds the one listener the node has.
func TestCorefile(t *testing.T) {
	for _, tc := range []struct {
		name, dnstapPath, extra string
	}{
		{"no dnstap", "", ""},
		{"dnstap", "/x/dnstap.sock", "dnstap unix:///x/dnstap.sock full"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fixture := testkit.Corefile{KubeDNS: testbed.UpstreamAddr, MaxConcurrent: 2000,
				ServeStale: "72000s verify", Extra: tc.extra}.String()
			got := localDNSCorefile(tc.dnstapPath)
			if g, w := rootBlock(got), rootBlock(fixture); g != w {
				t.Errorf("root block differs from the fixture's pod block:\n got %s\nwant %s", g, w)
			}
			health, _, _ := strings.Cut(got, ".:53 {")
			if want := "health-check.localdns.local:53 {\n    bind " + testkit.PodListener + "\n    whoami\n}\n"; health != want {
				t.Errorf("health-check block %q, want %q", health, want)
			}
		})
	}
}

// rootBlock is the last root block of a Corefile, to its end.
func rootBlock(corefile string) string {
	return corefile[strings.LastIndex(corefile, ".:53 {"):]
}
