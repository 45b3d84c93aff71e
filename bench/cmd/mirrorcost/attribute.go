package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
)

// What a feed costs LocalDNS is LocalDNS's CPU with the feed less without
// it, and on this project's VMs that difference drowns in how fast the one
// LocalDNS process runs from one window to the next (53.7 to 80.3
// µs/query beside the same process in one run): the host's other tenants
// take the core, and the guest has no steal accounting to tell. A profile
// of the window itself does not drift so: the share of LocalDNS's samples
// whose call chain passes through code that runs only because a feed
// watches it, times its CPU per query, is that feed's cost to LocalDNS in
// the same window. It leaves out indirect costs (caches the feed's code
// evicts), so it is a floor where the difference is a noisy estimate.

// feedPaths are the code LocalDNS runs only because a feed watches it: in
// the kernel, the cgroup skb hook (ring mode's programs and the ring under
// them), packet sockets' delivery (the query sockets' filter; packet
// mode's tap) and the clone of each sent packet for an ETH_P_ALL socket;
// in CoreDNS, the dnstap plugin and its encoder.
var feedPaths = []string{
	"__cgroup_bpf_run_filter_skb",
	"packet_rcv",
	"tpacket_rcv",
	"dev_queue_xmit_nit",
	"coredns/plugin/dnstap",
	"dnstap/golang-dnstap",
}

// feedSamples counts the samples in r, perf script's output with call
// chains (one sample a block, blocks apart by a blank line), and those
// whose chain passes through one of feedPaths.
func feedSamples(r io.Reader) (samples, feed int, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	in, hit := false, false
	end := func() {
		if in {
			samples++
			if hit {
				feed++
			}
		}
		in, hit = false, false
	}
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			end()
			continue
		}
		in = true
		for _, p := range feedPaths {
			if !hit && strings.Contains(line, p) {
				hit = true
			}
		}
	}
	end()
	if err := sc.Err(); err != nil {
		return 0, 0, fmt.Errorf("read perf script: %w", err)
	}
	return samples, feed, nil
}

// feedShare is the share of pid's samples in the perf data file whose
// call chain passes through one of feedPaths.
func feedShare(ctx context.Context, file string, pid int) (float64, error) {
	cmd := exec.CommandContext(ctx, "perf", "script", "-i", file, "--pid", strconv.Itoa(pid), "-F", "ip,sym")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, fmt.Errorf("perf script: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("perf script: %w", err)
	}
	samples, feed, readErr := feedSamples(out)
	if readErr != nil {
		_ = cmd.Process.Kill()
	}
	if err := cmd.Wait(); err != nil && readErr == nil {
		return 0, fmt.Errorf("perf script -i %s: %w", file, err)
	}
	if readErr != nil {
		return 0, readErr
	}
	if samples == 0 {
		return 0, fmt.Errorf("perf script -i %s: no samples of pid %d", file, pid)
	}
	return float64(feed) / float64(samples), nil
}
