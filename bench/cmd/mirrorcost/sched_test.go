package main

import (
	"strings"
	"testing"
)

// A perf sched timehist excerpt: LocalDNS is pid 3777, dnsstandby 3787.
const timehist = `           time    cpu  task name                       wait time  sch delay   run time
                        [tid/pid]                          (msec)     (msec)     (msec)
--------------- ------  ------------------------------  ---------  ---------  ---------
   50157.000000 [0000]  perf[3808]                          0.000      0.000      0.000 
   50157.100000 [0000]  coredns[3785/3777]                  0.000      0.010      0.169 
   50157.200000 [0000]  <idle>                              0.000      0.000      0.332 
   50157.300000 [0000]  dnsstandby[3790/3787]               0.000      1.908      0.450 
   50157.400000 [0000]  coredns[3785/3777]                  0.332      0.300      0.819 
   50157.500000 [0000]  dnsstandby[3794/3787]               0.000      0.064      0.050 
   50157.600000 [0000]  memfd:sealed wk[91]                 0.000      0.000      0.010 
   50158.000000 [0000]  coredns[3786/3777]                  0.100      0.020      0.100 
`

func TestParseTimehist(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    schedStats
		wantErr string
	}{
		{"both", timehist, schedStats{StandbyRuns: 2, StandbyRunP99Us: 450, StandbyRunMaxUs: 450, StandbyCPUPct: 0.05,
			LocalDNSWakeups: 3, LocalDNSDelayP99Us: 300, LocalDNSDelayP999Us: 300}, ""},
		{"dnsstandby elsewhere", strings.ReplaceAll(timehist, "/3787]", "/9]"), schedStats{
			LocalDNSWakeups: 3, LocalDNSDelayP99Us: 300, LocalDNSDelayP999Us: 300}, ""},
		{"no LocalDNS", strings.ReplaceAll(timehist, "/3777]", "/9]"), schedStats{}, "no switch of LocalDNS's (pid 3777) threads"},
		{"a broken number", strings.Replace(timehist, "0.819", "0.8x9", 1), schedStats{}, `line "`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseTimehist(strings.NewReader(tt.in), 3787, 3777)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want one with %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := got.StandbyCPUPct - tt.want.StandbyCPUPct; d < -1e-9 || d > 1e-9 {
				t.Errorf("StandbyCPUPct %v, want %v", got.StandbyCPUPct, tt.want.StandbyCPUPct)
			}
			got.StandbyCPUPct = tt.want.StandbyCPUPct
			if *got != tt.want {
				t.Errorf("got %+v\nwant %+v", *got, tt.want)
			}
		})
	}
}

func TestSchedNote(t *testing.T) {
	tests := []struct {
		name string
		s    *schedStats
		want string
	}{
		{"not recorded", nil, ""},
		{"beside LocalDNS", &schedStats{StandbyRuns: 2, StandbyRunP99Us: 450, StandbyRunMaxUs: 450, StandbyCPUPct: 0.05,
			LocalDNSWakeups: 3, LocalDNSDelayP99Us: 300, LocalDNSDelayP999Us: 310},
			"; on LocalDNS's CPU dnsstandby ran 0.05% of the time, 2 times, at most 450 µs at a time (p99 450), and LocalDNS's threads waited p99 300 µs, p99.9 310 µs from wake-up to running"},
		{"elsewhere", &schedStats{LocalDNSWakeups: 3, LocalDNSDelayP99Us: 300, LocalDNSDelayP999Us: 310},
			"; dnsstandby did not run on LocalDNS's CPU, and LocalDNS's threads waited p99 300 µs, p99.9 310 µs from wake-up to running"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := schedNote(tt.s); got != tt.want {
				t.Errorf("got  %q\nwant %q", got, tt.want)
			}
		})
	}
}
