package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/dnsstandby/dnsstandby/bench/internal/dnsperf"
	"github.com/dnsstandby/dnsstandby/bench/internal/procstat"
	"github.com/dnsstandby/dnsstandby/bench/internal/promtext"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

// Addresses inside the node's namespace. Queries come from dnsperf in the
// same namespace, so LocalDNS's replies leave on lo, where the tap sees each
// once (as PACKET_OUTGOING).
const (
	// listenAddr is LocalDNS's pod-facing address, shared by dnsstandby.
	listenAddr = "169.254.10.11:53"
	// anchorLink holds 169.254.10.11/32 (a bridge: this machine has no
	// dummy driver), as localdns.sh's `localdns` link does on a node.
	anchorLink = "localdns"
	// The upstream, the kube-dns stand-in, on the namespace's loopback.
	upstreamAddr    = "127.0.0.10:53"
	upstreamMetrics = "127.0.0.10:9153"
	// LocalDNS's prometheus (AKS: :9253) and ready (AKS: .11:8181).
	localDNSMetrics = "127.0.0.1:9253"
	localDNSReady   = "169.254.10.11:8181"
	// dnsstandby's metrics, on its default port.
	standbyMetrics = "127.0.0.1:9355"
)

// upstreamTTL is the TTL of the names the upstream serves: long enough that
// no entry of either cache expires during the run.
const upstreamTTL = 3600

// node is the namespace with its address link and the upstream; LocalDNS
// and dnsstandby come and go per mirror feed.
type node struct {
	o         *options
	ns        *nstest.Namespace
	scratch   string   // configs, the dnstap socket, dnsperf output
	queryFile string   // dnsperf input, one "NAME A" per line
	names     []string // the names in queryFile
	upstream  *nstest.CoreDNS
	http      *http.Client // dials from inside ns
}

// newNode creates the namespace, the link with 169.254.10.11, the query
// file and the upstream. close undoes all of it, also after an error.
func newNode(o *options) (n *node, close func() error, err error) {
	ns, closeNS, err := nstest.Create(nstest.UniqueName("mirrorcost"))
	if err != nil {
		return nil, nil, fmt.Errorf("namespace: %w", err)
	}
	n = &node{o: o, ns: ns, http: promtext.Client(ns)}
	close = func() error {
		var errs []error
		if n.upstream != nil {
			errs = append(errs, n.upstream.Close())
		}
		errs = append(errs, closeNS()) // stops whatever still runs in it
		if n.scratch != "" {
			errs = append(errs, os.RemoveAll(n.scratch))
		}
		return errors.Join(errs...)
	}
	fail := func(err error) (*node, func() error, error) {
		return nil, nil, errors.Join(err, close())
	}
	if n.scratch, err = dnsperf.ScratchDir("bench-mirror-"); err != nil {
		return fail(err)
	}
	host, _, _ := strings.Cut(listenAddr, ":")
	if err := ns.AddLink(anchorLink, "bridge", host+"/32"); err != nil {
		return fail(err)
	}
	zones := nstest.KubeDNSZones(nstest.ZoneOptions{Services: o.names, TTL: upstreamTTL})
	for _, s := range zones.Services {
		n.names = append(n.names, s.FQDN)
	}
	if n.queryFile, err = dnsperf.WriteQueryFile(n.scratch, n.names); err != nil {
		return fail(err)
	}
	if err := n.startUpstream(zones); err != nil {
		return fail(err)
	}
	return n, close, nil
}

// startUpstream runs the authoritative CoreDNS serving cluster.local on the
// client's CPU, with prometheus so that upstreamQueries shows which queries
// reached it.
func (n *node) startUpstream(zones *nstest.Zones) error {
	const file = "db.cluster.local"
	if _, ok := zones.Files[file]; !ok {
		return fmt.Errorf("upstream: nstest zones have no %s", file)
	}
	host, port, _ := strings.Cut(upstreamAddr, ":")
	corefile := fmt.Sprintf("cluster.local:%s {\n    bind %s\n    file %s\n    prometheus %s\n}\n",
		port, host, file, upstreamMetrics)
	c, err := nstest.LaunchCoreDNS(n.ns, nstest.CoreDNSConfig{
		Binary: n.o.coredns, Corefile: corefile, Files: zones.Files, Probe: upstreamAddr,
	})
	if err != nil {
		return fmt.Errorf("upstream: %w", err)
	}
	n.upstream = c
	if err := procstat.Pin(c.Pid(), n.o.clientCPU); err != nil {
		return fmt.Errorf("upstream: %w", err)
	}
	return nil
}

// metrics fetches http://addr/metrics inside the namespace.
func (n *node) metrics(ctx context.Context, addr string) (promtext.Samples, error) {
	return promtext.Fetch(ctx, n.http, "http://"+addr+"/metrics")
}

// upstreamQueries is how many A queries for cluster.local the upstream has
// answered: a change across a warm-up pass or a measurement means a miss
// somewhere (only LocalDNS forwards; dnsstandby answers nothing).
func (n *node) upstreamQueries(ctx context.Context) (uint64, error) {
	s, err := n.metrics(ctx, upstreamMetrics)
	if err != nil {
		return 0, fmt.Errorf("upstream %w", err)
	}
	return uint64(s.Sum("coredns_dns_requests_total", map[string]string{"type": "A", "zone": "cluster.local."})), nil
}

// poll calls cond every interval until it returns true, an error that is
// not temporary, ctx ends, done closes, or timeout passes. cond's last
// reason for false is in the timeout error.
func poll(ctx context.Context, what string, timeout, interval time.Duration, done <-chan struct{},
	cond func() (ok bool, why string)) error {
	deadline := time.Now().Add(timeout)
	why := "not checked"
	for {
		var ok bool
		if ok, why = cond(); ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not after %v: %s", what, timeout, why)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-done:
			return fmt.Errorf("%s: the process exited (%s)", what, why)
		case <-time.After(interval):
		}
	}
}
