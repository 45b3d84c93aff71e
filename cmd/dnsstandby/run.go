package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/dnsstandby/dnsstandby/admin"
	"github.com/dnsstandby/dnsstandby/cache"
	"github.com/dnsstandby/dnsstandby/clock"
	"github.com/dnsstandby/dnsstandby/corefile"
	"github.com/dnsstandby/dnsstandby/mirror/dnstap"
	"github.com/dnsstandby/dnsstandby/mirror/tap"
	"github.com/dnsstandby/dnsstandby/pipeline"
	"github.com/dnsstandby/dnsstandby/responder"
	"github.com/dnsstandby/dnsstandby/takeover"
	"github.com/dnsstandby/dnsstandby/takeover/anchor"
	"github.com/dnsstandby/dnsstandby/upstream"
)

func runCommand(args []string, stdout, stderr io.Writer) int {
	o, err := parseRunFlags(args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "dnsstandby run: %v (dnsstandby run -h lists the flags)\n", err)
		return exitUsage
	}
	log := newLogger(o, stderr)
	pl, err := buildPlan(o, log)
	if err != nil {
		fmt.Fprintf(stderr, "dnsstandby run: %v\n", err)
		return exitUsage
	}
	if o.validate {
		fmt.Fprintln(stdout, "dnsstandby run: options valid")
		return exitOK
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, o, pl, log); err != nil {
		log.Error("dnsstandby stopped", "err", err.Error())
		return exitFail
	}
	return exitOK
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(s))
	return l, err
}

func newLogger(o *runOptions, w io.Writer) *slog.Logger {
	level, _ := parseLevel(o.logLevel) // checked by parseRunFlags
	hopts := &slog.HandlerOptions{Level: level}
	if o.logFormat == "text" {
		return slog.New(slog.NewTextHandler(w, hopts))
	}
	return slog.New(slog.NewJSONHandler(w, hopts))
}

// plan is what run starts: the options merged with the Corefile.
type plan struct {
	cache    cache.Config
	pipeline pipeline.Config // Cache and Routes filled by run
	routes   []routePlan
	resp     responder.Config
	takeover takeover.Config // Sockets, Healthy and Answered filled by run
}

// routePlan is one zone's upstream servers.
type routePlan struct {
	zone     string
	servers  []netip.AddrPort
	forceTCP bool
}

// buildPlan merges flags with the LocalDNS Corefile (flags win) and checks
// the result: at least one upstream, and none of them ourselves.
func buildPlan(o *runOptions, log *slog.Logger) (*plan, error) {
	p := &plan{cache: cache.DefaultConfig(), pipeline: pipeline.DefaultConfig(), resp: responder.DefaultConfig()}
	var zones []corefile.Zone
	if o.corefile != "" {
		s, err := corefile.Load(o.corefile, o.listen)
		switch {
		case err != nil && len(o.upstream) == 0:
			return nil, fmt.Errorf("no upstream: --upstream not given and %w", err)
		case err != nil:
			log.Error("LocalDNS Corefile unusable, continuing with flags", "err", err.Error())
		default:
			zones = s.Zones
			log.Info("LocalDNS Corefile read", "file", o.corefile, "zones", len(zones))
		}
	}
	cc := rootCache(zones)
	applyCorefileCache(p, cc)

	if len(o.upstream) > 0 {
		p.routes = []routePlan{{zone: ".", servers: o.upstream}}
	} else {
		for _, z := range zones {
			if len(z.Upstreams) > 0 {
				p.routes = append(p.routes, routePlan{zone: z.Name, servers: z.Upstreams, forceTCP: z.ForceTCP})
			}
		}
	}
	if len(p.routes) == 0 {
		return nil, errors.New("no upstream: give --upstream ADDR:PORT (the kube-dns ClusterIP) or a --localdns-corefile whose blocks forward somewhere")
	}
	for _, r := range p.routes {
		for _, s := range r.servers {
			if slices.Contains(o.listen, s) {
				return nil, fmt.Errorf("upstream %s is one of dnsstandby's listen addresses: forwarding there would loop", s)
			}
		}
	}

	// Flags given explicitly override the Corefile.
	c := &p.cache
	c.MaxEntries = o.cacheEntries
	c.MaxBytes = int64(o.cacheBytes)
	c.NSID = o.nsid
	c.UDPSize = p.pipeline.UDPSize
	override := func(name string, dst *time.Duration, v time.Duration) {
		if o.set[name] || cc == nil {
			*dst = v
		}
	}
	override("cache-max-ttl", &c.MaxTTL, o.maxTTL)
	override("cache-max-neg-ttl", &c.MaxNegTTL, o.maxNegTTL)
	override("cache-min-ttl", &c.MinTTL, o.minTTL)
	override("cache-min-ttl", &c.MinNegTTL, o.minTTL)
	override("servfail-ttl", &c.ServfailTTL, o.servfailTTL)
	override("serve-stale", &c.MaxStale, o.serveStale)
	c.StaleTTL = o.staleTTL
	if o.set["stale-mode"] || cc == nil {
		p.pipeline.StaleMode, _ = pipeline.ParseStaleMode(o.staleMode)
	}

	pc := &p.pipeline
	pc.StaleBudget = o.staleBudget
	pc.UpstreamTimeout = o.upstreamTimeout
	pc.MaxInflight = o.maxInflight
	pc.MaxPerClient = o.maxPerClient
	pc.RefreshRate = o.refreshRate
	pc.NSID = o.nsid
	pc.Logger = log

	t := &p.takeover
	*t = takeover.DefaultConfig()
	t.Steering = o.steering
	t.ProbeInterval = o.probeInterval
	if len(o.peerProbe) == 1 {
		t.ProbeAddr = o.peerProbe[0]
	}
	t.Machine = takeover.MachineConfig{HungAfter: o.hungAfter, HealthyProbes: o.holdProbes, HealthyFor: o.holdDown}
	t.TCPMigrate = o.tcpMigrate
	t.Logger = log
	if o.anchorLink != "" {
		a := &anchor.Config{Link: o.anchorLink, Kind: o.anchorKind, Cleanup: o.anchorCleanup}
		for _, ap := range o.listen {
			if !slices.Contains(a.Addrs, ap.Addr()) {
				a.Addrs = append(a.Addrs, ap.Addr())
			}
		}
		t.Anchor = a
	}

	r := &p.resp
	r.Listen = o.listen
	r.ReadersPerSocket = o.udpReaders
	r.Batch = o.udpBatch
	r.SocketsPerAddr = o.socketsPerAddr
	r.MaxTCPConns = o.maxTCPConns
	r.TCPIdle = o.tcpIdle
	r.Logger = log
	return p, nil
}

// rootCache returns the cache block of the Corefile's root zone, or nil.
// When present, its values replace the built-in defaults.
func rootCache(zones []corefile.Zone) *corefile.Cache {
	for _, z := range zones {
		if z.Name == "." && z.Cache != nil {
			return z.Cache
		}
	}
	return nil
}

// applyCorefileCache takes the cache policy of the Corefile's root block:
// dnsstandby should keep answers exactly as long as LocalDNS would.
func applyCorefileCache(p *plan, cc *corefile.Cache) {
	if cc == nil {
		return
	}
	c := &p.cache
	c.MaxTTL, c.MaxNegTTL = cc.MaxTTL, cc.MaxNegTTL
	c.MinTTL, c.MinNegTTL = cc.MinTTL, cc.MinNegTTL
	c.ServfailTTL = cc.ServfailTTL
	c.MaxStale = cc.ServeStale
	if cc.StaleVerify {
		p.pipeline.StaleMode = pipeline.StaleVerify
	} else {
		p.pipeline.StaleMode = pipeline.StaleImmediate
	}
}

// run starts everything, waits for ctx, and shuts down in order: stop
// reading, finish what is in flight, close.
func run(ctx context.Context, o *runOptions, pl *plan, log *slog.Logger) error {
	ver := readBuildVersion()
	log.Info("dnsstandby starting", "version", ver.Version, "revision", ver.revision(), "go", ver.GoVersion)
	var wg sync.WaitGroup
	bg, cancelBG := context.WithCancel(context.Background())
	defer func() { cancelBG(); wg.Wait() }()

	clk := clock.NewCoarse()
	wg.Go(func() { clk.Run(bg) })
	pl.cache.Now = clk.Now
	c, err := cache.New(pl.cache)
	if err != nil {
		return err
	}

	// A warm cache before the sockets open: a restart during a takeover
	// answers from what the last process knew.
	if o.stateDir != "" {
		if err := os.MkdirAll(o.stateDir, 0o700); err != nil {
			log.Error("state directory unusable: no cache snapshots", "dir", o.stateDir, "err", err.Error())
			o.stateDir = ""
		} else {
			loadSnapshot(c, o.stateDir, log)
			wg.Go(func() { snapshotLoop(bg, c, o.stateDir, o.snapshotInterval, log) })
		}
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), ver.collector(), c)

	var groups []*upstream.Group
	defer func() {
		for _, g := range groups {
			_ = g.Close()
		}
	}()
	for i, r := range pl.routes {
		g, err := upstream.New(upstream.Config{
			Servers: r.servers,
			// Leave room within the resolution's budget to try the next
			// server after one that does not answer.
			Timeout:  max(pl.pipeline.UpstreamTimeout/time.Duration(len(r.servers)), 250*time.Millisecond),
			ForceTCP: r.forceTCP,
			Logger:   log.With("zone", r.zone),
		})
		if err != nil {
			return fmt.Errorf("upstream for zone %s: %w", r.zone, err)
		}
		groups = append(groups, g)
		// Groups export the same metric names; a zone label keeps their
		// series apart.
		if err := prometheus.WrapRegistererWith(prometheus.Labels{"zone": r.zone}, reg).Register(g); err != nil {
			return fmt.Errorf("register upstream metrics: %w", err)
		}
		pl.pipeline.Routes = append(pl.pipeline.Routes, pipeline.Route{Zone: r.zone, Upstream: g})
		log.Info("upstream", "zone", r.zone, "servers", fmt.Sprint(r.servers), "index", i)
	}

	pl.pipeline.Cache = c
	pipe, err := pipeline.New(pl.pipeline)
	if err != nil {
		return err
	}
	reg.MustRegister(pipe)
	srv, err := responder.Listen(pl.resp, pipe)
	if err != nil {
		return err
	}
	reg.MustRegister(srv)

	if err := srv.Start(); err != nil {
		srv.Shutdown(context.Background())
		return err
	}
	// Takeover after the read loops run: the steering program may send us
	// traffic the moment it is attached.
	socks, err := srv.Sockets()
	if err != nil {
		srv.Shutdown(context.Background())
		return err
	}
	// The mirror feed: LocalDNS's own answers into our cache.
	mirrorKind, dnstapPath, _ := parseMirror(o.mirror) // checked by parseRunFlags
	var tp *tap.Tap
	switch mirrorKind {
	case "tap":
		var addrs []netip.Addr
		for _, ap := range o.listen {
			if !slices.Contains(addrs, ap.Addr()) {
				addrs = append(addrs, ap.Addr())
			}
		}
		tp, err = tap.Start(bg, tap.Config{Addrs: addrs, Port: o.listen[0].Port(), Logger: log}, c.InsertMirror)
		if err != nil {
			// A node without packet sockets still serves; the cache then
			// fills only with what dnsstandby answers itself.
			log.Error("mirror feed not running: the cache will not mirror LocalDNS's answers", "mirror", "tap", "err", err.Error())
			break
		}
		tp.SetEnabled(false) // until takeover says every reply on the wire is LocalDNS's
		defer tp.Close()
		reg.MustRegister(tp)
	case "dnstap":
		rx, err := dnstap.Listen(bg, dnstap.Config{Path: dnstapPath, Logger: log}, c.InsertMirror)
		if err != nil {
			log.Error("mirror feed not running: the cache will not mirror LocalDNS's answers", "mirror", "dnstap", "path", dnstapPath, "err", err.Error())
			break
		}
		defer rx.Close()
		reg.MustRegister(rx)
	}

	tc := pl.takeover
	if tp != nil {
		tc.OnMirrorSafe = tp.SetEnabled
	}
	for _, s := range socks {
		tc.Sockets = append(tc.Sockets, takeover.OurSocket{Addr: s.Addr, UDP: s.UDP, Conn: s.Conn})
	}
	tc.Healthy = srv.Healthy
	tc.Answered = func() uint64 {
		var n uint64
		for src, v := range pipe.Answered() {
			if src != "error" {
				n += v
			}
		}
		return n
	}
	ctrl, err := takeover.Start(ctx, tc)
	if err != nil {
		srv.Shutdown(context.Background())
		return err
	}
	reg.MustRegister(ctrl)

	if o.adminSocket != "" {
		as, err := admin.Listen(o.adminSocket, newStatusHandler(ctrl, o, reg), log)
		if err != nil {
			ctrl.Close()
			srv.Shutdown(context.Background())
			return err
		}
		defer as.Close()
	}
	var ready readiness
	if o.metricsAddr != "" {
		hs, err := serveHTTP(o.metricsAddr, reg, srv, ctrl, &ready, log)
		if err != nil {
			ctrl.Close()
			srv.Shutdown(context.Background())
			return err
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_ = hs.Shutdown(sctx)
		}()
	}
	ready.set(true)
	st := ctrl.Status().(takeover.Status)
	log.Info("dnsstandby ready", "listen", fmt.Sprint(o.listen), "mode", st.Mode, "steering", st.Steering.Level,
		"stale_mode", pl.pipeline.StaleMode.String(), "cache_max_entries", pl.cache.MaxEntries, "serve_stale", pl.cache.MaxStale.String())
	// takeover.Start returned with the anchor, the steering program and
	// the first mode in place: systemd may now start LocalDNS.
	sd := notify{log}
	sd.ready(fmt.Sprintf("serving %s; mode %s; steering %s", fmt.Sprint(o.listen), st.Mode, st.Steering.Level))
	wg.Go(func() { sd.watchdog(bg, srv.Healthy) })

	<-ctx.Done()
	ready.set(false)
	sd.stopping()
	log.Info("shutting down", "timeout", o.shutdownTimeout.String())
	sctx, cancel := context.WithTimeout(context.Background(), o.shutdownTimeout)
	defer cancel()
	start := time.Now()
	// Stop reading and finish what is in flight; then end steering, which
	// leaves the programs attached in their last mode (in mirror, every
	// query goes on to LocalDNS while our sockets close); then close them.
	srv.Drain(sctx)
	if err := ctrl.Close(); err != nil {
		log.Warn("takeover stop", "err", err.Error())
	}
	srv.Close()
	if o.stateDir != "" {
		saveSnapshot(c, o.stateDir, log)
	}
	log.Info("stopped", "took", time.Since(start).Round(time.Millisecond).String())
	return nil
}

// readiness is what /readyz reports: true between start and shutdown.
type readiness struct {
	mu sync.Mutex
	ok bool
}

func (r *readiness) set(v bool) { r.mu.Lock(); r.ok = v; r.mu.Unlock() }
func (r *readiness) get() bool  { r.mu.Lock(); defer r.mu.Unlock(); return r.ok }

// serveHTTP serves /metrics, /healthz (the read loops make progress) and
// /readyz (listening and not shutting down).
func serveHTTP(addr string, reg *prometheus.Registry, srv *responder.Server, ctrl *takeover.Controller, ready *readiness, log *slog.Logger) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := srv.Healthy(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/debug/events", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(ctrl.Events())
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.get() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server", "err", err.Error())
		}
	}()
	return hs, nil
}
