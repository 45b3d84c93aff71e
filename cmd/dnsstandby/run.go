package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dnsstandby/dnsstandby/cache"
	"github.com/dnsstandby/dnsstandby/corefile"
	"github.com/dnsstandby/dnsstandby/daemon"
	"github.com/dnsstandby/dnsstandby/handover"
	"github.com/dnsstandby/dnsstandby/hedge"
	"github.com/dnsstandby/dnsstandby/internal/journald"
	"github.com/dnsstandby/dnsstandby/takeover/steer"
)

func runCommand(args []string, stdout, stderr io.Writer) int {
	cfg, o, err := runConfig(args, os.LookupEnv)
	if err == nil {
		fs, _ := runFlags(&cfg)
		err = checkEnv(fs, os.Environ())
	}
	if errors.Is(err, flag.ErrHelp) {
		printRunHelp(stdout)
		return exitOK
	}
	names := runFlagNames()
	if err != nil {
		fmt.Fprintf(stderr, "dnsstandby run: %s (dnsstandby run -h lists the flags)\n", names.rename(err.Error()))
		return exitConfig
	}
	log := newLogger(o, stderr, isJournal(stderr))
	d, err := daemon.New(cfg, log)
	if err != nil {
		fmt.Fprintf(stderr, "dnsstandby run: %s\n", names.rename(err.Error()+unusableHint(cfg)))
		return exitConfig
	}
	if o.validate {
		return validate(cfg, names, stdout, stderr)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// SIGHUP (systemctl reload) reloads; from here on it no longer kills.
	defer onSignal(syscall.SIGHUP, d.Reload)()
	return runExit(d.Run(ctx), log)
}

// runExit turns Run's error into the exit code, with one line: another
// dnsstandby serving the node is not a failure of this one.
func runExit(err error, log *slog.Logger) int {
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, handover.ErrRunning), errors.Is(err, daemon.ErrHandedOver):
		log.Warn("dnsstandby stopped: another dnsstandby serves this node", slog.Any("err", err))
		return exitServed
	}
	log.Error("dnsstandby stopped", slog.Any("err", err))
	return exitFail
}

// onSignal calls fn at each sig until the returned stop is called; stop
// returns once fn is no longer running.
func onSignal(sig os.Signal, fn func()) (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, sig)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-ch:
				fn()
			}
		}
	})
	return func() {
		signal.Stop(ch)
		close(done)
		wg.Wait()
	}
}

// validate is `dnsstandby run --validate`: whether dnsstandby would
// start as LocalDNS's standby, where the configuration comes from and
// what it serves. It exits 0 when dnsstandby would start from the
// Corefile (or the flags, without one) and listen wherever LocalDNS
// does; 1 when it would start with a problem to fix: the Corefile is
// refused (it starts from the last known good or the fallback), or the
// Corefile has LocalDNS serve a listener that --listen does not name
// (unanswered when LocalDNS fails). A configuration it would not start
// with never gets here: runCommand exits 78 (exitConfig).
func validate(cfg daemon.Config, names *flagNames, stdout, stderr io.Writer) int {
	p := &cfg.Provenance
	var problems []string
	switch p.Source {
	case daemon.SourceLastGood, daemon.SourceFallback:
		from := "the last known good Corefile"
		if p.Source == daemon.SourceFallback {
			from = "the fallback, without a Corefile"
		}
		problems = append(problems, fmt.Sprintf("the Corefile is refused (%s): dnsstandby would start from %s", corefile.Reason(p.Refused), from))
		p.Refused = renamed{p.Refused, names.rename(p.Refused.Error())}
	}
	uncovered, err := cfg.Uncovered()
	if err != nil {
		problems = append(problems, fmt.Sprintf("which listeners LocalDNS serves is not known: %v", err))
	}
	for _, ap := range uncovered {
		problems = append(problems, fmt.Sprintf("LocalDNS's Corefile serves %s, which --listen does not name: dnsstandby will not answer there when LocalDNS fails (add --listen %s)", ap, ap))
	}
	if len(problems) == 0 {
		from := "the flags"
		if p.Source == daemon.SourceFile {
			from = "the Corefile " + p.Corefile + ", on every listener it has LocalDNS serve"
		}
		fmt.Fprintf(stdout, "dnsstandby run: valid: would start from %s\n", from)
	} else {
		fmt.Fprintln(stdout, "dnsstandby run: would start, with problems to fix:")
		for _, pr := range problems {
			fmt.Fprintf(stdout, "  - %s\n", pr)
		}
	}
	fmt.Fprintln(stdout)
	for i, line := range cfg.Ignored {
		cfg.Ignored[i] = names.rename(line)
	}
	if err := cfg.WriteTable(stdout); err != nil {
		fmt.Fprintf(stderr, "dnsstandby run: %v\n", err)
		return exitFail
	}
	if len(problems) > 0 {
		return exitFail
	}
	return exitOK
}

// renamed is an error whose message names flags (flagNames.rename), still
// unwrapping to the error it renames (corefile.Reason reads it).
type renamed struct {
	err error
	msg string
}

func (r renamed) Error() string { return r.msg }
func (r renamed) Unwrap() error { return r.err }

// runFlagNames maps the fields of the daemon's configuration to the
// flags of `dnsstandby run` that set them.
func runFlagNames() *flagNames {
	cfg := daemon.DefaultConfig()
	fs, _ := runFlags(&cfg)
	return newFlagNames(fs, &cfg)
}

// unusableHint says, after the daemon's own error, that the configuration
// refused came from the fallback and why, and names the missing servers
// only when the fallback has none.
func unusableHint(cfg daemon.Config) string {
	p := cfg.Provenance
	if p.Source != daemon.SourceFallback {
		return ""
	}
	hint := fmt.Sprintf("; it is the fallback's: the Corefile is refused (%v)", p.Refused)
	if p.LastGood != nil {
		hint += ", the last known good is unusable (" + p.LastGood.Error() + ")"
	} else {
		hint += ", there is no last known good"
	}
	if len(cfg.Fallback.Upstreams) == 0 {
		hint += ", and the fallback has no servers: give --fallback-upstream KUBE_DNS_CLUSTER_IP:53"
	}
	return hint
}

// runOptions are the settings of `dnsstandby run` that are not the
// daemon's: how to log, and whether only to validate.
type runOptions struct {
	validate  bool
	logFormat string
	logLevel  slog.Level
}

// runConfig makes the configuration `dnsstandby run` starts with, by the
// daemon's rule (daemon.Resolver): from the LocalDNS Corefile, else the
// last known good, else the fallback. Its error is for the flags and
// environment; a Corefile that cannot be used is in the Provenance.
func runConfig(args []string, lookup func(string) (string, bool)) (daemon.Config, runOptions, error) {
	var o runOptions
	layer := func(src *corefile.Source) (daemon.Config, error) {
		cfg, opts, err := layerConfig(args, lookup, src)
		o = opts
		return cfg, err
	}
	res := &daemon.Resolver{Layer: layer}
	cfg, prov, err := res.Resolve()
	if err != nil {
		return cfg, o, err
	}
	cfg.Provenance = prov
	if prov.Source != daemon.SourceFlags {
		cfg.Resolver = res
	}
	return cfg, o, nil
}

// layerConfig layers the settings of `dnsstandby run`, each layer winning
// over those before it: the defaults, the Corefile src (nil: none), the
// DNSSTANDBY_* environment (lookup), the command line. The listen
// addresses the Corefile is read for come from the last two, so they are
// parsed once to find them and once more over what the Corefile gave.
func layerConfig(args []string, lookup func(string) (string, bool), src *corefile.Source) (daemon.Config, runOptions, error) {
	cfg := daemon.DefaultConfig()
	o, err := parseRunFlags(&cfg, args, lookup)
	if err != nil || src == nil {
		return cfg, o, err
	}
	s, err := src.Settings(cfg.Listen)
	if err != nil {
		return cfg, o, err
	}
	layered := daemon.DefaultConfig()
	layered.Listen = cfg.Listen // the Corefile's routes are per listen address
	daemon.ApplyCorefile(&layered, s)
	if o, err = parseRunFlags(&layered, args, lookup); err != nil {
		return layered, o, err
	}
	layered.Corefile = s.File // the one read, of those the flag lists
	return layered, o, nil
}

// parseRunFlags sets cfg from the command line, then from the environment
// for the flags the command line did not give, and checks what no field
// of the daemon's checks by itself: that there is an address to serve and
// misses have somewhere to go.
func parseRunFlags(cfg *daemon.Config, args []string, lookup func(string) (string, bool)) (runOptions, error) {
	fs, o := runFlags(cfg)
	if err := parseWithEnv(fs, args, lookup); err != nil {
		return *o, err
	}
	if fs.NArg() > 0 {
		return *o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	// A cache setting given wins over every block's own policy too.
	fs.Visit(func(f *flag.Flag) {
		if set := routeCacheFlags[f.Name]; set != nil {
			for _, r := range cfg.Routes {
				if r.Cache != nil {
					set(r.Cache, &cfg.Cache)
				}
			}
		}
	})
	if len(cfg.Listen) == 0 {
		return *o, errors.New("--listen names no address")
	}
	if len(cfg.Routes) == 0 && cfg.Corefile == "" && len(cfg.Fallback.Upstreams) == 0 {
		return *o, errors.New("no upstream: give --upstream ADDR:PORT or --fallback-upstream ADDR:PORT (the kube-dns ClusterIP), or a --localdns-corefile whose blocks forward somewhere")
	}
	return *o, nil
}

// routeCacheFlags are the flags of a cache policy setting that a Corefile
// block's cache plugin sets too: each copies its setting from the daemon's
// cache policy (src) to a block's (dst). The bounds are not among them:
// they bound every cache together.
var routeCacheFlags = map[string]func(dst, src *cache.Config){
	"cache-max-ttl":     func(dst, src *cache.Config) { dst.MaxTTL = src.MaxTTL },
	"cache-max-neg-ttl": func(dst, src *cache.Config) { dst.MaxNegTTL = src.MaxNegTTL },
	"cache-min-ttl":     func(dst, src *cache.Config) { dst.MinTTL, dst.MinNegTTL = src.MinTTL, src.MinNegTTL },
	"servfail-ttl":      func(dst, src *cache.Config) { dst.ServfailTTL = src.ServfailTTL },
	"serve-stale":       func(dst, src *cache.Config) { dst.MaxStale = src.MaxStale },
	"stale-mode":        func(dst, src *cache.Config) { dst.StaleMode = src.StaleMode },
	"stale-ttl":         func(dst, src *cache.Config) { dst.StaleTTL = src.StaleTTL },
}

// runFlags binds every flag of `dnsstandby run` to the field of cfg it
// sets; each flag's default is the field's value when it is bound.
func runFlags(cfg *daemon.Config) (*flag.FlagSet, *runOptions) {
	o := &runOptions{logFormat: "json", logLevel: slog.LevelInfo}
	fs := flag.NewFlagSet("dnsstandby run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c, p, r, t := &cfg.Cache, &cfg.Pipeline, &cfg.Responder, &cfg.Takeover

	fs.Var(&addrList{p: &cfg.Listen}, "listen", "`ADDR:PORT` to serve, repeatable")
	fs.Var(&upstreamFlag{cfg: cfg}, "upstream", "`ADDR:PORT` misses are forwarded to, repeatable, tried in order (the kube-dns ClusterIP); replaces the Corefile's forwards")
	fs.StringVar(&cfg.Corefile, "localdns-corefile", cfg.Corefile, "LocalDNS Corefile `PATH`, or several separated by commas of which the first that exists is read: take upstreams, zones, cache policy, templates and hosts from its blocks bound to the listen addresses; flags override")
	fs.Var(notNegative(&cfg.ReloadInterval), "corefile-check-interval", "how often the Corefile is checked for a change, applied while running (0: only at SIGHUP, systemctl reload)")
	fs.Var(&addrList{p: &cfg.Fallback.Upstreams}, "fallback-upstream", "kube-dns's `ADDR:PORT` (its ClusterIP), repeatable: where misses go when neither the Corefile nor the last known good in --state-dir can be used (every listener's cluster.local, and all names but on --fallback-node-listen)")
	fs.Var(parsed[netip.AddrPort]{&cfg.Fallback.NodeListen, parseAddrPort, netip.AddrPort.String}, "fallback-node-listen", "the node's own listener (LocalDNS's `ADDR:PORT` for kubelet and the node): in the fallback, its names outside cluster.local go to the node's resolvers, never to kube-dns")
	fs.StringVar(&cfg.LocalDNSCoreDNS, "localdns-coredns", cfg.LocalDNSCoreDNS, "LocalDNS's CoreDNS binary (`PATH`): a Corefile is judged against the directives its build has (`coredns -plugins`, run once per binary); without it, against CoreDNS 1.13.1's standard build (empty: never run it)")
	fs.StringVar(&cfg.Fallback.ResolvConf, "fallback-resolv-conf", cfg.Fallback.ResolvConf, "resolv.conf `PATH` listing the node's upstream resolvers (systemd-resolved's), for the fallback of --fallback-node-listen; loopback and the listen addresses are left out")
	fs.StringVar(&cfg.MetricsAddr, "metrics-addr", cfg.MetricsAddr, "`ADDR:PORT` for /metrics, /healthz and /readyz (empty: off)")

	fs.Var(positive(&c.MaxEntries), "cache-max-entries", "cache bound in entries")
	fs.Var(parsed[int64]{&c.MaxBytes, parseSize, formatSize}, "cache-max-bytes", "cache bound in `BYTES` (units Ki, Mi, Gi, KiB, MiB, GiB, K, M, G)")
	fs.Var(positive(&c.MaxTTL), "cache-max-ttl", "cap on how long positive answers stay fresh")
	fs.Var(positive(&c.MaxNegTTL), "cache-max-neg-ttl", "cap on how long negative answers stay fresh")
	fs.Var(minTTL{&c.MinTTL, &c.MinNegTTL}, "cache-min-ttl", "floor on how long answers stay fresh (the TTL served is never raised)")
	fs.Var(notNegative(&c.ServfailTTL), "servfail-ttl", "how long SERVFAIL is cached (0: never)")
	fs.Var(notNegative(&c.MaxStale), "serve-stale", "how long past expiry an answer may be served stale (0: never)")
	fs.Var(parsed[cache.StaleMode]{&c.StaleMode, cache.ParseStaleMode, cache.StaleMode.String}, "stale-mode", "verify: ask upstreams first, serve stale if they fail within --stale-budget; immediate: serve stale and refresh in the background")
	fs.Var(positive(&c.StaleTTL), "stale-ttl", "TTL of stale answers (RFC 8767 recommends 30s)")
	fs.Var(positive(&p.StaleBudget), "stale-budget", "in verify mode, how long a query with a stale answer waits for upstreams")

	fs.Var(positive(&p.UpstreamTimeout), "upstream-timeout", "time to resolve a miss upstream before SERVFAIL (or stale)")
	fs.Var(positive(&p.MaxInflight), "max-inflight", "cap on concurrent upstream resolutions (names the cache does not know: three quarters of it)")
	fs.Var(positive(&p.MaxPerZone), "max-per-zone", "cap on concurrent upstream resolutions of the names under one registrable domain (or one routed zone)")
	fs.Var(positive(&p.MaxPerClient), "max-per-client", "cap on one client address's queries waiting on upstreams, over UDP and over TCP apart; over it UDP gets TC (ask again over TCP)")
	fs.Var(notNegative(&p.RefreshRate), "refresh-rate", "background refreshes per second of entries hit in the last tenth of their life (0: none)")
	fs.StringVar(&p.NSID, "nsid", p.NSID, "NSID sent to clients that ask (empty: none)")

	fs.Var(positive(&r.ReadersPerSocket), "udp-readers", "read loops per UDP socket")
	fs.Var(positive(&r.Batch), "udp-batch", "datagrams per recvmmsg/sendmmsg call")
	fs.Var(positive(&r.SocketsPerAddr), "sockets-per-addr", "UDP sockets per listen address (each takes a share of the reuseport hash from LocalDNS)")
	fs.Var(positive(&r.MaxTCPConns), "max-tcp-conns", "open TCP connections; at the cap the idlest is closed, or with none idle the oldest of the address holding the most")
	fs.Var(positive(&r.MaxTCPConnsPerAddr), "max-tcp-conns-per-addr", "open TCP connections of one client address; past it that address's idlest, else oldest, is closed")
	fs.Var(positive(&r.TCPIdle), "tcp-idle-timeout", "close a TCP connection idle this long")

	fs.StringVar(&cfg.AdminSocket, "admin-socket", cfg.AdminSocket, "control socket for dnsstandby status, hold and release (empty: off)")
	fs.StringVar(&cfg.LockFile, "lock-file", cfg.LockFile, "file locked while running, before anything on the node is changed: a second dnsstandby exits 75 without touching the first (empty: no lock)")
	fs.StringVar(&cfg.HandoverFrom, "handover-from", cfg.HandoverFrom, "admin socket (`PATH`) of the dnsstandby that may be running: when the lock is held, ask it for its sockets, caches and lock, and serve in its place once started (a surge handover: DaemonSet rollout, a new build beside the old); it stops. Empty: a second dnsstandby exits 75")
	fs.Var(parsed[bool]{&cfg.WaitAfterHandover, parseAfterHandover, afterHandoverString}, "after-handover", "what a dnsstandby does once it has handed over to a --handover-from one and stopped: exit (75: another serves this node), or wait for its stop signal and exit 0 (a DaemonSet's old pod, whose exit would restart it)")
	fs.StringVar(&cfg.Anchor.Link, "anchor-link", cfg.Anchor.Link, "link of our own that keeps the listen addresses local when LocalDNS deletes its link (empty: no anchor)")
	fs.StringVar(&cfg.Anchor.Kind, "anchor-kind", cfg.Anchor.Kind, "kind of the anchor link (bridge where the dummy driver is missing)")
	fs.BoolVar(&cfg.Anchor.Cleanup, "anchor-cleanup", cfg.Anchor.Cleanup, "delete the anchor link on exit (by default it stays, so the addresses stay local across restarts)")
	fs.Var(parsed[string]{&t.Steering, parseSteering, identity}, "steering", "auto, adopt, own or off: how the reuseport groups are steered (see docs/design.md, Steering levels)")
	fs.Var(positive(&t.ProbeInterval), "probe-interval", "how often LocalDNS is probed while bound")
	fs.Var(parsed[netip.AddrPort]{&t.ProbeAddr, parseAddrPort, netip.AddrPort.String}, "peer-probe-addr", "LocalDNS `ADDR:PORT` probed when steering cannot route probes to its socket on the listen address")
	fs.Var(positive(&t.Machine.HungAfter), "hung-after", "failed probes in a row after which a bound LocalDNS counts as hung")
	fs.Var(positive(&t.Machine.HealthyProbes), "holddown-probes", "probes in a row a restarted or hung LocalDNS must pass before it gets traffic back")
	fs.Var(notNegative(&t.Machine.HealthyFor), "holddown", "how long those probes must span")
	fs.BoolVar(&t.TCPMigrate, "tcp-migrate", t.TCPMigrate, "set net.ipv4.tcp_migrate_req=1 so TCP connections queued on a dying LocalDNS move to us")
	fs.StringVar(&t.FallbackUnit, "localdns-fallback-unit", t.FallbackUnit, "systemd `UNIT` of AKS's LocalDNS fallback: a CoreDNS in it on a listen address is reported, never taken for LocalDNS (empty: every socket not ours is LocalDNS's)")

	fs.Var(parsed[daemon.Mirror]{&cfg.Mirror, parseMirror, daemon.Mirror.String}, "mirror", "how LocalDNS's answers fill the cache (`MODE`): tap (a packet tap on the listen addresses' replies), dnstap:PATH (a socket LocalDNS streams to: `dnstap PATH full` in its Corefile), none")
	fs.BoolVar(&cfg.TapRing, "tap-ring", cfg.TapRing, "with --mirror tap, read LocalDNS's replies at its cgroup's egress and the queries through a BPF ring buffer once LocalDNS is found, so that no packet socket sees what the node sends (false: the tap's packet socket reads both, and the kernel clones every packet the node sends for it)")
	h := &cfg.Hedge
	fs.BoolVar(&cfg.Hedging, "hedge", cfg.Hedging, "answer, from dnsstandby's own socket, the UDP queries LocalDNS leaves unanswered past a deadline, and hold a LocalDNS that answers none (needs --mirror tap; tracks queries only at steering level adopt)")
	fs.Var(positive(&h.CacheMin), "hedge-cache-min", "least wait for LocalDNS's answer before a hedge from the cache (the wait is 4 × LocalDNS's p99, within these bounds)")
	fs.Var(positive(&h.CacheMax), "hedge-cache-max", "most wait for LocalDNS's answer before a hedge from the cache")
	fs.Var(positive(&h.UpstreamMin), "hedge-upstream-min", "least wait before a query the cache cannot answer is hedged from the upstreams (the wait is 8 × LocalDNS's p99, within these bounds)")
	fs.Var(positive(&h.UpstreamMax), "hedge-upstream-max", "most wait before a query the cache cannot answer is hedged from the upstreams")
	fs.Var(hedgeRate{h}, "hedge-rate", "most hedges per second (and in one burst): a LocalDNS outage or forged queries cannot make dnsstandby send more")
	fs.Var(positive(&h.MinQueries), "silent-after", "cached queries LocalDNS must leave unanswered, with no reply of its in between, before it is held at once (below this many a second, the probes detect a hang)")
	fs.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "directory for the cache snapshots, loaded at start and written periodically and on SIGTERM, the last known good Corefile, and the directives of --localdns-coredns, kept so that a start need not run it (empty: none)")
	fs.Var(positive(&cfg.SnapshotInterval), "snapshot-interval", "how often the cache snapshot is written")
	fs.Var(positive(&cfg.ShutdownTimeout), "shutdown-timeout", "on SIGTERM, how long queries in flight may take to finish")

	fs.BoolVar(&o.validate, "validate", false, "check the options and the Corefile, print what would be served and from where, and exit: 0 if dnsstandby would start from the Corefile (or the flags) and listen wherever the Corefile has LocalDNS listen, 1 if it would start with a problem (the Corefile refused, so from the last known good or the fallback; a listener of LocalDNS's that --listen does not name), 2 if it would not start")
	fs.Var(parsed[string]{&o.logFormat, parseLogFormat, identity}, "log-format", "json or text")
	fs.TextVar(&o.logLevel, "log-level", o.logLevel, "debug, info, warn or error")
	return fs, o
}

func printRunHelp(w io.Writer) {
	cfg := daemon.DefaultConfig()
	fs, _ := runFlags(&cfg)
	fs.SetOutput(w)
	fmt.Fprintln(w, "usage: dnsstandby run [flags]\n\nEvery flag may also be set as DNSSTANDBY_<NAME> (e.g. DNSSTANDBY_LISTEN=169.254.10.11:53).\nFlags win over the environment, and both over the --localdns-corefile.")
	fs.PrintDefaults()
}

// upstreamFlag is --upstream: the first value replaces the routes (from
// the defaults or the Corefile) by one root route; later values add
// servers to it, tried in the order given.
type upstreamFlag struct {
	cfg *daemon.Config
	set bool
}

func (u *upstreamFlag) String() string {
	if u == nil || u.cfg == nil || len(u.cfg.Routes) == 0 {
		return ""
	}
	return fmt.Sprint(u.cfg.Routes[0].Upstream.Servers)
}

func (u *upstreamFlag) Set(v string) error {
	aps, err := parseAddrPorts(v)
	if err != nil {
		return err
	}
	if !u.set {
		// Only the forwards are replaced: the root block's cache policy
		// stays.
		root := daemon.NewRoute(".")
		for _, r := range u.cfg.Routes {
			if r.Zone == "." && r.Cache != nil {
				root.Cache = r.Cache
				break
			}
		}
		u.cfg.Routes, u.set = []daemon.Route{root}, true
	}
	r := &u.cfg.Routes[0].Upstream
	r.Servers = append(r.Servers, aps...)
	return nil
}

// hedgeRate is --hedge-rate: the hedges' rate and burst together.
type hedgeRate struct{ c *hedge.Config }

func (r hedgeRate) String() string {
	if r.c == nil {
		return ""
	}
	return fmt.Sprint(r.c.Burst)
}

func (r hedgeRate) Set(s string) error {
	var n int
	if err := positive(&n).Set(s); err != nil {
		return err
	}
	r.c.Rate, r.c.Burst = float64(n), n
	return nil
}

// minTTL is --cache-min-ttl, the floor for positive and negative answers
// alike.
type minTTL struct{ pos, neg *time.Duration }

func (m minTTL) String() string {
	if m.pos == nil {
		return ""
	}
	return m.pos.String()
}

func (m minTTL) Set(s string) error {
	var d time.Duration
	if err := notNegative(&d).Set(s); err != nil {
		return err
	}
	*m.pos, *m.neg = d, d
	return nil
}

// parseMirror reads --mirror: tap, dnstap:PATH or none.
func parseMirror(v string) (daemon.Mirror, error) {
	switch {
	case v == daemon.MirrorTap || v == daemon.MirrorNone:
		return daemon.Mirror{Kind: v}, nil
	case strings.HasPrefix(v, "dnstap:") && len(v) > len("dnstap:"):
		return daemon.Mirror{Kind: daemon.MirrorDnstap, DnstapPath: strings.TrimPrefix(v, "dnstap:")}, nil
	}
	return daemon.Mirror{}, fmt.Errorf("%q: want tap, dnstap:PATH or none", v)
}

func parseSteering(v string) (string, error) {
	_, err := steer.ParseLevel(v)
	return v, err
}

func parseLogFormat(v string) (string, error) {
	if v != "json" && v != "text" {
		return "", fmt.Errorf("%q: want json or text", v)
	}
	return v, nil
}

func identity(s string) string { return s }

// newLogger is the daemon's logger: a line per record on w in the format
// of --log-format; journal says w is the journal's stream
// (journald.Connected), whose lines then carry their syslog priority, so
// that `journalctl -p warning` filters by level.
func newLogger(o runOptions, w io.Writer, journal bool) *slog.Logger {
	hopts := &slog.HandlerOptions{Level: o.logLevel}
	format := func(w io.Writer) slog.Handler {
		if o.logFormat == "text" {
			return slog.NewTextHandler(w, hopts)
		}
		return slog.NewJSONHandler(w, hopts)
	}
	if journal {
		return slog.New(journald.NewHandler(w, format))
	}
	return slog.New(format(w))
}

// isJournal reports whether w is a file that is the journal's stream
// systemd connected this process to (JOURNAL_STREAM).
func isJournal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && journald.Connected(os.Getenv(journald.StreamEnv), f)
}

// parseAfterHandover is --after-handover: exit or wait.
func parseAfterHandover(v string) (bool, error) {
	switch v {
	case "exit":
		return false, nil
	case "wait":
		return true, nil
	}
	return false, fmt.Errorf("%q: want exit or wait", v)
}

func afterHandoverString(wait bool) string {
	if wait {
		return "wait"
	}
	return "exit"
}
