package main

import (
	"fmt"
	"slices"
	"testing"
)

func TestRatios(t *testing.T) {
	modes := []mode{{name: "fixed", maxQPS: 100000}, {name: "full"}}
	points := []point{
		{Name: "dnsstandby", Mode: "fixed", CPUUs: 3, QPS: 100000},
		{Name: "coredns", Mode: "fixed", CPUUs: 10, QPS: 60000},
		{Name: "reflector", Mode: "fixed", CPUUs: 2, QPS: 100000},
		{Name: "dnsstandby", Mode: "full", CPUUs: 2, QPS: 260000},
		{Name: "coredns", Mode: "full", CPUUs: 10, QPS: 100000},
	}
	var got []string
	for _, r := range ratios(points, modes) {
		got = append(got, fmt.Sprintf("%s %.2f %v", r.what, r.value, r.met))
	}
	// No reflector at full rate: that comparison is skipped.
	want := []string{
		"CPU/query dnsstandby ÷ CoreDNS, fixed rate 0.30 true",
		"CPU/query dnsstandby ÷ reflector, fixed rate 1.50 false",
		"CPU/query dnsstandby ÷ CoreDNS, full rate 0.20 true",
		"qps dnsstandby ÷ CoreDNS, full rate 2.60 true",
	}
	if !slices.Equal(got, want) {
		t.Errorf("ratios\n got %q\nwant %q", got, want)
	}
}
