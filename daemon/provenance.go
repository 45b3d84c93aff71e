package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/corefile"
	"github.com/dnsstandby/dnsstandby/lastgood"
	"github.com/dnsstandby/dnsstandby/status"
	"github.com/dnsstandby/dnsstandby/upstream"
)

// This file is the one rule for where the configuration in force comes
// from, at start and at every reload:
//
//	the Corefile > the last known good > the fallback
//
// The Corefile (Config.Corefile, the first of its paths that exists) is
// used when CoreDNS would run it and dnsstandby can serve from it. Else
// the last Corefile dnsstandby applied, kept in the state directory
// (package lastgood). Else the fallback: no Corefile at all, misses sent
// to the --upstream servers if given, else to Config.Fallback (kube-dns
// for every listener; the node's own resolvers for names outside
// cluster.local on the node listener). A running daemon never steps down
// this order at a reload: a Corefile refused later leaves what is in force.

// The sources of the configuration in force, as status and metrics name
// them.
const (
	SourceFile     = "file"      // the Corefile
	SourceLastGood = "last-good" // the last Corefile applied, from the state directory
	SourceFallback = "fallback"  // no Corefile: the fallback upstreams (or --upstream)
	SourceFlags    = "flags"     // no Corefile configured: the flags' upstreams
)

// Sources lists every source, for metrics to start at 0.
func Sources() []string { return []string{SourceFile, SourceLastGood, SourceFallback, SourceFlags} }

// rank orders the sources: a reload applies a configuration whose source
// ranks at least as high as the one in force.
func rank(source string) int {
	switch source {
	case SourceFile, SourceFlags:
		return 2
	case SourceLastGood:
		return 1
	}
	return 0
}

// Provenance says where the configuration in force comes from.
type Provenance struct {
	Source string // SourceFile, SourceLastGood, SourceFallback or SourceFlags
	// Corefile is the path of the Corefile in force (read, or the one the
	// last known good came from), SHA256 the hash of its content and
	// Applied when that content was first applied. Empty for the fallback
	// and the flags.
	Corefile string
	SHA256   string
	Applied  time.Time
	// Refused is why the Corefile is not in force (nil when it is, or
	// when none is configured); LastGood why the last known good is not,
	// when it was looked for (nil when it is, or there is none).
	Refused  error
	LastGood error
	// Build is the CoreDNS the Corefile was judged for: LocalDNS's own
	// (Config.LocalDNSCoreDNS), or, BuildErr says why not, the standard
	// build.
	Build    corefile.Build
	BuildErr error

	src *corefile.Source // the Corefile in force, kept as the last known good
}

// Fallback is where misses go when neither the Corefile nor a last known
// good configuration can be used: a fresh node whose first rendering is
// refused, or one that never had a Corefile.
type Fallback struct {
	// Upstreams are kube-dns (its ClusterIP): every listener forwards
	// cluster.local there, and every listener but NodeListen forwards
	// everything there.
	Upstreams []netip.AddrPort
	// NodeListen is the node's own listener (LocalDNS's 169.254.10.10),
	// which serves kubelet and the node: names outside cluster.local go
	// to the node's upstream resolvers, never to kube-dns, whose own pods
	// resolve through this listener.
	NodeListen netip.AddrPort
	// ResolvConf lists the node's upstream resolvers: systemd-resolved's
	// /run/systemd/resolve/resolv.conf ("" : none). Loopback addresses,
	// the listen addresses and NodeListen are left out.
	ResolvConf string
}

// clusterZone is the zone the fallback sends to kube-dns on every
// listener: the cluster domain AKS sets.
const clusterZone = "cluster.local."

// Layer makes the whole configuration from a Corefile: the defaults, the
// Corefile's blocks for the listen addresses, then the environment and
// flags over them (the command line's layering). A nil src is no
// Corefile: the defaults and flags alone. The result need not be valid.
type Layer func(src *corefile.Source) (Config, error)

// DefaultLayer is the Layer of the defaults, listening on listen, with no
// flags: what a Corefile alone gives the daemon. With Validate after it,
// it decides as Resolve does whether a Corefile is applied (the
// differential test of the loader against CoreDNS uses it).
func DefaultLayer(listen []netip.AddrPort) Layer {
	return func(src *corefile.Source) (Config, error) {
		cfg := DefaultConfig()
		cfg.Listen = slices.Clone(listen)
		if src == nil {
			return cfg, nil
		}
		s, err := src.Settings(cfg.Listen)
		if err != nil {
			return cfg, err
		}
		ApplyCorefile(&cfg, s)
		return cfg, nil
	}
}

// Resolver makes the configuration in force by the rule above, at start
// and at each reload, from the command line's Layer.
type Resolver struct {
	Layer  Layer
	builds builds
}

// Resolve makes the configuration in force by the rule above, and says
// where it came from. Its error is for settings that are wrong whatever
// the Corefile (the flags'); a Corefile or last known good that cannot be
// used is only in Provenance.
func (r *Resolver) Resolve() (Config, Provenance, error) {
	layer := r.Layer
	base, err := layer(nil)
	if err != nil {
		return base, Provenance{}, err
	}
	if base.Corefile == "" {
		if len(base.Routes) == 0 {
			base.Routes = base.fallbackRoutes()
		}
		return base, Provenance{Source: SourceFlags}, nil
	}
	paths := corefilePaths(base.Corefile)
	base.Watch = slices.Clone(paths)
	if rc := base.Fallback.ResolvConf; rc != "" && slices.Contains(base.Listen, base.Fallback.NodeListen) {
		base.Watch = append(base.Watch, rc)
	}
	var prov Provenance
	prov.Build, prov.BuildErr = r.builds.get(base.LocalDNSCoreDNS, base.StateDir)
	path, err := firstExisting(paths)
	var src *corefile.Source
	if err == nil {
		src, err = prov.Build.Read(path)
	}
	if err == nil {
		cfg, err := layerChecked(layer, src, base.Watch)
		if err == nil {
			prov.Source, prov.Corefile, prov.SHA256, prov.src = SourceFile, src.File, src.SHA256, src
			return cfg, prov, nil
		}
		prov.Refused = err
		if ce := (*corefile.Error)(nil); !errors.As(err, &ce) {
			prov.Refused = fmt.Errorf("%s: %w", path, err) // the daemon's own refusal names no file
		}
	} else {
		prov.Refused = err
	}
	if base.StateDir != "" {
		rec, err := lastgood.Load(base.StateDir, prov.Build)
		if err == nil {
			cfg, err := layerChecked(layer, rec.Source, base.Watch)
			if err == nil {
				prov.Source, prov.Corefile, prov.SHA256, prov.Applied, prov.src = SourceLastGood, rec.Source.File, rec.Source.SHA256, rec.Applied, rec.Source
				return cfg, prov, nil
			}
			prov.LastGood = err
		} else if !errors.Is(err, lastgood.ErrNone) {
			prov.LastGood = err
		}
	}
	prov.Source = SourceFallback
	base.Corefile = ""
	if len(base.Routes) == 0 {
		base.Routes = base.fallbackRoutes()
	}
	return base, prov, nil
}

// layerChecked is layer of src, refused unless the daemon would run it:
// a Corefile CoreDNS accepts may still leave a listener nothing to serve.
func layerChecked(layer Layer, src *corefile.Source, watch []string) (Config, error) {
	cfg, err := layer(src)
	if err == nil {
		err = cfg.Validate()
	}
	cfg.Watch = watch
	return cfg, err
}

// corefilePaths splits Config.Corefile: paths separated by commas.
func corefilePaths(s string) []string { return strings.Split(s, ",") }

// firstExisting returns the first of paths that exists, or the only one
// (reading it says why not): LocalDNS runs updated.localdns.corefile,
// which localdns.sh writes from localdns.corefile at its start, so a node
// may have either. When several are given and none exists, the error
// names them all.
func firstExisting(paths []string) (string, error) {
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if len(paths) == 1 {
		return paths[0], nil
	}
	return "", fmt.Errorf("none of the Corefiles %s exists: %w", strings.Join(paths, ", "), fs.ErrNotExist)
}

// fallbackRoutes are the routes of the fallback, per listen address:
// cluster.local to kube-dns; the rest to kube-dns too, or, on the node
// listener, to the node's resolvers. Servers are asked in order, as
// LocalDNS's AKS blocks do (policy sequential).
func (c *Config) fallbackRoutes() []Route {
	f := c.Fallback
	var resolvers []netip.AddrPort
	for _, ap := range c.Listen {
		if ap == f.NodeListen {
			resolvers = c.nodeResolvers()
			break
		}
	}
	var routes []Route
	add := func(ap netip.AddrPort, zone string, servers []netip.AddrPort) {
		if len(servers) == 0 {
			return
		}
		r := NewRoute(zone, servers...)
		r.Listen = ap
		r.Upstream.Policy = upstream.PolicySequential
		routes = append(routes, r)
	}
	for _, ap := range c.Listen {
		if ap != f.NodeListen {
			add(ap, ".", f.Upstreams)
			continue
		}
		add(ap, clusterZone, f.Upstreams)
		add(ap, ".", resolvers)
	}
	return routes
}

// nodeResolvers reads the node's upstream resolvers from
// Fallback.ResolvConf, less loopback, the listen addresses and the node
// listener's address; none when the file cannot be read.
func (c *Config) nodeResolvers() []netip.AddrPort {
	if c.Fallback.ResolvConf == "" {
		return nil
	}
	rc, err := dns.ClientConfigFromFile(c.Fallback.ResolvConf)
	if err != nil {
		return nil
	}
	var out []netip.AddrPort
	for _, s := range rc.Servers {
		ip, err := netip.ParseAddr(s)
		if err != nil {
			continue
		}
		ip = ip.Unmap().WithZone("")
		if ip.IsLoopback() || ip.IsUnspecified() || ip == c.Fallback.NodeListen.Addr() ||
			slices.ContainsFunc(c.Listen, func(ap netip.AddrPort) bool { return ap.Addr() == ip }) {
			continue
		}
		ap := netip.AddrPortFrom(ip, 53)
		if !slices.Contains(out, ap) {
			out = append(out, ap)
		}
	}
	return out
}

// Uncovered returns the listeners the Corefile in force has LocalDNS
// serve (its node and pod listeners, status.NodeListen and
// status.DefaultListen, and every address a block binds) that Listen does
// not cover: when LocalDNS fails, queries sent there go unanswered. None
// when no Corefile is in force (the fallback, the flags).
func (c *Config) Uncovered() ([]netip.AddrPort, error) {
	src := c.Provenance.src
	if src == nil {
		return nil, nil
	}
	served, err := src.Listeners([]netip.AddrPort{status.NodeListen, status.DefaultListen})
	if err != nil {
		return nil, err
	}
	var out []netip.AddrPort
	for _, ap := range served {
		if !corefile.Covers(c.Listen, ap) {
			out = append(out, ap)
		}
	}
	return out, nil
}
