package upstream

import (
	"errors"
	"log/slog"
	"time"

	"github.com/miekg/dns"
)

// Health follows CoreDNS forward with one simplification: CoreDNS probes
// after every failed query and counts failed probes, while here the failed
// attempts themselves count, each only if the server replied to nothing
// else meanwhile (so two slow external names in a row, with nothing else
// asked, can mark kube-dns down; the first answered probe puts it back).
// After MaxFails
// consecutive failures a server is marked down, and one goroutine per down
// server probes it with `HealthCheckDomain IN NS` (`. IN NS` by default)
// every HealthCheck until it answers with any rcode. An answer to a real query (a down server is still tried when
// all else failed) brings it back as well.

// answered records that s replied.
func (g *Group) answered(s *server) {
	s.lastReply.Store(time.Now().UnixNano())
	if s.fails.Load() != 0 { // no write, so no cache-line bouncing, while healthy
		s.fails.Store(0)
	}
	if s.down.Load() {
		g.markUp(s, "query")
	}
}

// failed records a failed attempt on s, begun at start, marking s down
// after MaxFails in a row (never with MaxFails 0). Errors that are not the
// server's fault (Close, a cancelled caller, a caller's deadline that left
// the server under half its Timeout: see ioError) are ignored, and so is
// an attempt that got replies, only not in the letter case asked (see
// caseNotKept). So is an attempt lost while s replied to another: the
// server is not silent, a packet or one of its backends is (a ClusterIP
// spreads flows over kube-dns's pods; one dead pod must not take the
// ClusterIP out of service, which CoreDNS's probe from a fresh socket
// would not either).
func (g *Group) failed(s *server, start time.Time, err error) {
	var f *failure
	if g.cfg.MaxFails == 0 || !errors.As(err, &f) || f.caseOnly {
		return
	}
	if s.lastReply.Load() > start.UnixNano() {
		return
	}
	n := s.fails.Add(1)
	if n < int64(g.cfg.MaxFails) || s.down.Load() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down.Load() {
		return
	}
	s.down.Store(true)
	s.downSince = time.Now()
	g.log.Warn("upstream server marked down", slog.String("server", s.name),
		slog.Int64("consecutive_failures", n), slog.Any("err", f))
	if !s.probing {
		g.mu.Lock()
		s.probing = g.goLocked(func() { g.probe(s) })
		g.mu.Unlock()
	}
}

// markUp puts s back in service.
func (g *Group) markUp(s *server, by string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.down.Load() {
		return
	}
	s.fails.Store(0)
	s.down.Store(false)
	g.log.Info("upstream server back up", slog.String("server", s.name), slog.String("by", by),
		slog.String("down_for", time.Since(s.downSince).Round(time.Millisecond).String()))
}

// probe checks s every HealthCheck until it is up again or the group
// closes. It is the only probe goroutine for s while s.probing is set.
func (g *Group) probe(s *server) {
	t := time.NewTicker(g.cfg.HealthCheck)
	defer t.Stop()
	for {
		select {
		case <-g.ctx.Done():
			s.mu.Lock()
			s.probing = false
			s.mu.Unlock()
			return
		case <-t.C:
		}
		if s.probeDone() {
			return
		}
		if g.check(s) == nil {
			g.markUp(s, "health check")
			if s.probeDone() {
				return
			}
		}
	}
}

// probeDone ends probing if s is up: a query may have brought it back.
// If s went down again meanwhile, probing simply goes on.
func (s *server) probeDone() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down.Load() {
		return false
	}
	s.probing = false
	return true
}

// check sends s one `HealthCheckDomain IN NS` query, with RD set unless
// HealthCheckNoRec, as CoreDNS's health checker does with its `domain` and
// `no_rec`, and returns nil on any matching reply. The probe is not
// counted in the metrics: they describe the queries of pods.
func (g *Group) check(s *server) error {
	ping := new(dns.Msg)
	ping.SetQuestion(g.cfg.HealthCheckDomain, dns.TypeNS)
	ping.RecursionDesired = !g.cfg.HealthCheckNoRec
	q, err := newQuery(ping)
	if err != nil {
		return err
	}
	var uncounted serverMetrics
	timeout := min(g.cfg.Timeout, maxProbeTimeout)
	if g.cfg.ForceTCP {
		_, err = g.exchangeTCP(g.ctx, s, &uncounted, q, timeout)
	} else {
		_, err = g.exchangeUDP(g.ctx, s, &uncounted, q, timeout)
	}
	return err
}
