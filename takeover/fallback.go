package takeover

import (
	"log/slog"
	"net/netip"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dnsstandby/dnsstandby/takeover/steer"
)

// This file is what the controller does beside AKS's own LocalDNS
// fallback (AgentBaker PR 9486), in either of its designs:
//
//   - coredns (v1/v2): a second CoreDNS in localdns-fallback.service binds
//     169.254.10.11:53 while localdns.service is failed. The peer watch
//     reports its sockets apart (peer.State.Fallback, by the holder's
//     systemd unit), so it is never taken for LocalDNS back: no
//     hold-down, no mirror towards it, no adoption. dnsstandby keeps
//     answering (takeover: the steering program gives our socket every
//     query at own and adopt), and the fallback gets none, so nothing is
//     queued on its socket when localdns.service's ExecStartPre stops it.
//   - nat (v3): an iptables nat chain DNATs the listen addresses' queries
//     before any socket sees them. Nothing here can or should take them
//     back; the controller notices (package dnat) and says so, and the
//     daemon keeps its caches warm from the queries the tap still sees.

// The designs of AKS's LocalDNS fallback, as status and the metric name
// them.
const (
	FallbackNone    = ""
	FallbackCoreDNS = "coredns"
	FallbackNAT     = "nat"
)

var fallbackDesigns = []string{FallbackCoreDNS, FallbackNAT}

var descFallback = prometheus.NewDesc("dnsstandby_localdns_fallback",
	"1 while AKS's LocalDNS fallback is seen, by design: coredns (a second CoreDNS in localdns-fallback.service on the listen address), nat (the listen addresses' queries DNATed away, the LOCALDNS-FALLBACK chain).",
	[]string{"design"}, nil)

// fallbackSeen is the design in force and, for coredns, its process.
type fallbackSeen struct {
	design string
	pid    int
}

// fallbackNow is what the peer watch and the nat detector show now: a
// fallback CoreDNS first (it is on our sockets' group), then nat. Called
// with c.mu held.
func (c *Controller) fallbackNow() fallbackSeen {
	if len(c.peer.Fallback) > 0 {
		f := fallbackSeen{design: FallbackCoreDNS}
		if len(c.peer.FallbackPIDs) > 0 {
			f.pid = c.peer.FallbackPIDs[0]
		}
		return f
	}
	if c.nat {
		return fallbackSeen{design: FallbackNAT}
	}
	return fallbackSeen{}
}

// reportFallback logs one line per change of the fallback seen and tells
// OnFallback. Only the goroutine that runs the machine calls it.
func (c *Controller) reportFallback() {
	c.mu.Lock()
	now, was := c.fallbackNow(), c.fallback
	c.fallback = now
	c.mu.Unlock()
	if now.design == was.design {
		return
	}
	if was.design != FallbackNone {
		c.log.Info("AKS LocalDNS fallback gone", "design", was.design)
	}
	if now.design != FallbackNone {
		// The platform's own fallback runs only once localdns.service has
		// failed for good: an operator wants to know.
		if now.design == FallbackCoreDNS {
			c.log.Warn("AKS LocalDNS fallback seen", "design", now.design, "pid", now.pid)
		} else {
			c.log.Warn("AKS LocalDNS fallback seen", "design", now.design)
		}
	}
	if c.cfg.OnFallback != nil {
		c.cfg.OnFallback(now.design)
	}
}

// ourShare is the share of the queries seen on the wire that our sockets
// should receive now, for the nat detector: all of them while LocalDNS
// has no socket or is held at own or adopt (the program gives us every
// one); a hash share beside LocalDNS's sockets at off, and in mirror at
// own; none in mirror at adopt (LocalDNS gets them all: nothing to judge).
func (c *Controller) ourShare() float64 {
	c.mu.Lock()
	mode, _, _ := c.machine.Mode()
	peerUDP := 0
	for _, s := range c.peer.Sockets {
		if s.Proto == "udp" {
			peerUDP++
		}
	}
	c.mu.Unlock()
	level := c.steer.Level()
	switch {
	case mode == Takeover || peerUDP == 0:
		return 1
	case mode == Hold && level != steer.Off:
		return 1
	case mode == Mirror && level == steer.Adopt:
		return 0
	}
	// The hash gives each socket of a group an equal share: ours against
	// LocalDNS's, over every group.
	return float64(c.udpSockets) / float64(c.udpSockets+peerUDP)
}

// natStep runs one interval of the nat detector (once a second, from the
// machine's goroutine) and reports a change.
func (c *Controller) natStep() {
	if c.det == nil {
		return
	}
	changed, by, err := c.det.Step(c.cfg.QueryCounts(), c.ourShare(), c.parts.flows, c.udpAddrs)
	if err != nil && !c.conntrackWarned {
		c.conntrackWarned = true
		c.log.Warn("cannot list conntrack to confirm a DNAT of the listen addresses; taking the packet tap's word after a few seconds", slog.Any("err", err))
	}
	if !changed {
		return
	}
	on := c.det.Diverted()
	if on && by.OrigDst.IsValid() {
		c.log.Info("listen address DNATed: conntrack flow answered from elsewhere", "listener", by.OrigDst.String(), "reply_from", by.ReplySrc.String())
	}
	c.mu.Lock()
	c.nat = on
	c.mu.Unlock()
	c.reportFallback()
	if !on {
		c.clearFallbackFlows()
	}
}

// clearFallbackFlows deletes the conntrack entries the nat fallback left
// on the listen addresses (dnat.ClearListenFlows): kept up to 120 s, each
// would rewrite the source port of LocalDNS's replies to a client port it
// saw, and glibc's connected socket drops those (the lab's aks-fallback-nat
// lost one lookup in about three runs so, both its tries).
func (c *Controller) clearFallbackFlows() {
	if c.parts.clearFlows == nil {
		return
	}
	n, err := c.parts.clearFlows(c.udpAddrs)
	if err != nil {
		c.log.Warn("AKS LocalDNS fallback gone, but its conntrack entries of the listen addresses stay: replies to a client port it saw may be rewritten until they expire", slog.Any("err", err))
		return
	}
	c.log.Info("AKS LocalDNS fallback's conntrack entries of the listen addresses deleted", "entries", n)
}

// udpListen returns the UDP listen addresses of socks, each once (those
// the tap counts), and how many UDP sockets they have (the hash's share).
func udpListen(socks []OurSocket) (addrs []netip.AddrPort, sockets int) {
	for _, s := range socks {
		if s.UDP {
			sockets++
			if !slices.Contains(addrs, s.Addr) {
				addrs = append(addrs, s.Addr)
			}
		}
	}
	return addrs, sockets
}

// collectFallback exports dnsstandby_localdns_fallback, both designs
// always.
func (c *Controller) collectFallback(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	design := c.fallback.design
	c.mu.Unlock()
	for _, d := range fallbackDesigns {
		v := 0.0
		if d == design {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(descFallback, prometheus.GaugeValue, v, d)
	}
}
