// Package testbed sets up the place a benchmark command measures in: a
// network namespace of its own holding an authoritative upstream CoreDNS
// (the kube-dns stand-in) that serves the names dnsperf asks for, a scratch
// directory with dnsperf's query file, and an HTTP client that reaches the
// namespace's /metrics and /ready pages. Everything inside the namespace is
// on its loopback (127.0.0.0/8 is local there), so no packet leaves it.
package testbed

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/dnsstandby/dnsstandby/bench/internal/dnsperf"
	"github.com/dnsstandby/dnsstandby/bench/internal/procstat"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

// The upstream's addresses inside the namespace.
const (
	UpstreamAddr    = "127.0.0.10:53"
	UpstreamMetrics = "127.0.0.10:9153" // CoreDNS's usual prometheus port
)

// Config is what a Bed is made of.
type Config struct {
	// Name tags the namespace (nstest.UniqueName) and the scratch
	// directory: the command's name.
	Name string
	// CoreDNS is the coredns binary the upstream runs.
	CoreDNS string
	// Names is how many distinct A names the upstream serves and the
	// query file asks for.
	Names int
	// UpstreamTTL is the TTL of those names: long enough that no cache's
	// entry expires during a run, so that every measured query is a hit
	// (UpstreamQueries checks that).
	UpstreamTTL time.Duration
	// UpstreamCPU is the CPU the upstream is pinned to: it works only
	// during warm-up, and is kept off the servers' CPU.
	UpstreamCPU int
}

// DefaultConfig is a bed of 1,000 names with a TTL of an hour, the upstream
// on CPU 1. Name and CoreDNS have no default.
func DefaultConfig() Config {
	return Config{Names: 1000, UpstreamTTL: time.Hour, UpstreamCPU: 1}
}

// Bed is a namespace with the upstream in it. Close removes all of it.
type Bed struct {
	NS        *nstest.Namespace
	Scratch   string       // temporary files: configs, sockets, dnsperf output
	QueryFile string       // dnsperf input, one "NAME A" per line
	Names     []string     // the names in QueryFile
	HTTP      *http.Client // dials from inside NS

	upstream *nstest.CoreDNS
	closeNS  func() error
}

// New creates the namespace, writes the query file and starts the upstream
// on cfg.UpstreamCPU. On error it leaves nothing behind.
func New(cfg Config) (*Bed, error) {
	switch {
	case cfg.Name == "":
		return nil, errors.New("testbed: Name must be set")
	case cfg.CoreDNS == "":
		return nil, errors.New("testbed: CoreDNS must be set")
	case cfg.Names < 1:
		return nil, fmt.Errorf("testbed: Names must be at least 1, got %d", cfg.Names)
	case cfg.UpstreamTTL < time.Second || cfg.UpstreamTTL%time.Second != 0:
		return nil, fmt.Errorf("testbed: UpstreamTTL must be whole seconds, at least 1, got %v", cfg.UpstreamTTL)
	}
	ns, closeNS, err := nstest.Create(nstest.UniqueName(cfg.Name))
	if err != nil {
		return nil, fmt.Errorf("testbed: namespace: %w", err)
	}
	b := &Bed{NS: ns, HTTP: httpClient(ns), closeNS: closeNS}
	fail := func(err error) (*Bed, error) {
		return nil, errors.Join(fmt.Errorf("testbed: %w", err), b.Close())
	}
	if b.Scratch, err = dnsperf.ScratchDir("bench-" + cfg.Name + "-"); err != nil {
		return fail(err)
	}
	zones := nstest.KubeDNSZones(nstest.ZoneOptions{Services: cfg.Names, TTL: uint32(cfg.UpstreamTTL / time.Second)})
	for _, s := range zones.Services {
		b.Names = append(b.Names, s.FQDN)
	}
	if b.QueryFile, err = dnsperf.WriteQueryFile(b.Scratch, b.Names); err != nil {
		return fail(err)
	}
	if err := b.startUpstream(cfg, zones); err != nil {
		return fail(err)
	}
	return b, nil
}

// Close stops the upstream and whatever else still runs in the namespace,
// removes the namespace and the scratch directory.
func (b *Bed) Close() error {
	var errs []error
	if b.upstream != nil {
		errs = append(errs, b.upstream.Close())
	}
	errs = append(errs, b.closeNS()) // stops whatever still runs in it
	if b.Scratch != "" {
		errs = append(errs, os.RemoveAll(b.Scratch))
	}
	return errors.Join(errs...)
}

// startUpstream runs the authoritative CoreDNS serving cluster.local, with
// its prometheus endpoint so that UpstreamQueries can show which queries
// reached it.
func (b *Bed) startUpstream(cfg Config, zones *nstest.Zones) error {
	const file = "db.cluster.local"
	if _, ok := zones.Files[file]; !ok {
		return fmt.Errorf("upstream: nstest zones have no %s", file)
	}
	host, port, _ := strings.Cut(UpstreamAddr, ":")
	corefile := fmt.Sprintf("cluster.local:%s {\n    bind %s\n    file %s\n    prometheus %s\n}\n",
		port, host, file, UpstreamMetrics)
	c, err := nstest.LaunchCoreDNS(b.NS, nstest.CoreDNSConfig{
		Binary: cfg.CoreDNS, Corefile: corefile, Files: zones.Files, Probe: UpstreamAddr,
	})
	if err != nil {
		return fmt.Errorf("upstream: %w", err)
	}
	b.upstream = c
	if err := procstat.Pin(c.Pid(), cfg.UpstreamCPU); err != nil {
		return fmt.Errorf("upstream: %w", err)
	}
	return nil
}

// UpstreamQueries is how many A queries for cluster.local the upstream has
// answered so far: a change across a warm-up pass or a measurement means a
// cache missed. (dnsdist's health checks ask for the SOA, so they do not
// count.)
func (b *Bed) UpstreamQueries(ctx context.Context) (uint64, error) {
	m, err := b.Metrics(ctx, UpstreamMetrics)
	if err != nil {
		return 0, fmt.Errorf("upstream %w", err)
	}
	return uint64(m.Sum("coredns_dns_requests_total", map[string]string{"type": "A", "zone": "cluster.local."})), nil
}

// WarmPass sends every name once to server, with dnsperf on cpu, and
// returns how many queries reached the upstream meanwhile. Every name must
// be answered NOERROR.
func (b *Bed) WarmPass(ctx context.Context, server string, cpu int) (upstream uint64, err error) {
	before, err := b.UpstreamQueries(ctx)
	if err != nil {
		return 0, err
	}
	r, err := dnsperf.Exec(ctx, b.NS, b.Scratch, dnsperf.Run{Server: server, QueryFile: b.QueryFile,
		Outstanding: 20, CPU: cpu})
	if err != nil {
		return 0, err
	}
	if r.Completed != uint64(len(b.Names)) || r.Rcodes["NOERROR"] != r.Completed {
		return 0, fmt.Errorf("%d of %d answered, rcodes %v", r.Completed, len(b.Names), r.Rcodes)
	}
	after, err := b.UpstreamQueries(ctx)
	if err != nil {
		return 0, err
	}
	return after - before, nil
}

// httpClient is an HTTP client whose connections are dialled from inside
// ns, so that it reaches addresses (127.0.0.1 included) of that namespace.
func httpClient(ns *nstest.Namespace) *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return ns.Dial(network, "", addr, 5*time.Second)
		},
	}}
}
