package daemon

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/localanswer"
	"github.com/dnsstandby/dnsstandby/pipeline"
)

// localFirst is a server block as the pipeline sees it: the answers the
// block makes itself (templates, then hosts, in CoreDNS's plugin order),
// and what they pass on goes to the block's upstream group, or gets
// SERVFAIL when the block has none, as CoreDNS answers a query no plugin
// of a block took.
type localFirst struct {
	answerers []localanswer.Answerer
	next      pipeline.Exchanger // nil: the block has no forward
}

// Exchange implements pipeline.Exchanger. The answerers see no client
// address: the pipeline shares one exchange among the clients asking the
// same question, and caches its reply for all of them.
func (l localFirst) Exchange(ctx context.Context, req *dns.Msg) (*dns.Msg, error) {
	r := localanswer.Request{Msg: req}
	for _, a := range l.answerers {
		if m, ok := a.Answer(r); ok {
			return m, nil
		}
	}
	if l.next == nil {
		m := new(dns.Msg)
		m.SetRcode(req, dns.RcodeServerFailure)
		return m, nil
	}
	return l.next.Exchange(ctx, req)
}

// direct answers for one client a block with whoami and no forward: its
// templates and hosts first, then whoami, which answers everything.
func direct(answerers []localanswer.Answerer) func(*dns.Msg, netip.AddrPort, bool) *dns.Msg {
	return func(req *dns.Msg, client netip.AddrPort, tcp bool) *dns.Msg {
		r := localanswer.Request{Msg: req, Client: client, TCP: tcp}
		for _, a := range answerers {
			if m, ok := a.Answer(r); ok {
				return m
			}
		}
		m, _ := localanswer.Whoami{}.Answer(r)
		return m
	}
}

// startLocal makes the route's own answerers and starts what they run
// (the hosts file's reload), stopped by the closers.
func (d *Daemon) startLocal(life context.Context, stack *closers, v *view, r Route) ([]localanswer.Answerer, error) {
	var out []localanswer.Answerer
	if len(r.Templates) > 0 {
		t, err := localanswer.NewTemplates(r.Templates)
		if err != nil {
			return nil, fmt.Errorf("templates of zone %s on %s: %w", r.Zone, v.listen, err)
		}
		out = append(out, t)
	}
	if r.Hosts != nil {
		hc := hostsConfig(&r)
		hc.Logger = d.base.With("listener", v.listen.String(), "zone", r.Zone)
		h, err := localanswer.NewHosts(hc)
		if err != nil {
			return nil, fmt.Errorf("hosts of zone %s on %s: %w", r.Zone, v.listen, err)
		}
		if err := h.Start(life); err != nil {
			return nil, fmt.Errorf("hosts of zone %s on %s: %w", r.Zone, v.listen, err)
		}
		stack.push("hosts "+r.Zone+" on "+v.listen.String(), h.Close)
		out = append(out, h)
	}
	return out, nil
}
