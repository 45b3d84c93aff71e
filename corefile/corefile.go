// Package corefile reads the LocalDNS Corefile so that dnsstandby behaves
// like the LocalDNS it stands in for. It owns one job: parse a Corefile
// with CoreDNS's own Caddyfile parser (github.com/coredns/caddy/caddyfile)
// and turn the server blocks that would answer a query sent to one of
// dnsstandby's listen addresses into plain values — zones, forward targets,
// cache policy, NSID, and the answers a block makes itself (template,
// hosts, whoami).
//
// It reads the plugins dnsstandby imitates (bind, forward, cache, nsid,
// template, hosts, whoami) the way CoreDNS 1.13.1 reads them, with the
// same defaults, and skips every other plugin. It never opens sockets and
// never resolves names; besides the Corefile and the files it imports, the
// system state it reads is the interface list, for `bind IFACE`, and
// whether the hosts plugin's file can be looked at, as CoreDNS does.
package corefile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// Settings is what dnsstandby takes from a LocalDNS Corefile.
type Settings struct {
	// File is the name the Corefile was read under.
	File string

	// Zones are the server-block zones that serve at least one of the
	// listen addresses given to Parse, most specific first (more labels
	// first, then in file order). A block with several keys gives one
	// Zone per key.
	Zones []Zone

	// Notes list what Parse understood but does not carry over (TLS or
	// file forward targets, forwards for part of a zone, unknown plugin
	// options, unresolvable bind interfaces), for the log.
	Notes []Note
}

// Zone is one server-block zone and the settings of its block.
type Zone struct {
	Name string // "." or "cluster.local.": fully qualified, lower case
	Port int    // from the block key; 53 when the key has none
	Key  string // the block key as written, e.g. "cluster.local:53"
	File string // file the block is in (differs from Settings.File for imports)
	Line int    // line of the block key (of its first directive if imported), for messages

	// Bind holds the addresses from the block's bind directives, with
	// interface names resolved and `except` applied. Empty means the block
	// has no bind and CoreDNS listens on every address.
	Bind []netip.Addr

	// Plugins are the directives of the block in the order they appear,
	// the ones this package skips included (log, ready, prometheus, ...),
	// so that the caller can say what LocalDNS does that it does not.
	Plugins []string

	// The fields below come from the first forward stanza whose FROM
	// covers the whole zone (`forward . ...` in every AKS block). They are
	// zero when the block has no such stanza.
	Upstreams            []netip.AddrPort // plain-DNS targets in order; port 53 when not given
	ForwardPolicy        string           // "random" (CoreDNS's default), "round_robin" or "sequential"
	PreferUDP, ForceTCP  bool
	MaxConcurrent        int           // 0: no limit
	MaxFails             int           // health checks failed before an upstream counts as down; default 2
	HealthCheck          time.Duration // health-check interval; default 500ms
	HealthCheckNoRec     bool          // health_check ... no_rec: probes with RD=0
	HealthCheckDomain    string        // health_check ... domain NAME, fully qualified and lower case; "" when not set (CoreDNS probes ".")
	Expire               time.Duration // idle upstream connections are closed after this; default 10s
	FailfastAllUnhealthy bool          // failfast_all_unhealthy_upstreams
	ForwardExcept        []string      // names under these are not forwarded by this stanza
	ForwardLine          int           // line of the forward stanza

	Cache *Cache // nil: no cache plugin in the block

	// The answers LocalDNS makes without upstreams.
	Whoami    bool       // the block has the whoami plugin
	Templates []Template // the block's template stanzas, in file order
	Hosts     *Hosts     // nil: no hosts plugin in the block

	// NSID is the nsid plugin's data: its arguments joined by a space,
	// or the host name for a bare `nsid`, as CoreDNS does. Empty when the
	// block has no nsid plugin.
	NSID string
}

// Cache is the block's cache plugin configuration, with CoreDNS 1.13.1's
// defaults filled in.
type Cache struct {
	// MaxTTL and MaxNegTTL cap how long success and denial answers stay
	// fresh (defaults 3600s and 1800s; `cache N` sets both to N).
	// MinTTL and MinNegTTL are floors (default 5s each).
	MaxTTL, MaxNegTTL, MinTTL, MinNegTTL time.Duration

	// SuccessCapacity and DenialCapacity are the entries CoreDNS really
	// holds: 256 shards of max(N/256, 4) entries, so the default 10000
	// gives 9984 and nothing gives less than 1024.
	SuccessCapacity, DenialCapacity int

	ServeStale  time.Duration // how long past expiry an entry may be served; 0: serve_stale absent
	StaleVerify bool          // serve_stale mode "verify": ask upstream first (else "immediate")
	ServfailTTL time.Duration // how long a SERVFAIL is cached; default 5s, 0 disables

	Prefetch int  // prefetch AMOUNT; 0: no prefetch
	KeepTTL  bool // keepttl: served TTLs are not aged

	// Zones restrict the cache to names under them (`cache [TTL] ZONES...`);
	// empty means the block's zones.
	Zones []string
	// DisabledSuccess and DisabledDenial are zones for which `disable`
	// turns off the success or denial cache.
	DisabledSuccess, DisabledDenial []string

	Line int // line of the cache directive
}

// Note is something Parse read but does not carry over, with its place.
type Note struct {
	File string
	Line int
	Text string
}

func (n Note) String() string { return place(n.File, n.Line) + ": " + n.Text }

// maxCorefileSize bounds what Parse reads. Generated LocalDNS Corefiles
// are a few KiB; anything near this is not a Corefile.
const maxCorefileSize = 16 << 20

// Load reads the Corefile at path and returns its Settings for listen:
// Read, then Settings.
func Load(path string, listen []netip.AddrPort) (Settings, error) {
	src, err := Read(path)
	if err != nil {
		return Settings{File: path}, err
	}
	return src.Settings(listen)
}

// Parse reads a Corefile from r and returns its Settings for listen:
// ReadFrom, then Settings. filename names the input in errors and notes,
// and is where relative `import` paths start from, as in CoreDNS.
func Parse(filename string, r io.Reader, listen []netip.AddrPort) (Settings, error) {
	src, err := ReadFrom(filename, r)
	if err != nil {
		return Settings{File: filename}, err
	}
	return src.Settings(listen)
}

// Settings returns the zones of the server blocks of s that would serve a
// query sent to one of listen: blocks whose key has the plain DNS
// transport and the listen port, and that have no bind or bind the listen
// address.
//
// Errors are *Error values naming the file and line. When no block serves
// any listen address the error wraps ErrNoServerBlock. With an error, the
// Settings hold File and the notes made so far, no zones.
func (s *Source) Settings(listen []netip.AddrPort) (Settings, error) {
	out := Settings{File: s.File}
	p := parser{file: s.File, listen: normalizeListen(listen), notes: &out.Notes}
	var zones []Zone
	for i := range s.Blocks {
		zs, err := p.block(s.File, &s.Blocks[i])
		if err != nil {
			return out, err
		}
		zones = append(zones, zs...)
	}
	// Most labels first, so the first zone that contains a name is the
	// longest match; SortStableFunc keeps file order among equals.
	slices.SortStableFunc(zones, func(a, b Zone) int {
		return dns.CountLabel(b.Name) - dns.CountLabel(a.Name)
	})
	if len(zones) == 0 {
		return out, &Error{File: s.File, Kind: KindNoServerBlock, Err: fmt.Errorf("%w %s", ErrNoServerBlock, listenString(p.listen))}
	}
	out.Zones = zones
	return out, nil
}

// ZoneFor returns the zone a query for qname goes to: the longest zone
// that contains it, among all of s.Zones. It returns nil when none does.
// Use ZoneForAddr when zones of several listen addresses share a name.
//
// Like this package, it does not copy CoreDNS's special case for DS
// queries (sent to the parent zone when the server has it).
func (s Settings) ZoneFor(qname string) *Zone {
	return s.lookup(qname, func(*Zone) bool { return true })
}

// ZoneForAddr is ZoneFor restricted to the zones that serve local, the
// address and port the query was received on.
func (s Settings) ZoneForAddr(local netip.AddrPort, qname string) *Zone {
	return s.lookup(qname, func(z *Zone) bool { return s.ServesAt(z, local) })
}

// ServesAt reports whether a query for z's zone sent to ap reaches z: z
// serves ap, and no other zone of the same name serves ap by its exact
// address where z has only a wildcard (no bind, 0.0.0.0, ::): the kernel
// gives a datagram to the socket bound to its exact address first.
func (s Settings) ServesAt(z *Zone, ap netip.AddrPort) bool {
	if !z.Serves(ap) {
		return false
	}
	if z.servesExactly(ap) {
		return true
	}
	for i := range s.Zones {
		o := &s.Zones[i]
		if o != z && o.Name == z.Name && o.servesExactly(ap) {
			return false
		}
	}
	return true
}

// servesExactly reports whether the zone's block binds ap's address
// itself, not through a wildcard.
func (z *Zone) servesExactly(ap netip.AddrPort) bool {
	a := ap.Addr().Unmap().WithZone("")
	return z.Port == int(ap.Port()) && slices.ContainsFunc(z.Bind, func(b netip.Addr) bool { return b.WithZone("") == a })
}

func (s Settings) lookup(qname string, ok func(*Zone) bool) *Zone {
	qname = strings.ToLower(dns.Fqdn(qname))
	for i := range s.Zones {
		z := &s.Zones[i]
		if ok(z) && dns.IsSubDomain(z.Name, qname) {
			return z
		}
	}
	return nil
}

// Serves reports whether the zone's block listens on ap: same port, and
// no bind or a bind address equal to ap's (0.0.0.0 covers every IPv4
// address, :: every address).
func (z *Zone) Serves(ap netip.AddrPort) bool {
	return z.Port == int(ap.Port()) && bindCovers(z.Bind, ap.Addr())
}

// ErrNoServerBlock is wrapped by Settings' error when no server block of
// the Corefile serves any of the listen addresses.
var ErrNoServerBlock = errors.New("no server block serves")

// Error is a problem at a place in a Corefile.
type Error struct {
	File   string
	Line   int    // 0 when not known
	Plugin string // the directive the problem is in; "" for block keys and syntax
	Kind   Kind
	Err    error
}

func (e *Error) Error() string {
	s := place(e.File, e.Line) + ": "
	if e.Plugin != "" {
		s += e.Plugin + ": "
	}
	return s + e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// Kind says what an Error is about.
type Kind int

// The kinds of Error, each a Reason.
const (
	KindRead          Kind = iota // the file could not be read whole
	KindSyntax                    // Caddyfile syntax: braces, quotes, imports
	KindDirective                 // a directive CoreDNS 1.13.1 does not have
	KindServerBlock               // a server block key, or a zone served twice
	KindPlugin                    // a plugin's arguments
	KindNoServerBlock             // no block serves the listen addresses
)

var kindReasons = [...]string{
	KindRead:          "unreadable",
	KindSyntax:        "syntax",
	KindDirective:     "unknown_directive",
	KindServerBlock:   "server_block",
	KindPlugin:        "plugin",
	KindNoServerBlock: "no_server_block",
}

// Reason names why a Corefile was refused, in a word fit for a metric
// label: "missing" (no such file), "unreadable", "syntax",
// "unknown_directive", "server_block", "plugin", "no_server_block", or
// "other" for an error that is none of these.
func Reason(err error) string {
	var e *Error
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "missing"
	case errors.As(err, &e) && int(e.Kind) < len(kindReasons):
		return kindReasons[e.Kind]
	case errors.Is(err, fs.ErrPermission), errors.As(err, new(*fs.PathError)):
		return "unreadable"
	}
	return "other"
}

// Reasons lists every value Reason returns, for metrics to start at 0.
func Reasons() []string {
	return append([]string{"missing"}, append(kindReasons[:], "other")...)
}

func place(file string, line int) string {
	if line > 0 {
		return fmt.Sprintf("%s:%d", file, line)
	}
	return file
}

func normalizeListen(listen []netip.AddrPort) []netip.AddrPort {
	out := make([]netip.AddrPort, 0, len(listen))
	for _, ap := range listen {
		out = append(out, netip.AddrPortFrom(ap.Addr().Unmap().WithZone(""), ap.Port()))
	}
	return out
}

func listenString(listen []netip.AddrPort) string {
	if len(listen) == 0 {
		return "(no listen address given)"
	}
	s := make([]string, len(listen))
	for i, ap := range listen {
		s[i] = ap.String()
	}
	return strings.Join(s, ", ")
}
