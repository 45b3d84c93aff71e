package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/bench/internal/dnsperf"
	"github.com/dnsstandby/dnsstandby/bench/internal/procstat"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

// Addresses inside the lab's namespace. Everything is on its loopback
// (127.0.0.0/8 is local there), so no packet leaves the namespace and each
// server gets an address of its own on port 53.
const (
	upstreamAddr    = "127.0.0.10:53"
	upstreamMetrics = "127.0.0.10:9153" // CoreDNS's usual prometheus port
)

// upstreamTTL is the TTL of the names the upstream serves: an hour, so that
// no cache's entry expires during a run of a few minutes and every measured
// query is a hit (the upstream's query counter checks that).
const upstreamTTL = 3600

// lab is the namespace the benchmark runs in, with the authoritative
// upstream every cache forwards its misses to.
type lab struct {
	ns        *nstest.Namespace // always non-nil
	scratch   string            // temporary files: configs, dnsperf output
	queryFile string            // dnsperf input, one "NAME A" per line
	names     []string          // the names in queryFile
	upstream  *nstest.CoreDNS
	metrics   *http.Client // dials from inside ns
}

// newLab creates the namespace, writes the query file and starts the
// upstream on upstreamCPU. close undoes all of it, also after an error.
func newLab(coredns string, names, upstreamCPU int) (l *lab, close func() error, err error) {
	ns, closeNS, err := nstest.Create(nstest.UniqueName("peers"))
	if err != nil {
		return nil, nil, fmt.Errorf("lab namespace: %w", err)
	}
	l = &lab{ns: ns}
	close = func() error {
		var errs []error
		if l.upstream != nil {
			errs = append(errs, l.upstream.Close())
		}
		errs = append(errs, closeNS())
		if l.scratch != "" {
			errs = append(errs, os.RemoveAll(l.scratch))
		}
		return errors.Join(errs...)
	}
	fail := func(err error) (*lab, func() error, error) {
		return nil, nil, errors.Join(err, close())
	}
	if l.scratch, err = dnsperf.ScratchDir("bench-peers-"); err != nil {
		return fail(err)
	}
	l.metrics = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return ns.Dial(network, "", addr, 5*time.Second)
		},
	}}

	zones := nstest.KubeDNSZones(nstest.ZoneOptions{Services: names, TTL: upstreamTTL})
	for _, s := range zones.Services {
		l.names = append(l.names, s.FQDN)
	}
	if l.queryFile, err = dnsperf.WriteQueryFile(l.scratch, l.names); err != nil {
		return fail(err)
	}
	if err := l.startUpstream(coredns, zones, upstreamCPU); err != nil {
		return fail(err)
	}
	return l, close, nil
}

// startUpstream runs the authoritative CoreDNS serving cluster.local, with
// its prometheus endpoint so that upstreamQueries can show which queries
// reached it.
func (l *lab) startUpstream(coredns string, zones *nstest.Zones, cpu int) error {
	const file = "db.cluster.local"
	if _, ok := zones.Files[file]; !ok {
		return fmt.Errorf("upstream: nstest zones have no %s", file)
	}
	host, port, _ := strings.Cut(upstreamAddr, ":")
	corefile := fmt.Sprintf("cluster.local:%s {\n    bind %s\n    file %s\n    prometheus %s\n}\n",
		port, host, file, upstreamMetrics)
	c, err := nstest.LaunchCoreDNS(l.ns, nstest.CoreDNSConfig{
		Binary: coredns, Corefile: corefile, Files: zones.Files, Probe: upstreamAddr,
	})
	if err != nil {
		return fmt.Errorf("upstream: %w", err)
	}
	l.upstream = c
	// The upstream only works during warm-up; keep it off the server's CPU.
	if err := procstat.Pin(c.Pid(), cpu); err != nil {
		return fmt.Errorf("upstream: %w", err)
	}
	return nil
}

// upstreamQueries returns how many A queries for cluster.local the upstream
// has answered so far. dnsdist's health checks ask for the SOA, so they do
// not count; a change across a measurement means a cache missed.
func (l *lab) upstreamQueries(ctx context.Context) (uint64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+upstreamMetrics+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := l.metrics.Do(req)
	if err != nil {
		return 0, fmt.Errorf("upstream metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("upstream metrics: %s", resp.Status)
	}
	var sum uint64
	s := bufio.NewScanner(resp.Body)
	for s.Scan() {
		line := s.Text()
		if !strings.HasPrefix(line, "coredns_dns_requests_total{") ||
			!strings.Contains(line, `type="A"`) || !strings.Contains(line, `zone="cluster.local."`) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("upstream metrics %q: %w", line, err)
		}
		sum += uint64(v)
	}
	if err := s.Err(); err != nil {
		return 0, fmt.Errorf("upstream metrics: %w", err)
	}
	return sum, nil
}

// probeTimeout bounds one readiness probe; probes repeat until
// startTimeout.
const (
	probeTimeout = 100 * time.Millisecond
	startTimeout = 15 * time.Second
)

// waitAnswering asks addr for the first query name until it answers
// NOERROR, the process exits, or startTimeout passes. NOERROR, not any
// reply: a dnsdist whose backend is not yet marked up answers SERVFAIL.
func (l *lab) waitAnswering(ctx context.Context, addr string, done <-chan struct{}) error {
	q := new(dns.Msg)
	q.SetQuestion(l.names[0], dns.TypeA)
	deadline := time.Now().Add(startTimeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return fmt.Errorf("exited before answering on %s", addr)
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		r, err := l.ns.Exchange("udp", "", addr, q, probeTimeout)
		switch {
		case err != nil:
			last = err
		case r.Rcode != dns.RcodeSuccess:
			last = fmt.Errorf("answered %s", dns.RcodeToString[r.Rcode])
		default:
			return nil
		}
		time.Sleep(probeTimeout / 4) // a refused port fails at once: do not spin
	}
	return fmt.Errorf("not answering NOERROR on %s after %v: %v", addr, startTimeout, last)
}
