package daemon

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"time"

	"github.com/dnsstandby/dnsstandby/admin"
	"github.com/dnsstandby/dnsstandby/cache"
	"github.com/dnsstandby/dnsstandby/corefile"
	"github.com/dnsstandby/dnsstandby/handover"
	"github.com/dnsstandby/dnsstandby/hedge"
	"github.com/dnsstandby/dnsstandby/pipeline"
	"github.com/dnsstandby/dnsstandby/responder"
	"github.com/dnsstandby/dnsstandby/status"
	"github.com/dnsstandby/dnsstandby/takeover"
	"github.com/dnsstandby/dnsstandby/upstream"
)

// Config is everything the daemon runs with: plain values, the parts'
// own Configs among them. Start from DefaultConfig. Fields that only the
// running daemon knows (the cache a pipeline uses, the sockets takeover
// steers, every Logger) are set by Run and ignored here.
type Config struct {
	// Listen are the addresses served, shared with LocalDNS.
	Listen []netip.AddrPort
	// Routes say where misses go: per listen address and zone, an
	// upstream group. The most specific zone matching a query wins, among
	// the routes of the address the query came to. Run sets each group's
	// per-attempt Timeout from Pipeline.UpstreamTimeout, so that a group
	// whose first server does not answer has time to try the next.
	Routes []Route
	// Corefile is the LocalDNS Corefile the Routes and cache policy were
	// taken from ("" for none); Ignored lists what dnsstandby does not
	// imitate of it, logged once at start. See ApplyCorefile.
	Corefile string
	Ignored  []string

	// Cache is the cache policy of the routes without one of their own,
	// and its MaxEntries and MaxBytes bound every route's cache together:
	// each route (per listen address and zone) has a cache of its own,
	// which gets an even share of both, never more entries than its own
	// policy's MaxEntries. NSID and UDPSize are taken from Pipeline's.
	Cache     cache.Config
	Pipeline  pipeline.Config  // Routes are set by Run
	Responder responder.Config // Listen is set by Run
	Takeover  takeover.Config  // Sockets, Healthy, CountReads, Answered, OnMirrorSafe and Anchor are set by Run
	Anchor    Anchor
	Mirror    Mirror
	// TapRing lets the packet tap read LocalDNS's replies at its cgroup's
	// egress and the queries through a BPF ring buffer (the tap's ring
	// mode), so that no packet socket sees what the node sends; false
	// keeps the tap's packet socket reading both.
	TapRing bool
	// Hedging answers, from dnsstandby's own socket, the UDP queries
	// LocalDNS leaves unanswered past a deadline, and holds a LocalDNS
	// that answers none (package hedge). It needs Mirror tap: only the
	// tap sees the queries. Hedge's OnSilent and Logger are set by Run.
	Hedging bool
	Hedge   hedge.Config

	// StateDir holds the cache snapshot, loaded at start and written every
	// SnapshotInterval and at stop ("" : no snapshots).
	StateDir         string
	SnapshotInterval time.Duration

	// LockFile is locked while Run runs, before it changes anything on
	// the node: one dnsstandby per node ("" : no lock).
	LockFile string
	// HandoverFrom is the admin socket of a dnsstandby that may be
	// running ("" : none): when LockFile is held, Run asks that process
	// for a surge handover (its sockets, caches and lock) instead of
	// returning handover.ErrRunning. WaitAfterHandover keeps a process
	// that gave a handover waiting for its stop signal once stopped,
	// rather than returning ErrHandedOver (a DaemonSet container that
	// exits is restarted).
	HandoverFrom      string
	WaitAfterHandover bool

	// MetricsAddr serves /metrics, /healthz, /readyz and /debug/events
	// ("" : off); AdminSocket serves status, hold and release ("" : off).
	MetricsAddr string
	AdminSocket string
	// HTTP bounds what one client of MetricsAddr can hold: the DaemonSet
	// serves it on the node IP, where every pod can connect.
	HTTP HTTPLimits

	// ShutdownTimeout bounds how long queries in flight may take to
	// finish once Run's context is done.
	ShutdownTimeout time.Duration

	// Resolver makes the configuration again (Resolve), at every change
	// of a file of Watch, and while the Corefile is refused at every
	// tick, and at every Daemon.Reload (SIGHUP); nil: no Corefile and no
	// reload. Provenance says where the configuration came from.
	// ReloadInterval is how often Watch is checked (0: only at Reload).
	// The routes of a reload take effect at once; other changed settings
	// at the next start.
	Resolver       *Resolver
	Provenance     Provenance
	Watch          []string
	ReloadInterval time.Duration
	// Fallback is where misses go when neither the Corefile nor the last
	// known good can be used (Resolve).
	Fallback Fallback
	// LocalDNSCoreDNS is the CoreDNS binary LocalDNS runs: a Corefile is
	// judged against the directives it lists (`coredns -plugins`), or
	// CoreDNS 1.13.1's standard build's when it cannot be run ("": never
	// run it).
	LocalDNSCoreDNS string
}

// Route is one zone's server block on one listen address: the answers
// it makes itself, then its upstream group.
type Route struct {
	// Listen is the listen address the route serves; the zero AddrPort
	// means every one (as --upstream gives).
	Listen netip.AddrPort
	Zone   string // fully qualified: "." or "cluster.local."
	// Upstream is the zone's forward; no Servers: the block has none, and
	// what its local answers pass on gets SERVFAIL, as in CoreDNS.
	Upstream upstream.Config
	// Templates and Hosts are the block's template stanzas and hosts
	// plugin, asked in CoreDNS's plugin order (template, then hosts)
	// before the upstreams; their answers are cached as upstream answers
	// are, as LocalDNS's cache plugin caches them.
	Templates []corefile.Template
	Hosts     *corefile.Hosts
	// Whoami answers what the templates and hosts pass on in a block
	// without a forward (CoreDNS runs whoami after forward): the client's
	// address and port, as LocalDNS's health-check block does. Such a
	// route has no cache: its answers are for one client.
	Whoami bool
	// Cache is the block's cache policy, as its cache plugin sets it
	// (nil: Config.Cache's). Its MaxEntries is the block's capacity;
	// Config.Cache's bounds still cap it, and its NSID, UDPSize, Now and
	// Logger are ignored.
	Cache *cache.Config
}

// cached reports whether the route has a cache: every route but whoami's.
func (r *Route) cached() bool { return !r.Whoami }

// local reports whether the route makes answers of its own.
func (r *Route) local() bool { return len(r.Templates) > 0 || r.Hosts != nil || r.Whoami }

// caches returns how many caches the routes make in all, one per cached
// route and listen address it serves: they share Cache's bounds.
func (c *Config) caches() int {
	n := 0
	for _, ap := range c.Listen {
		for _, r := range c.routesFor(ap) {
			if r.cached() {
				n++
			}
		}
	}
	return max(n, 1)
}

// cacheConfig returns the cache config of route r: its own policy or
// Cache's, with an even share of Cache's bounds among the n caches.
func (c *Config) cacheConfig(r *Route, n int) cache.Config {
	cc := c.Cache
	share := max(c.Cache.MaxEntries/n, 1)
	if r.Cache != nil {
		cc = *r.Cache
		share = min(share, max(cc.MaxEntries, 1))
	}
	cc.MaxEntries = share
	cc.MaxBytes = max(c.Cache.MaxBytes/int64(n), 1)
	cc.NSID, cc.UDPSize = c.Pipeline.NSID, c.Pipeline.UDPSize
	cc.Now, cc.Logger = nil, nil
	return cc
}

// routesFor returns the routes serving the listen address ap.
func (c *Config) routesFor(ap netip.AddrPort) []Route {
	var out []Route
	for _, r := range c.Routes {
		if !r.Listen.IsValid() || r.Listen == ap {
			out = append(out, r)
		}
	}
	return out
}

// Anchor is the link of dnsstandby's own that keeps the listen addresses
// local when LocalDNS deletes its link.
type Anchor struct {
	Link    string // "" : no anchor
	Kind    string // dummy on nodes; bridge where the dummy driver is missing
	Cleanup bool   // delete the link at stop (by default it stays, for the next start)
}

// HTTPLimits bound the server on MetricsAddr: time per request and per
// idle connection, header size, and connections open at once. Peers are
// told apart by source address; the node itself (a connection whose
// source address is the address it reached, as the kubelet's probes of a
// hostNetwork pod are) is never counted in MaxConns, so that pods holding
// every shared slot cannot fail the liveness probe and restart us.
type HTTPLimits struct {
	// ReadHeaderTimeout bounds reading a request's headers; positive.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request; positive.
	ReadTimeout time.Duration
	// WriteTimeout bounds writing a response, from the end of the
	// request's headers; positive.
	WriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection idle this long; positive.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's headers, in bytes; at least 1024.
	MaxHeaderBytes int
	// MaxConns bounds the connections open at once from every address
	// but the node's own; at least 1. Over it, a new connection is closed
	// as soon as it is accepted.
	MaxConns int
	// MaxConnsPerAddr bounds the connections open at once from one source
	// address, the node's own included; at least 1, at most MaxConns.
	MaxConnsPerAddr int
}

// Validate checks the limits; errors name the field.
func (l *HTTPLimits) Validate() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"ReadHeaderTimeout", l.ReadHeaderTimeout},
		{"ReadTimeout", l.ReadTimeout},
		{"WriteTimeout", l.WriteTimeout},
		{"IdleTimeout", l.IdleTimeout},
	} {
		if d.v <= 0 {
			return fmt.Errorf("daemon: HTTP.%s must be positive, got %s", d.name, d.v)
		}
	}
	switch {
	case l.MaxHeaderBytes < 1024:
		return fmt.Errorf("daemon: HTTP.MaxHeaderBytes must be at least 1024, got %d", l.MaxHeaderBytes)
	case l.MaxConns < 1:
		return fmt.Errorf("daemon: HTTP.MaxConns must be positive, got %d", l.MaxConns)
	case l.MaxConnsPerAddr < 1 || l.MaxConnsPerAddr > l.MaxConns:
		return fmt.Errorf("daemon: HTTP.MaxConnsPerAddr must be between 1 and MaxConns (%d), got %d", l.MaxConns, l.MaxConnsPerAddr)
	}
	return nil
}

// Mirror is how LocalDNS's answers reach the cache.
type Mirror struct {
	Kind       string // MirrorTap, MirrorDnstap or MirrorNone
	DnstapPath string // the socket LocalDNS streams to, for MirrorDnstap
}

// The mirror feeds.
const (
	MirrorTap    = "tap"    // a packet tap on the listen addresses' replies
	MirrorDnstap = "dnstap" // a socket LocalDNS's dnstap plugin streams to
	MirrorNone   = "none"
)

// String is the feed as the command line and the status write it: tap,
// dnstap:PATH or none.
func (m Mirror) String() string {
	if m.Kind == MirrorDnstap {
		return m.Kind + ":" + m.DnstapPath
	}
	return m.Kind
}

// DefaultConfig returns the defaults of every setting: serve LocalDNS's
// pod listener, with no routes (they come from the Corefile or the
// caller).
func DefaultConfig() Config {
	return Config{
		Listen:           []netip.AddrPort{status.DefaultListen},
		Cache:            cache.DefaultConfig(),
		Pipeline:         pipeline.DefaultConfig(),
		Responder:        responder.DefaultConfig(),
		Takeover:         takeover.DefaultConfig(),
		Anchor:           Anchor{Link: "dnsstandby", Kind: "dummy"},
		Mirror:           Mirror{Kind: MirrorTap},
		TapRing:          true,
		Hedging:          true,
		Hedge:            hedge.DefaultConfig(),
		StateDir:         "/var/lib/dnsstandby",
		SnapshotInterval: time.Minute,
		MetricsAddr:      "127.0.0.1:9355",
		HTTP: HTTPLimits{
			// A probe or a scrape sends a few hundred bytes of headers at
			// once; a client still sending after 5 s is holding a slot.
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       10 * time.Second,
			// Prometheus's default scrape timeout: a reader slower than
			// that has given up anyway.
			WriteTimeout: 10 * time.Second,
			// Longer than the probes' periods (5 s, 10 s) and the usual
			// scrape intervals (15 s, 30 s) are short, so a scraper keeps
			// its connection; an idle one costs about 16 KiB.
			IdleTimeout: 60 * time.Second,
			// Requests here are a path and a few headers; net/http's
			// default is 1 MiB.
			MaxHeaderBytes: 8 << 10,
			// A scraper or two and the odd curl; at 16 KiB each, 64 idle
			// connections cost about 1 MiB.
			MaxConns: 64,
			// One pod (one address) cannot take every slot: it takes 8,
			// and the kubelet's probes, from the node's own address, have
			// 8 of their own outside MaxConns.
			MaxConnsPerAddr: 8,
		},
		AdminSocket:     admin.DefaultSocket,
		LockFile:        handover.DefaultLockFile,
		ShutdownTimeout: 5 * time.Second,
		ReloadInterval:  time.Second,
		Fallback: Fallback{
			NodeListen: status.NodeListen,
			ResolvConf: "/run/systemd/resolve/resolv.conf",
		},
		// Where AKS's node image puts it.
		LocalDNSCoreDNS: "/opt/azure/containers/localdns/binary/coredns",
	}
}

// NewRoute returns a route for zone to servers, with the upstream
// defaults.
func NewRoute(zone string, servers ...netip.AddrPort) Route {
	u := upstream.DefaultConfig()
	u.Servers = servers
	return Route{Zone: zone, Upstream: u}
}

// Validate checks everything Run would refuse before it opens a socket:
// that there is something to serve and somewhere to send misses, that no
// upstream is one of the listen addresses, the daemon's own settings, and
// every part's Config as Run builds it (each part's own Validate). New
// calls it; so does `dnsstandby run --validate`, through New.
func (c *Config) Validate() error {
	if len(c.Listen) == 0 {
		return errors.New("daemon: no Listen address")
	}
	if len(c.Routes) == 0 {
		return errors.New("daemon: no Routes: misses would have nowhere to go")
	}
	for _, r := range c.Routes {
		if len(r.Upstream.Servers) == 0 && !r.local() {
			return fmt.Errorf("daemon: route %s has no servers and no answers of its own", r.Zone)
		}
		if r.Listen.IsValid() && !slices.Contains(c.Listen, r.Listen) {
			return fmt.Errorf("daemon: route %s is for %s, which is not a listen address", r.Zone, r.Listen)
		}
		for _, s := range r.Upstream.Servers {
			if slices.Contains(c.Listen, s) {
				return fmt.Errorf("daemon: upstream %s of zone %s is one of the listen addresses: forwarding there would loop", s, r.Zone)
			}
		}
	}
	for _, ap := range c.Listen {
		routes := c.routesFor(ap)
		if len(routes) == 0 {
			return fmt.Errorf("daemon: no Routes for listen address %s: its misses would have nowhere to go", ap)
		}
		zones := map[string]bool{}
		for _, r := range routes {
			if zones[r.Zone] {
				return fmt.Errorf("daemon: zone %s routed twice on %s", r.Zone, ap)
			}
			zones[r.Zone] = true
		}
	}
	switch c.Mirror.Kind {
	case MirrorTap, MirrorNone:
	case MirrorDnstap:
		if c.Mirror.DnstapPath == "" {
			return errors.New("daemon: Mirror.DnstapPath is empty")
		}
		if len(c.Listen) > 1 {
			return fmt.Errorf("daemon: Mirror %s with %d listen addresses: a dnstap stream does not say which listener a reply left from; use %s", MirrorDnstap, len(c.Listen), MirrorTap)
		}
	default:
		return fmt.Errorf("daemon: Mirror.Kind %q: want %s, %s or %s", c.Mirror.Kind, MirrorTap, MirrorDnstap, MirrorNone)
	}
	if c.StateDir != "" && c.SnapshotInterval <= 0 {
		return fmt.Errorf("daemon: SnapshotInterval must be positive, got %s", c.SnapshotInterval)
	}
	if c.MetricsAddr != "" {
		_, port, err := net.SplitHostPort(c.MetricsAddr)
		if err != nil {
			return fmt.Errorf("daemon: MetricsAddr %q: want HOST:PORT: %w", c.MetricsAddr, err)
		}
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return fmt.Errorf("daemon: MetricsAddr %q: port %q is not a port number", c.MetricsAddr, port)
		}
		if err := c.HTTP.Validate(); err != nil {
			return err
		}
	}
	if c.ReloadInterval < 0 {
		return fmt.Errorf("daemon: ReloadInterval must not be negative, got %s", c.ReloadInterval)
	}
	if c.ShutdownTimeout <= 0 {
		return fmt.Errorf("daemon: ShutdownTimeout must be positive, got %s", c.ShutdownTimeout)
	}
	return c.validateParts()
}

// listenAddrs returns the listen addresses, each once.
func (c *Config) listenAddrs() []netip.Addr {
	var out []netip.Addr
	for _, ap := range c.Listen {
		if !slices.Contains(out, ap.Addr()) {
			out = append(out, ap.Addr())
		}
	}
	return out
}
