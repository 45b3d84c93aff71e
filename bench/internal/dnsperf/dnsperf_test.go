package dnsperf

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// dnsperfOutput is dnsperf 2.10.0's output with -v, one answer timed out.
const dnsperfOutput = `DNS Performance Testing Tool
Version 2.10.0

[Status] Command line: dnsperf -s 127.0.0.11 -p 53 -d q.txt -l 1 -v
[Status] Sending queries (to 127.0.0.11:53)
[Status] Started at: Sun Nov 29 19:25:35 2026
[Status] Stopping after 1.000000 seconds
> NOERROR svc-0.default.svc.cluster.local. A 0.000769
> NOERROR svc-1.default.svc.cluster.local. A 0.000094
> SERVFAIL svc-2.default.svc.cluster.local. A 1.000120
> T svc-3.default.svc.cluster.local. A
[Status] Testing complete (time limit)

Statistics:

  Queries sent:         4
  Queries completed:    3 (75.00%)
  Queries lost:         1 (25.00%)

  Response codes:       NOERROR 2 (66.67%), SERVFAIL 1 (33.33%)
  Average packet size:  request 49, response 65
  Run time (s):         1.000521
  Queries per second:   2.998438

  Average Latency (s):  0.333661 (min 0.000094, max 1.000120)
  Latency StdDev (s):   0.577220
`

func TestParseDnsperf(t *testing.T) {
	res, err := Parse(strings.NewReader(dnsperfOutput))
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != 4 || res.Completed != 3 || res.Lost != 1 {
		t.Errorf("sent/completed/lost = %d/%d/%d, want 4/3/1", res.Sent, res.Completed, res.Lost)
	}
	if res.QPS != 2.998438 || res.RunTime != 1000521*time.Microsecond {
		t.Errorf("qps %v run time %v", res.QPS, res.RunTime)
	}
	if res.Rcodes["NOERROR"] != 2 || res.Rcodes["SERVFAIL"] != 1 || len(res.Rcodes) != 2 {
		t.Errorf("rcodes %v", res.Rcodes)
	}
	if want := []uint32{769, 94, 1000120}; !slices.Equal(res.Latencies, want) {
		t.Errorf("latencies %v, want %v", res.Latencies, want)
	}
}

func TestParseDnsperfIncomplete(t *testing.T) {
	cut := dnsperfOutput[:strings.Index(dnsperfOutput, "  Run time")]
	if _, err := Parse(strings.NewReader(cut)); err == nil {
		t.Error("output without the run time parsed without error")
	}
}

func TestParseVerboseLatencyErrors(t *testing.T) {
	for _, line := range []string{"> NOERROR x. A 0.0001", "> NOERROR x. A 12", "> NOERROR", "> NOERROR x. A 5000.000000"} {
		if us, err := parseVerboseLatency(line); err == nil {
			t.Errorf("%q: %d µs, want an error", line, us)
		}
	}
}

func TestPercentile(t *testing.T) {
	lat := []uint32{5, 1, 4, 2, 3, 6, 7, 8, 9, 100}
	p50, p99 := LatencyPercentiles(lat)
	if p50 != 5 || p99 != 100 {
		t.Errorf("p50 %d p99 %d, want 5 and 100", p50, p99)
	}
	if p50, p99 := LatencyPercentiles(nil); p50 != 0 || p99 != 0 {
		t.Errorf("no samples: p50 %d p99 %d, want 0", p50, p99)
	}
	if p50, p99 := LatencyPercentiles([]uint32{7}); p50 != 7 || p99 != 7 {
		t.Errorf("one sample: p50 %d p99 %d, want 7", p50, p99)
	}
}

func TestDnsperfArgs(t *testing.T) {
	r := Run{Server: "127.0.0.11:53", QueryFile: "q.txt", Duration: 10 * time.Second,
		Outstanding: 100, MaxQPS: 100000, Verbose: true, CPU: 1}
	want := "taskset -c 1 dnsperf -s 127.0.0.11 -p 53 -d q.txt -c 1 -T 1 -b 2048 -t 1 -q 100 -l 10 -Q 100000 -v"
	if got := strings.Join(r.Args(), " "); got != want {
		t.Errorf("args\n got %s\nwant %s", got, want)
	}
	r = Run{Server: "127.0.0.11:53", QueryFile: "q.txt", Outstanding: 20, CPU: 1}
	if got := strings.Join(r.Args(), " "); !strings.HasSuffix(got, "-q 20 -n 1") {
		t.Errorf("one pass: %s", got)
	}
}
