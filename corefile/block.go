package corefile

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
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

// block returns the zones of one server block that serve a listen address,
// with the block's settings. Keys and bind are read for every block, as
// they decide; other plugins only for blocks that serve, so that a mistake
// in a block dnsstandby never serves (a VnetDNS block bound to
// 169.254.10.10, say) cannot stop it from starting.
func (p *parser) block(b caddyfile.ServerBlock, line int, file string) ([]Zone, error) {
	keys := make([]key, 0, len(b.Keys))
	for _, k := range b.Keys {
		kk, err := parseKey(k)
		if err != nil {
			return nil, &Error{File: file, Line: line, Err: fmt.Errorf("server block key %q: %w", k, err)}
		}
		keys = append(keys, kk)
	}
	bind, hasBind, err := p.bind(b.Tokens["bind"])
	if err != nil {
		return nil, err
	}
	if hasBind && len(bind) == 0 {
		// Every address was excepted or unknown: CoreDNS listens nowhere
		// for this block, which is not the same as having no bind.
		return nil, nil
	}

	type served struct {
		key  key
		zone string
	}
	var zones []served
	for _, k := range keys {
		if !p.servesListen(k.port, bind) {
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

	forwards, err := p.forwards(b.Tokens["forward"])
	if err != nil {
		return nil, err
	}
	cache, err := p.cache(b.Tokens["cache"])
	if err != nil {
		return nil, err
	}
	nsid, err := p.nsid(b.Tokens["nsid"])
	if err != nil {
		return nil, err
	}
	whoami, err := p.whoami(b.Tokens["whoami"])
	if err != nil {
		return nil, err
	}
	hosts, err := p.hosts(b.Tokens["hosts"], b.Tokens["root"], keys)
	if err != nil {
		return nil, err
	}
	templates, err := p.templates(b.Tokens["template"], keys)
	if err != nil {
		return nil, err
	}
	plugins := pluginOrder(b.Tokens)

	used := make([]bool, len(forwards))
	out := make([]Zone, 0, len(zones))
	for _, s := range zones {
		z := Zone{
			Name:    s.zone,
			Port:    s.key.port,
			Key:     s.key.text,
			File:    file,
			Line:    line,
			Bind:    slices.Clone(bind),
			Plugins: slices.Clone(plugins),
			NSID:    nsid,
			Whoami:  whoami,
			Hosts:   hosts.clone(),
		}
		z.Templates = slices.Clone(templates)
		if cache != nil {
			c := *cache
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

// checkDuplicates refuses two zones of the same name served on the same
// address, which CoreDNS refuses too ("it is already defined"), unless one
// of the blocks has a view: CoreDNS lets a block with a view filter share
// its zone with another. Views are not modelled here; ZoneFor returns the
// first such block.
func (p *parser) checkDuplicates(zones []Zone) error {
	for j := range zones {
		for i := range j {
			a, b := &zones[i], &zones[j]
			if a.Name != b.Name || a.Port != b.Port ||
				slices.Contains(a.Plugins, "view") || slices.Contains(b.Plugins, "view") {
				continue
			}
			for _, ap := range p.listen {
				if a.Serves(ap) && b.Serves(ap) {
					return &Error{File: b.File, Line: b.Line,
						Err: fmt.Errorf("zone %s on %s is already served by the block at %s", b.Name, ap, place(a.File, a.Line))}
				}
			}
		}
	}
	return nil
}

// pluginOrder lists the directives of a block in the order they appear.
func pluginOrder(tokens map[string][]caddyfile.Token) []string {
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
	return &Error{File: d.File(), Line: d.Line(), Plugin: d.name, Err: fmt.Errorf(format, args...)}
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

// skipOption consumes an option this package does not know and notes it.
// CoreDNS would refuse unknown options, but a newer CoreDNS than 1.13.1
// may know more, and dnsstandby must not refuse a Corefile LocalDNS runs.
func (d *directive) skipOption() {
	d.notef("unknown option %q ignored", d.Val())
	d.RemainingArgs()
}

// caddyError matches the errors of the caddyfile parser, which put the
// place first in their own format.
var caddyError = regexp.MustCompile(`(?s)^(.*):(\d+) - (Syntax error|Error during parsing): (.*)$`)

// syntaxError turns a caddyfile parser error into an *Error.
func syntaxError(filename string, err error) error {
	m := caddyError.FindStringSubmatch(err.Error())
	if m == nil {
		return &Error{File: filename, Err: err}
	}
	line, _ := strconv.Atoi(m[2])
	msg := m[4]
	if m[3] == "Syntax error" {
		msg = "syntax error: " + msg
	}
	return &Error{File: m[1], Line: line, Err: errors.New(msg)}
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
