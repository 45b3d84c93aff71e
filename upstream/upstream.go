// Package upstream forwards the queries dnsstandby cannot answer from its
// cache to the configured upstream servers — in practice the kube-dns
// ClusterIP — the way CoreDNS's forward plugin does: each query puts the
// servers in the order of the group's policy (sequential, round_robin or
// random), a server that keeps failing is marked down, skipped and probed
// until it answers again.
//
// It owns everything between a query message and its upstream reply: the
// sockets (a fresh connected UDP socket per query, a small pool of TCP
// connections per server), the ID, question and 0x20 letter-case checks
// that keep spoofed datagrams out, the TC=1 retry over TCP, the
// per-server health state and its probe goroutines, the cap on exchanges
// in flight (MaxConcurrent, as CoreDNS's max_concurrent), the speculative
// attempts that keep a silent server from holding a query for its whole
// timeout, and the upstream metrics. Loop prevention (never forwarding to ourselves or to LocalDNS)
// is the caller's job, and so is what to answer a client when the
// upstreams fail (the pipeline's).
package upstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

const (
	// maxProbeTimeout caps a health probe's wait, as CoreDNS's health
	// checker does (1 s read timeout): a probe that waits longer than two
	// intervals only delays the next one.
	maxProbeTimeout = time.Second

	// maxIdleTCP is how many idle TCP connections a server's pool keeps.
	// TCP is used only for truncated answers (or with ForceTCP), so a few
	// cover the concurrency seen; connections beyond it are closed after
	// use rather than left open against kube-dns.
	maxIdleTCP = 16
)

var (
	// ErrClosed is returned by Exchange after Close.
	ErrClosed = errors.New("upstream group closed")
	// ErrLimitExceeded is returned by Exchange, at once and without asking
	// any server, when MaxConcurrent exchanges are already in flight. It
	// is CoreDNS forward's ErrLimitExceeded, which LocalDNS answers with
	// REFUSED.
	ErrLimitExceeded = errors.New("max concurrent queries exceeded")
	// ErrNoHealthy is the Cause of the *Error returned by Exchange, at
	// once and without asking any server, when FailFast is set and every
	// server is marked down. It is CoreDNS forward's ErrNoHealthy, which
	// LocalDNS answers with SERVFAIL.
	ErrNoHealthy = errors.New("every upstream server is marked down")
	// ErrQuestionCount is returned for a request without exactly one
	// question: the reply check needs the question, and resolvers never
	// send more than one.
	ErrQuestionCount = errors.New("request does not have exactly one question")
)

// Policy is the order in which an exchange asks the servers, as CoreDNS
// forward's `policy`: it is drawn afresh for each query.
type Policy string

// The policies of CoreDNS forward.
const (
	// PolicySequential asks the servers in Config order.
	PolicySequential Policy = "sequential"
	// PolicyRoundRobin asks first the next server of a counter shared by
	// every query of the group, then the others in Config order, as
	// CoreDNS does (for servers A B C: B A C, then C A B, then A B C).
	PolicyRoundRobin Policy = "round_robin"
	// PolicyRandom asks the servers in a random order (every order
	// equally likely).
	PolicyRandom Policy = "random"
)

// Config says where to forward and how patiently. Start from
// DefaultConfig and set Servers.
type Config struct {
	// Servers are the upstreams, asked in the order Policy gives.
	// Addresses must be specified (not 0.0.0.0 or ::), ports non-zero, and
	// each server listed once.
	Servers []netip.AddrPort
	// Policy orders the servers for each query: PolicySequential,
	// PolicyRoundRobin or PolicyRandom. Servers marked down go last
	// whatever the policy.
	Policy Policy
	// FailFast never asks a server marked down, and so fails an exchange
	// at once with ErrNoHealthy when every server is (CoreDNS forward's
	// failfast_all_unhealthy_upstreams). Without it, servers marked down
	// are asked after those in service have failed.
	FailFast bool
	// Timeout bounds each attempt: a UDP exchange, or a TCP exchange
	// including one retry on a fresh connection. A server silent for all
	// of it has failed the attempt. So has one silent until the caller's
	// deadline when that left it at least half of Timeout (a caller that
	// shares one deadline among the servers, as the daemon does, gives
	// each about Timeout); an attempt the caller's deadline cuts shorter,
	// or the caller cancels, is not held against the server. Must be
	// positive.
	Timeout time.Duration
	// MaxFails is how many consecutive failed attempts mark a server down;
	// 0 never marks a server down (CoreDNS max_fails 0).
	MaxFails int
	// HealthCheck is the probe interval for a server marked down. Must be
	// positive.
	HealthCheck time.Duration
	// HealthCheckDomain is the name a probe asks for (type NS): fully
	// qualified, as CoreDNS forward's `health_check ... domain NAME`.
	HealthCheckDomain string
	// HealthCheckNoRec sends probes with RD=0 (CoreDNS forward's
	// `health_check ... no_rec`); otherwise RD=1.
	HealthCheckNoRec bool
	// ExpireTCP is how long an idle pooled TCP connection is kept. Must be
	// positive.
	ExpireTCP time.Duration
	// MaxConcurrent caps the exchanges in flight through the group, as
	// CoreDNS forward's max_concurrent does: an Exchange over the cap
	// fails at once with ErrLimitExceeded and is counted in
	// dnsstandby_upstream_max_concurrent_rejects_total. 0 means no cap.
	MaxConcurrent int
	// ForceTCP sends every query over TCP. It also turns speculative
	// attempts off: they are for UDP, where a new socket is cheap.
	ForceTCP bool

	// Speculative attempts: a UDP attempt still unanswered after
	// SpeculativeMult × its server's p99 reply time (over the last
	// SpeculativeWindow), clamped to [SpeculativeMin, SpeculativeMax], has
	// the exchange's next attempt started beside it (the next server of
	// the order, or the only server again from a fresh socket) and the
	// first reply wins. The attempt left waiting keeps its Timeout and
	// still counts for health. SpeculativeRate 0 turns them off.
	SpeculativeMult                float64
	SpeculativeMin, SpeculativeMax time.Duration
	SpeculativeWindow              time.Duration
	// SpeculativeShare caps the speculative attempts that proved extra
	// (another attempt of the same exchange answered too) at this share
	// of the queries sent over SpeculativeWindow, 5 at the least (a group
	// that asks little would otherwise stop at one); SpeculativeRate and
	// SpeculativeBurst cap all of them with a token bucket (per second).
	SpeculativeShare float64
	SpeculativeRate  float64
	SpeculativeBurst int
	// Logger receives one line per health transition; nil discards them.
	Logger *slog.Logger
}

// DefaultConfig returns CoreDNS forward's defaults, so that dnsstandby
// treats kube-dns exactly as LocalDNS itself does. Servers is left empty
// for the caller.
func DefaultConfig() Config {
	return Config{
		// 2 s is CoreDNS forward's read timeout (plugin/pkg/proxy), the
		// value LocalDNS uses against the same kube-dns upstream. kube-dns
		// resolves external names by forwarding them with that same 2 s
		// timeout, so a shorter one here would count slow but healthy
		// external lookups as failures; a longer one would leave no room,
		// inside glibc's 5 s resolver timeout, for a second server or the
		// caller's stale answer.
		Timeout: 2 * time.Second,
		// dnsstandby's own default, how it has always asked kube-dns (the
		// single server of a route given on the command line). CoreDNS's
		// default is random; ApplyCorefile sets the policy of LocalDNS's
		// Corefile, CoreDNS's default included.
		Policy: PolicySequential,
		// CoreDNS forward's default: servers marked down are still asked
		// when every server is.
		FailFast: false,
		// CoreDNS forward's max_fails.
		MaxFails: 2,
		// CoreDNS forward's health_check interval. Its authors call 0.5 s
		// "an eternity in DNS" but a balance between finding a recovered
		// upstream quickly and not sending much (plugin/pkg/up).
		HealthCheck: 500 * time.Millisecond,
		// CoreDNS forward's probe, `. IN NS` with RD=1.
		HealthCheckDomain: ".",
		HealthCheckNoRec:  false,
		// CoreDNS forward's expire. A CoreDNS server (and kube-dns is one)
		// closes a TCP connection after 10 s idle (core/dnsserver
		// IdleTimeout), so an older pooled connection would be dead
		// anyway; one that dies right at the edge is retried once.
		ExpireTCP: 10 * time.Second,
		// CoreDNS forward's default: no cap. (LocalDNS sets 1000.)
		MaxConcurrent: 0,
		// A reply slower than 4 × the server's p99 is rare when it is
		// healthy (well under 1% of queries), so speculation costs
		// almost nothing there. 50 ms is above any in-cluster round trip
		// and a busy node's scheduling stall; 250 ms keeps a query held by
		// a silent server (CoreDNS waits 2 s) answered within a quarter
		// second of its first try.
		SpeculativeMult:   4,
		SpeculativeMin:    50 * time.Millisecond,
		SpeculativeMax:    250 * time.Millisecond,
		SpeculativeWindow: 10 * time.Second,
		// A slow server that still answers cannot add more than 1% to
		// the load of the others, nor to its own (a busy node's slow
		// kube-dns had 3.5% of its queries sent twice at 10%); one that
		// is silent costs nothing extra (its failover would have sent the
		// same query after its timeout), so only the rate bounds those:
		// 500 a second is a small load for kube-dns, and covers a busy
		// node's misses while a server is silent.
		SpeculativeShare: 0.01,
		SpeculativeRate:  500,
		SpeculativeBurst: 500,
	}
}

// Validate checks c as New takes it; its errors name the Config field.
// The daemon calls it for `dnsstandby run --validate`.
func (c *Config) Validate() error {
	if err := c.validate(); err != nil {
		return fmt.Errorf("upstream: %w", err)
	}
	return nil
}

func (c *Config) validate() error {
	if len(c.Servers) == 0 {
		return errors.New("Servers is empty")
	}
	seen := make(map[netip.AddrPort]bool, len(c.Servers))
	for i, s := range c.Servers {
		a := s.Addr().Unmap()
		switch {
		case !s.IsValid():
			return fmt.Errorf("Servers[%d]: invalid address", i)
		case a.IsUnspecified():
			return fmt.Errorf("Servers[%d] %s: unspecified address", i, s)
		case s.Port() == 0:
			return fmt.Errorf("Servers[%d] %s: port 0", i, s)
		case a.Zone() != "":
			// net.UDPAddrFromAddrPort keeps zones, but a kube-dns ClusterIP
			// never has one; refuse rather than half-support it.
			return fmt.Errorf("Servers[%d] %s: zoned addresses are not supported", i, s)
		}
		k := netip.AddrPortFrom(a, s.Port())
		if seen[k] {
			return fmt.Errorf("Servers[%d] %s: listed twice", i, s)
		}
		seen[k] = true
	}
	switch c.Policy {
	case PolicySequential, PolicyRoundRobin, PolicyRandom:
	default:
		return fmt.Errorf("Policy must be %s, %s or %s, got %q", PolicySequential, PolicyRoundRobin, PolicyRandom, c.Policy)
	}
	if _, ok := dns.IsDomainName(c.HealthCheckDomain); !ok || !dns.IsFqdn(c.HealthCheckDomain) {
		return fmt.Errorf("HealthCheckDomain must be a fully qualified domain name, got %q", c.HealthCheckDomain)
	}
	switch {
	case c.Timeout <= 0:
		return fmt.Errorf("Timeout must be positive, got %s", c.Timeout)
	case c.MaxFails < 0:
		return fmt.Errorf("MaxFails must not be negative, got %d", c.MaxFails)
	case c.HealthCheck <= 0:
		return fmt.Errorf("HealthCheck must be positive, got %s", c.HealthCheck)
	case c.ExpireTCP <= 0:
		return fmt.Errorf("ExpireTCP must be positive, got %s", c.ExpireTCP)
	case c.MaxConcurrent < 0:
		return fmt.Errorf("MaxConcurrent must not be negative, got %d", c.MaxConcurrent)
	case !(c.SpeculativeMult >= 1 && c.SpeculativeMult <= 1000):
		return fmt.Errorf("SpeculativeMult must be 1 to 1000, got %v", c.SpeculativeMult)
	case c.SpeculativeMin < time.Millisecond:
		return fmt.Errorf("SpeculativeMin must be at least 1ms, got %s", c.SpeculativeMin)
	case c.SpeculativeMax < c.SpeculativeMin:
		// One at or past Timeout is allowed: it never fires.
		return fmt.Errorf("SpeculativeMax must be at least SpeculativeMin (%s), got %s", c.SpeculativeMin, c.SpeculativeMax)
	case c.SpeculativeWindow < 100*time.Millisecond:
		return fmt.Errorf("SpeculativeWindow must be at least 100ms, got %s", c.SpeculativeWindow)
	case !(c.SpeculativeShare >= 0 && c.SpeculativeShare <= 1):
		return fmt.Errorf("SpeculativeShare must be 0 to 1, got %v", c.SpeculativeShare)
	case !(c.SpeculativeRate >= 0 && c.SpeculativeRate <= 1e6):
		return fmt.Errorf("SpeculativeRate must be 0 to 1e6, got %v", c.SpeculativeRate)
	case c.SpeculativeBurst < 1:
		return fmt.Errorf("SpeculativeBurst must be at least 1, got %d", c.SpeculativeBurst)
	}
	return nil
}

// Group forwards queries to its servers. It is safe for concurrent use.
type Group struct {
	cfg     Config       // as given, validated
	log     *slog.Logger // always non-nil, tagged component=upstream
	servers []*server    // in Config order

	// bufs holds *[]byte read buffers big enough for any DNS message.
	// Unpack copies out all it keeps, so a buffer is free again as soon as
	// the reply is unpacked.
	bufs sync.Pool

	ctx    context.Context // good until Close; probes and janitor run under it
	cancel context.CancelFunc
	closed atomic.Bool // Close was called; read on every Exchange

	robin      atomic.Uint64 // PolicyRoundRobin's counter, one step per exchange
	concurrent atomic.Int64  // exchanges in flight, counted only with MaxConcurrent > 0
	rejects    atomic.Uint64 // exchanges refused with ErrLimitExceeded

	spec specState // speculative attempts: caps and counters

	mu       sync.Mutex     // guards following
	stopping bool           // Close has begun: no goroutine may start
	wg       sync.WaitGroup // the goroutines started by goLocked
}

// server is one upstream with its health, connection pool and counters.
type server struct {
	name    string         // host:port as configured: dialed, and the metric label and log value
	udpAddr *net.UDPAddr   // the same, for DialUDP
	want    netip.AddrPort // the same, unmapped: where replies must come from

	fails atomic.Int64 // consecutive failed attempts
	down  atomic.Bool  // read on every Exchange; changed with mu held
	// lastReply is when the server last replied, and lastOverdue when an
	// attempt on it last went past its speculative deadline, unix ns.
	lastReply, lastOverdue atomic.Int64
	// caps is set while questions to the server go in random letter case
	// (0x20); cleared for good once it is seen not to keep case.
	caps atomic.Bool

	mu        sync.Mutex // guards following, and changes to down
	probing   bool       // a probe goroutine runs for this server
	downSince time.Time

	pool    pool
	metrics serverMetrics
	lat     serverLatency // its p99, for the speculative deadline
}

// New validates cfg and returns a Group. Its only goroutine, which closes
// expired TCP connections, runs until Close.
func New(cfg Config) (*Group, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Servers = append([]netip.AddrPort(nil), cfg.Servers...)
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g := &Group{cfg: cfg, log: log.With("component", "upstream")}
	g.bufs.New = func() any { b := make([]byte, 0xffff); return &b }
	for _, a := range cfg.Servers {
		s := &server{
			name:    a.String(),
			udpAddr: net.UDPAddrFromAddrPort(a),
			want:    netip.AddrPortFrom(a.Addr().Unmap(), a.Port()),
		}
		s.caps.Store(true)
		s.lat.init(cfg)
		g.servers = append(g.servers, s)
	}
	g.spec.init(cfg)
	g.ctx, g.cancel = context.WithCancel(context.Background())
	g.mu.Lock()
	g.goLocked(g.janitor)
	g.mu.Unlock()
	return g, nil
}

// goLocked starts f as a goroutine Close waits for, unless Close has begun.
// The caller holds g.mu.
func (g *Group) goLocked(f func()) bool {
	if g.stopping {
		return false
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		f()
	}()
	return true
}

// Close stops the probe and janitor goroutines, closes pooled connections
// and wakes Exchange calls in flight, which then return ErrClosed. It is
// safe to call more than once.
func (g *Group) Close() error {
	g.mu.Lock()
	if g.stopping {
		g.mu.Unlock()
		return nil
	}
	g.stopping = true
	g.closed.Store(true)
	g.mu.Unlock()

	g.cancel()
	g.wg.Wait()
	for _, s := range g.servers {
		s.pool.close()
	}
	return nil
}

// janitor closes pooled TCP connections that have been idle for ExpireTCP.
// It ticks at half that, so none lingers past 1.5×ExpireTCP.
func (g *Group) janitor() {
	t := time.NewTicker(max(g.cfg.ExpireTCP/2, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-g.ctx.Done():
			return
		case now := <-t.C:
			for _, s := range g.servers {
				s.pool.expire(now, g.cfg.ExpireTCP)
			}
		}
	}
}
