package main

import (
	"fmt"
	"io"
)

// printTable writes the points as a Markdown table.
func printTable(w io.Writer, points []point) {
	fmt.Fprintln(w, "| server | mode | qps | CPU µs/query | p50 µs | p99 µs | lost | server drops | client drops | server CPU % | dnsperf CPU % | upstream queries |")
	fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	for _, p := range points {
		fmt.Fprintf(w, "| %s | %s | %.0f | %.2f | %d | %d | %d | %d | %d | %.0f | %.0f | %d |\n",
			p.Name, p.Mode, p.QPS, p.CPUUs, p.P50Us, p.P99Us, p.Lost, p.RxDrops, p.ClientRxDrops,
			p.ServerCPUPct, p.ClientCPUPct, p.UpstreamQueries)
	}
}

// ratio is one comparison the design sets a target for.
type ratio struct {
	what   string
	value  float64
	target string
	met    bool
}

// ratios computes the comparisons that matter: dnsstandby's
// CPU per query against CoreDNS's and the reflector's, in each mode, and
// its full-rate throughput against CoreDNS's. A comparison whose points are
// missing (a server left out with -servers) is skipped.
func ratios(points []point, modes []mode) []ratio {
	find := func(name, mode string) *point {
		for i := range points {
			if points[i].Name == name && points[i].Mode == mode {
				return &points[i]
			}
		}
		return nil
	}
	var rs []ratio
	for _, m := range modes {
		ds := find("dnsstandby", m.name)
		if ds == nil {
			continue
		}
		if cd := find("coredns", m.name); cd != nil && cd.CPUUs > 0 {
			v := ds.CPUUs / cd.CPUUs
			rs = append(rs, ratio{"CPU/query dnsstandby ÷ CoreDNS, " + m.name + " rate", v, "≤ 0.75", v <= 0.75})
		}
		if rf := find("reflector", m.name); rf != nil && rf.CPUUs > 0 {
			v := ds.CPUUs / rf.CPUUs
			rs = append(rs, ratio{"CPU/query dnsstandby ÷ reflector, " + m.name + " rate", v, "≤ 1.15", v <= 1.15})
		}
		if b1 := find("dnsstandby-batch1", m.name); b1 != nil && b1.CPUUs > 0 {
			// No target: this says whether batching earns its keep.
			v := ds.CPUUs / b1.CPUUs
			rs = append(rs, ratio{"CPU/query dnsstandby ÷ dnsstandby-batch1, " + m.name + " rate", v, "< 1", v < 1})
		}
		if cd := find("coredns", m.name); m.maxQPS == 0 && cd != nil && cd.QPS > 0 {
			v := ds.QPS / cd.QPS
			rs = append(rs, ratio{"qps dnsstandby ÷ CoreDNS, " + m.name + " rate", v, "≥ 1.3", v >= 1.3})
		}
	}
	return rs
}

func printRatios(w io.Writer, rs []ratio) {
	for _, r := range rs {
		verdict := "met"
		if !r.met {
			verdict = "MISSED"
		}
		fmt.Fprintf(w, "- %s: **%.2f×** (target %s: %s)\n", r.what, r.value, r.target, verdict)
	}
}
