package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/dnsstandby/dnsstandby/cache"
	"github.com/dnsstandby/dnsstandby/pipeline"
	"github.com/dnsstandby/dnsstandby/responder"
	"github.com/dnsstandby/dnsstandby/takeover"
	"github.com/dnsstandby/dnsstandby/takeover/steer"
)

// envPrefix: every flag may also come from DNSSTANDBY_<NAME>, the name
// upper-cased with dashes as underscores (--listen: DNSSTANDBY_LISTEN).
// The command line wins over the environment.
const envPrefix = "DNSSTANDBY_"

// runOptions holds every flag of `dnsstandby run`.
type runOptions struct {
	listen      addrPorts // addresses to serve (shared with LocalDNS)
	upstream    addrPorts // where misses go, tried in order
	corefile    string    // LocalDNS Corefile to take upstreams and cache policy from
	metricsAddr string    // HTTP: /metrics, /healthz, /readyz
	validate    bool      // check the options and exit

	cacheEntries int
	cacheBytes   byteSize
	maxTTL       time.Duration
	maxNegTTL    time.Duration
	minTTL       time.Duration
	servfailTTL  time.Duration
	serveStale   time.Duration // how long past expiry entries stay servable
	staleMode    string
	staleTTL     time.Duration
	staleBudget  time.Duration

	upstreamTimeout time.Duration
	maxInflight     int
	maxPerClient    int
	refreshRate     int // background refreshes of expiring entries per second
	nsid            string

	udpReaders     int
	udpBatch       int
	socketsPerAddr int
	maxTCPConns    int
	tcpIdle        time.Duration

	adminSocket   string        // control socket for status, hold and release
	anchorLink    string        // link holding the listen addresses ("" : no anchor)
	anchorKind    string        // its kind: dummy on nodes, bridge where dummy is missing
	anchorCleanup bool          // delete the anchor link on exit
	steering      string        // auto, adopt, own or off
	probeInterval time.Duration // how often LocalDNS is probed
	peerProbe     addrPorts     // LocalDNS's address to probe when steering cannot route probes to it
	hungAfter     int           // failed probes in a row that make LocalDNS hung
	holdProbes    int           // hold-down: probes in a row LocalDNS must pass
	holdDown      time.Duration // hold-down: how long those probes must span
	tcpMigrate    bool          // set net.ipv4.tcp_migrate_req

	mirror           string        // tap, dnstap:PATH or none: how LocalDNS's answers reach the cache
	stateDir         string        // where the cache snapshot lives ("" : no snapshots)
	snapshotInterval time.Duration // how often it is written (and on SIGTERM)

	shutdownTimeout time.Duration
	logFormat       string
	logLevel        string

	// set lists the flags given on the command line or in the
	// environment: those override the Corefile.
	set map[string]bool
}

func newRunFlags() (*flag.FlagSet, *runOptions) {
	o := &runOptions{}
	cd := cache.DefaultConfig()
	pd := pipeline.DefaultConfig()
	rd := responder.DefaultConfig()
	o.cacheBytes = byteSize(cd.MaxBytes)

	fs := flag.NewFlagSet("dnsstandby run", flag.ContinueOnError)
	fs.Var(&o.listen, "listen", "`ADDR:PORT` to serve, repeatable (default 169.254.10.11:53)")
	fs.Var(&o.upstream, "upstream", "`ADDR:PORT` misses are forwarded to, repeatable, tried in order (the kube-dns ClusterIP)")
	fs.StringVar(&o.corefile, "localdns-corefile", "", "LocalDNS Corefile `PATH`: take upstreams, zones and cache policy from its blocks bound to the listen addresses; flags override")
	fs.StringVar(&o.metricsAddr, "metrics-addr", "127.0.0.1:9355", "`ADDR:PORT` for /metrics, /healthz and /readyz (empty: off)")

	fs.IntVar(&o.cacheEntries, "cache-max-entries", cd.MaxEntries, "cache bound in entries")
	fs.Var(&o.cacheBytes, "cache-max-bytes", "cache bound in `BYTES` (suffixes KiB, MiB, GiB) (default 64MiB)")
	fs.DurationVar(&o.maxTTL, "cache-max-ttl", cd.MaxTTL, "cap on how long positive answers stay fresh")
	fs.DurationVar(&o.maxNegTTL, "cache-max-neg-ttl", cd.MaxNegTTL, "cap on how long negative answers stay fresh")
	fs.DurationVar(&o.minTTL, "cache-min-ttl", cd.MinTTL, "floor on how long answers stay fresh (the TTL served is never raised)")
	fs.DurationVar(&o.servfailTTL, "servfail-ttl", cd.ServfailTTL, "how long SERVFAIL is cached (0: never)")
	fs.DurationVar(&o.serveStale, "serve-stale", cd.MaxStale, "how long past expiry an answer may be served stale (0: never)")
	fs.StringVar(&o.staleMode, "stale-mode", pd.StaleMode.String(), "verify: ask upstreams first, serve stale if they fail within --stale-budget; immediate: serve stale and refresh in the background")
	fs.DurationVar(&o.staleTTL, "stale-ttl", cd.StaleTTL, "TTL of stale answers (RFC 8767 recommends 30s)")
	fs.DurationVar(&o.staleBudget, "stale-budget", pd.StaleBudget, "in verify mode, how long a query with a stale answer waits for upstreams")

	fs.DurationVar(&o.upstreamTimeout, "upstream-timeout", pd.UpstreamTimeout, "time to resolve a miss upstream before SERVFAIL (or stale)")
	fs.IntVar(&o.maxInflight, "max-inflight", pd.MaxInflight, "cap on concurrent upstream resolutions")
	fs.IntVar(&o.maxPerClient, "max-per-client", pd.MaxPerClient, "cap on one client address's queries waiting on upstreams")
	fs.IntVar(&o.refreshRate, "refresh-rate", pd.RefreshRate, "background refreshes per second of entries hit in the last tenth of their life (0: none)")
	fs.StringVar(&o.nsid, "nsid", pd.NSID, "NSID sent to clients that ask (empty: none)")

	fs.IntVar(&o.udpReaders, "udp-readers", rd.ReadersPerSocket, "read loops per UDP socket")
	fs.IntVar(&o.udpBatch, "udp-batch", rd.Batch, "datagrams per recvmmsg/sendmmsg call")
	fs.IntVar(&o.socketsPerAddr, "sockets-per-addr", rd.SocketsPerAddr, "UDP sockets per listen address (each takes a share of the reuseport hash from LocalDNS)")
	fs.IntVar(&o.maxTCPConns, "max-tcp-conns", rd.MaxTCPConns, "open TCP connections; at the cap the idlest is closed")
	fs.DurationVar(&o.tcpIdle, "tcp-idle-timeout", rd.TCPIdle, "close a TCP connection idle this long")

	td := takeover.DefaultConfig()
	fs.StringVar(&o.adminSocket, "admin-socket", "/run/dnsstandby/admin.sock", "control socket for dnsstandby status, hold and release (empty: off)")
	fs.StringVar(&o.anchorLink, "anchor-link", "dnsstandby", "link of our own that keeps the listen addresses local when LocalDNS deletes its link (empty: no anchor)")
	fs.StringVar(&o.anchorKind, "anchor-kind", "dummy", "kind of the anchor link (bridge where the dummy driver is missing)")
	fs.BoolVar(&o.anchorCleanup, "anchor-cleanup", false, "delete the anchor link on exit (by default it stays, so the addresses stay local across restarts)")
	fs.StringVar(&o.steering, "steering", td.Steering, "auto, adopt, own or off: how the reuseport groups are steered (see README)")
	fs.DurationVar(&o.probeInterval, "probe-interval", td.ProbeInterval, "how often LocalDNS is probed while bound")
	fs.Var(&o.peerProbe, "peer-probe-addr", "LocalDNS address probed when steering cannot route probes to its socket on the listen address (default "+td.ProbeAddr.String()+")")
	fs.IntVar(&o.hungAfter, "hung-after", td.Machine.HungAfter, "failed probes in a row after which a bound LocalDNS counts as hung")
	fs.IntVar(&o.holdProbes, "holddown-probes", td.Machine.HealthyProbes, "probes in a row a restarted or hung LocalDNS must pass before it gets traffic back")
	fs.DurationVar(&o.holdDown, "holddown", td.Machine.HealthyFor, "how long those probes must span")
	fs.BoolVar(&o.tcpMigrate, "tcp-migrate", false, "set net.ipv4.tcp_migrate_req=1 so TCP connections queued on a dying LocalDNS move to us")

	fs.StringVar(&o.mirror, "mirror", "tap", "how LocalDNS's answers fill the cache: tap (a packet tap on the listen addresses' replies), dnstap:PATH (a socket LocalDNS streams to: `dnstap PATH full` in its Corefile), none")
	fs.StringVar(&o.stateDir, "state-dir", "/var/lib/dnsstandby", "directory for the cache snapshot, loaded at start and written periodically and on SIGTERM (empty: none)")
	fs.DurationVar(&o.snapshotInterval, "snapshot-interval", time.Minute, "how often the cache snapshot is written")

	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 5*time.Second, "on SIGTERM, how long queries in flight may take to finish")
	fs.BoolVar(&o.validate, "validate", false, "check the options (and the Corefile) and exit: 0 if dnsstandby would start with them, 2 if not")
	fs.StringVar(&o.logFormat, "log-format", "json", "json or text")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	return fs, o
}

// parseRunFlags parses args, then the environment for flags not given.
func parseRunFlags(args []string, stdout io.Writer) (*runOptions, error) {
	fs, o := newRunFlags()
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stdout)
			fmt.Fprintln(stdout, "usage: dnsstandby run [flags]\n\nEvery flag may also be set as DNSSTANDBY_<NAME> (e.g. DNSSTANDBY_LISTEN=169.254.10.11:53); flags win.")
			fs.PrintDefaults()
			return nil, err
		}
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	o.set = make(map[string]bool)
	if err := applyEnv(fs, o.set); err != nil {
		return nil, err
	}
	if len(o.listen) == 0 {
		o.listen = addrPorts{netip.MustParseAddrPort("169.254.10.11:53")}
	}
	return o, o.check()
}

// applyEnv sets each flag of the parsed fs not given on the command line
// from DNSSTANDBY_<NAME>, and records in set every flag given either way.
func applyEnv(fs *flag.FlagSet, set map[string]bool) error {
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || envErr != nil {
			return
		}
		key := envPrefix + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		v, ok := os.LookupEnv(key)
		if !ok {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			envErr = fmt.Errorf("%s=%q: %w", key, v, err)
			return
		}
		set[f.Name] = true
	})
	return envErr
}

// check rejects values no component would accept, with the flag's name.
func (o *runOptions) check() error {
	if _, err := steer.ParseLevel(o.steering); err != nil {
		return fmt.Errorf("--steering: %w", err)
	}
	if len(o.peerProbe) > 1 {
		return errors.New("--peer-probe-addr: give one address")
	}
	if o.hungAfter < 1 || o.holdProbes < 1 || o.holdDown < 0 || o.probeInterval <= 0 {
		return errors.New("--hung-after and --holddown-probes must be at least 1, --holddown not negative, --probe-interval positive")
	}
	if _, err := pipeline.ParseStaleMode(o.staleMode); err != nil {
		return fmt.Errorf("--stale-mode: %w", err)
	}
	for name, v := range map[string]int{
		"cache-max-entries": o.cacheEntries, "max-inflight": o.maxInflight, "max-per-client": o.maxPerClient,
		"udp-readers": o.udpReaders, "udp-batch": o.udpBatch, "sockets-per-addr": o.socketsPerAddr, "max-tcp-conns": o.maxTCPConns,
	} {
		if v <= 0 {
			return fmt.Errorf("--%s must be positive, got %d", name, v)
		}
	}
	for name, v := range map[string]time.Duration{
		"upstream-timeout": o.upstreamTimeout, "stale-budget": o.staleBudget, "tcp-idle-timeout": o.tcpIdle,
		"shutdown-timeout": o.shutdownTimeout, "cache-max-ttl": o.maxTTL, "cache-max-neg-ttl": o.maxNegTTL,
		"snapshot-interval": o.snapshotInterval,
	} {
		if v <= 0 {
			return fmt.Errorf("--%s must be positive, got %s", name, v)
		}
	}
	if _, _, err := parseMirror(o.mirror); err != nil {
		return fmt.Errorf("--mirror: %w", err)
	}
	if o.refreshRate < 0 {
		return fmt.Errorf("--refresh-rate must not be negative, got %d", o.refreshRate)
	}
	if o.logFormat != "json" && o.logFormat != "text" {
		return fmt.Errorf("--log-format %q: want json or text", o.logFormat)
	}
	if _, err := parseLevel(o.logLevel); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	return nil
}

// addrPorts is a repeatable ADDR:PORT flag; one value may also hold a
// comma-separated list (convenient in the environment).
type addrPorts []netip.AddrPort

func (a *addrPorts) String() string {
	parts := make([]string, len(*a))
	for i, ap := range *a {
		parts[i] = ap.String()
	}
	return strings.Join(parts, ",")
}

func (a *addrPorts) Set(v string) error {
	for _, s := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' }) {
		ap, err := parseAddrPort(s)
		if err != nil {
			return err
		}
		*a = append(*a, ap)
	}
	return nil
}

// parseAddrPort accepts ADDR:PORT, [V6]:PORT, or a bare address for port 53.
func parseAddrPort(s string) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap, nil
	}
	if ip, err := netip.ParseAddr(strings.Trim(s, "[]")); err == nil {
		return netip.AddrPortFrom(ip, 53), nil
	}
	return netip.AddrPort{}, fmt.Errorf("%q is not an IP address with optional :port", s)
}

// byteSize is a size flag with optional KiB/MiB/GiB suffix.
type byteSize int64

func (b *byteSize) String() string { return strconv.FormatInt(int64(*b), 10) }

func (b *byteSize) Set(v string) error {
	mult := int64(1)
	for suffix, m := range map[string]int64{"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30} {
		if strings.HasSuffix(v, suffix) {
			v, mult = strings.TrimSuffix(v, suffix), m
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n <= 0 {
		return fmt.Errorf("%q is not a positive size", v)
	}
	*b = byteSize(n * mult)
	return nil
}

// parseMirror splits --mirror into its kind (tap, dnstap, none) and the
// dnstap socket path.
func parseMirror(v string) (kind, path string, err error) {
	switch {
	case v == "tap" || v == "none":
		return v, "", nil
	case strings.HasPrefix(v, "dnstap:") && len(v) > len("dnstap:"):
		return "dnstap", strings.TrimPrefix(v, "dnstap:"), nil
	}
	return "", "", fmt.Errorf("%q: want tap, dnstap:PATH or none", v)
}
