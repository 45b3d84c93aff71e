package corefile

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/coredns/caddy/caddyfile"
	"github.com/miekg/dns"
)

// parser holds what Parse needs while it walks the server blocks.
type parser struct {
	file   string           // name given to Parse
	listen []netip.AddrPort // unmapped, without IPv6 zones
	notes  *[]Note          // always non-nil; Settings.Notes
}

// head is what decides which addresses a server block serves: its keys
// and its bind.
type head struct {
	keys []key
	// bind holds the addresses of the block's bind directives, interface
	// names resolved and `except` applied; hasBind is false without any
	// bind (the block listens everywhere). hosts are the same addresses as
	// CoreDNS keeps them, for its check of zones served twice.
	bind    []netip.Addr
	hosts   []string
	hasBind bool
}

// readHead reads a block's keys and bind.
func (p *parser) readHead(main string, b *Block) (head, error) {
	var h head
	for _, k := range b.Keys {
		kk, err := parseKey(k)
		if err != nil {
			return h, &Error{File: b.file(main), Line: b.Line, Kind: KindServerBlock, Err: fmt.Errorf("server block key %q: %w", k, err)}
		}
		h.keys = append(h.keys, kk)
	}
	var err error
	h.bind, h.hosts, h.hasBind, err = p.bind(b.tokens(main, "bind"))
	return h, err
}

// listensOn reports whether the block listens on ap: a plain DNS key
// with its port, and its bind covers the address (without bind, every
// address of the node).
func (h head) listensOn(ap netip.AddrPort) bool {
	if !slices.ContainsFunc(h.keys, func(k key) bool { return k.transport == transportDNS && k.port == int(ap.Port()) }) {
		return false
	}
	// A wildcard or no bind covers the node's own addresses only.
	return bindable(ap.Addr()) && (!h.hasBind || len(h.bind) > 0 && bindCovers(h.bind, ap.Addr()))
}

// blockPlugins are the settings of a block's plugins that dnsstandby
// imitates.
type blockPlugins struct {
	forwards  []forwardStanza
	cache     *Cache
	nsid      string
	whoami    bool
	hosts     *Hosts
	templates []Template
	order     []string // every directive, in the order they appear
}

// plugins reads every plugin of a block: those dnsstandby imitates into
// their settings, the others only as far as CoreDNS's setup checks their
// arguments (shapes.go).
func (p *parser) plugins(main string, b *Block, h head) (blockPlugins, error) {
	var (
		bp  blockPlugins
		err error
	)
	tokens := func(name string) []caddyfile.Token { return b.tokens(main, name) }
	if bp.forwards, err = p.forwards(tokens("forward")); err != nil {
		return bp, err
	}
	if bp.cache, err = p.cache(tokens("cache")); err != nil {
		return bp, err
	}
	if bp.nsid, err = p.nsid(tokens("nsid")); err != nil {
		return bp, err
	}
	if bp.whoami, err = p.whoami(tokens("whoami")); err != nil {
		return bp, err
	}
	if bp.hosts, err = p.hosts(tokens("hosts"), tokens("root"), h.keys); err != nil {
		return bp, err
	}
	if bp.templates, err = p.templates(tokens("template"), h.keys); err != nil {
		return bp, err
	}
	if _, loop := b.Directives["loop"]; loop {
		for _, f := range bp.forwards {
			for _, up := range f.upstreams {
				if h.listensOn(up) {
					return bp, &Error{File: f.file, Line: f.line, Plugin: "forward", Kind: KindPlugin,
						Err: fmt.Errorf("target %s is this block's own listener: CoreDNS's loop plugin detects the loop and stops CoreDNS", up)}
				}
			}
		}
	}
	bp.order = pluginOrder(b.Directives)
	for _, name := range bp.order {
		if err := p.checkShape(name, tokens(name)); err != nil {
			return bp, err
		}
	}
	return bp, nil
}

// block returns the zones of one server block that serve a listen
// address, with the block's settings. A block that serves none is not
// read further: Check has read every block already.
func (p *parser) block(main string, b *Block) ([]Zone, error) {
	h, err := p.readHead(main, b)
	if err != nil {
		return nil, err
	}
	if h.hasBind && len(h.bind) == 0 {
		// Every address was excepted or unknown: CoreDNS listens nowhere
		// for this block, which is not the same as having no bind.
		return nil, nil
	}
	file, line := b.file(main), b.Line

	type served struct {
		key  key
		zone string
	}
	var zones []served
	for _, k := range h.keys {
		if !p.servesListen(k.port, h.bind) {
			continue
		}
		if k.transport != transportDNS {
			*p.notes = append(*p.notes, Note{File: file, Line: line,
				Text: fmt.Sprintf("server block %q serves %s, not plain DNS; not used", k.text, k.transport)})
			continue
		}
		for _, z := range k.zones {
			zones = append(zones, served{k, z})
		}
	}
	if len(zones) == 0 {
		return nil, nil
	}

	bp, err := p.plugins(main, b, h)
	if err != nil {
		return nil, err
	}
	for _, name := range bp.order {
		if unchecked(name) {
			*p.notes = append(*p.notes, Note{File: file, Line: line,
				Text: fmt.Sprintf("plugin %s: its arguments are not checked here; CoreDNS may refuse what dnsstandby accepts", name)})
		}
	}
	forwards := bp.forwards
	used := make([]bool, len(forwards))
	out := make([]Zone, 0, len(zones))
	for _, s := range zones {
		z := Zone{
			Name:    s.zone,
			Port:    s.key.port,
			Key:     s.key.text,
			File:    file,
			Line:    line,
			Bind:    slices.Clone(h.bind),
			Plugins: slices.Clone(bp.order),
			NSID:    bp.nsid,
			Whoami:  bp.whoami,
			Hosts:   bp.hosts.clone(),
		}
		z.Templates = slices.Clone(bp.templates)
		if bp.cache != nil {
			c := *bp.cache
			c.Zones = slices.Clone(c.Zones)
			c.DisabledSuccess = slices.Clone(c.DisabledSuccess)
			c.DisabledDenial = slices.Clone(c.DisabledDenial)
			z.Cache = &c
		}
		// CoreDNS chains forward stanzas in file order and the first whose
		// FROM contains the name (and does not except it) answers, so the
		// first stanza covering the whole zone is the zone's forward.
		for i := range forwards {
			if dns.IsSubDomain(forwards[i].from, z.Name) {
				forwards[i].apply(&z)
				used[i] = true
				break
			}
		}
		out = append(out, z)
	}
	for i, f := range forwards {
		if used[i] {
			continue
		}
		why := "an earlier forward covers the zone"
		if !slices.ContainsFunc(zones, func(s served) bool { return dns.IsSubDomain(f.from, s.zone) }) {
			why = "it does not cover the whole zone"
		}
		*p.notes = append(*p.notes, Note{File: f.file, Line: f.line,
			Text: fmt.Sprintf("forward %s: not used: %s", f.from, why)})
	}
	return out, nil
}

// servesListen reports whether a block with this port and bind list
// listens on one of the listen addresses.
func (p *parser) servesListen(port int, bind []netip.Addr) bool {
	for _, ap := range p.listen {
		if int(ap.Port()) == port && bindCovers(bind, ap.Addr()) {
			return true
		}
	}
	return false
}

// blockZones is a checked block's head and place, for checkAddresses.
type blockZones struct {
	head
	view bool // the block has a view filter
	file string
	line int
}

// zoneAddr is what CoreDNS refuses to serve twice: a zone on a transport,
// port and listen host ("" for a block without bind).
type zoneAddr struct {
	transport, zone, host string
	port                  int
}

func (z zoneAddr) listen() string {
	if z.host == "" {
		return fmt.Sprintf("port %d", z.port)
	}
	return net.JoinHostPort(z.host, strconv.Itoa(z.port))
}

// checkAddresses refuses what CoreDNS's validateZonesAndListeningAddresses
// refuses: one zone served twice on the same transport, port and listen
// host, or on one port both by a block with bind and one without. A block
// with a view filter may share its zone with others, as in CoreDNS.
func checkAddresses(blocks []blockZones) error {
	registered := map[zoneAddr]string{} // the place of the block serving it
	unbound := map[zoneAddr]string{}    // the same, by the zoneAddr without host
	for _, b := range blocks {
		hosts := b.hosts
		if !b.hasBind {
			hosts = []string{""}
		}
		for _, k := range b.keys {
			for _, zone := range k.zones {
				for _, host := range hosts {
					z := zoneAddr{transport: k.transport, zone: zone, host: host, port: k.port}
					u := z
					u.host = ""
					prev, dup := registered[z]
					if !dup {
						if other, ok := unbound[u]; ok {
							if _, unboundServed := registered[u]; host == "" || unboundServed {
								prev, dup = other, true
							}
						}
					}
					if dup {
						return &Error{File: b.file, Line: b.line, Kind: KindServerBlock,
							Err: fmt.Errorf("zone %s on %s is already served by the block at %s", zone, z.listen(), prev)}
					}
					if !b.view {
						registered[z] = place(b.file, b.line)
						unbound[u] = place(b.file, b.line)
					}
				}
			}
		}
	}
	return nil
}

// pluginOrder lists the directives of a block in the order they appear.
func pluginOrder(tokens map[string][]Token) []string {
	type first struct {
		name string
		line int
	}
	var fs []first
	for name, toks := range tokens {
		if len(toks) > 0 {
			fs = append(fs, first{name, toks[0].Line})
		}
	}
	slices.SortFunc(fs, func(a, b first) int {
		return cmp.Or(cmp.Compare(a.line, b.line), cmp.Compare(a.name, b.name))
	})
	names := make([]string, len(fs))
	for i, f := range fs {
		names[i] = f.name
	}
	return names
}

// directive walks the tokens of one directive (all its occurrences in a
// block) with the caddyfile Dispenser, as CoreDNS's setup functions do,
// and makes errors and notes that name the current token's place.
type directive struct {
	caddyfile.Dispenser
	name  string  // as the block's token map has it
	first string  // text of the first token: each occurrence starts with it
	notes *[]Note // always non-nil
}

func (p *parser) directive(name string, toks []caddyfile.Token) *directive {
	return &directive{
		Dispenser: caddyfile.NewDispenserTokens(p.file, toks),
		name:      name,
		first:     toks[0].Text,
		notes:     p.notes,
	}
}

// next moves to the start of the directive's next occurrence.
func (d *directive) next() (bool, error) {
	if !d.Next() {
		return false, nil
	}
	if d.Val() != d.first {
		return false, d.errf("unexpected %q", d.Val())
	}
	return true, nil
}

// once runs stanza for the directive's one occurrence in a block, as a
// CoreDNS plugin that may appear once per server block reads it: a second
// occurrence is an error. The tokens of the occurrence are stanza's to
// read.
func (d *directive) once(stanza func() error) error {
	for n := 0; ; n++ {
		ok, err := d.next()
		if err != nil || !ok {
			return err
		}
		if n > 0 {
			return d.errf("can only be used once per server block")
		}
		if err := stanza(); err != nil {
			return err
		}
	}
}

func (d *directive) errf(format string, args ...any) error {
	return &Error{File: d.File(), Line: d.Line(), Plugin: d.name, Kind: KindPlugin, Err: fmt.Errorf(format, args...)}
}

// argErr is CoreDNS's "wrong argument count" error for the current token.
func (d *directive) argErr() error {
	if d.Val() == "{" {
		return d.errf("unexpected '{', expecting an argument")
	}
	return d.errf("wrong argument count or unexpected line ending after %q", d.Val())
}

func (d *directive) notef(format string, args ...any) {
	*d.notes = append(*d.notes, Note{File: d.File(), Line: d.Line(), Text: d.name + ": " + fmt.Sprintf(format, args...)})
}

// unknownOption is the error for an option the plugin does not have,
// which CoreDNS refuses.
func (d *directive) unknownOption() error { return d.errf("unknown property '%s'", d.Val()) }

// caddyError matches the errors of the caddyfile parser, which put the
// place first in their own format.
var caddyError = regexp.MustCompile(`(?s)^(.*):(\d+) - (Syntax error|Error during parsing): (.*)$`)

// syntaxError turns a caddyfile parser error into an *Error: an unknown
// directive, or a syntax error.
func syntaxError(filename string, err error) error {
	m := caddyError.FindStringSubmatch(err.Error())
	if m == nil {
		return &Error{File: filename, Kind: KindSyntax, Err: err}
	}
	line, _ := strconv.Atoi(m[2])
	msg, kind := m[4], KindSyntax
	switch {
	case strings.HasPrefix(msg, "Unknown directive "):
		kind = KindDirective
		msg = "unknown directive " + strings.TrimPrefix(msg, "Unknown directive ")
	case m[3] == "Syntax error":
		msg = "syntax error: " + msg
	}
	return &Error{File: m[1], Line: line, Kind: kind, Err: errors.New(msg)}
}

// keyLine is where a top-level server block's keys are.
type keyLine struct {
	keys []string
	line int
}

// keyLines finds the line of every server block's keys in the main file;
// the caddyfile parser keeps only the keys. It follows the parser's rules
// for where keys end (at "{", or at a new line unless a key ended with a
// comma) and skips snippets and top-level imports. Blocks it cannot see
// (from imports) are handled by blockLine.
func keyLines(filename string, data []byte) []keyLine {
	d := caddyfile.NewDispenser(filename, bytes.NewReader(data))
	var out []keyLine
	for d.Next() {
		if d.Val() == "import" {
			d.NextArg()
			continue
		}
		kl := keyLine{line: d.Line()}
		eof := false
		for {
			t := d.Val()
			if t == "{" {
				break
			}
			more := strings.HasSuffix(t, ",")
			if t != "" {
				kl.keys = append(kl.keys, strings.TrimSuffix(t, ","))
			}
			end := d.Line() + strings.Count(t, "\n")
			if !d.Next() {
				eof = true
				break
			}
			if !more && d.Line() > end {
				break
			}
		}
		if len(kl.keys) != 1 || !strings.HasPrefix(kl.keys[0], "(") || !strings.HasSuffix(kl.keys[0], ")") {
			out = append(out, kl)
		}
		if eof || d.Val() != "{" {
			// A block without braces runs to the end of the file.
			break
		}
		for depth := 1; depth > 0 && d.Next(); {
			switch d.Val() {
			case "{":
				depth++
			case "}":
				depth--
			}
		}
	}
	return out
}

// blockLine returns the line and file of block b's keys, and the key lines
// left after it. A block keyLines did not see gets the first line of its
// directives.
func blockLine(b caddyfile.ServerBlock, filename string, lines []keyLine) (int, string, []keyLine) {
	for i, kl := range lines {
		if slices.Equal(kl.keys, b.Keys) {
			return kl.line, filename, lines[i+1:]
		}
	}
	line, file := 0, filename
	for _, toks := range b.Tokens {
		if len(toks) > 0 && (line == 0 || toks[0].Line < line) {
			line = toks[0].Line
			file = cmp.Or(toks[0].File, filename)
		}
	}
	return line, file, lines
}
