// Command coredns is CoreDNS v1.13.1, every standard plugin in its usual
// order, plus lossy, a fault plugin the lab needs and CoreDNS does not
// have: it drops a share of the queries a block would answer, cache hits
// included, and passes every other query on unchanged.
//
// CoreDNS's own erratic cannot do that: it answers every query itself
// (192.0.2.53 for A, SERVFAIL for most other types) and never calls the
// plugins after it, and in the compiled order it comes after cache and
// forward, so in a block with those it never sees a query at all. Moved
// before cache it would replace LocalDNS's answers, a different fault.
//
//	lossy AMOUNT [FILE]
//
// drops 1 in AMOUNT queries (the first, then every AMOUNTth, counted per
// block as erratic counts) while FILE exists, or always without FILE. The
// file is looked at every 50 ms, so a test turns the loss on and off
// without a reload: CoreDNS's reload (SIGUSR1) keeps the sockets but
// starts every plugin afresh, which empties the cache, a fault of its own.
package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	_ "github.com/coredns/coredns/core/plugin" // every standard plugin
	"github.com/coredns/coredns/coremain"
	"github.com/coredns/coredns/plugin"
	"github.com/miekg/dns"
)

// lossyPoll is how often lossy looks for its switch file.
const lossyPoll = 50 * time.Millisecond

func init() {
	// Just before cache: ahead of every plugin that answers (cache,
	// template, hosts, forward, whoami), after the ones that only watch
	// (prometheus, errors, log, nsid), as a lossy link in front of the
	// server would look to them.
	i := slices.Index(dnsserver.Directives, "cache")
	if i < 0 {
		panic("coredns: no cache directive to put lossy before")
	}
	dnsserver.Directives = slices.Insert(dnsserver.Directives, i, "lossy")
	plugin.Register("lossy", setupLossy)
}

func main() { coremain.Run() }

// lossy drops the first of every `every` queries while on; each server
// block has its own.
type lossy struct {
	next  plugin.Handler
	every uint64
	n     atomic.Uint64 // queries seen while on
	on    atomic.Bool
}

func (l *lossy) Name() string { return "lossy" }

func (l *lossy) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	if l.on.Load() && (l.n.Add(1)-1)%l.every == 0 {
		// Nothing written: the client sees a lost datagram.
		return dns.RcodeSuccess, nil
	}
	return plugin.NextOrFailure(l.Name(), l.next, ctx, w, r)
}

func setupLossy(c *caddy.Controller) error {
	l := &lossy{}
	var file string
	for c.Next() {
		args := c.RemainingArgs()
		if len(args) < 1 || len(args) > 2 {
			return plugin.Error("lossy", c.ArgErr())
		}
		n, err := strconv.ParseUint(args[0], 10, 32)
		if err != nil || n < 1 {
			return plugin.Error("lossy", fmt.Errorf("amount %q: want a whole number from 1", args[0]))
		}
		l.every = n
		if len(args) == 2 {
			file = args[1]
		}
	}
	if file == "" {
		l.on.Store(true)
	} else {
		stop := make(chan struct{})
		go l.watch(file, stop)
		c.OnShutdown(func() error { close(stop); return nil })
	}
	dnsserver.GetConfig(c).AddPlugin(func(next plugin.Handler) plugin.Handler {
		l.next = next
		return l
	})
	return nil
}

// watch turns l on while file exists, until stop is closed.
func (l *lossy) watch(file string, stop <-chan struct{}) {
	t := time.NewTicker(lossyPoll)
	defer t.Stop()
	for {
		_, err := os.Stat(file)
		l.on.Store(err == nil)
		select {
		case <-t.C:
		case <-stop:
			return
		}
	}
}
