package daemon

import (
	"context"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dnsstandby/dnsstandby/clock"
	"github.com/dnsstandby/dnsstandby/hedge"
	"github.com/dnsstandby/dnsstandby/mirror/tap"
	"github.com/dnsstandby/dnsstandby/pipeline"
	"github.com/dnsstandby/dnsstandby/responder"
	"github.com/dnsstandby/dnsstandby/takeover"
)

// This file wires hedging in: each listen address's tap shows its hedger
// the queries LocalDNS receives and the replies it sends, and the hedger
// answers, from dnsstandby's own socket on that address, those LocalDNS
// leaves unanswered (package hedge). Hedging needs the tap; it tracks
// queries only while takeover says LocalDNS gets every one (mirror at
// level adopt: the same condition as the tap's inserting), since a query
// dnsstandby's own socket received is answered already.

// hedging reports whether the daemon hedges: asked for, with the tap as
// the mirror feed (only the tap sees queries).
func (c *Config) hedging() bool { return c.Hedging && c.Mirror.Kind == MirrorTap }

// answers is a hedger's Answerer over one view: its pipeline and the
// responder's socket on its listen address.
type answers struct {
	listen netip.AddrPort
	pipe   *pipeline.Pipeline
	srv    *responder.Server
	run    *pipeline.Worker // Cached: the hedger's ticks only (one at a time)
	tap    *pipeline.Worker // Fresh: the tap's goroutine only
}

func (a *answers) Cached(dst, query []byte) (int, bool) { return a.run.Cached(dst, query) }
func (a *answers) Fresh(query []byte) bool              { return a.tap.Fresh(query) }

func (a *answers) Resolve(client netip.AddrPort, query []byte, send func([]byte)) {
	a.pipe.Resolve(query, client, true, send)
}

func (a *answers) Send(client netip.AddrPort, reply []byte) error {
	return a.srv.SendTo(a.listen, client, reply)
}

// observer hands the tap's packets to a hedger, and the queries to a
// warmer.
type observer struct {
	h    *hedge.Hedger
	warm *warmer
	clk  *clock.Coarse
}

func (o observer) Query(p *tap.Packet) {
	o.h.Query(p.At, p.Client, p.DNS)
	o.warm.query(p.Client, p.DNS)
}
func (o observer) Reply(p *tap.Packet) bool {
	if p.QueryAt != 0 {
		// Its query, matched in the kernel, was not shown: nothing to
		// warm (the nat fallback's queries reach no LocalDNS socket).
		return o.h.Answered(p.QueryAt, p.At, p.Client, p.DNS)
	}
	return o.h.Reply(p.At, p.Client, p.DNS)
}

// Drained ticks the hedger, and moves the coarse clock on: the tap reads
// at least every 50 ms while queries come, so the clock need not wake for
// the mirror's reads of it.
func (o observer) Drained(now, unseen int64) int64 {
	o.clk.Advance(now)
	return o.h.Drained(now, unseen)
}

// The hedger ticks on the tap's reads.
var _ tap.Drainer = observer{}

// warmer keeps a view's cache warm while AKS's nat fallback takes the
// listen address's queries (takeover.FallbackNAT): neither LocalDNS nor
// dnsstandby sees them or their answers (the replies are forwarded by the
// node, which the tap's filter refuses), but the tap still sees each
// query arrive, so a query whose answer is not cached fresh is resolved
// in the background, as a miss of LocalDNS's own cache would be, and
// LocalDNS's return finds the cache warm. Identical misses in flight
// share one resolution and the pipeline's caps bound them, so the
// upstreams see about what LocalDNS would have sent them; the answers go
// nowhere, and the pods' queries are left to the fallback untouched.
type warmer struct {
	on atomic.Bool // the nat fallback is seen
	a  *answers
}

// query is called from the tap's goroutine (Fresh's worker is its).
func (w *warmer) query(client netip.AddrPort, msg []byte) {
	if !w.on.Load() || w.a.Fresh(msg) {
		return
	}
	w.a.pipe.Resolve(msg, client, true, func([]byte) {})
}

// newHedger makes view v's hedger, its deadlines not yet running (see
// startHedgers), and registers its metrics under v's listener label.
func (d *Daemon) newHedger(v *view) (observer, error) {
	hc := d.cfg.hedgeConfig()
	hc.Logger = d.base.With("listener", v.listen.String())
	a := &answers{listen: v.listen, pipe: v.pipe, srv: d.srv, run: v.pipe.NewWorker(), tap: v.pipe.NewWorker()}
	h, err := hedge.New(hc, a)
	if err != nil {
		return observer{}, err
	}
	v.reg.MustRegister(h)
	return observer{h: h, warm: &warmer{a: a}, clk: d.clk}, nil
}

// startHedgers runs the hedgers' deadlines once takeover runs: a fast
// hold goes to its controller ctrl. It stops them first at shutdown,
// before the sockets they answer from drain.
func (d *Daemon) startHedgers(life context.Context, stack *closers, ctrl *takeover.Controller) {
	ctx, cancel := context.WithCancel(life)
	var wg sync.WaitGroup
	for _, v := range d.views {
		if v.hedger == nil {
			continue
		}
		listen := v.listen
		silent := func(unanswered int, since time.Time) {
			ctrl.Silent(takeover.Silence{Listener: listen, Unanswered: unanswered, Since: since})
		}
		wg.Go(func() { v.hedger.Run(ctx, silent) })
	}
	stack.push("hedgers", func() error { cancel(); wg.Wait(); return nil })
}
