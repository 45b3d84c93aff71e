// Package dnat notices that the queries for the listen addresses are
// taken before any socket sees them: AKS's LocalDNS fallback in its nat
// design (AgentBaker PR 9486, v3), an iptables nat chain LOCALDNS-FALLBACK
// first in PREROUTING and OUTPUT that DNATs 169.254.10.11 to kube-dns and
// 169.254.10.10 to the VNet's DNS server.
//
// The packet tap sees a pod's query on its veth before netfilter rewrites
// it; a query so rewritten never reaches a socket of the reuseport group.
// So, while dnsstandby's sockets should be getting the queries, many seen
// on the wire and few received is the cheap signal, and conntrack confirms
// it: a flow whose original destination is a listen address and whose
// reply comes from elsewhere was DNATed. Reading both costs nothing on the
// data path and changes nothing on the node: the fallback's traffic is
// never touched.
//
// Detector is pure (its inputs carry the counts and the flows); the
// takeover controller feeds it once a second. Flows lists conntrack.
package dnat

import (
	"fmt"
	"net/netip"
	"slices"
)

// Counts are two running totals over the listen addresses' UDP traffic.
type Counts struct {
	// Seen counts the queries to the listen addresses the packet tap saw
	// arrive (before netfilter).
	Seen uint64
	// Received counts the queries dnsstandby's own sockets received.
	Received uint64
}

// Flow is one conntrack entry, as far as the Detector needs it.
type Flow struct {
	OrigSrc  netip.AddrPort // the client
	OrigDst  netip.AddrPort // where the client sent it
	ReplySrc netip.AddrPort // where the reply comes from: OrigDst unless DNATed
}

// divertedTo reports whether f was sent to one of listen and answered
// from another address: a DNAT took it.
func (f Flow) divertedTo(listen []netip.AddrPort) bool {
	return slices.Contains(listen, f.OrigDst) && f.ReplySrc.Addr() != f.OrigDst.Addr()
}

// Diverted returns the first flow among flows sent to one of listen and
// answered from another address: a DNAT took it.
func Diverted(flows []Flow, listen []netip.AddrPort) (Flow, bool) {
	for _, f := range flows {
		if f.divertedTo(listen) {
			return f, true
		}
	}
	return Flow{}, false
}

// flowKey names a flow in conntrack: the same key is the same flow.
type flowKey struct{ src, dst netip.AddrPort }

// newDiverted returns the flows among flows that were DNATed away from
// listen, and whether any of them is not in before: a DNAT made a flow
// since before was listed, so the rule is still there.
func newDiverted(flows []Flow, listen []netip.AddrPort, before map[flowKey]bool) (now map[flowKey]bool, fresh bool) {
	now = make(map[flowKey]bool)
	for _, f := range flows {
		if f.divertedTo(listen) {
			k := flowKey{f.OrigSrc, f.OrigDst}
			now[k] = true
			fresh = fresh || !before[k]
		}
	}
	return now, fresh
}

// Config holds the Detector's thresholds. Start from DefaultConfig.
type Config struct {
	// MinSeen is the fewest queries an interval must have seen on the wire
	// to be judged, and the fewest missing (expected at the sockets and
	// not received) to be suspect.
	MinSeen uint64
	// Ratio: an interval is suspect when the queries missing are also at
	// least Ratio of those expected (share × seen; share is what the
	// sockets should get, 1 when they are the only ones). A DNAT applies
	// only to a flow's first packet, so flows that reached our sockets
	// before the chain came (long-lived client sockets) keep doing so,
	// and only the new ones go: what is missing can be a small part.
	// The interval is clear when less than half of both is missing; in
	// between it is at the edge: conntrack is listed (no more often than
	// Recheck allows), but the interval counts toward nothing else (no
	// flapping at the edge). A DNAT that takes only a few new flows a
	// second, beside many long-lived client sockets, can stay there.
	Ratio float64
	// Confirm is how many suspect intervals in a row stand for
	// conntrack's confirmation when conntrack cannot be read.
	Confirm int
	// Recheck is how many suspect or edge intervals pass, after conntrack
	// showed no DNAT, before it is listed again: queries lost some other
	// way (dropped by a firewall, a stalled dnsstandby) must not have the
	// whole table dumped every second.
	Recheck int
	// ClearAfter is how many clear intervals in a row, each with no flow
	// DNATed since conntrack was last listed, end a diversion. The tap's
	// clear alone is not enough: where most queries come from long-lived
	// client sockets (which keep going to our sockets), the few new flows
	// the DNAT takes can miss the suspect bar for a second; a new DNATed
	// flow cannot lie, it needs the rule. Where conntrack cannot be
	// listed, the clear intervals alone count.
	ClearAfter int
}

// DefaultConfig: judged from 10 queries an interval, suspect with 10 and
// 1% of those expected missing (at the edge from half that), 3 suspect
// intervals without conntrack, conntrack listed again after 10 suspect or
// edge intervals it did not confirm, cleared by 3 clear intervals in a
// row without a new DNATed flow. Conntrack decides: a suspect or edge
// interval only makes it be listed.
func DefaultConfig() Config {
	return Config{MinSeen: 10, Ratio: 0.01, Confirm: 3, Recheck: 10, ClearAfter: 3}
}

// Validate reports a threshold out of range.
func (c Config) Validate() error {
	switch {
	case c.MinSeen < 1:
		return fmt.Errorf("dnat: MinSeen must be at least 1, got %d", c.MinSeen)
	case c.Ratio <= 0 || c.Ratio >= 1:
		return fmt.Errorf("dnat: Ratio must be between 0 and 1, got %v", c.Ratio)
	case c.Confirm < 1:
		return fmt.Errorf("dnat: Confirm must be at least 1, got %d", c.Confirm)
	case c.Recheck < 1:
		return fmt.Errorf("dnat: Recheck must be at least 1, got %d", c.Recheck)
	case c.ClearAfter < 1:
		return fmt.Errorf("dnat: ClearAfter must be at least 1, got %d", c.ClearAfter)
	}
	return nil
}

// Verdict is what one interval says.
type Verdict uint8

const (
	// Unknown: too few queries, or the sockets were not expected to get
	// any (LocalDNS has them all): the state stands.
	Unknown Verdict = iota
	// Suspect: queries seen, and fewer received than expected.
	Suspect
	// Clear: the sockets received about what they should.
	Clear
	// Edge: fewer received than expected, by less than a suspect's share
	// but not by little enough to be clear.
	Edge
)

// Judge says what one interval's deltas show, when the sockets should
// receive share (0 to 1) of the queries seen.
func (c Config) Judge(seen, received uint64, share float64) Verdict {
	if share <= 0 || seen < c.MinSeen {
		return Unknown
	}
	expected := share * float64(seen)
	missing := expected - float64(received)
	bar := max(float64(c.MinSeen), c.Ratio*expected)
	switch {
	case missing >= bar:
		return Suspect
	case 2*missing < bar:
		return Clear
	}
	return Edge
}

// Detector turns intervals into a state: diverted or not.
type Detector struct {
	cfg      Config
	last     Counts
	started  bool
	diverted bool
	suspects int // suspect intervals in a row
	skip     int // suspect intervals to pass before conntrack is listed again
	clears   int // while diverted: clear intervals in a row without a new DNATed flow
	// flows are the DNATed flows conntrack listed last while diverted (or
	// when it confirmed the diversion): those not among them are new.
	flows map[flowKey]bool
}

// New returns a Detector that has seen nothing diverted.
func New(cfg Config) (*Detector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Detector{cfg: cfg}, nil
}

// Diverted reports the current state.
func (d *Detector) Diverted() bool { return d.diverted }

// Step takes the running totals at the end of an interval, the share the
// sockets should have had, and list, which lists conntrack (called for a
// suspect interval while not diverted, and for a clear one while
// diverted). It returns whether the state changed, and the flow that
// confirmed a change to diverted (zero when the suspects in a row stood
// for it: conntrack failed, err).
func (d *Detector) Step(now Counts, share float64, list func() ([]Flow, error), listen []netip.AddrPort) (changed bool, by Flow, err error) {
	if !d.started || now.Seen < d.last.Seen || now.Received < d.last.Received {
		// The first totals, or a counter that went back (a restarted
		// feed): a baseline, nothing to judge.
		d.started, d.last = true, now
		return false, Flow{}, nil
	}
	v := d.cfg.Judge(now.Seen-d.last.Seen, now.Received-d.last.Received, share)
	d.last = now
	switch v {
	case Clear:
		d.suspects, d.skip = 0, 0
		if !d.diverted {
			return false, Flow{}, nil
		}
		flows, err := list()
		if err == nil {
			var fresh bool
			if d.flows, fresh = newDiverted(flows, listen, d.flows); fresh {
				d.clears = 0
				return false, Flow{}, nil
			}
		}
		d.clears++
		if d.clears < d.cfg.ClearAfter {
			return false, Flow{}, err
		}
		d.diverted, d.clears, d.flows = false, 0, nil
		return true, Flow{}, err
	case Suspect, Edge:
		if v == Suspect {
			d.suspects++
			d.clears = 0
		}
		if d.diverted {
			return false, Flow{}, nil
		}
		if d.skip > 0 {
			d.skip--
			return false, Flow{}, nil
		}
		flows, err := list()
		if err == nil {
			f, ok := Diverted(flows, listen)
			if ok {
				d.diverted = true
				d.flows, _ = newDiverted(flows, listen, nil)
			} else {
				d.skip = d.cfg.Recheck - 1
			}
			return ok, f, nil
		}
		// Without conntrack only suspects in a row stand for it; an
		// edge interval neither adds to them nor ends them.
		if v == Suspect && d.suspects >= d.cfg.Confirm {
			d.diverted = true
			return true, Flow{}, err
		}
		return false, Flow{}, err
	}
	return false, Flow{}, nil
}
