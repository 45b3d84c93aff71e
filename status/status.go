// Package status owns the daemon's status: what its admin socket answers
// to "status", what `dnsstandby status` prints and what `dnsstandby check`
// weighs. The daemon fills it from the typed state of its parts (the
// takeover controller's Status, the upstream groups', the mirror feed's
// and the cache's Stats); nothing in it is read back from metrics.
package status

import (
	"net/netip"

	"github.com/dnsstandby/dnsstandby/takeover"
)

// Daemon is the daemon's status. Fields other than the embedded
// takeover.Status are nil or empty when a daemon does not report them (an
// older build); readers treat that as unknown.
type Daemon struct {
	takeover.Status
	Version   string     `json:"version,omitempty"` // the build, as `dnsstandby version` prints it
	PID       int        `json:"pid,omitempty"`     // the daemon's process
	Config    *Config    `json:"config,omitempty"`
	Upstreams []Upstream `json:"upstreams,omitempty"`
	Mirror    *Mirror    `json:"mirror,omitempty"`
	Hedging   []Hedging  `json:"hedging,omitempty"`
	Cache     *Cache     `json:"cache,omitempty"`
}

// Config is what the daemon was asked for, where it may differ from what
// it got.
type Config struct {
	Steering   string   `json:"steering"`    // auto, adopt, own, off
	Mirror     string   `json:"mirror"`      // tap, dnstap:PATH, none
	Listen     []string `json:"listen"`      // ADDR:PORT
	AnchorLink string   `json:"anchor_link"` // "" for none
	// Source is where the configuration in force comes from: the rule
	// is the Corefile, else the last known good, else the fallback.
	Source *Source `json:"source,omitempty"`
}

// Source is where the configuration in force comes from.
type Source struct {
	From     string `json:"from"`               // file, last-good, fallback or flags
	Corefile string `json:"corefile,omitempty"` // the Corefile in force (for last-good: the one it was read from)
	SHA256   string `json:"sha256,omitempty"`   // of that Corefile's content
	// Applied is when that content was first applied (RFC 3339); its
	// age says how old what dnsstandby serves from is.
	Applied string `json:"applied,omitempty"`
	// Refused is why the Corefile is not in force, Reason its kind
	// (corefile.Reason); LastGood why the last known good is not used.
	Refused  string `json:"refused,omitempty"`
	Reason   string `json:"reason,omitempty"`
	LastGood string `json:"last_good,omitempty"`
	// Build is the CoreDNS build the Corefile is judged for: LocalDNS's
	// own binary's directives, or CoreDNS 1.13.1's standard build.
	Build string `json:"build,omitempty"`
}

// Upstream is one upstream server of one zone on one listen address.
type Upstream struct {
	Listener string `json:"listener,omitempty"` // ADDR:PORT the zone is served on
	Zone     string `json:"zone"`               // "." for the root
	Server   string `json:"server"`             // ADDR:PORT
	Healthy  bool   `json:"healthy"`            // not marked down by the daemon's health checks
}

// Mirror is the mirror feed: LocalDNS's replies into the cache.
type Mirror struct {
	Feed string `json:"feed"` // tap, dnstap or none
	// Running: the feed's source is up (the tap's socket, the dnstap
	// listener). False when it could not be started.
	Running bool `json:"running"`
	// Enabled: what it reads goes into the cache. The tap pauses while
	// dnsstandby answers itself; dnstap never does.
	Enabled bool `json:"enabled"`
	// Connections: dnstap streams open now (LocalDNS's CoreDNS).
	Connections int `json:"connections,omitempty"`
	// LocalOnly: the tap's kernel filter takes only what this node sent
	// (eBPF); false with the classic fallback, which a pod behind a Linux
	// bridge can forge into. Nil for other feeds and older builds.
	LocalOnly *bool `json:"local_only,omitempty"`
	// Ring: every tap reads LocalDNS's replies at its cgroup and the
	// queries through its ring (ring mode), so that no packet socket sees
	// what the node sends. Nil for other feeds and older builds.
	Ring     *bool  `json:"ring,omitempty"`
	Accepted uint64 `json:"accepted"` // replies inserted since the daemon started
	Rejected uint64 `json:"rejected"` // replies not inserted (duplicates, uncacheable, malformed)
}

// Hedging is one listen address's hedger: the queries LocalDNS left
// unanswered that dnsstandby answered.
type Hedging struct {
	Listener string `json:"listener"` // ADDR:PORT
	// Tracking: queries LocalDNS receives are being tracked (mirror at
	// level adopt); otherwise dnsstandby answers them itself or cannot
	// tell which socket they reached.
	Tracking bool `json:"tracking"`
	// Tracked counts the queries tracked since start; Hedges the answers
	// sent, by source (cache, stale, upstream); LocalDNSLater those
	// LocalDNS answered too, later.
	Tracked       uint64            `json:"tracked"`
	Hedges        map[string]uint64 `json:"hedges"`
	LocalDNSLater uint64            `json:"localdns_later"`
	// Silent counts the fast holds: LocalDNS answered none of what it
	// was sent.
	Silent uint64 `json:"silent"`
	// The current waits for LocalDNS's answer before a hedge.
	CacheDeadlineMs    float64 `json:"cache_deadline_ms"`
	UpstreamDeadlineMs float64 `json:"upstream_deadline_ms"`
}

// Cache is the cache's size and bounds.
type Cache struct {
	Entries    int64  `json:"entries"`
	Bytes      int64  `json:"bytes"`
	Evictions  uint64 `json:"evictions"`
	MaxEntries int64  `json:"max_entries"`
	MaxBytes   int64  `json:"max_bytes"`
}

// DefaultListen is where the daemon serves unless told otherwise, and so
// where its clients look first: LocalDNS's listener for ClusterFirst pods.
var DefaultListen = netip.MustParseAddrPort("169.254.10.11:53")

// NodeListen is LocalDNS's other listener, the node's own: kubelet,
// hostNetwork and dnsPolicy:Default pods.
var NodeListen = netip.MustParseAddrPort("169.254.10.10:53")
