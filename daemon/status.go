package daemon

import (
	"cmp"
	"net"
	"os"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dnsstandby/dnsstandby/admin"
	"github.com/dnsstandby/dnsstandby/corefile"
	"github.com/dnsstandby/dnsstandby/handover"
	"github.com/dnsstandby/dnsstandby/status"
	"github.com/dnsstandby/dnsstandby/takeover"
	"github.com/dnsstandby/dnsstandby/takeover/peer"
)

// Status returns the daemon's status from its parts' own state: the
// takeover controller's Status, each upstream group's, the mirror feed's
// and the cache's Stats. Call it once Ready is closed.
func (d *Daemon) Status() status.Daemon {
	cfg := d.cfg
	st := status.Daemon{
		Status:  d.ctrl.Status(),
		Version: d.build.String(),
		PID:     os.Getpid(),
		Config: &status.Config{
			Steering:   cfg.Takeover.Steering,
			Mirror:     cfg.Mirror.String(),
			AnchorLink: cfg.Anchor.Link,
			Listen:     []string{},
			Source:     statusSource(d.config.provenance()),
		},
		Upstreams: []status.Upstream{},
	}
	for _, l := range cfg.Listen {
		st.Config.Listen = append(st.Config.Listen, l.String())
	}
	// Lists are [] when empty, never null: readers of the JSON need not
	// tell the two apart.
	if st.Peer.Sockets == nil {
		st.Peer.Sockets = []peer.Socket{}
	}
	if st.Events == nil {
		st.Events = []takeover.Event{}
	}
	m := &status.Mirror{Feed: cfg.Mirror.Kind}
	cs := &status.Cache{}
	for _, zc := range d.caches() {
		c := zc.c.Stats()
		cs.Entries += int64(c.Entries)
		cs.Bytes += c.Bytes
		cs.Evictions += c.Evictions
		cs.MaxEntries += int64(zc.cfg.MaxEntries)
		cs.MaxBytes += zc.cfg.MaxBytes
	}
	for _, v := range d.views {
		v.mu.Lock()
		var groups []group
		if v.set != nil {
			groups = v.set.groups
		}
		v.mu.Unlock()
		for _, g := range groups {
			for _, s := range g.g.Stats() {
				st.Upstreams = append(st.Upstreams, status.Upstream{Listener: v.listen.String(), Zone: g.zone, Server: s.Server, Healthy: s.Healthy})
			}
		}
		if v.hedger != nil {
			hs := v.hedger.Stats()
			st.Hedging = append(st.Hedging, status.Hedging{
				Listener: v.listen.String(), Tracking: hs.Tracking, Tracked: hs.Queries["tracked"],
				Hedges: hs.Hedges, LocalDNSLater: hs.Outcomes["later"], Silent: hs.Silent,
				CacheDeadlineMs:    float64(hs.CacheDeadline.Microseconds()) / 1000,
				UpstreamDeadlineMs: float64(hs.UpstreamDeadline.Microseconds()) / 1000,
			})
		}
		if v.tap != nil {
			ts := v.tap.Stats()
			m.Running = true
			m.Enabled = m.Enabled || ts.Enabled
			local := ts.LocalOnly && (m.LocalOnly == nil || *m.LocalOnly)
			m.LocalOnly = &local
			ring := ts.Ring && (m.Ring == nil || *m.Ring)
			m.Ring = &ring
			m.Accepted += ts.Accepted
			m.Rejected += ts.RejectedTotal()
		}
	}
	slices.SortStableFunc(st.Upstreams, func(a, b status.Upstream) int {
		return cmp.Or(cmp.Compare(a.Listener, b.Listener), cmp.Compare(a.Zone, b.Zone))
	})
	if d.dnstap != nil {
		ds := d.dnstap.Stats()
		m.Running, m.Enabled = true, true
		m.Connections = ds.Connections
		m.Accepted, m.Rejected = ds.Accepted, ds.RejectedTotal()
	}
	st.Mirror = m
	st.Cache = cs
	return st
}

// handler serves the admin socket: status from the daemon, hold and
// release to the takeover controller.
type handler struct {
	d    *Daemon
	hand *handover.Handover
}

func (h handler) Status() status.Daemon { return h.d.Status() }
func (h handler) Release() error        { return h.d.ctrl.Release() }

func (h handler) Hold(d time.Duration) (admin.Hold, error) {
	holding, until, err := h.d.ctrl.Hold(d)
	return admin.Hold{Holding: holding, Until: until}, err
}

// Give is admin.Giver: the surge handover (package handover).
func (h handler) Give(c *net.UnixConn, peer *unix.Ucred) error { return h.hand.Give(c, peer) }

// statusSource is the status's view of p.
func statusSource(p Provenance) *status.Source {
	s := &status.Source{From: p.Source, Corefile: p.Corefile, SHA256: p.SHA256,
		Refused: errString(p.Refused), LastGood: errString(p.LastGood)}
	if p.Source != SourceFlags {
		s.Build = p.Build.String()
	}
	if p.Refused != nil {
		s.Reason = corefile.Reason(p.Refused)
	}
	if !p.Applied.IsZero() {
		s.Applied = p.Applied.UTC().Format(time.RFC3339)
	}
	return s
}
