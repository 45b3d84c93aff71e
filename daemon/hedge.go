package daemon

import (
	"context"
	"net/netip"
	"sync"
	"time"

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
	run    *pipeline.Worker // Cached: the hedger's Run goroutine only
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

// observer hands the tap's packets to a hedger.
type observer struct{ h *hedge.Hedger }

func (o observer) Query(p *tap.Packet)      { o.h.Query(p.At, p.Client, p.DNS) }
func (o observer) Reply(p *tap.Packet) bool { return o.h.Reply(p.At, p.Client, p.DNS) }

// newHedger makes view v's hedger, its deadlines not yet running (see
// startHedgers), and registers its metrics under v's listener label.
func (d *Daemon) newHedger(v *view) (*hedge.Hedger, error) {
	hc := d.cfg.hedgeConfig()
	hc.Logger = d.base.With("listener", v.listen.String())
	a := &answers{listen: v.listen, pipe: v.pipe, srv: d.srv, run: v.pipe.NewWorker(), tap: v.pipe.NewWorker()}
	h, err := hedge.New(hc, a)
	if err != nil {
		return nil, err
	}
	v.reg.MustRegister(h)
	return h, nil
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
