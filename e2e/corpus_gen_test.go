package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// The corpus of TestCorefileCorpus: mutations of the AgentBaker renderings
// in corefile/testdata, each labelled with its category, the rendering, the
// line it is about and what it does. It is built from the files alone, in
// file and line order, so every run tests the same Corefiles.

// Mutation categories, in the order the test reports them.
const (
	catDeleted    = "deleted-line"
	catDuplicated = "duplicated-line"
	catSwapped    = "swapped-lines"
	catUnknown    = "unknown-directive"
	catMisspelt   = "misspelt-directive"
	catBadArg     = "bad-argument"
	catTruncated  = "truncated"
	catBrace      = "stray-brace"
	catEmpty      = "empty"
	catValid      = "valid-edit"
)

// corpusCategories lists the categories in report order.
var corpusCategories = []string{
	catDeleted, catDuplicated, catSwapped, catUnknown, catMisspelt,
	catBadArg, catTruncated, catBrace, catEmpty, catValid,
}

// TestCorpusGenerator checks the corpus without running anything: the
// same on every build, each mutation with a label of its own, every
// category present, and every edit table entry found in its rendering
// (buildCorpus panics on one that is not). It needs no root, so a broken
// table shows everywhere.
func TestCorpusGenerator(t *testing.T) {
	paths, err := filepath.Glob("../corefile/testdata/*.corefile")
	must(t, err)
	a, err := buildCorpus(paths)
	must(t, err)
	b, err := buildCorpus(paths)
	must(t, err)
	if !slices.Equal(a, b) {
		t.Fatal("two builds of the corpus differ")
	}
	labels := map[string]bool{}
	perCat := map[string]int{}
	for _, m := range a {
		if labels[m.label()] {
			t.Errorf("label %q used twice", m.label())
		}
		labels[m.label()] = true
		perCat[m.Category]++
		if !slices.Contains(corpusCategories, m.Category) {
			t.Errorf("%s: unknown category", m.label())
		}
	}
	for _, c := range corpusCategories {
		if perCat[c] == 0 {
			t.Errorf("no mutation of category %s", c)
		}
	}
	if len(a) < 300 {
		t.Errorf("%d mutations, want at least 300", len(a))
	}
	t.Logf("%d mutations: %v", len(a), perCat)
}

// mainRendering is the rendering most edits apply to: it has every block
// kind (hosts, cluster.local and override zones on both listeners).
const mainRendering = "agentbaker.corefile"

// mutation is one Corefile of the corpus.
type mutation struct {
	Category string `json:"category"`
	File     string `json:"file"` // base name of the rendering it mutates
	Line     int    `json:"line"` // 1-based line of the rendering it is about; 0: the whole file
	Desc     string `json:"desc"`
	Text     string `json:"text"` // the mutated Corefile
	Diff     string `json:"diff"` // the rendering's lines removed (-) and added (+)
	// Linger marks a Corefile CoreDNS starts on and then exits on soon
	// after (loop detection): the oracle waits corpusLinger for that exit.
	Linger bool `json:"linger,omitempty"`
}

func (m mutation) label() string {
	return fmt.Sprintf("%s %s:%d %s", m.Category, m.File, m.Line, m.Desc)
}

// rendering is one AgentBaker Corefile, split into lines with the block
// structure the mutations need.
type rendering struct {
	name  string
	lines []rline
}

type rline struct {
	text   string
	indent string   // leading white space
	tokens []string // Caddyfile tokens, quotes kept; none for blank and comment lines
	depth  int      // blocks open before the line
	server int      // index of the enclosing server block's key line; -1 outside every block
	plugin string   // directive whose { } block holds the line; "" elsewhere
	close  int      // for a line that opens a block: the line that closes it; else -1
}

func (l rline) code() bool { return len(l.tokens) > 0 }

func (l rline) trimmed() string { return strings.TrimSpace(l.text) }

// opens reports whether the line ends by opening a block.
func (l rline) opens() bool { return l.code() && l.tokens[len(l.tokens)-1] == "{" }

// caddyTokens splits a line as the Caddyfile lexer does: white space
// separates tokens, double quotes group (backslash escapes inside them),
// and '#' at the start of a token comments out the rest of the line.
func caddyTokens(line string) []string {
	var (
		toks             []string
		cur              strings.Builder
		inTok, inQ, escd bool
	)
	flush := func() {
		if inTok {
			toks = append(toks, cur.String())
			cur.Reset()
			inTok = false
		}
	}
	for _, r := range line {
		switch {
		case inQ:
			cur.WriteRune(r)
			switch {
			case escd:
				escd = false
			case r == '\\':
				escd = true
			case r == '"':
				inQ = false
			}
		case unicode.IsSpace(r):
			flush()
		case r == '#' && !inTok:
			flush()
			return toks
		default:
			if r == '"' {
				inQ = true
			}
			cur.WriteRune(r)
			inTok = true
		}
	}
	flush()
	return toks
}

func loadRendering(path string) (*rendering, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r := &rendering{name: filepath.Base(path)}
	var stack []int // lines whose block is open
	server := -1
	for i, text := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		l := rline{
			text:   text,
			indent: text[:len(text)-len(strings.TrimLeftFunc(text, unicode.IsSpace))],
			tokens: caddyTokens(text),
			depth:  len(stack),
			close:  -1,
		}
		if len(stack) == 0 && l.opens() {
			server = i
		}
		if len(stack) > 0 || l.opens() {
			l.server = server
		} else {
			l.server = -1
		}
		if len(stack) >= 2 {
			l.plugin = r.lines[stack[1]].tokens[0]
		}
		r.lines = append(r.lines, l)
		for _, tok := range l.tokens {
			switch tok {
			case "{":
				stack = append(stack, i)
			case "}":
				if len(stack) == 0 {
					return nil, fmt.Errorf("%s:%d: unbalanced }", path, i+1)
				}
				r.lines[stack[len(stack)-1]].close = i
				stack = stack[:len(stack)-1]
			}
		}
	}
	if len(stack) != 0 {
		return nil, fmt.Errorf("%s: %d blocks not closed", path, len(stack))
	}
	return r, nil
}

// blockName names the server block holding line i as "KEY@BIND", e.g.
// ".:53@169.254.10.10" (bind's arguments joined by commas), "" outside.
func (r *rendering) blockName(i int) string {
	s := r.lines[i].server
	if s < 0 {
		return ""
	}
	name := r.lines[s].tokens[0]
	for j := s + 1; j < r.lines[s].close; j++ {
		if l := r.lines[j]; l.depth == 1 && l.code() && l.tokens[0] == "bind" {
			return name + "@" + strings.Join(l.tokens[1:], ",")
		}
	}
	return name
}

// kind names what line i is, for deduplication: its text, and the
// directive whose block holds it. Options (forward's prefer_udp, cache's
// success ...) repeat in block after block to the same effect; what a
// directive line does may depend on its server block, so serverKind adds
// the block's key.
func (r *rendering) kind(i int) string {
	return r.lines[i].plugin + "|" + r.lines[i].trimmed()
}

func (r *rendering) serverKind(i int) string {
	l := r.lines[i]
	if l.depth >= 2 || l.server < 0 {
		return r.kind(i)
	}
	return r.lines[l.server].tokens[0] + "|" + r.kind(i)
}

// splice replaces lines [from, to) with the given lines and returns the
// new text and the diff, numbered by the rendering's lines.
func (r *rendering) splice(from, to int, with ...string) (text, diff string) {
	var b, d strings.Builder
	for _, l := range r.lines[:from] {
		b.WriteString(l.text + "\n")
	}
	for _, l := range with {
		b.WriteString(l + "\n")
	}
	for _, l := range r.lines[to:] {
		b.WriteString(l.text + "\n")
	}
	for i := from; i < to; i++ {
		fmt.Fprintf(&d, "-%d: %s\n", i+1, r.lines[i].text)
	}
	for k, l := range with {
		fmt.Fprintf(&d, "+%d: %s\n", from+1+k, l) // numbered as in the mutated file
	}
	if from == to && len(with) == 0 {
		fmt.Fprintf(&d, "(nothing at line %d)\n", from+1)
	}
	return b.String(), strings.TrimSuffix(d.String(), "\n")
}

// truncate keeps the first n lines (and, when partial is not empty, the
// start of line n+1 with no newline after it).
func (r *rendering) truncate(n int, partial string) (text, diff string) {
	var b strings.Builder
	for _, l := range r.lines[:n] {
		b.WriteString(l.text + "\n")
	}
	b.WriteString(partial)
	if partial != "" {
		return b.String(), fmt.Sprintf("-%d...: %s\n+%d: %s (no newline, end of file)", n+1, r.lines[n].text, n+1, partial)
	}
	if n == len(r.lines) {
		return b.String(), "(whole file)"
	}
	return b.String(), fmt.Sprintf("-%d...%d: everything from %q on", n+1, len(r.lines), r.lines[n].trimmed())
}

// find returns the line of directive plugin (its option opt when opt is
// not "") in the first server block whose blockName starts with block.
// It returns -1 when there is none.
func (r *rendering) find(block, plugin, opt string) int {
	for i, l := range r.lines {
		if !l.code() || !strings.HasPrefix(r.blockName(i), block) {
			continue
		}
		if plugin == "key" && opt == "" && l.depth == 0 {
			return i
		}
		if opt == "" && l.depth == 1 && l.tokens[0] == plugin {
			return i
		}
		if opt != "" && l.depth == 2 && l.plugin == plugin && l.tokens[0] == opt {
			return i
		}
	}
	return -1
}

// indented gives each "\n"-separated line of s the indent, plus four
// spaces more for lines inside a { } opened in s.
func indented(indent, s string) []string {
	var out []string
	depth := 0
	for _, l := range strings.Split(s, "\n") {
		t := caddyTokens(l)
		if len(t) > 0 && t[0] == "}" {
			depth--
		}
		out = append(out, indent+strings.Repeat("    ", max(depth, 0))+strings.TrimSpace(l))
		if len(t) > 0 && t[len(t)-1] == "{" {
			depth++
		}
	}
	return out
}

// corpus collects mutations, keeping the first of identical texts and
// skipping any that leave the rendering as it was.
type corpus struct {
	list     []mutation
	seen     map[string]bool
	dupKeys  map[string]bool // per-category deduplication of similar edits
	original map[string]bool
}

func (c *corpus) add(m mutation) {
	if c.seen[m.Text] || c.original[m.Text] {
		return
	}
	c.seen[m.Text] = true
	c.list = append(c.list, m)
}

// once reports whether key is new, for edits that would only repeat one
// made already in another rendering or block.
func (c *corpus) once(key string) bool {
	if c.dupKeys[key] {
		return false
	}
	c.dupKeys[key] = true
	return true
}

// edit describes one edit of a directive line or of its { } block.
type edit struct {
	plugin string // directive whose line (or block) is edited; "key" for a server block key line
	opt    string // option line in the directive's block; "" for the directive's own line
	op     string // "set" replaces the line, "block" the line and its block, "add" inserts after it, "before" inserts before it, "twice" repeats the line and its block
	with   string // new lines, "\n"-separated, indented like the line (a block's contents one step more)
	desc   string
	file   string // rendering; "" is mainRendering
	block  string // prefix of the server block's blockName; "" is the first block with the line
	linger bool   // see mutation.Linger
}

func (c *corpus) apply(rs map[string]*rendering, cat string, e edit) {
	file := cmp(e.file, mainRendering)
	r := rs[file]
	if r == nil {
		panic("corpus: no rendering " + file)
	}
	i := r.find(e.block, e.plugin, e.opt)
	if i < 0 {
		panic(fmt.Sprintf("corpus: %s has no %s %s in block %q (%s)", file, e.plugin, e.opt, e.block, e.desc))
	}
	l := r.lines[i]
	var text, diff string
	switch e.op {
	case "set":
		text, diff = r.splice(i, i+1, indented(l.indent, e.with)...)
	case "block":
		text, diff = r.splice(i, max(i, l.close)+1, indented(l.indent, e.with)...)
	case "twice":
		end := max(i, l.close) + 1
		text, diff = r.splice(end, end, textsOf(r.lines[i:end])...)
	case "add":
		indent := l.indent
		if l.opens() {
			indent += "    "
		}
		text, diff = r.splice(i+1, i+1, indented(indent, e.with)...)
	case "before":
		text, diff = r.splice(i, i, indented(l.indent, e.with)...)
	default:
		panic("corpus: unknown op " + e.op)
	}
	c.add(mutation{Category: cat, File: file, Line: i + 1, Desc: e.desc, Text: text, Diff: diff, Linger: e.linger})
}

func cmp(s, dflt string) string {
	if s == "" {
		return dflt
	}
	return s
}

// buildCorpus generates the corpus from the renderings at paths.
func buildCorpus(paths []string) ([]mutation, error) {
	c := &corpus{seen: map[string]bool{}, dupKeys: map[string]bool{}, original: map[string]bool{}}
	rs := map[string]*rendering{}
	var order []*rendering
	for _, p := range paths {
		r, err := loadRendering(p)
		if err != nil {
			return nil, err
		}
		rs[r.name] = r
		order = append(order, r)
		text, _ := r.splice(0, 0)
		c.original[text] = true
	}
	// The main rendering first: it has every block kind, so the other
	// renderings add only what they do differently.
	slices.SortStableFunc(order, func(a, b *rendering) int {
		return boolInt(b.name == mainRendering) - boolInt(a.name == mainRendering)
	})
	if rs[mainRendering] == nil {
		return nil, fmt.Errorf("corpus: no %s among %v", mainRendering, paths)
	}
	for _, r := range order {
		lineEdits(c, r)
		misspellings(c, r)
		truncations(c, r)
	}
	unknownDirectives(c, rs[mainRendering])
	strayBraces(c, rs)
	emptyFiles(c, order)
	for _, e := range badArguments {
		c.apply(rs, catBadArg, e)
	}
	for _, e := range validEdits {
		c.apply(rs, catValid, e)
	}
	wholeFileEdits(c, rs[mainRendering])
	return c.list, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// lineEdits deletes, duplicates and swaps lines. The renderings repeat the
// same lines in many blocks; each edit is made once per kind of line (see
// kind), which keeps the corpus small while every distinct line is edited:
// deleted once (keys, bind and closing braces once per server block key),
// duplicated once, and swapped with the line after it once.
func lineEdits(c *corpus, r *rendering) {
	var code []int
	for i, l := range r.lines {
		if l.code() {
			code = append(code, i)
		}
	}
	for n, i := range code {
		l := r.lines[i]
		where := r.blockName(i)
		dkey := r.kind(i)
		if l.depth == 0 || (l.depth == 1 && l.tokens[0] == "bind") || (l.depth == 1 && l.tokens[0] == "}") {
			dkey = r.serverKind(i) // a block's key, bind and end decide which block serves what
		}
		if c.once(catDeleted + "|" + dkey) {
			text, diff := r.splice(i, i+1)
			c.add(mutation{Category: catDeleted, File: r.name, Line: i + 1, Desc: fmt.Sprintf("delete %q (%s)", l.trimmed(), where), Text: text, Diff: diff})
		}
		if c.once(catDuplicated + "|" + r.kind(i)) {
			text, diff := r.splice(i+1, i+1, l.text)
			c.add(mutation{Category: catDuplicated, File: r.name, Line: i + 1, Desc: fmt.Sprintf("duplicate %q (%s)", l.trimmed(), where), Text: text, Diff: diff})
		}
		if n+1 < len(code) {
			j := code[n+1]
			m := r.lines[j]
			if c.once(catSwapped + "|" + r.kind(i)) {
				text, diff := r.splice(i, j+1, append(append([]string{m.text}, textsOf(r.lines[i+1:j])...), l.text)...)
				c.add(mutation{Category: catSwapped, File: r.name, Line: i + 1, Desc: fmt.Sprintf("swap %q and %q (%s)", l.trimmed(), m.trimmed(), where), Text: text, Diff: diff})
			}
		}
	}
}

func textsOf(ls []rline) []string {
	var out []string
	for _, l := range ls {
		out = append(out, l.text)
	}
	return out
}

// misspellingsOf are plausible misspellings of every directive in the
// renderings: transposed or dropped letters, a wrong case, and the name of
// something else (metrics for prometheus, proxy for forward).
var misspellingsOf = map[string][]string{
	"bind":       {"bnid", "Bind"},
	"forward":    {"froward", "Forward", "proxy"},
	"cache":      {"cahce", "CACHE"},
	"hosts":      {"host"},
	"template":   {"tempalte"},
	"nsid":       {"nsdi"},
	"whoami":     {"whoiam"},
	"log":        {"logs"},
	"errors":     {"error"},
	"ready":      {"raedy"},
	"loop":       {"lopo"},
	"prometheus": {"prometheous", "metrics"},
}

// misspellings misspells every directive, each way, in the first block
// that has it. (The loader reads every block bound to a listener alike, so
// the same misspelling in another block would only repeat the verdict.)
func misspellings(c *corpus, r *rendering) {
	for i, l := range r.lines {
		if !l.code() || l.depth != 1 {
			continue
		}
		where := r.blockName(i)
		for _, w := range misspellingsOf[l.tokens[0]] {
			if !c.once(catMisspelt + "|" + l.tokens[0] + "|" + w) {
				continue
			}
			text, diff := r.splice(i, i+1, l.indent+w+strings.TrimPrefix(l.trimmed(), l.tokens[0]))
			c.add(mutation{Category: catMisspelt, File: r.name, Line: i + 1, Desc: fmt.Sprintf("%s -> %s (%s)", l.tokens[0], w, where), Text: text, Diff: diff})
		}
	}
}

// truncations cuts the file after every line of its first ".:53" block,
// in the middle of every fourth of that block's lines in the main rendering, and
// just before the last line of every other block (once for blocks the
// renderings share) and, in the main rendering, just after it.
func truncations(c *corpus, r *rendering) {
	first := -1
	for i, l := range r.lines {
		if l.depth == 0 && l.opens() && l.tokens[0] == ".:53" {
			first = i
			break
		}
	}
	if first < 0 {
		panic("corpus: " + r.name + " has no .:53 block")
	}
	cut := func(n int, partial, desc string) {
		text, diff := r.truncate(n, partial)
		c.add(mutation{Category: catTruncated, File: r.name, Line: n + 1, Desc: desc, Text: text, Diff: diff})
	}
	for i := first; i <= r.lines[first].close; i++ {
		cut(i, "", fmt.Sprintf("end before line %d %q (first .:53 block)", i+1, r.lines[i].trimmed()))
		if t := r.lines[i].text; r.name == mainRendering && r.lines[i].code() && len(strings.TrimSpace(t)) > 2 && (i-first)%4 == 1 {
			half := len(r.lines[i].indent) + len(strings.TrimSpace(t))/2
			cut(i, t[:half], fmt.Sprintf("end in the middle of line %d %q", i+1, r.lines[i].trimmed()))
		}
	}
	cut(r.lines[first].close+1, "", "end after the first .:53 block")
	for i, l := range r.lines {
		if l.close < 0 || (i >= first && i <= r.lines[first].close) {
			continue
		}
		where := r.blockName(i)
		if !c.once(catTruncated + "|" + where + "|" + r.kind(i)) {
			continue // the same block in a rendering already cut
		}
		cut(l.close, "", fmt.Sprintf("end before the closing } of %q (%s)", l.trimmed(), where))
		if l.depth == 0 && r.name == mainRendering {
			cut(l.close+1, "", fmt.Sprintf("end after the closing } of %q (%s)", l.trimmed(), where))
		}
	}
}

// unknownNames are directives no CoreDNS has, or had once (proxy), or
// options misplaced as directives.
var unknownNames = []string{
	"frobnicate",
	"proxy . 10.0.0.10",
	"upstream 168.63.129.16",
	"dnssec_validate",
	"prefer_udp",
	"serve_stale 3600s verify",
}

// unknownDirectives adds unknown directives: every name in the first
// ".:53" block, and the first in every other block, at the top level and
// at the end of the file.
func unknownDirectives(c *corpus, r *rendering) {
	for i, l := range r.lines {
		if !l.code() || l.depth != 1 || l.tokens[0] != "bind" {
			continue
		}
		where := r.blockName(i)
		for n, name := range unknownNames {
			if n >= 1 && !strings.HasPrefix(where, vnetRoot) {
				continue
			}
			text, diff := r.splice(i+1, i+1, l.indent+name)
			c.add(mutation{Category: catUnknown, File: r.name, Line: i + 2, Desc: fmt.Sprintf("unknown directive %q in %s", name, where), Text: text, Diff: diff})
		}
	}
	firstKey := slices.IndexFunc(r.lines, func(l rline) bool { return l.depth == 0 && l.opens() })
	for _, name := range unknownNames[:2] {
		text, diff := r.splice(firstKey, firstKey, name)
		c.add(mutation{Category: catUnknown, File: r.name, Line: firstKey + 1, Desc: fmt.Sprintf("unknown directive %q at top level before the first block", name), Text: text, Diff: diff})
		text, diff = r.splice(len(r.lines), len(r.lines), name)
		c.add(mutation{Category: catUnknown, File: r.name, Line: len(r.lines) + 1, Desc: fmt.Sprintf("unknown directive %q at top level at the end", name), Text: text, Diff: diff})
	}
	// An unknown directive in a block of its own, as a newer LocalDNS
	// template might add one.
	text, diff := r.splice(len(r.lines), len(r.lines), "example.org:53 {", "    bind 169.254.10.11", "    frobnicate", "}")
	c.add(mutation{Category: catUnknown, File: r.name, Line: len(r.lines) + 1, Desc: "new block for example.org on 169.254.10.11 with unknown directive frobnicate", Text: text, Diff: diff})
	text, diff = r.splice(len(r.lines), len(r.lines), "example.org:53 {", "    bind 169.254.10.12", "    frobnicate", "}")
	c.add(mutation{Category: catUnknown, File: r.name, Line: len(r.lines) + 1, Desc: "new block for example.org on 169.254.10.12 (not a listener) with unknown directive frobnicate", Text: text, Diff: diff})
}

// strayBraces adds and removes braces: a lone { or } at the top level,
// inside a server block and inside a plugin block; a { after a directive
// that has no block; a directive's { dropped; a closing } doubled.
func strayBraces(c *corpus, rs map[string]*rendering) {
	r := rs[mainRendering]
	add := func(i int, line, desc string) {
		text, diff := r.splice(i, i, line)
		c.add(mutation{Category: catBrace, File: r.name, Line: i + 1, Desc: desc, Text: text, Diff: diff})
	}
	set := func(i int, line, desc string) {
		text, diff := r.splice(i, i+1, line)
		c.add(mutation{Category: catBrace, File: r.name, Line: i + 1, Desc: desc, Text: text, Diff: diff})
	}
	firstKey := slices.IndexFunc(r.lines, func(l rline) bool { return l.depth == 0 && l.opens() })
	root := r.find(".:53@169.254.10.10", "key", "")
	bind := r.find(".:53@169.254.10.10", "bind", "")
	fwd := r.find(".:53@169.254.10.10", "forward", "")
	cache := r.find(".:53@169.254.10.10", "cache", "")
	loop := r.find(".:53@169.254.10.10", "loop", "")
	nsid := r.find(".:53@169.254.10.10", "nsid", "")
	whoami := r.find("health-check", "whoami", "")
	tmpl := r.find(".:53@169.254.10.10", "template", "")
	for _, brace := range []string{"{", "}"} {
		add(firstKey, brace, "lone "+brace+" at the top level before the first block")
		add(root, brace, "lone "+brace+" at the top level between blocks")
		add(len(r.lines), brace, "lone "+brace+" at the end of the file")
		add(bind+1, r.lines[bind].indent+brace, "lone "+brace+" in the .:53 block after bind")
		add(fwd+2, r.lines[fwd+1].indent+brace, "lone "+brace+" inside forward's block")
		add(cache+1, r.lines[cache+1].indent+brace, "lone "+brace+" inside cache's block")
		add(whoami+1, r.lines[whoami].indent+brace, "lone "+brace+" in the health-check block after whoami")
	}
	set(loop, r.lines[loop].text+" {", "loop { with no }")
	set(nsid, r.lines[nsid].text+" {", "nsid localdns { with no }")
	set(whoami, r.lines[whoami].text+" {", "whoami { with no }")
	set(loop, r.lines[loop].text+" { }", "loop { } on one line")
	set(loop, r.lines[loop].text+" {}", "loop {} (one token)")
	set(fwd, strings.TrimSuffix(r.lines[fwd].text, " {"), "forward's { dropped")
	set(cache, strings.TrimSuffix(r.lines[cache].text, " {"), "cache's { dropped")
	set(tmpl, strings.TrimSuffix(r.lines[tmpl].text, " {"), "template's { dropped")
	set(root, strings.TrimSuffix(r.lines[root].text, " {"), ".:53 block key's { dropped")
	set(root, r.lines[root].text+" {", ".:53 { { (doubled)")
	set(r.lines[fwd].close, r.lines[r.lines[fwd].close].text+"}", "forward's } doubled (}})")
	set(r.lines[root].close, "}}", ".:53 block's } doubled (}})")
	set(r.lines[cache].close, "", "cache's } replaced by an empty line")
	set(r.lines[root].close, "{", ".:53 block's } replaced by {")
	set(fwd, r.lines[fwd].indent+"forward . 168.63.129.16 {{", "forward {{")
}

// emptyFiles adds the empty file, white space only, and the main
// rendering's comments alone and with every line commented out.
func emptyFiles(c *corpus, order []*rendering) {
	c.add(mutation{Category: catEmpty, File: mainRendering, Desc: "empty file", Text: "", Diff: "(every line removed)"})
	c.add(mutation{Category: catEmpty, File: mainRendering, Desc: "blank lines only", Text: "\n\n\n", Diff: "(three blank lines)"})
	c.add(mutation{Category: catEmpty, File: mainRendering, Desc: "spaces and tabs only", Text: " \t \n\t\n    \n", Diff: "(white space only)"})
	c.add(mutation{Category: catEmpty, File: mainRendering, Desc: "one comment line", Text: "# LocalDNS Corefile\n", Diff: "+1: # LocalDNS Corefile"})
	for _, r := range order[:1] { // the main rendering: the others' comments are alike
		var comments, commented strings.Builder
		for _, l := range r.lines {
			if !l.code() {
				comments.WriteString(l.text + "\n")
			}
			commented.WriteString("# " + l.text + "\n")
		}
		c.add(mutation{Category: catEmpty, File: r.name, Desc: "comment lines only (every code line removed)", Text: comments.String(), Diff: "(code lines removed)"})
		c.add(mutation{Category: catEmpty, File: r.name, Desc: "every line commented out", Text: commented.String(), Diff: "(# before every line)"})
	}
}

// wholeFileEdits changes the whole main rendering in ways CoreDNS's lexer
// should not mind: CRLF line ends, tabs for indentation, no indentation,
// a byte order mark, no final newline.
func wholeFileEdits(c *corpus, r *rendering) {
	text, _ := r.splice(0, 0)
	var tabs, flat strings.Builder
	for _, l := range r.lines {
		tabs.WriteString(strings.Repeat("\t", l.depth) + strings.TrimSpace(l.text) + "\n")
		flat.WriteString(strings.TrimSpace(l.text) + "\n")
	}
	c.add(mutation{Category: catValid, File: r.name, Desc: "CRLF line ends", Text: strings.ReplaceAll(text, "\n", "\r\n"), Diff: "(every \\n is \\r\\n)"})
	c.add(mutation{Category: catValid, File: r.name, Desc: "tabs for indentation", Text: tabs.String(), Diff: "(indentation by tabs)"})
	c.add(mutation{Category: catValid, File: r.name, Desc: "no indentation", Text: flat.String(), Diff: "(indentation removed)"})
	c.add(mutation{Category: catValid, File: r.name, Desc: "UTF-8 byte order mark", Text: "\ufeff" + text, Diff: "(BOM before line 1)"})
	c.add(mutation{Category: catValid, File: r.name, Desc: "no newline at the end", Text: strings.TrimSuffix(text, "\n"), Diff: "(final newline removed)"})
	c.add(mutation{Category: catValid, File: r.name, Desc: "blank line after every line", Text: strings.ReplaceAll(text, "\n", "\n\n"), Diff: "(blank lines added)"})
}

// Server blocks of the main rendering, by blockName prefix.
const (
	hcBlock   = "health-check."
	vnetRoot  = ".:53@169.254.10.10"
	kubeRoot  = ".:53@169.254.10.11"
	vnetLocal = "cluster.local:53@169.254.10.10"
	kubeLocal = "cluster.local:53@169.254.10.11"
	override  = "testdomain567.com:53@169.254.10.11"
)

// badArguments are, for every plugin of the renderings and for the server
// block keys, the mistakes a hand edit or a bad template makes: a missing
// or extra argument, an invalid IP or port, a bad duration, negative, zero
// and huge numbers, an unknown or misspelt option in its block, an option
// without its value, another plugin's option. Some are valid for CoreDNS
// all the same (cache's extra arguments are zones); the oracle decides.
var badArguments = []edit{
	// bind
	{plugin: "bind", op: "set", with: "bind", desc: "bind: no argument", block: vnetRoot},
	{plugin: "bind", op: "set", with: "bind 169.254.10.300", desc: "bind: invalid IP 169.254.10.300", block: vnetRoot},
	{plugin: "bind", op: "set", with: "bind 169.254.10.10:53", desc: "bind: address with a port", block: vnetRoot},
	{plugin: "bind", op: "set", with: "bind 169.254.10.12", desc: "bind: address on no link (169.254.10.12)", block: vnetRoot},
	{plugin: "bind", op: "set", with: "bind eth9", desc: "bind: no such interface eth9", block: vnetRoot},
	{plugin: "bind", op: "set", with: "bind localdns", desc: "bind: interface localdns (holds .10 and .11: two .:53 blocks on .11)", block: vnetRoot},
	{plugin: "bind", op: "set", with: "bind 169.254.10.10 169.254.10.11", desc: "bind: extra argument 169.254.10.11 (two .:53 blocks on .11)", block: vnetRoot},
	{plugin: "bind", op: "set", with: "bind 0.0.0.0", desc: "bind: 0.0.0.0 beside the .:53 block on .11", block: vnetRoot},
	{plugin: "bind", op: "set", with: "bind 169.254.10.10 {\nexcept\n}", desc: "bind: except without a value", block: vnetRoot},
	{plugin: "bind", op: "set", with: "bind 169.254.10.10 {\nexclude 169.254.10.11\n}", desc: "bind: unknown option exclude", block: vnetRoot},
	{plugin: "bind", op: "set", with: "bind 169.254.10.10 {\nprefer_udp\n}", desc: "bind: forward's option prefer_udp", block: vnetRoot},
	{plugin: "bind", op: "set", with: "bind 169.254.10.10 169.254.10.300", desc: "bind: second address invalid (169.254.10.300)", block: hcBlock},
	{plugin: "bind", op: "set", with: "bind 169.254.10.10 169.254.10.11 {\nexcept 169.254.10.300\n}", desc: "bind: except an invalid IP", block: hcBlock},
	{plugin: "bind", op: "set", with: "bind 169.254.10.10 169.254.10.11 {\nexcept 169.254.10.10 169.254.10.11\n}", desc: "bind: every address excepted", block: hcBlock},
	{plugin: "bind", op: "set", with: "bind 169.254.10.11", desc: "bind: cluster.local block moved to .11 beside the other cluster.local block", block: vnetLocal},
	{plugin: "bind", op: "set", with: "bind 169.254.10.11", desc: "bind: 169.254.10.10 override block moved to .11", block: "testdomain456"},
	{plugin: "prometheus", op: "add", with: "}\nexample.org:53 {\nbind 169.254.10.12\nforward . 10.0.0.10\n", desc: "bind: a new block bound to an address on no link (169.254.10.12)", block: override},
	{plugin: "bind", op: "set", with: "bind 169.254.10.10 169.254.10.10", desc: "bind: the same address twice", block: vnetRoot},
	// Mistakes in blocks dnsstandby does not serve (another port, another
	// address): CoreDNS reads every block.
	{plugin: "prometheus", op: "add", with: "}\nexample.org:5353 {\nbind 169.254.10.11\nforward . 10.0.0.300\n", desc: "forward: invalid IP in a new block on port 5353", block: override},
	{plugin: "prometheus", op: "add", with: "}\nexample.org:53 {\nbind 127.0.0.1\ncache 0\n", desc: "cache: TTL 0 in a new block bound to 127.0.0.1", block: override},
	{plugin: "prometheus", op: "add", with: "}\ntls://.:853 {\nbind 169.254.10.10\ntemplate FOO ANY\n", desc: "template: unknown class in a new tls:// block", block: override},
	{plugin: "bind", op: "set", with: "bind 127.0.0.1\nforward example.com 10.0.0.300", desc: "forward: invalid IP in the testdomain567 block moved to 127.0.0.1", block: override},

	// forward
	{plugin: "forward", op: "twice", desc: "forward: the whole stanza twice", block: vnetRoot},
	{plugin: "forward", op: "set", with: "forward {", desc: "forward: no FROM and no TO", block: vnetRoot},
	{plugin: "forward", op: "set", with: "forward . {", desc: "forward: no TO", block: vnetRoot},
	{plugin: "forward", op: "set", with: "forward . 10.0.0.300 {", desc: "forward: invalid IP 10.0.0.300", block: vnetRoot},
	{plugin: "forward", op: "set", with: "forward . 10.0.0.10 10.0.0.300 {", desc: "forward: second TO invalid IP", block: kubeRoot},
	{plugin: "forward", op: "set", with: "forward . 168.63.129.16:99999 {", desc: "forward: port 99999", block: vnetRoot},
	{plugin: "forward", op: "set", with: "forward . 168.63.129.16:0 {", desc: "forward: port 0", block: vnetRoot},
	{plugin: "forward", op: "set", with: "forward . 168.63.129.16:dns {", desc: "forward: port not a number", block: vnetRoot},
	{plugin: "forward", op: "set", with: "forward . 168.63.129.16: {", desc: "forward: empty port", block: vnetRoot},
	{plugin: "forward", op: "set", with: "forward . 168.63.129.16 1000 {", desc: "forward: extra argument 1000", block: vnetRoot},
	{plugin: "forward", op: "set", with: "forward . 10.0.0.1 10.0.0.2 10.0.0.3 10.0.0.4 10.0.0.5 10.0.0.6 10.0.0.7 10.0.0.8 10.0.0.9 10.0.0.10 10.0.0.11 10.0.0.12 10.0.0.13 10.0.0.14 10.0.0.15 10.0.0.16 {", desc: "forward: 16 TOs (more than 15)", block: kubeRoot},
	{plugin: "forward", op: "set", with: "forward . https://168.63.129.16 {", desc: "forward: https:// TO", block: vnetRoot},
	{plugin: "forward", op: "set", with: "forward . grpc://168.63.129.16 {", desc: "forward: grpc:// TO", block: vnetRoot},
	{plugin: "forward", op: "set", with: "forward . /nonexistent/resolv.conf {", desc: "forward: TO a file that does not exist", block: vnetRoot},
	{plugin: "forward", op: "set", with: "forward cluster..local 10.0.0.10 {", desc: "forward: FROM not a domain name (cluster..local)", block: vnetLocal},
	// CoreDNS starts, answers, and exits once the loop plugin's first
	// query has come back to it three times: a crash loop all the same.
	{plugin: "forward", op: "set", with: "forward . 169.254.10.10 {", desc: "forward: TO its own listener (a loop)", block: vnetRoot, linger: true},
	{plugin: "forward", opt: "policy", op: "set", with: "policy fastest", desc: "forward: unknown policy fastest", block: vnetRoot},
	{plugin: "forward", opt: "policy", op: "set", with: "policy", desc: "forward: policy without a value", block: vnetRoot},
	{plugin: "forward", opt: "policy", op: "set", with: "policy sequential random", desc: "forward: policy with two values", block: vnetRoot},
	{plugin: "forward", opt: "policy", op: "set", with: "policy Sequential", desc: "forward: policy in the wrong case", block: vnetRoot},
	{plugin: "forward", opt: "max_concurrent", op: "set", with: "max_concurrent -1", desc: "forward: max_concurrent -1", block: vnetRoot},
	{plugin: "forward", opt: "max_concurrent", op: "set", with: "max_concurrent 1k", desc: "forward: max_concurrent not a number", block: vnetRoot},
	{plugin: "forward", opt: "max_concurrent", op: "set", with: "max_concurrent 99999999999999999999", desc: "forward: max_concurrent huge (over int64)", block: vnetRoot},
	{plugin: "forward", opt: "max_concurrent", op: "set", with: "max_concurrent", desc: "forward: max_concurrent without a value", block: vnetRoot},
	{plugin: "forward", opt: "max_concurrent", op: "set", with: "max_concurrent 1000 2000", desc: "forward: max_concurrent with two values", block: vnetRoot},
	{plugin: "forward", opt: "prefer_udp", op: "set", with: "prefer_udp true", desc: "forward: prefer_udp with a value", block: vnetRoot},
	{plugin: "forward", opt: "prefer_udp", op: "add", with: "force_tcp", desc: "forward: force_tcp beside prefer_udp", block: vnetRoot},
	{plugin: "forward", opt: "force_tcp", op: "set", with: "force_tcp yes", desc: "forward: force_tcp with a value", block: vnetLocal},
	{plugin: "forward", op: "add", with: "max_fails -1", desc: "forward: max_fails -1", block: vnetRoot},
	{plugin: "forward", op: "add", with: "max_fails", desc: "forward: max_fails without a value", block: vnetRoot},
	{plugin: "forward", op: "add", with: "max_fails 4294967296", desc: "forward: max_fails over 32 bits", block: vnetRoot},
	{plugin: "forward", op: "add", with: "health_check", desc: "forward: health_check without a value", block: vnetRoot},
	{plugin: "forward", op: "add", with: "health_check 1x", desc: "forward: health_check bad duration 1x", block: vnetRoot},
	{plugin: "forward", op: "add", with: "health_check -1s", desc: "forward: health_check negative", block: vnetRoot},
	{plugin: "forward", op: "add", with: "health_check 500", desc: "forward: health_check without a unit", block: vnetRoot},
	{plugin: "forward", op: "add", with: "health_check 1s recursive", desc: "forward: health_check unknown option recursive", block: vnetRoot},
	{plugin: "forward", op: "add", with: "expire", desc: "forward: expire without a value", block: vnetRoot},
	{plugin: "forward", op: "add", with: "expire 10", desc: "forward: expire without a unit", block: vnetRoot},
	{plugin: "forward", op: "add", with: "expire -10s", desc: "forward: expire negative", block: vnetRoot},
	{plugin: "forward", op: "add", with: "except", desc: "forward: except without a value", block: vnetRoot},
	{plugin: "forward", op: "add", with: "next", desc: "forward: next without a value", block: vnetRoot},
	{plugin: "forward", op: "add", with: "next BOGUS", desc: "forward: next with an unknown rcode", block: vnetRoot},
	{plugin: "forward", op: "add", with: "failover NOERROR", desc: "forward: failover NOERROR", block: vnetRoot},
	{plugin: "forward", op: "add", with: "failfast_all_unhealthy_upstreams true", desc: "forward: failfast_all_unhealthy_upstreams with a value", block: vnetRoot},
	{plugin: "forward", op: "add", with: "tls_servername", desc: "forward: tls_servername without a value", block: vnetRoot},
	{plugin: "forward", op: "add", with: "retries 3", desc: "forward: unknown option retries", block: vnetRoot},
	{plugin: "forward", op: "add", with: "max_concurent 1000", desc: "forward: misspelt option max_concurent", block: vnetRoot},
	{plugin: "forward", op: "add", with: "prefer-udp", desc: "forward: misspelt option prefer-udp", block: kubeRoot},
	{plugin: "forward", op: "add", with: "serve_stale 3600s", desc: "forward: cache's option serve_stale", block: vnetRoot},
	{plugin: "forward", op: "add", with: "ttl 5", desc: "forward: hosts's option ttl", block: vnetRoot},
	{plugin: "forward", op: "add", with: "fallthrough", desc: "forward: hosts's option fallthrough", block: kubeRoot},
	{plugin: "forward", opt: "health_check", op: "set", with: "health_check 1s no_rec domain", desc: "forward: health_check domain without a value", file: "agentbaker-health-check.corefile", block: vnetRoot},
	{plugin: "forward", opt: "health_check", op: "set", with: "health_check 1s no_rec domain health..local.", desc: "forward: health_check invalid domain", file: "agentbaker-health-check.corefile", block: vnetRoot},
	{plugin: "forward", opt: "health_check", op: "set", with: "health_check 0s no_rec domain health.local.", desc: "forward: health_check 0s", file: "agentbaker-health-check.corefile", block: vnetRoot},
	{plugin: "forward", opt: "failfast_all_unhealthy_upstreams", op: "set", with: "failfast_all_unhealthy_upstreams 1", desc: "forward: failfast_all_unhealthy_upstreams with a value", file: "agentbaker-health-check.corefile", block: vnetRoot},
	{plugin: "forward", opt: "health_check", op: "set", with: "health_check 2", desc: "forward: health_check without a unit", file: "agentbaker-health-check.corefile", block: kubeRoot},
	{plugin: "forward", op: "set", with: "forward . 10.224.0.4 10.224.0.300 {", desc: "forward: second VNet DNS invalid", file: "agentbaker-vnet-dns.corefile", block: vnetRoot},
	{plugin: "forward", op: "set", with: "forward . 10.224.0.4,10.224.0.5 {", desc: "forward: TOs joined by a comma", file: "agentbaker-vnet-dns.corefile", block: vnetRoot},

	// cache
	{plugin: "cache", op: "set", with: "cache 0 {", desc: "cache: TTL 0", block: vnetRoot},
	{plugin: "cache", op: "set", with: "cache -1 {", desc: "cache: TTL -1", block: vnetRoot},
	{plugin: "cache", op: "set", with: "cache 99999999999999999999 {", desc: "cache: TTL huge (over int64)", block: vnetRoot},
	{plugin: "cache", op: "set", with: "cache 1h {", desc: "cache: TTL as a duration (1h)", block: vnetRoot},
	{plugin: "cache", op: "set", with: "cache 4294967296 {", desc: "cache: TTL 2^32 s", block: vnetRoot},
	{plugin: "cache", op: "set", with: "cache 3600 3600 {", desc: "cache: extra argument 3600", block: vnetRoot},
	{plugin: "cache", op: "set", with: "cache 3600 cluster..local {", desc: "cache: extra argument not a domain name", block: vnetLocal},
	{plugin: "cache", op: "block", with: "cache 3600 {\n}", desc: "cache: empty block", block: kubeRoot},
	{plugin: "cache", opt: "success", op: "set", with: "success", desc: "cache: success without a value", block: vnetRoot},
	{plugin: "cache", opt: "success", op: "set", with: "success many", desc: "cache: success not a number", block: vnetRoot},
	{plugin: "cache", opt: "success", op: "set", with: "success 9984 0", desc: "cache: success TTL 0", block: vnetRoot},
	{plugin: "cache", opt: "success", op: "set", with: "success 9984 -5", desc: "cache: success TTL -5", block: vnetRoot},
	{plugin: "cache", opt: "success", op: "set", with: "success -1", desc: "cache: success capacity -1", block: vnetRoot},
	{plugin: "cache", opt: "success", op: "set", with: "success 0", desc: "cache: success capacity 0", block: vnetRoot},
	{plugin: "cache", opt: "success", op: "set", with: "success 99999999999999999999", desc: "cache: success capacity huge (over int64)", block: vnetRoot},
	{plugin: "cache", opt: "success", op: "set", with: "success 9984 3600 -1", desc: "cache: success min TTL -1", block: vnetRoot},
	{plugin: "cache", opt: "success", op: "set", with: "success 9984 3600 5 1", desc: "cache: success with a fourth value", block: vnetRoot},
	{plugin: "cache", opt: "success", op: "set", with: "success 9984 1h", desc: "cache: success TTL as a duration", block: vnetRoot},
	{plugin: "cache", opt: "denial", op: "set", with: "denial", desc: "cache: denial without a value", block: vnetRoot},
	{plugin: "cache", opt: "denial", op: "set", with: "denial 9984 0", desc: "cache: denial TTL 0", block: vnetRoot},
	{plugin: "cache", opt: "denial", op: "set", with: "denial abc", desc: "cache: denial not a number", block: vnetRoot},
	{plugin: "cache", opt: "denial", op: "set", with: "denial 9984 30 -1", desc: "cache: denial min TTL -1", block: vnetRoot},
	{plugin: "cache", opt: "serve_stale", op: "set", with: "serve_stale 3600", desc: "cache: serve_stale without a unit", block: vnetRoot},
	{plugin: "cache", opt: "serve_stale", op: "set", with: "serve_stale 3600s later", desc: "cache: serve_stale unknown mode later", block: vnetRoot},
	{plugin: "cache", opt: "serve_stale", op: "set", with: "serve_stale 3600s VERIFY", desc: "cache: serve_stale mode in capitals", block: vnetRoot},
	{plugin: "cache", opt: "serve_stale", op: "set", with: "serve_stale -1s", desc: "cache: serve_stale negative", block: vnetRoot},
	{plugin: "cache", opt: "serve_stale", op: "set", with: "serve_stale 1x verify", desc: "cache: serve_stale bad duration 1x", block: vnetRoot},
	{plugin: "cache", opt: "serve_stale", op: "set", with: "serve_stale 3600s verify now", desc: "cache: serve_stale with three values", block: vnetRoot},
	{plugin: "cache", opt: "serve_stale", op: "set", with: "serve_stale 0s verify", desc: "cache: serve_stale 0s", block: vnetRoot},
	{plugin: "cache", opt: "servfail", op: "set", with: "servfail", desc: "cache: servfail without a value", block: vnetRoot},
	{plugin: "cache", opt: "servfail", op: "set", with: "servfail 10m", desc: "cache: servfail over 5 minutes", block: vnetRoot},
	{plugin: "cache", opt: "servfail", op: "set", with: "servfail -1s", desc: "cache: servfail negative", block: vnetRoot},
	{plugin: "cache", opt: "servfail", op: "set", with: "servfail 5", desc: "cache: servfail without a unit", block: vnetRoot},
	{plugin: "cache", opt: "servfail", op: "set", with: "servfail 301s", desc: "cache: servfail 301s (just over 5 minutes)", block: vnetRoot},
	{plugin: "cache", opt: "servfail", op: "set", with: "servfail 0 0", desc: "cache: servfail with two values", block: vnetRoot},
	{plugin: "cache", op: "twice", desc: "cache: the whole stanza twice", block: vnetRoot},
	{plugin: "cache", op: "add", with: "prefetch -1", desc: "cache: prefetch -1", block: vnetRoot},
	{plugin: "cache", op: "add", with: "prefetch", desc: "cache: prefetch without a value", block: vnetRoot},
	{plugin: "cache", op: "add", with: "prefetch 10 1m 95%", desc: "cache: prefetch percentage 95% (over 90)", block: vnetRoot},
	{plugin: "cache", op: "add", with: "prefetch 10 1m 50", desc: "cache: prefetch percentage without %", block: vnetRoot},
	{plugin: "cache", op: "add", with: "prefetch 10 1x", desc: "cache: prefetch bad duration", block: vnetRoot},
	{plugin: "cache", op: "add", with: "keepttl 5", desc: "cache: keepttl with a value", block: vnetRoot},
	{plugin: "cache", op: "add", with: "disable", desc: "cache: disable without a value", block: vnetRoot},
	{plugin: "cache", op: "add", with: "disable everything", desc: "cache: disable unknown type", block: vnetRoot},
	{plugin: "cache", op: "add", with: "max_ttl 30", desc: "cache: unknown option max_ttl", block: vnetRoot},
	{plugin: "cache", op: "add", with: "succes 9984", desc: "cache: misspelt option succes", block: kubeRoot},
	{plugin: "cache", op: "add", with: "prefer_udp", desc: "cache: forward's option prefer_udp", block: vnetRoot},
	{plugin: "cache", op: "add", with: "ttl 5", desc: "cache: hosts's option ttl", block: kubeRoot},

	// hosts
	{plugin: "hosts", op: "twice", desc: "hosts: the whole stanza twice", block: kubeRoot},
	{plugin: "hosts", op: "set", with: "hosts {", desc: "hosts: no file (/etc/hosts)", block: vnetRoot},
	{plugin: "hosts", op: "set", with: "hosts /etc/localdns/hosts cluster..local {", desc: "hosts: extra argument not a domain name", block: vnetRoot},
	{plugin: "hosts", op: "set", with: "hosts /etc/localdns/hosts example.com {", desc: "hosts: extra argument (a zone)", block: vnetRoot},
	{plugin: "hosts", opt: "ttl", op: "set", with: "ttl", desc: "hosts: ttl without a value", block: vnetRoot},
	{plugin: "hosts", opt: "ttl", op: "set", with: "ttl 0", desc: "hosts: ttl 0", block: vnetRoot},
	{plugin: "hosts", opt: "ttl", op: "set", with: "ttl 65536", desc: "hosts: ttl 65536 (over 65535)", block: vnetRoot},
	{plugin: "hosts", opt: "ttl", op: "set", with: "ttl -5", desc: "hosts: ttl -5", block: vnetRoot},
	{plugin: "hosts", opt: "ttl", op: "set", with: "ttl 5s", desc: "hosts: ttl as a duration", block: vnetRoot},
	{plugin: "hosts", opt: "ttl", op: "set", with: "ttl 5 10", desc: "hosts: ttl with two values", block: vnetRoot},
	{plugin: "hosts", opt: "reload", op: "set", with: "reload", desc: "hosts: reload without a value", block: vnetRoot},
	{plugin: "hosts", opt: "reload", op: "set", with: "reload 5", desc: "hosts: reload without a unit", block: vnetRoot},
	{plugin: "hosts", opt: "reload", op: "set", with: "reload -5s", desc: "hosts: reload negative", block: vnetRoot},
	{plugin: "hosts", opt: "reload", op: "set", with: "reload 5s 10s", desc: "hosts: reload with two values", block: vnetRoot},
	{plugin: "hosts", opt: "fallthrough", op: "add", with: "refresh 5s", desc: "hosts: unknown option refresh after fallthrough", block: vnetRoot},
	{plugin: "hosts", opt: "ttl", op: "before", with: "refresh 5s", desc: "hosts: unknown option refresh before fallthrough", block: vnetRoot},
	{plugin: "hosts", opt: "fallthrough", op: "add", with: "prefer_udp", desc: "hosts: forward's option prefer_udp after fallthrough", block: kubeRoot},
	{plugin: "hosts", opt: "fallthrough", op: "add", with: "ttl", desc: "hosts: second ttl without a value", block: kubeRoot},
	{plugin: "hosts", opt: "fallthrough", op: "set", with: "fallthrough cluster..local", desc: "hosts: fallthrough zone not a domain name", block: vnetRoot},

	// template
	{plugin: "template", op: "twice", desc: "template: the whole stanza twice", block: kubeRoot},
	{plugin: "template", op: "set", with: "template {", desc: "template: no class and type", block: vnetRoot},
	{plugin: "template", op: "set", with: "template ANY {", desc: "template: no type", block: vnetRoot},
	{plugin: "template", op: "set", with: "template FOO ANY internal.cloudapp.net {", desc: "template: unknown class FOO", block: vnetRoot},
	{plugin: "template", op: "set", with: "template ANY FOO internal.cloudapp.net {", desc: "template: unknown type FOO", block: vnetRoot},
	{plugin: "template", op: "set", with: "template any any internal.cloudapp.net {", desc: "template: class and type in lower case", block: vnetRoot},
	{plugin: "template", op: "set", with: "template ANY ANY internal..cloudapp.net {", desc: "template: zone not a domain name", block: vnetRoot},
	{plugin: "template", opt: "match", op: "set", with: "match", desc: "template: match without a value", block: vnetRoot},
	{plugin: "template", opt: "match", op: "set", with: `match "^(?:[^.]+\.{4,}internal\.cloudapp\.net\.$"`, desc: "template: match regex with an unclosed (", block: vnetRoot},
	{plugin: "template", opt: "match", op: "set", with: `match "^(?:[^.]+\.){4,}internal\.cloudapp\.net\.$`, desc: "template: match with an unclosed quote", block: vnetRoot},
	{plugin: "template", opt: "rcode", op: "set", with: "rcode", desc: "template: rcode without a value", block: vnetRoot},
	{plugin: "template", opt: "rcode", op: "set", with: "rcode nxdomain", desc: "template: rcode in lower case", block: vnetRoot},
	{plugin: "template", opt: "rcode", op: "set", with: "rcode NOSUCHNAME", desc: "template: unknown rcode", block: vnetRoot},
	{plugin: "template", opt: "rcode", op: "set", with: "rcode NXDOMAIN SERVFAIL", desc: "template: rcode with two values", block: vnetRoot},
	{plugin: "template", opt: "rcode", op: "set", with: "rcode 3", desc: "template: rcode as a number", block: kubeRoot},
	{plugin: "template", opt: "fallthrough", op: "set", with: "fallthrough cluster..local", desc: "template: fallthrough zone not a domain name", block: vnetRoot},
	{plugin: "template", op: "add", with: "answer", desc: "template: answer without a value", block: vnetRoot},
	{plugin: "template", op: "add", with: `answer "{{ .Name"`, desc: "template: answer not a Go template", block: vnetRoot},
	{plugin: "template", op: "add", with: `answer "{{ .Name }} 60 IN A 10.0.0.300"`, desc: "template: answer not a record (invalid IP)", block: vnetRoot},
	{plugin: "template", op: "add", with: `answer "{{ .Nmae }} 60 IN A 192.0.2.1"`, desc: "template: answer with an unknown field .Nmae", block: vnetRoot},
	{plugin: "template", op: "add", with: "ederror", desc: "template: ederror without a value", block: vnetRoot},
	{plugin: "template", op: "add", with: "ederror abc", desc: "template: ederror not a number", block: vnetRoot},
	{plugin: "template", op: "add", with: "ederror 70000", desc: "template: ederror over 16 bits", block: vnetRoot},
	{plugin: "template", op: "add", with: "ttl 30", desc: "template: unknown option ttl", block: vnetRoot},
	{plugin: "template", op: "add", with: "prefer_udp", desc: "template: forward's option prefer_udp", block: kubeRoot},
	{plugin: "template", op: "add", with: "mtach \"^x$\"", desc: "template: misspelt option mtach", block: kubeRoot},

	// nsid
	{plugin: "nsid", op: "set", with: "nsid localdns {\nfoo\n}", desc: "nsid: a block", block: vnetRoot},
	{plugin: "nsid", op: "set", with: "nsid localdns\nnsid again", desc: "nsid: twice", block: vnetRoot},

	// whoami
	{plugin: "whoami", op: "twice", desc: "whoami: twice", block: hcBlock},
	{plugin: "whoami", op: "set", with: "whoami extra", desc: "whoami: an argument", block: hcBlock},
	{plugin: "whoami", op: "set", with: "whoami {\n}", desc: "whoami: an empty block", block: hcBlock},
	{plugin: "whoami", op: "set", with: "whoami {\nfoo\n}", desc: "whoami: a block with an option", block: hcBlock},

	// log
	{plugin: "log", op: "twice", desc: "log: twice", block: vnetRoot},
	{plugin: "log", op: "set", with: "log {\nclass bogus\n}", desc: "log: unknown class", block: vnetRoot},
	{plugin: "log", op: "set", with: "log {\nclass\n}", desc: "log: class without a value", block: vnetRoot},
	{plugin: "log", op: "set", with: "log {\nformat combined\n}", desc: "log: unknown option format", block: vnetRoot},
	{plugin: "log", op: "set", with: "log {\nprefer_udp\n}", desc: "log: forward's option prefer_udp", block: vnetRoot},

	// errors
	{plugin: "errors", op: "set", with: "errors stderr", desc: "errors: log file stderr (only stdout)", block: kubeRoot},
	{plugin: "errors", op: "set", with: "errors stdout extra", desc: "errors: two arguments", block: kubeRoot},
	{plugin: "errors", op: "set", with: "errors {\nconsolidate 5x ^timeout\n}", desc: "errors: consolidate bad duration", block: kubeRoot},
	{plugin: "errors", op: "set", with: "errors {\nconsolidate 5m\n}", desc: "errors: consolidate without a pattern", block: kubeRoot},
	{plugin: "errors", op: "set", with: "errors {\nconsolidate 5m ^timeout fatal\n}", desc: "errors: consolidate unknown level fatal", block: kubeRoot},
	{plugin: "errors", op: "set", with: "errors {\nconsolidate 5m (\n}", desc: "errors: consolidate bad regex", block: kubeRoot},
	{plugin: "errors", op: "set", with: "errors {\nstack\n}", desc: "errors: unknown option stack", block: kubeRoot},
	{plugin: "errors", op: "set", with: "errors\nerrors", desc: "errors: twice", block: kubeRoot},

	// ready
	{plugin: "ready", op: "set", with: "ready 169.254.10.10", desc: "ready: address without a port", block: vnetRoot},
	{plugin: "ready", op: "set", with: "ready 169.254.10.10:99999", desc: "ready: port 99999", block: vnetRoot},
	{plugin: "ready", op: "set", with: "ready 169.254.10.300:8181", desc: "ready: invalid IP", block: vnetRoot},
	{plugin: "ready", op: "set", with: "ready 169.254.10.12:8181", desc: "ready: address on no link", block: vnetRoot},
	{plugin: "ready", op: "set", with: "ready 169.254.10.10:8181 extra", desc: "ready: extra argument", block: vnetRoot},
	{plugin: "ready", op: "set", with: "ready 169.254.10.10:8181 {\nmonitor sometimes\n}", desc: "ready: unknown monitor type", block: vnetRoot},
	{plugin: "ready", op: "set", with: "ready 169.254.10.10:8181 {\nmonitor\n}", desc: "ready: monitor without a value", block: vnetRoot},
	{plugin: "ready", op: "set", with: "ready 169.254.10.10:8181 {\nfoo\n}", desc: "ready: unknown option foo", block: vnetRoot},
	{plugin: "ready", op: "set", with: "ready :8181", desc: "ready: :8181 beside 169.254.10.11:8181", block: vnetRoot},
	{plugin: "ready", op: "set", with: "ready 169.254.10.10:9253", desc: "ready: on prometheus's port 9253", block: vnetRoot},
	{plugin: "ready", op: "set", with: "ready 169.254.10.10:8182", desc: "ready: a second port on .10 (8182)", block: vnetLocal},

	// loop
	{plugin: "loop", op: "set", with: "loop extra", desc: "loop: an argument", block: vnetRoot},
	{plugin: "loop", op: "set", with: "loop {\n}", desc: "loop: an empty block", block: vnetRoot},

	// prometheus
	{plugin: "prometheus", op: "set", with: "prometheus 9253", desc: "prometheus: port without :", block: vnetRoot},
	{plugin: "prometheus", op: "set", with: "prometheus :99999", desc: "prometheus: port 99999", block: vnetRoot},
	{plugin: "prometheus", op: "set", with: "prometheus 169.254.10.300:9253", desc: "prometheus: invalid IP", block: vnetRoot},
	{plugin: "prometheus", op: "set", with: "prometheus :9253 extra", desc: "prometheus: extra argument", block: vnetRoot},
	{plugin: "prometheus", op: "set", with: "prometheus :9253 {\nfoo\n}", desc: "prometheus: a block", block: vnetRoot},
	{plugin: "prometheus", op: "set", with: "prometheus 127.0.0.1:9253", desc: "prometheus: 127.0.0.1:9253 beside :9253", block: vnetRoot},
	{plugin: "prometheus", op: "set", with: "prometheus :8181", desc: "prometheus: on ready's port 8181", block: vnetRoot},

	// server block keys
	{plugin: "key", op: "set", with: "cluster.local:99999 {", desc: "key: port 99999", block: vnetLocal},
	{plugin: "key", op: "set", with: "cluster.local:abc {", desc: "key: port not a number", block: vnetLocal},
	{plugin: "key", op: "set", with: "cluster..local:53 {", desc: "key: not a domain name", block: vnetLocal},
	{plugin: "key", op: "set", with: ".:53 {", desc: "key: cluster.local block becomes a second .:53 on .10", block: vnetLocal},
	{plugin: "key", op: "set", with: "cluster.local:53 cluster.local:53 {", desc: "key: the same key twice", block: vnetLocal},
	{plugin: "key", op: "set", with: "tls://cluster.local:53 {", desc: "key: tls:// without a tls plugin", block: vnetLocal},
	{plugin: "key", op: "set", with: "https://cluster.local:53 {", desc: "key: https:// without a tls plugin", block: kubeLocal},
	{plugin: "key", op: "set", with: "udp://cluster.local:53 {", desc: "key: unknown transport udp://", block: kubeLocal},
	{plugin: "key", op: "set", with: "cluster.local:53, {", desc: "key: trailing comma", block: vnetLocal},
	{plugin: "key", op: "set", with: "health-check.localdns.local:53 {", desc: "key: testdomain456 block becomes a second health-check block", block: "testdomain456"},
	{plugin: "key", op: "set", with: "10.0.0.0/33:53 {", desc: "key: invalid reverse CIDR", block: vnetLocal},
	{plugin: "key", op: "set", with: ".:-1 {", desc: "key: port -1", block: kubeRoot},
}

// validEdits are edits CoreDNS 1.13.1 accepts: other valid values and
// options, comments, more plugins and blocks. They keep the accepted side
// of the comparison exercised.
var validEdits = []edit{
	{plugin: "forward", opt: "policy", op: "set", with: "policy random", desc: "forward: policy random", block: vnetRoot},
	{plugin: "forward", opt: "policy", op: "set", with: "policy round_robin", desc: "forward: policy round_robin", block: kubeRoot},
	{plugin: "forward", opt: "policy", op: "set", with: "# policy sequential", desc: "forward: policy commented out", block: vnetRoot},
	{plugin: "forward", opt: "max_concurrent", op: "set", with: "max_concurrent 0", desc: "forward: max_concurrent 0", block: vnetRoot},
	{plugin: "forward", op: "add", with: "expire 10s", desc: "forward: expire 10s", block: vnetRoot},
	{plugin: "forward", op: "add", with: "max_fails 3", desc: "forward: max_fails 3", block: vnetRoot},
	{plugin: "forward", op: "add", with: "health_check 5s", desc: "forward: health_check 5s", block: vnetRoot},
	{plugin: "forward", op: "add", with: "health_check 5s no_rec domain example.com", desc: "forward: health_check with no_rec and domain", block: kubeRoot},
	{plugin: "forward", op: "add", with: "except example.com example.net", desc: "forward: except two zones", block: vnetRoot},
	{plugin: "forward", op: "add", with: "failfast_all_unhealthy_upstreams", desc: "forward: failfast_all_unhealthy_upstreams", block: kubeRoot},
	{plugin: "forward", op: "add", with: "next NXDOMAIN", desc: "forward: next NXDOMAIN", block: vnetRoot},
	{plugin: "forward", op: "add", with: "failover SERVFAIL REFUSED", desc: "forward: failover SERVFAIL REFUSED", block: vnetRoot},
	{plugin: "forward", op: "set", with: "forward . 168.63.129.16 168.63.129.17 {", desc: "forward: two TOs", block: vnetRoot},
	{plugin: "forward", op: "set", with: "forward . 10.0.0.10:5353 {", desc: "forward: TO with port 5353", block: kubeRoot},
	{plugin: "forward", op: "set", with: "forward . dns://168.63.129.16 {", desc: "forward: dns:// TO", block: vnetRoot},
	{plugin: "forward", op: "set", with: "forward . tls://168.63.129.16 {", desc: "forward: tls:// TO", block: vnetRoot},
	{plugin: "forward", op: "set", with: "forward . /etc/resolv.conf {", desc: "forward: TO /etc/resolv.conf", block: vnetRoot},
	{plugin: "forward", op: "set", with: "forward cluster.local 10.0.0.10 {", desc: "forward: FROM the block's zone", block: vnetLocal},
	{plugin: "loop", op: "add", with: "forward example.com 10.0.0.10", desc: "forward: a second stanza for example.com", block: kubeRoot},
	{plugin: "cache", op: "set", with: "cache 30 {", desc: "cache: TTL 30", block: vnetRoot},
	{plugin: "cache", op: "set", with: "cache 2147483647 {", desc: "cache: TTL 2^31-1 s", block: kubeRoot},
	{plugin: "cache", opt: "servfail", op: "set", with: "servfail 5m", desc: "cache: servfail 5m (the most allowed)", block: kubeRoot},
	{plugin: "cache", op: "set", with: "cache {", desc: "cache: no TTL", block: vnetRoot},
	{plugin: "cache", op: "set", with: "cache 3600 example.com {", desc: "cache: TTL and a zone", block: vnetRoot},
	{plugin: "cache", op: "block", with: "cache 3600", desc: "cache: no block", block: vnetLocal},
	{plugin: "cache", opt: "success", op: "set", with: "success 5000 60 10", desc: "cache: success capacity, TTL, min TTL", block: vnetRoot},
	{plugin: "cache", opt: "denial", op: "set", with: "denial 1000 30 5", desc: "cache: denial capacity, TTL, min TTL", block: vnetRoot},
	{plugin: "cache", opt: "serve_stale", op: "set", with: "serve_stale", desc: "cache: serve_stale without a value", block: vnetRoot},
	{plugin: "cache", opt: "serve_stale", op: "set", with: "serve_stale 1h VeRiFy", desc: "cache: serve_stale 1h mode in mixed case", block: kubeRoot},
	{plugin: "cache", op: "add", with: "prefetch 10 1m 10%", desc: "cache: prefetch 10 1m 10%", block: vnetRoot},
	{plugin: "cache", op: "add", with: "keepttl", desc: "cache: keepttl", block: vnetRoot},
	{plugin: "cache", op: "add", with: "disable success example.com", desc: "cache: disable success example.com", block: vnetRoot},
	{plugin: "hosts", opt: "ttl", op: "set", with: "ttl 30", desc: "hosts: ttl 30", block: vnetRoot},
	{plugin: "hosts", opt: "ttl", op: "set", with: "ttl 65535", desc: "hosts: ttl 65535 (the most allowed)", block: kubeRoot},
	{plugin: "hosts", opt: "reload", op: "set", with: "reload 0", desc: "hosts: reload 0", block: vnetRoot},
	{plugin: "hosts", opt: "fallthrough", op: "add", with: "no_reverse", desc: "hosts: no_reverse", block: vnetRoot},
	{plugin: "hosts", opt: "ttl", op: "before", with: "192.0.2.1 example.test", desc: "hosts: an inline entry", block: vnetRoot},
	{plugin: "hosts", opt: "fallthrough", op: "set", with: "fallthrough in-addr.arpa ip6.arpa", desc: "hosts: fallthrough for reverse zones", block: kubeRoot},
	{plugin: "template", opt: "rcode", op: "set", with: "rcode SERVFAIL", desc: "template: rcode SERVFAIL", block: vnetRoot},
	{plugin: "template", op: "add", with: "ederror 15 blocked", desc: "template: ederror 15 blocked", block: vnetRoot},
	{plugin: "template", op: "before", with: "template IN A example.test {\nanswer \"{{ .Name }} 60 IN A 192.0.2.1\"\n}", desc: "template: another stanza with an answer", block: kubeRoot},
	{plugin: "nsid", op: "set", with: "nsid", desc: "nsid: no argument (host name)", block: vnetRoot},
	{plugin: "log", op: "set", with: "log . {combined}", desc: "log: combined format", block: vnetRoot},
	{plugin: "log", op: "set", with: "log {\nclass denial error\n}", desc: "log: class denial error", block: vnetRoot},
	{plugin: "errors", op: "set", with: "errors stdout", desc: "errors: stdout", block: kubeRoot},
	{plugin: "errors", op: "set", with: "errors {\nconsolidate 5m \"^timeout\" warning\n}", desc: "errors: consolidate", block: kubeRoot},
	{plugin: "ready", op: "set", with: "ready", desc: "ready: no argument (:8181)", file: "agentbaker-no-hosts.corefile", block: kubeRoot},
	{plugin: "prometheus", op: "set", with: "prometheus", desc: "prometheus: no argument (localhost:9153)", block: kubeLocal},
	{plugin: "bind", op: "set", with: "bind lo", desc: "bind: interface name lo", block: vnetRoot},
	{plugin: "bind", op: "set", with: "bind 169.254.10.10 ::1", desc: "bind: another address ::1", block: vnetRoot},
	{plugin: "bind", op: "set", with: "bind 169.254.10.10 169.254.10.11 127.0.0.1 {\nexcept 127.0.0.1\n}", desc: "bind: except", block: hcBlock},
	{plugin: "bind", op: "set", with: "bind \"169.254.10.10\"", desc: "bind: quoted address", block: vnetRoot},
	{plugin: "key", op: "set", with: "dns://.:53 {", desc: "key: dns:// prefix", block: vnetRoot},
	{plugin: "key", op: "set", with: "cluster.local {", desc: "key: no port", block: vnetLocal},
	{plugin: "key", op: "set", with: "Cluster.Local.:53 {", desc: "key: mixed case, trailing dot", block: kubeLocal},
	{plugin: "key", op: "set", with: "cluster.local:53 svc.cluster.local:53 {", desc: "key: two zones", block: kubeLocal},
	{plugin: "key", op: "set", with: "cluster.local:5353 {", desc: "key: port 5353", block: vnetLocal},
	{plugin: "key", op: "set", with: "testdomain567.com:53 10.in-addr.arpa:53 {", desc: "key: a reverse zone too", block: override},
	{plugin: "key", op: "add", with: "# comment after the key", desc: "comment: after a block key", block: vnetRoot},
	{plugin: "forward", op: "add", with: "# comment in forward's block", desc: "comment: in forward's block", block: vnetRoot},
	{plugin: "loop", op: "set", with: "loop # detect forwarding loops", desc: "comment: at the end of a line", block: vnetRoot},
	{plugin: "cache", opt: "success", op: "set", with: "success 9984 # entries", desc: "comment: at the end of an option line", block: kubeRoot},
	{plugin: "bind", op: "set", with: "bind    169.254.10.10   ", desc: "extra spaces between and after arguments", block: vnetRoot},
	{plugin: "loop", op: "add", with: "health :8080", desc: "plugin: health :8080", block: vnetRoot},
	{plugin: "loop", op: "add", with: "bufsize 1232", desc: "plugin: bufsize 1232", block: vnetRoot},
	{plugin: "loop", op: "add", with: "reload 30s", desc: "plugin: reload 30s", block: kubeRoot},
	{plugin: "loop", op: "add", with: "rewrite name exact a.example.com b.example.com", desc: "plugin: rewrite", block: vnetRoot},
	{plugin: "prometheus", op: "add", with: "}\nexample.org:53 {\nbind 169.254.10.11\nforward . 10.0.0.10\n", desc: "block: a new example.org block on .11", block: override},
	{plugin: "prometheus", op: "add", with: "}\n(common) {\nloop\n", desc: "snippet defined and not used", block: override},
}
