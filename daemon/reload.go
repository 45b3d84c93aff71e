package daemon

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/dnsstandby/dnsstandby/clock"
	"github.com/dnsstandby/dnsstandby/corefile"
)

// This file is the live reload: LocalDNS's Corefile is rewritten on nodes
// (localdns.sh writes updated.localdns.corefile at every LocalDNS start,
// and operators patch it), and dnsstandby follows it without a restart.

// maxWatchedSize bounds what is read of a watched file to fingerprint it;
// a Corefile is a few KiB.
const maxWatchedSize = 16 << 20

// fingerprint says what each watched file holds now: its size and the
// SHA-256 of its content, or why it cannot be read. A change in any of
// them is a change; a file rewritten with the same bytes is not.
func fingerprint(paths []string) string {
	var b strings.Builder
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", p, err)
			continue
		}
		h := sha256.New()
		n, err := io.Copy(h, io.LimitReader(f, maxWatchedSize))
		f.Close()
		fmt.Fprintf(&b, "%s: %d %x %v\n", p, n, h.Sum(nil), err)
	}
	return b.String()
}

// Reload asks for a reload now, as SIGHUP (systemctl reload) does: the
// watched files are read again and what changed is applied, by the
// goroutine and the code of the periodic check (watch), at once. It never
// blocks; a request made while one is pending joins it. Without a
// Corefile there is nothing to reload, which it logs.
func (d *Daemon) Reload() {
	if !d.reloadable {
		d.log.Info("reload: nothing to reload: dnsstandby runs from its flags, without a Corefile; changed flags take effect at the next start")
		return
	}
	select {
	case d.reloads <- struct{}{}:
	default:
	}
}

// Triggers of a reload, as its log line gives them.
const (
	triggerChange = "change" // the periodic check saw a watched file change
	triggerRetry  = "retry"  // the periodic retry of a refused Corefile
	triggerReload = "reload" // Reload: SIGHUP, systemctl reload
)

// watch checks the watched files every ReloadInterval (never when 0) and
// at every Reload, until life ends (against what they held when New was
// called, close to when the settings were read), and when they change,
// resolves the configuration again (Resolve) and applies it unless that
// would step down from what is in force: a Corefile refused later leaves
// the one in force, a good one replaces the last known good or the
// fallback. A Reload resolves again even when nothing changed, and logs
// its outcome either way. Route sets a reload replaced are stopped once
// the resolutions that started with them are done; the last at once when
// life ends. It runs on its own goroutine, owned by Run.
func (d *Daemon) watch(life context.Context) {
	cfg := d.cfg
	// The check waits for the instants the other periodic work shares
	// (clock.UntilNext).
	var tick <-chan time.Time
	var reloadT *time.Timer
	if cfg.ReloadInterval > 0 {
		reloadT = time.NewTimer(clock.UntilNext(cfg.ReloadInterval))
		defer reloadT.Stop()
		tick = reloadT.C
	}
	sd := notify{d.log}
	last := d.watched
	type retired struct {
		set   *routeSet
		after time.Time
	}
	var old []retired
	stopRetired := func(now time.Time, all bool) {
		old = slices.DeleteFunc(old, func(r retired) bool {
			if all || now.After(r.after) {
				r.set.stop.closeAll(d.log)
				d.log.Debug("replaced routes stopped", "zones", len(r.set.routes))
				return true
			}
			return false
		})
	}
	defer func() { stopRetired(time.Time{}, true) }()
	for {
		var now time.Time
		asked := false
		select {
		case <-life.Done():
			return
		case now = <-tick:
			reloadT.Reset(clock.UntilNext(cfg.ReloadInterval))
		case <-d.reloads:
			now, asked = time.Now(), true
		}
		stopRetired(now, false)
		// While the Corefile is not in force it is tried at every tick,
		// changed or not: whether CoreDNS takes it may depend on the
		// node (an interface or an address a bind names).
		fp := fingerprint(cfg.Watch)
		changed := fp != last
		trigger := triggerRetry
		switch {
		case asked:
			trigger = triggerReload
			sd.reloading()
		case changed:
			trigger = triggerChange
		case d.config.provenance().Refused == nil:
			continue
		}
		last = fp
		sets, err := d.reloadChanged(life, changed, trigger)
		if asked {
			sd.reloaded()
		}
		if err != nil {
			d.log.Error("Corefile change not applied: the configuration in force stays", "trigger", trigger, "corefile", strings.Join(cfg.Watch, ","), "source", d.config.provenance().Source, slog.Any("err", err))
			continue
		}
		// A resolution lasts at most UpstreamTimeout, a stale answer's
		// wait StaleBudget: after both the replaced upstreams are idle.
		after := now.Add(cfg.Pipeline.UpstreamTimeout + cfg.Pipeline.StaleBudget + time.Second)
		for _, s := range sets {
			old = append(old, retired{s, after})
		}
	}
}

// reloadChanged resolves the configuration again (changed: after a change
// of a watched file; else a Reload or the periodic retry of a refused
// Corefile; trigger says which, for the log) and
// applies it, unless that steps down the rule: then the configuration in
// force stays, as the last known good, and the error says why. A retry
// that finds nothing new does nothing; a Reload says so.
func (d *Daemon) reloadChanged(life context.Context, changed bool, trigger string) ([]*routeSet, error) {
	next, prov, err := d.cfg.Resolver.Resolve()
	if err != nil {
		return nil, err
	}
	cur := d.config.provenance()
	if !changed && prov.Source == cur.Source && prov.SHA256 == cur.SHA256 && errString(prov.Refused) == errString(cur.Refused) {
		if trigger == triggerReload {
			d.log.Info("reload: nothing changed: the configuration in force stays", "trigger", trigger, "corefile", next.Corefile, "source", cur.Source, "sha256", cur.SHA256)
		}
		return nil, nil
	}
	if prov.Refused != nil {
		d.config.refused(prov.Refused)
	}
	sameContent := prov.Source == cur.Source && prov.SHA256 == cur.SHA256 && prov.Source != SourceFallback
	if rank(prov.Source) < rank(cur.Source) || sameContent && prov.Refused != nil {
		// What is in force was the Corefile's last good content: it is
		// the last known good now.
		kept := cur
		if kept.Source == SourceFile {
			kept.Source = SourceLastGood
		}
		kept.Refused = prov.Refused
		d.config.set(kept)
		return nil, fmt.Errorf("refused (%s): %w", corefile.Reason(prov.Refused), prov.Refused)
	}
	sets, err := d.reload(life, next)
	if err != nil {
		return nil, err
	}
	d.applied(prov)
	now := d.config.provenance()
	d.log.Info("Corefile reloaded", "trigger", trigger, "corefile", next.Corefile, "source", now.Source, "sha256", now.SHA256, "ignored", len(next.Ignored))
	if cur.Source != now.Source {
		d.logProvenance(now)
	}
	return sets, nil
}

// reload puts the routes of next in force on every listen address at
// once, returning the route sets they replaced. A zone
// still routed keeps its cache; one whose cache policy changed gets a new
// cache holding the old one's entries. Settings other than the routes and
// their caches take effect at the next start.
func (d *Daemon) reload(life context.Context, next Config) ([]*routeSet, error) {
	if err := next.Validate(); err != nil {
		return nil, err
	}
	if !slices.Equal(next.Listen, d.cfg.Listen) {
		return nil, fmt.Errorf("listen addresses %v, now %v: a restart applies them", d.cfg.Listen, next.Listen)
	}
	sets := make([]*routeSet, len(d.views))
	for i, v := range d.views {
		v.mu.Lock()
		prev := v.set
		v.mu.Unlock()
		var err error
		if sets[i], err = d.buildRoutes(life, &next, v, prev, d.clk); err != nil {
			for _, s := range sets[:i] {
				s.stop.closeAll(d.log)
			}
			return nil, err
		}
	}
	replaced := make([]*routeSet, 0, len(d.views))
	for i, v := range d.views {
		if err := v.pipe.SetRoutes(sets[i].routes); err != nil {
			// Checked by Validate and buildRoutes; the old routes stay.
			d.log.Error("routes not replaced", "listener", v.listen.String(), slog.Any("err", err))
			sets[i].stop.closeAll(d.log)
			continue
		}
		v.mu.Lock()
		prev := v.set
		if prev != nil { // nil: the daemon is stopping
			v.set = sets[i]
		}
		v.mu.Unlock()
		if prev == nil {
			sets[i].stop.closeAll(d.log)
			continue
		}
		prev.unregister(v.reg, sets[i])
		if err := sets[i].register(v.reg, prev); err != nil {
			d.log.Warn("upstream metrics not registered after a reload", "listener", v.listen.String(), slog.Any("err", err))
		}
		replaced = append(replaced, prev)
	}
	return replaced, nil
}
