package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/bench/internal/procstat"
	"github.com/dnsstandby/dnsstandby/bench/internal/testbed"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

// server is one of the DNS servers compared.
type server struct {
	name   string // as in the table and the JSON
	addr   string // ADDR:PORT it answers on, its own
	caches bool   // answers from a cache warmed through the upstream (all but the reflector)
	start  func(bed *testbed.Bed, b binaries, addr string) (instance, error)
}

// instance is a started server.
type instance interface {
	Pid() int
	Output() string // the tail of its stdout and stderr, for errors
	Done() <-chan struct{}
	Close() error // stop it and remove what it wrote
}

// binaries are the programs the servers run.
type binaries struct {
	dnsstandby, coredns, dnsdist, reflector string
}

// servers are the contenders, in the order they run. dnsstandby-batch1 is
// dnsstandby reading and writing one datagram per system call: it shows
// what recvmmsg/sendmmsg batching buys.
var servers = []server{
	{name: "dnsstandby", addr: "127.0.0.11:53", caches: true, start: startDnsstandby},
	{name: "dnsstandby-batch1", addr: "127.0.0.15:53", caches: true, start: startDnsstandbyBatch1},
	{name: "coredns", addr: "127.0.0.12:53", caches: true, start: startCoreDNS},
	{name: "dnsdist", addr: "127.0.0.13:53", caches: true, start: startDnsdist},
	{name: "reflector", addr: "127.0.0.14:53", caches: false, start: startReflector},
}

// process adapts an nstest.Process to instance.
type process struct{ *nstest.Process }

func (p process) Close() error { return p.Stop() }

// startDnsstandby runs dnsstandby as deployed, except that it listens on the
// lab's address, forwards misses to the lab's upstream and serves no
// metrics endpoint. Everything else (readers, batch size, cache bounds) is
// its default.
func startDnsstandby(bed *testbed.Bed, b binaries, addr string) (instance, error) {
	return startDnsstandbyArgs(bed, b, addr)
}

func startDnsstandbyBatch1(bed *testbed.Bed, b binaries, addr string) (instance, error) {
	return startDnsstandbyArgs(bed, b, addr, "--udp-batch", "1")
}

func startDnsstandbyArgs(bed *testbed.Bed, b binaries, addr string, extra ...string) (instance, error) {
	args := append([]string{"run", "--listen", addr, "--upstream", testbed.UpstreamAddr, "--metrics-addr", "", "--lock-file", ""}, extra...)
	p, err := bed.NS.Start(b.dnsstandby, args...)
	if err != nil {
		return nil, fmt.Errorf("start dnsstandby: %w", err)
	}
	return process{p}, nil
}

// coreDNSCorefile is a LocalDNS-like server block: the cache settings AKS
// gives LocalDNS's pod-facing block, in front of forward. It leaves out the
// plugins that do not serve the query (log is off in LocalDNS; errors,
// prometheus, nsid and the rest are left out), so this is CoreDNS's
// cheapest cache-hit path, not LocalDNS's full one.
const coreDNSCorefile = `.:%s {
    bind %s
    cache 3600 {
        success 9984
        denial 9984
        serve_stale 72000s verify
        servfail 0
    }
    forward . %s {
        prefer_udp
    }
}
`

func startCoreDNS(bed *testbed.Bed, b binaries, addr string) (instance, error) {
	host, port, _ := strings.Cut(addr, ":")
	c, err := nstest.LaunchCoreDNS(bed.NS, nstest.CoreDNSConfig{
		Binary:   b.coredns,
		Corefile: fmt.Sprintf(coreDNSCorefile, port, host, testbed.UpstreamAddr),
		Probe:    addr,
	})
	if err != nil {
		return nil, fmt.Errorf("start coredns: %w", err)
	}
	return c, nil
}

// dnsdistConfig puts dnsdist's packet cache in front of the upstream.
// Health checks ask for the SOA, so they stay out of the upstream's A
// query count; security polling (a DNS query to powerdns.com) is off.
const dnsdistConfig = `setSecurityPollSuffix("")
setLocal(%q)
newServer({address=%q, checkName="cluster.local.", checkType="SOA"})
pc = newPacketCache(10000, {maxTTL=86400, minTTL=0})
getPool(""):setCache(pc)
`

// dnsdistInstance is dnsdist with its configuration directory.
type dnsdistInstance struct {
	process
	dir string
}

func (d dnsdistInstance) Close() error {
	return errors.Join(d.process.Close(), os.RemoveAll(d.dir))
}

func startDnsdist(bed *testbed.Bed, b binaries, addr string) (instance, error) {
	dir, err := os.MkdirTemp(bed.Scratch, "dnsdist-")
	if err != nil {
		return nil, fmt.Errorf("start dnsdist: %w", err)
	}
	conf := filepath.Join(dir, "dnsdist.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(dnsdistConfig, addr, testbed.UpstreamAddr)), 0o644); err != nil {
		return nil, errors.Join(fmt.Errorf("start dnsdist: %w", err), os.RemoveAll(dir))
	}
	// --supervised: stay in the foreground without a console.
	p, err := bed.NS.Start(b.dnsdist, "--supervised", "--disable-syslog", "-C", conf)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("start dnsdist: %w", err), os.RemoveAll(dir))
	}
	return dnsdistInstance{process{p}, dir}, nil
}

func startReflector(bed *testbed.Bed, b binaries, addr string) (instance, error) {
	p, err := bed.NS.Start(b.reflector, "-listen", addr)
	if err != nil {
		return nil, fmt.Errorf("start reflector: %w", err)
	}
	return process{p}, nil
}

// launch starts s, waits until it answers and pins it to cpu. On error it
// leaves nothing running.
func launch(ctx context.Context, bed *testbed.Bed, b binaries, s server, cpu int) (instance, error) {
	inst, err := s.start(bed, b, s.addr)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (instance, error) {
		err = fmt.Errorf("%s: %w\noutput:\n%s", s.name, err, inst.Output())
		return nil, errors.Join(err, inst.Close())
	}
	if err := waitAnswering(ctx, bed, s.addr, inst.Done()); err != nil {
		return fail(err)
	}
	if err := procstat.Pin(inst.Pid(), cpu); err != nil {
		return fail(err)
	}
	return inst, nil
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
func waitAnswering(ctx context.Context, bed *testbed.Bed, addr string, done <-chan struct{}) error {
	q := new(dns.Msg)
	q.SetQuestion(bed.Names[0], dns.TypeA)
	// A refused port fails at once: the poll's growing pause keeps that from spinning.
	return testbed.Poll(ctx, "answering NOERROR on "+addr, startTimeout, done, func() (bool, string) {
		r, err := bed.NS.Exchange("udp", "", addr, q, probeTimeout)
		switch {
		case err != nil:
			return false, err.Error()
		case r.Rcode != dns.RcodeSuccess:
			return false, "answered " + dns.RcodeToString[r.Rcode]
		}
		return true, ""
	})
}
