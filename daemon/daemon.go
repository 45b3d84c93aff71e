// Package daemon assembles dnsstandby: it starts the parts in order —
// cache, upstream groups, pipeline, listeners, mirror feed, takeover,
// admin socket, HTTP endpoints — under one lifetime, and stops them in
// reverse. It owns the order and the wiring between the parts and nothing
// else: what each part does is the part's own business, and the command
// line (cmd/dnsstandby) only turns flags, environment and the LocalDNS
// Corefile into a Config.
//
// Data flows one way: listeners (responder) → pipeline → cache and
// upstreams. The mirror feed writes into the cache. Takeover decides who
// answers (LocalDNS or dnsstandby) and steers the sockets; it sees the
// pipeline only through two functions the daemon hands it: Healthy and
// Answered.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/dnsstandby/dnsstandby/admin"
	"github.com/dnsstandby/dnsstandby/cache"
	"github.com/dnsstandby/dnsstandby/clock"
	"github.com/dnsstandby/dnsstandby/handover"
	"github.com/dnsstandby/dnsstandby/hedge"
	"github.com/dnsstandby/dnsstandby/internal/buildinfo"
	"github.com/dnsstandby/dnsstandby/mirror/dnstap"
	"github.com/dnsstandby/dnsstandby/mirror/tap"
	"github.com/dnsstandby/dnsstandby/pipeline"
	"github.com/dnsstandby/dnsstandby/responder"
	"github.com/dnsstandby/dnsstandby/takeover"
	"github.com/dnsstandby/dnsstandby/takeover/dnat"
	"github.com/dnsstandby/dnsstandby/upstream"
)

// Daemon is one run of dnsstandby. Create it with New, run it with Run.
type Daemon struct {
	cfg   Config
	base  *slog.Logger // always non-nil; for the parts, which tag their own lines
	log   *slog.Logger // base, tagged as the daemon's
	build buildinfo.Info
	ready chan struct{} // closed once everything is started

	// watched is what the files of Watch held at New; the reload's
	// goroutine owns it from Run on.
	watched string
	// reloadable: there is a Corefile to reload (Resolver and Watch).
	reloadable bool
	// reloads carries Reload's requests to the reload's goroutine; one
	// pending stands for any number (cap 1).
	reloads chan struct{}
	// config is the configuration in force, for status and metrics.
	config configState

	// The parts, set by Run as it starts them; read by the status.
	clk      *clock.Coarse
	stateDir string  // Config.StateDir if usable, else ""
	views    []*view // one per listen address, in Listen order
	srv      *responder.Server
	dnstap   *dnstap.Receiver
	ctrl     *takeover.Controller
	hand     *handover.Handover // set first by Run; what came from the previous process
	// savedAtStop: the stop's disk snapshots are written (or left to a
	// surge taker), so the routes' closers do not write them again.
	savedAtStop atomic.Bool
}

// group is one route's running upstream group.
type group struct {
	zone string
	g    *upstream.Group
}

// New checks cfg and returns a daemon that has not started anything. A
// nil logger discards.
func New(cfg Config, log *slog.Logger) (*Daemon, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return newUnchecked(cfg, log), nil
}

// newUnchecked is New without Validate: tests use it to see that Run's
// parts refuse what Validate refuses.
func newUnchecked(cfg Config, log *slog.Logger) *Daemon {
	d := &Daemon{cfg: cfg, base: log, log: log.With("component", "daemon"), build: buildinfo.Read(), ready: make(chan struct{}), reloads: make(chan struct{}, 1)}
	if cfg.Resolver != nil {
		d.watched = fingerprint(cfg.Watch)
	}
	d.reloadable = cfg.Resolver != nil && len(cfg.Watch) > 0
	d.config.set(cfg.Provenance)
	return d
}

// Ready is closed once Run has started every part: the listeners serve,
// the anchor, the steering program and the first mode are in place.
func (d *Daemon) Ready() <-chan struct{} { return d.ready }

// closers is the stop half of Run: what was started, stopped in reverse.
type closers []closer

type closer struct {
	name string
	fn   func() error
}

func (c *closers) push(name string, fn func() error) { *c = append(*c, closer{name, fn}) }

// closeAll runs the closers last first and logs those that fail.
func (c closers) closeAll(log *slog.Logger) {
	for i := len(c) - 1; i >= 0; i-- {
		if err := c[i].fn(); err != nil {
			log.Warn("stop "+c[i].name, slog.Any("err", err))
		}
	}
}

// Run starts every part, serves until ctx is done, and stops them in
// reverse order of start: on ctx, it first writes the caches into the fd
// store and to disk while still serving (handover.go), then stops reading
// and lets the queries in flight finish (within ShutdownTimeout), then
// ends takeover, which leaves the steering programs attached in their
// last mode, then closes the sockets (the store keeps its copies). A part that
// fails to start stops those already started and Run returns its error.
// Every goroutine of every part runs under one context that Run cancels
// after the last part has stopped. Run may be called once. It returns
// handover.ErrRunning when another dnsstandby holds the lock, and
// ErrHandedOver when it stopped because it gave a surge handover.
func (d *Daemon) Run(ctx context.Context) error {
	cfg := d.cfg
	log := d.log
	var stack closers
	defer func() { stack.closeAll(log) }()
	// Before anything binds or any cache is made: the lock, and what the
	// previous process passed (systemd's store, or a surge giver).
	hand, err := handover.Begin(ctx, d.handoverConfig(), handover.SystemdFromEnv())
	if errors.Is(err, handover.ErrRunning) {
		notify{log}.stepAside(err.Error())
	}
	if err != nil {
		return err
	}
	d.hand = hand
	stack.push("handover", hand.Close)
	d.openStateDir()
	// The configuration may change here, to a newer last known good the
	// previous process handed over.
	if b := hand.Cache(handover.LastGoodKey); b != nil {
		d.takeHandedLastGood(b)
	}
	cfg = d.cfg
	log.Info("dnsstandby starting", "version", d.build.Version, "revision", d.build.ShortRevision(), "go", d.build.GoVersion, "pid", os.Getpid())
	if p := cfg.Provenance; p.Refused != nil {
		d.config.refused(p.Refused)
	}
	d.applied(cfg.Provenance)
	d.logProvenance(d.config.provenance())
	for _, line := range cfg.Ignored {
		log.Info("LocalDNS does what dnsstandby does not", "corefile", cfg.Corefile, "what", line)
	}

	// life outlives ctx: the parts keep running while they drain.
	life, endLife := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	stack.push("goroutines", func() error { endLife(); wg.Wait(); return nil })

	clk := clock.NewCoarse()
	wg.Go(func() { clk.Run(life) })

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), d.build.Collector(), configCollector{&d.config})

	d.clk = clk
	if err := d.startViews(life, &stack, reg, clk); err != nil {
		return err
	}
	d.startSnapshots(life, &wg, &stack)
	if err := d.startListeners(&stack, reg); err != nil {
		return err
	}
	d.startMirror(life, &stack, reg)
	ctrl, err := d.startTakeover(life, &stack, reg)
	if err != nil {
		return err
	}
	d.startHedgers(life, &stack, ctrl)
	// Our sockets read and our steering program is attached: they go
	// into the store for the next process, and a giver may stop. It
	// frees the admin socket and the metrics address as it does.
	if err := hand.Serving(served{d}); err != nil {
		return err
	}
	if cfg.AdminSocket != "" {
		var as *admin.Server
		err := hand.AfterGiver(ctx, "admin socket", func() (err error) {
			as, err = admin.Listen(cfg.AdminSocket, handler{d: d, hand: hand}, d.base)
			return err
		})
		if err != nil {
			return err
		}
		stack.push("admin socket", as.Close)
	}
	var ready readiness
	if cfg.MetricsAddr != "" {
		var hs *http.Server
		err := hand.AfterGiver(ctx, "metrics address", func() (err error) {
			hs, err = d.serveHTTP(&wg, reg, &ready)
			return err
		})
		if err != nil {
			return err
		}
		stack.push("HTTP server", func() error {
			sctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			return hs.Shutdown(sctx)
		})
	}

	// The first closers to run at stop: leave readiness, then drain.
	stack.push("drain", func() error {
		sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
		defer cancel()
		d.srv.Drain(sctx)
		return nil
	})
	stack.push("cache hand-off", func() error { d.handOver(); return nil })
	sd := notify{log}
	stack.push("readiness", func() error {
		ready.set(false)
		sd.stopping()
		log.Info("shutting down", "timeout", cfg.ShutdownTimeout.String())
		return nil
	})

	ready.set(true)
	close(d.ready)
	st := ctrl.Status()
	log.Info("dnsstandby ready", "listen", fmt.Sprint(cfg.Listen), "mode", st.Mode, "steering", st.Steering.Level, "caches", len(d.caches()))
	// takeover.Start returned with the anchor, the steering program and
	// the first mode in place: systemd may now start LocalDNS.
	sd.ready(fmt.Sprintf("serving %s; mode %s; steering %s", fmt.Sprint(cfg.Listen), st.Mode, st.Steering.Level))
	wg.Go(func() { sd.watchdog(life, d.srv.Healthy) })
	if d.reloadable {
		wg.Go(func() { d.watch(life) })
	}

	select {
	case <-ctx.Done():
	case <-hand.GaveC():
	}
	start := time.Now()
	stack.closeAll(log)
	stack = nil
	log.Info("stopped", "took", time.Since(start).Round(time.Millisecond).String())
	if !hand.Gave() || ctx.Err() != nil {
		return nil
	}
	if cfg.WaitAfterHandover {
		// As a DaemonSet's old pod: exiting would restart the
		// container, which would ask for the handover back.
		log.Info("handover: done; waiting for the stop signal", "to_pid", hand.GaveTo())
		<-ctx.Done()
		return nil
	}
	return fmt.Errorf("%w: PID %d", ErrHandedOver, hand.GaveTo())
}

// ErrHandedOver is returned by Run when it stopped because it handed over
// to a surge taker (--handover-from), which serves the node now; with
// WaitAfterHandover, Run waits for ctx instead and returns nil.
var ErrHandedOver = errors.New("handed over: another dnsstandby serves this node")

// openStateDir makes the state directory if it is not there; without it
// there are no cache snapshots and no last known good.
func (d *Daemon) openStateDir() {
	dir := d.cfg.StateDir
	if dir == "" {
		return
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		d.log.Error("state directory unusable: no cache snapshots, no last known good configuration", "dir", dir, slog.Any("err", err))
		return
	}
	d.stateDir = dir
}

// view is what serves one listen address. LocalDNS answers each of its
// listeners from the server blocks bound to it, each with its own forward
// and cache; a view is dnsstandby's copy of that: its own pipeline, and
// per zone an upstream group and a cache, so that an answer learned
// through one block is never served through another.
type view struct {
	listen netip.AddrPort
	reg    prometheus.Registerer // the daemon's, with the listener label
	pipe   *pipeline.Pipeline
	tap    *tap.Tap      // nil unless the mirror feed is the tap and it runs
	hedger *hedge.Hedger // nil unless hedging, and the tap runs
	warm   *warmer       // with hedger: warms the cache while AKS's nat fallback has the queries

	mu  sync.Mutex // guards set, replaced by a reload
	set *routeSet
}

// zoneCache is one route's cache on a view, kept across reloads while its
// zone is routed and its policy stays.
type zoneCache struct {
	zone string
	cfg  cache.Config // as built, to tell a policy change
	c    *cache.Cache
	snap snapshots
}

// startViews makes a view per listen address, with its routes, their
// caches and its pipeline, and registers their metrics under a listener
// label.
func (d *Daemon) startViews(life context.Context, stack *closers, reg *prometheus.Registry, clk *clock.Coarse) error {
	for _, ap := range d.cfg.Listen {
		v := &view{listen: ap}
		v.reg = prometheus.WrapRegistererWith(prometheus.Labels{"listener": ap.String()}, reg)
		if err := d.startRoutes(life, stack, clk, v); err != nil {
			return err
		}
		pc := d.cfg.Pipeline
		pc.Logger = d.base.With("listener", ap.String())
		pc.Routes = v.set.routes
		pipe, err := pipeline.New(pc)
		if err != nil {
			return fmt.Errorf("listener %s: %w", ap, err)
		}
		if err := v.reg.Register(pipe); err != nil {
			return fmt.Errorf("listener %s: register pipeline metrics: %w", ap, err)
		}
		v.pipe = pipe
		d.views = append(d.views, v)
	}
	return nil
}

// newZoneCache makes route r's cache on view v with config cc. It starts
// warm: from prev, the zone's cache until now when its policy changed,
// else from the zone's last snapshot, if any, so that a restart during a
// takeover answers from what the last process knew.
func (d *Daemon) newZoneCache(v *view, zone string, cc cache.Config, clk *clock.Coarse, prev *zoneCache) (*zoneCache, error) {
	built := cc
	cc.Now = clk.Now
	c, err := cache.New(cc)
	if err != nil {
		return nil, fmt.Errorf("cache of zone %s on %s: %w", zone, v.listen, err)
	}
	zc := &zoneCache{zone: zone, cfg: built, c: c}
	zc.snap = snapshots{log: d.base.With("component", "snapshot", "listener", v.listen.String(), "zone", zone)}
	if d.stateDir != "" {
		zc.snap.path = snapshotPath(d.stateDir, v.listen, zone)
	}
	switch {
	case prev != nil:
		zc.snap.copyFrom(prev.c, c)
	case d.hand.LoadCache(handover.CacheKey(v.listen, zone), c, zc.snap.log):
	case zc.snap.path != "":
		zc.snap.load(c)
	}
	return zc, nil
}

// routeSet is one generation of a view's routes: what its pipeline asks
// per zone, the upstream groups and caches behind them (for the status
// and the metrics), and what stops them. A reloaded Corefile makes a new
// one, which keeps the caches of the zones it still routes alike.
type routeSet struct {
	routes []pipeline.Route
	groups []group
	caches map[string]*zoneCache // by zone
	stop   closers               // the groups, and the hosts files' reloads
}

// buildRoutes makes, per route of cfg serving the view's listen address,
// its local answers, its upstream group and its cache (the one of prev,
// the set in force, when the zone's policy is the same). On error it
// stops what it made.
func (d *Daemon) buildRoutes(life context.Context, cfg *Config, v *view, prev *routeSet, clk *clock.Coarse) (*routeSet, error) {
	set := &routeSet{caches: map[string]*zoneCache{}}
	fail := func(err error) (*routeSet, error) {
		set.stop.closeAll(d.log)
		return nil, err
	}
	n := cfg.caches()
	for _, r := range cfg.routesFor(v.listen) {
		local, err := d.startLocal(life, &set.stop, v, r)
		if err != nil {
			return fail(err)
		}
		var zc *zoneCache
		if r.cached() {
			cc := cfg.cacheConfig(&r, n)
			var old *zoneCache
			if prev != nil {
				old = prev.caches[r.Zone]
			}
			if old != nil && reflect.DeepEqual(old.cfg, cc) {
				zc = old
			} else if zc, err = d.newZoneCache(v, r.Zone, cc, clk, old); err != nil {
				return fail(err)
			}
			set.caches[r.Zone] = zc
		}
		if len(r.Upstream.Servers) == 0 {
			route := pipeline.Route{Zone: r.Zone, Upstream: localFirst{answerers: local}}
			if r.Whoami {
				route = pipeline.Route{Zone: r.Zone, Direct: direct(local)}
			} else {
				route.Cache = zc.c
			}
			set.routes = append(set.routes, route)
			d.log.Info("route", "listener", v.listen.String(), "zone", r.Zone, "templates", len(r.Templates), "hosts", r.Hosts != nil, "whoami", r.Whoami, "servers", "none")
			continue
		}
		uc := cfg.upstreamConfig(&r)
		uc.Logger = d.base.With("listener", v.listen.String(), "zone", r.Zone)
		g, err := upstream.New(uc)
		if err != nil {
			return fail(fmt.Errorf("upstream for zone %s on %s: %w", r.Zone, v.listen, err))
		}
		set.stop.push("upstream "+r.Zone+" on "+v.listen.String(), g.Close)
		set.groups = append(set.groups, group{r.Zone, g})
		var ex pipeline.Exchanger = g
		if len(local) > 0 {
			ex = localFirst{answerers: local, next: g}
		}
		set.routes = append(set.routes, pipeline.Route{Zone: r.Zone, Upstream: ex, Cache: zc.c})
		d.log.Info("route", "listener", v.listen.String(), "zone", r.Zone, "templates", len(r.Templates), "hosts", r.Hosts != nil,
			"servers", fmt.Sprint(uc.Servers), "force_tcp", uc.ForceTCP, "max_concurrent", uc.MaxConcurrent,
			"cache_max_entries", zc.cfg.MaxEntries, "serve_stale", zc.cfg.MaxStale.String(), "stale_mode", zc.cfg.StaleMode.String())
	}
	return set, nil
}

// register registers what of the set prev does not have: its upstream
// groups and its new caches, under their zone label; unregister takes out
// what next does not keep. prev and next may be nil.
func (s *routeSet) register(reg prometheus.Registerer, prev *routeSet) error {
	for _, g := range s.groups {
		if err := zoneRegisterer(reg, g.zone).Register(g.g); err != nil {
			return fmt.Errorf("register upstream metrics of zone %s: %w", g.zone, err)
		}
	}
	for zone, zc := range s.caches {
		if prev != nil && prev.caches[zone] == zc {
			continue
		}
		if err := zoneRegisterer(reg, zone).Register(zc.c); err != nil {
			return fmt.Errorf("register cache metrics of zone %s: %w", zone, err)
		}
	}
	return nil
}

func (s *routeSet) unregister(reg prometheus.Registerer, next *routeSet) {
	for _, g := range s.groups {
		zoneRegisterer(reg, g.zone).Unregister(g.g)
	}
	for zone, zc := range s.caches {
		if next == nil || next.caches[zone] != zc {
			zoneRegisterer(reg, zone).Unregister(zc.c)
		}
	}
}

func zoneRegisterer(reg prometheus.Registerer, zone string) prometheus.Registerer {
	return prometheus.WrapRegistererWith(prometheus.Labels{"zone": zone}, reg)
}

// startRoutes makes the view's first route set; the closer stops the set
// in force at stop, whichever generation it is.
func (d *Daemon) startRoutes(life context.Context, stack *closers, clk *clock.Coarse, v *view) error {
	set, err := d.buildRoutes(life, &d.cfg, v, nil, clk)
	if err != nil {
		return err
	}
	v.set = set
	// At stop the listeners are closed already: the caches hold all they
	// will, and their snapshots are written last.
	stack.push("routes on "+v.listen.String(), func() error {
		v.mu.Lock()
		s := v.set
		v.set = nil
		v.mu.Unlock()
		if s == nil {
			return nil
		}
		s.stop.closeAll(d.log)
		var errs []error
		for _, zc := range s.caches {
			if zc.snap.path != "" && !d.savedAtStop.Load() {
				errs = append(errs, zc.snap.save(zc.c, slog.LevelInfo))
			}
		}
		return errors.Join(errs...)
	})
	if err := set.register(v.reg, nil); err != nil {
		return fmt.Errorf("listener %s: %w", v.listen, err)
	}
	return nil
}

// caches returns the caches in force on every view.
func (d *Daemon) caches() []*zoneCache {
	var out []*zoneCache
	for _, v := range d.views {
		v.mu.Lock()
		if v.set != nil {
			for _, zc := range v.set.caches {
				out = append(out, zc)
			}
		}
		v.mu.Unlock()
	}
	return out
}

// startSnapshots writes every cache's snapshot every SnapshotInterval
// until stop; the routes' closers write the last ones.
func (d *Daemon) startSnapshots(life context.Context, wg *sync.WaitGroup, stack *closers) {
	if d.stateDir == "" {
		return
	}
	loopCtx, stopLoop := context.WithCancel(life)
	done := make(chan struct{})
	wg.Go(func() {
		defer close(done)
		t := time.NewTicker(d.cfg.SnapshotInterval)
		defer t.Stop()
		for {
			select {
			case <-loopCtx.Done():
				return
			case <-t.C:
				for _, zc := range d.caches() {
					if err := zc.snap.save(zc.c, slog.LevelDebug); err != nil {
						zc.snap.log.Error("cache snapshot not written", slog.Any("err", err))
					}
				}
			}
		}
	})
	stack.push("cache snapshot loop", func() error { stopLoop(); <-done; return nil })
}

// startListeners opens the listen addresses, each feeding its view's
// pipeline, and starts their read loops.
func (d *Daemon) startListeners(stack *closers, reg *prometheus.Registry) error {
	pipes := make(map[netip.AddrPort]*pipeline.Pipeline, len(d.views))
	for _, v := range d.views {
		pipes[v.listen] = v.pipe
	}
	rc := d.cfg.Responder
	rc.Listen = d.cfg.Listen
	rc.Logger = d.base
	if in := d.hand.Inherited(); in != nil {
		rc.Inherit = in
	}
	srv, err := responder.Listen(rc, pipes)
	if err != nil {
		return err
	}
	stack.push("listeners", func() error { srv.Close(); return nil })
	reg.MustRegister(srv)
	d.srv = srv
	return srv.Start()
}

// startMirror starts the mirror feed: LocalDNS's own answers into the
// caches. The tap reads each listen address's replies into that view's
// cache. A feed that cannot start is logged, not fatal: the cache then
// fills only with what dnsstandby answers itself.
func (d *Daemon) startMirror(life context.Context, stack *closers, reg *prometheus.Registry) {
	m := d.cfg.Mirror
	fail := func(err error) {
		d.log.Error("mirror feed not running: the cache will not mirror LocalDNS's answers", "mirror", m.String(), slog.Any("err", err))
	}
	if d.cfg.Hedging && !d.cfg.hedging() {
		d.log.Info("hedging off: only the packet tap sees the queries LocalDNS receives", "mirror", m.String())
	}
	switch m.Kind {
	case MirrorTap:
		for _, v := range d.views {
			tc := d.cfg.tapConfig(v.listen)
			tc.Logger = d.base.With("listener", v.listen.String())
			// The tap's goroutine files the replies: its own worker
			// parses each once, one record ahead (Worker.PrefetchMirror).
			mirror := v.pipe.NewWorker()
			tc.Prefetch = mirror.PrefetchMirror
			var obs observer
			if d.cfg.hedging() {
				var err error
				if obs, err = d.newHedger(v); err != nil {
					fail(fmt.Errorf("listener %s: %w", v.listen, err))
					continue
				}
				tc.Queries, tc.Observer = true, obs
			}
			tp, err := tap.Start(life, tc, mirror.InsertMirror)
			if err != nil {
				fail(fmt.Errorf("listener %s: %w", v.listen, err))
				continue
			}
			v.hedger, v.warm = obs.h, obs.warm
			// Off until takeover says every reply on the wire is LocalDNS's.
			tp.SetEnabled(false)
			stack.push("mirror tap "+v.listen.String(), tp.Close)
			prometheus.WrapRegistererWith(prometheus.Labels{"listener": v.listen.String()}, reg).MustRegister(tp)
			v.tap = tp
		}
	case MirrorDnstap:
		// Validate allows dnstap with one listen address only: the stream
		// carries no listener to route replies by.
		v := d.views[0]
		dc := d.cfg.dnstapConfig()
		dc.Logger = d.base
		rx, err := dnstap.Listen(life, dc, v.pipe.InsertMirror)
		if err != nil {
			fail(err)
			return
		}
		stack.push("mirror dnstap", rx.Close)
		reg.MustRegister(rx)
		d.dnstap = rx
	}
}

// setMirrorSafe enables or pauses every tap, as takeover decides.
func (d *Daemon) setMirrorSafe(safe bool) {
	for _, v := range d.views {
		if v.tap != nil {
			v.tap.SetEnabled(safe)
		}
		if v.hedger != nil {
			v.hedger.SetTracking(safe)
		}
	}
}

// setLocalDNS names LocalDNS's processes to every tap, which then reads
// their replies at their cgroup (ring mode).
func (d *Daemon) setLocalDNS(pids []int) {
	for _, v := range d.views {
		if v.tap != nil {
			v.tap.SetLocalDNS(pids)
		}
	}
}

// startTakeover starts the controller once the read loops run: the
// steering program may send traffic to our sockets the moment it is
// attached.
func (d *Daemon) startTakeover(life context.Context, stack *closers, reg *prometheus.Registry) (*takeover.Controller, error) {
	socks, err := d.srv.Sockets()
	if err != nil {
		return nil, err
	}
	tc := d.cfg.Takeover
	tc.Logger = d.base
	for _, s := range socks {
		tc.Sockets = append(tc.Sockets, takeover.OurSocket{Addr: s.Addr, UDP: s.UDP, Conn: s.Conn})
	}
	tc.Healthy = d.srv.Healthy
	tc.CountReads = d.srv.CountReads
	tc.Answered = d.answered
	if d.cfg.Mirror.Kind == MirrorTap {
		tc.OnMirrorSafe = d.setMirrorSafe
		tc.OnLocalDNS = d.setLocalDNS
	}
	if d.cfg.hedging() {
		tc.QueryCounts = d.queryCounts
	}
	tc.OnFallback = d.setFallback
	if a := d.cfg.Anchor; a.Link != "" {
		ac := d.cfg.anchorConfig()
		tc.Anchor = &ac
	}
	ctrl, err := takeover.Start(life, tc)
	if err != nil {
		return nil, err
	}
	stack.push("takeover", ctrl.Close)
	reg.MustRegister(ctrl)
	d.ctrl = ctrl // for the status and the admin socket, served from here on
	return ctrl, nil
}

// queryCounts are the queries the taps saw arrive for the listen
// addresses and those our UDP sockets received: takeover notices AKS's
// nat fallback from them. Only the taps that see queries (hedging) count.
func (d *Daemon) queryCounts() dnat.Counts {
	var c dnat.Counts
	for _, v := range d.views {
		if v.tap != nil && v.hedger != nil {
			c.Seen += v.tap.Stats().Queries
		}
	}
	c.Received = d.srv.UDPReceived()
	return c
}

// setFallback follows the AKS LocalDNS fallback takeover sees: while
// its nat design has the queries, the taps' queries warm the caches, so
// the taps show them though paused (otherwise they only count them).
func (d *Daemon) setFallback(design string) {
	nat := design == takeover.FallbackNAT
	for _, v := range d.views {
		if v.warm != nil {
			v.warm.on.Store(nat)
			v.tap.WatchQueries(nat)
		}
	}
}

// answered is the running total of queries dnsstandby answered, for
// takeover's mode events.
func (d *Daemon) answered() uint64 {
	var n uint64
	for _, v := range d.views {
		for src, k := range v.pipe.Answered() {
			if src != "error" {
				n += k
			}
		}
	}
	return n
}
