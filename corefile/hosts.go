package corefile

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/coredns/caddy/caddyfile"
)

// CoreDNS 1.13.1's hosts defaults (plugin/hosts: setup.go, hostsfile.go).
const (
	defaultHostsFile   = "/etc/hosts"
	defaultHostsTTL    = 3600
	defaultHostsReload = 5 * time.Second
	maxHostsTTL        = 65535
)

// Hosts is the hosts plugin of a block, as CoreDNS 1.13.1 reads
// `hosts [FILE [ZONES...]] { [INLINE]; ttl; no_reverse; reload; fallthrough }`,
// with its defaults filled in.
type Hosts struct {
	// File is the hosts file: /etc/hosts when not given. A relative path
	// is joined to the block's `root` when it has one; otherwise it is
	// relative to LocalDNS's working directory, which dnsstandby does not
	// know (Parse notes it). The file need not exist: CoreDNS only warns
	// and reads it once it appears.
	File string

	// Zones are the names the plugin answers for (A, AAAA, and which
	// names of the file it keeps): the ZONES arguments, or the zones of
	// every key of the block when there are none. Arguments that are not
	// zones are dropped, as CoreDNS does (and noted), so Zones may be
	// empty: then the plugin answers only PTR queries.
	Zones []string

	// Inline are the lines of the block that are not options, hosts-file
	// lines written into the Corefile, each with its tokens joined by a
	// space. CoreDNS takes a line as inline only before a fallthrough
	// that has zones; after it, an unknown line is an error.
	Inline []string

	TTL       uint32        // TTL of every record, in seconds: 1 to 65535, default 3600
	NoReverse bool          // no_reverse: no PTR answers from the file's addresses
	Reload    time.Duration // how often the file is checked for changes; default 5s, 0: never

	// Fallthrough are the zones for which a name the plugin has no
	// address for is passed to the next plugin: nil without fallthrough,
	// ["."] for a bare `fallthrough`.
	Fallthrough []string

	Line int // line of the hosts directive
}

// hosts reads a block's hosts directive as CoreDNS's hostsParse does.
// keys are all the block's keys, whose zones are the default ZONES; root
// is the block's root directive, which CoreDNS applies to a relative FILE.
func (p *parser) hosts(toks, root []caddyfile.Token, keys []key) (*Hosts, error) {
	if len(toks) == 0 {
		return nil, nil
	}
	var blockZones []string
	for _, k := range keys {
		blockZones = append(blockZones, k.zones...)
	}
	rootDir, err := p.root(root)
	if err != nil {
		return nil, err
	}
	h := &Hosts{File: defaultHostsFile, TTL: defaultHostsTTL, Reload: defaultHostsReload}
	d := p.directive("hosts", toks)
	err = d.once(func() error {
		h.Line = d.Line()

		args := d.RemainingArgs()
		h.Zones = blockZones
		if len(args) > 0 {
			if err := d.hostsFile(h, args[0], rootDir); err != nil {
				return err
			}
			if len(args) > 1 {
				h.Zones = d.zones(args[1:])
			}
		}

		for d.NextBlock() {
			if err := d.hostsOption(h); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return h, nil
}

// hostsFile sets the file as CoreDNS does: joined to root when relative,
// refused when it exists but cannot be looked at.
func (d *directive) hostsFile(h *Hosts, file, root string) error {
	h.File = file
	if !filepath.IsAbs(file) {
		if root != "" {
			h.File = filepath.Join(root, file)
		} else {
			d.notef("file %q is relative to LocalDNS's working directory; read relative to dnsstandby's", file)
		}
	}
	if _, err := os.Stat(h.File); err != nil && !errors.Is(err, os.ErrNotExist) {
		return d.errf("unable to access hosts file '%s': %v", h.File, err)
	}
	return nil
}

// hostsOption reads one line of the hosts block.
func (d *directive) hostsOption(h *Hosts) error {
	switch d.Val() {
	case "fallthrough":
		h.Fallthrough = []string{"."}
		if args := d.RemainingArgs(); len(args) > 0 {
			// Non-nil even when every zone is dropped: CoreDNS then never
			// falls through but still takes later lines as inline.
			h.Fallthrough = append([]string{}, d.zones(args)...)
		}
	case "no_reverse":
		// CoreDNS reads no arguments here: a word after no_reverse is
		// the next line of the block.
		h.NoReverse = true
	case "ttl":
		args := d.RemainingArgs()
		if len(args) < 1 {
			return d.errf("ttl needs a time in second")
		}
		ttl, err := strconv.Atoi(args[0])
		if err != nil {
			return d.errf("ttl needs a number of second")
		}
		if ttl <= 0 || ttl > maxHostsTTL {
			return d.errf("ttl provided is invalid")
		}
		h.TTL = uint32(ttl)
	case "reload":
		args := d.RemainingArgs()
		if len(args) != 1 {
			return d.errf("reload needs a duration (zero seconds to disable)")
		}
		reload, err := time.ParseDuration(args[0])
		if err != nil {
			return d.errf("invalid duration for reload '%s'", args[0])
		}
		if reload < 0 {
			return d.errf("invalid negative duration for reload '%s'", args[0])
		}
		h.Reload = reload
	default:
		if len(h.Fallthrough) == 0 {
			line := strings.Join(append([]string{d.Val()}, d.RemainingArgs()...), " ")
			h.Inline = append(h.Inline, line)
			return nil
		}
		return d.errf("unknown property '%s'", d.Val())
	}
	return nil
}

// clone returns a deep copy of h, nil for nil, for each Zone of a block.
func (h *Hosts) clone() *Hosts {
	if h == nil {
		return nil
	}
	c := *h
	c.Zones = slices.Clone(h.Zones)
	c.Inline = slices.Clone(h.Inline)
	c.Fallthrough = slices.Clone(h.Fallthrough)
	return &c
}

// root reads a block's root directive as CoreDNS's root plugin does: the
// last one's argument is the directory relative FILEs are joined to.
func (p *parser) root(toks []caddyfile.Token) (string, error) {
	if len(toks) == 0 {
		return "", nil
	}
	d := p.directive("root", toks)
	dir := ""
	for {
		ok, err := d.next()
		if err != nil {
			return "", err
		}
		if !ok {
			return dir, nil
		}
		if !d.NextArg() {
			return "", d.argErr()
		}
		dir = d.Val()
	}
}
