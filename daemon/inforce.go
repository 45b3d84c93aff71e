package daemon

import (
	"bytes"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dnsstandby/dnsstandby/corefile"
	"github.com/dnsstandby/dnsstandby/handover"
	"github.com/dnsstandby/dnsstandby/lastgood"
)

// This file keeps what is known of the configuration in force: its
// Provenance, the Corefile refusals counted, and the last known good it
// writes to the state directory and hands to the next process.

// configState is the configuration in force as status and metrics see
// it; Run sets it first, the reload's goroutine changes it.
type configState struct {
	mu       sync.Mutex // guards following
	prov     Provenance
	refusals map[string]uint64 // by corefile.Reason
}

func (c *configState) provenance() Provenance {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.prov
}

func (c *configState) set(p Provenance) {
	c.mu.Lock()
	c.prov = p
	c.mu.Unlock()
}

// refused counts a Corefile refusal.
func (c *configState) refused(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.refusals == nil {
		c.refusals = map[string]uint64{}
	}
	c.refusals[corefile.Reason(err)]++
}

// applied makes prov the provenance in force. A Corefile from the file
// becomes the last known good: written to the state directory unless the
// record there holds the same content, whose first application time it
// then keeps.
func (d *Daemon) applied(prov Provenance) {
	if prov.Source == SourceFile && prov.src != nil {
		prov.Applied = time.Now().UTC()
		if d.stateDir != "" {
			r, err := lastgood.Load(d.stateDir, prov.Build)
			if err == nil && r.Source.SHA256 == prov.SHA256 && r.Source.File == prov.Corefile {
				prov.Applied = r.Applied
			} else if err := lastgood.Save(d.stateDir, lastgood.New(prov.src, prov.Applied)); err != nil {
				d.log.Error("last known good configuration not written", slog.Any("err", err))
			} else {
				d.log.Info("last known good configuration written", "path", lastgood.Path(d.stateDir), "corefile", prov.Corefile, "sha256", prov.SHA256)
			}
		}
	}
	d.config.set(prov)
}

// logProvenance says, once, where the configuration in force comes
// from: a warning when it is not the Corefile that was asked for.
func (d *Daemon) logProvenance(p Provenance) {
	switch p.Source {
	case SourceFile:
		d.log.Info("configuration from the Corefile", "corefile", p.Corefile, "sha256", p.SHA256)
	case SourceLastGood:
		d.log.Warn("Corefile refused: serving the last known good configuration until it is good again",
			"reason", corefile.Reason(p.Refused), "refused", errString(p.Refused),
			"last_good", p.Corefile, "sha256", p.SHA256, "applied", p.Applied.Format(time.RFC3339),
			"age", time.Since(p.Applied).Round(time.Second).String())
	case SourceFallback:
		d.log.Warn("Corefile refused and no last known good configuration: serving the fallback until the Corefile is good again",
			"reason", corefile.Reason(p.Refused), "refused", errString(p.Refused),
			"last_good", errString(p.LastGood), "routes", len(d.cfg.Routes))
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// lastGoodSave is the last known good in force, as the handover's cache
// file carries it to the next process; nil when there is none.
func (d *Daemon) lastGoodSave() *handover.CacheSave {
	p := d.config.provenance()
	if p.src == nil || p.Applied.IsZero() {
		return nil
	}
	r := lastgood.New(p.src, p.Applied)
	return &handover.CacheSave{Key: handover.LastGoodKey, Save: func(w io.Writer) (int, error) { return 0, lastgood.Encode(w, r) }}
}

// takeHandedLastGood uses the last known good a previous process handed
// over (handover.LastGoodKey), when it is newer than what Resolve found
// and the Corefile is not in force: a state directory the two do not
// share, or one not written yet. It runs before the views are built.
func (d *Daemon) takeHandedLastGood(b []byte) {
	r, err := lastgood.Decode(bytes.NewReader(b), d.cfg.Provenance.Build)
	if err != nil {
		d.log.Warn("handover: last known good configuration ignored", slog.Any("err", err))
		return
	}
	cur := d.cfg.Provenance
	if cur.Source == SourceFile || cur.Source == SourceFlags || d.cfg.Resolver == nil ||
		(cur.Source == SourceLastGood && !r.Applied.After(cur.Applied)) {
		return
	}
	cfg, err := layerChecked(d.cfg.Resolver.Layer, r.Source, d.cfg.Watch)
	if err != nil {
		d.log.Warn("handover: last known good configuration not usable", slog.Any("err", err))
		return
	}
	prov := Provenance{Source: SourceLastGood, Corefile: r.Source.File, SHA256: r.Source.SHA256, Applied: r.Applied,
		Refused: cur.Refused, Build: cur.Build, BuildErr: cur.BuildErr, src: r.Source}
	cfg.Provenance = prov
	cfg.Resolver = d.cfg.Resolver // layer's Config has none: without it, no reload
	d.cfg = cfg
	d.config.set(prov)
	if d.stateDir != "" {
		if err := lastgood.Save(d.stateDir, r); err != nil {
			d.log.Error("last known good configuration not written", slog.Any("err", err))
		}
	}
	d.log.Info("handover: using the last known good configuration of the previous process", "corefile", r.Source.File, "applied", r.Applied.Format(time.RFC3339))
}

// Metrics of the configuration in force.
var (
	descConfigSource = prometheus.NewDesc("dnsstandby_config_source",
		"1 for where the configuration in force comes from: file (the Corefile), last-good (the last Corefile applied, the Corefile being refused or missing), fallback (neither: the fallback upstreams), flags (no Corefile configured).", []string{"source"}, nil)
	descConfigApplied = prometheus.NewDesc("dnsstandby_config_applied_timestamp_seconds",
		"When the Corefile in force was first applied, in seconds since the epoch (time() minus it is its age); absent for the fallback and the flags.", nil, nil)
	descCorefileRefusals = prometheus.NewDesc("dnsstandby_corefile_refusals_total",
		"Corefiles refused, at start and at each change, because CoreDNS would refuse them or dnsstandby could not serve from them, by reason: missing, unreadable, syntax, unknown_directive, server_block, plugin, no_server_block, other.", []string{"reason"}, nil)
)

// configCollector exports the configuration in force.
type configCollector struct{ c *configState }

func (configCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descConfigSource
	ch <- descConfigApplied
	ch <- descCorefileRefusals
}

func (cc configCollector) Collect(ch chan<- prometheus.Metric) {
	c := cc.c
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range Sources() {
		v := 0.0
		if s == c.prov.Source {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(descConfigSource, prometheus.GaugeValue, v, s)
	}
	if !c.prov.Applied.IsZero() {
		ch <- prometheus.MustNewConstMetric(descConfigApplied, prometheus.GaugeValue, float64(c.prov.Applied.UnixMilli())/1000)
	}
	for _, r := range corefile.Reasons() {
		ch <- prometheus.MustNewConstMetric(descCorefileRefusals, prometheus.CounterValue, float64(c.refusals[r]), r)
	}
}
