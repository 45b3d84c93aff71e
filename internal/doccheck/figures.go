// Package doccheck holds the repository's documents to the tree and to
// each other, for its tests (`make docs-check`, and `make test`):
//
//   - a measured figure — how long `make lab`, one lab scenario or `make
//     test` takes, the front page's crash-storm table — is stated in one
//     document only, and others link to it (Figures, Conflicts);
//   - docs/architecture.md's package table names every package of the
//     module, no other, and the imports it forbids are not made
//     (PackageTable, against `go list`).
package doccheck

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// A Statement is one figure as one document states it.
type Statement struct {
	Figure string // what is measured, e.g. "how long `make lab` takes"
	Value  string // as stated, normalised
	File   string
	Line   int
}

func (s Statement) String() string {
	return fmt.Sprintf("%s:%d: %s", s.File, s.Line, s.Value)
}

// The things whose duration a document may state, each with what names
// it. The first that matches a stretch of text wins, so the narrower
// subjects come first (`make lab SCENARIO=x` before `make lab`).
var subjects = []struct {
	figure string
	re     *regexp.Regexp
}{
	{"how long one lab scenario takes", regexp.MustCompile(`make lab SCENARIO=|(?i)\b(one|a single|each) (lab )?scenario\b`)},
	{"how long `make lab` takes", regexp.MustCompile("make lab`?|(?i)every scenario|full `?make lab")},
	{"how long `make test` takes", regexp.MustCompile(`make test|\.ci/run`)},
	{"how long building CoreDNS takes", regexp.MustCompile(`bin/coredns|(?i)CoreDNS build`)},
	{"how long `make bench-peers` takes", regexp.MustCompile(`bench-peers`)},
	{"how long `make bench-mirror` takes", regexp.MustCompile(`bench-mirror`)},
}

// A duration in minutes: "about 15 minutes", "about 2–3 minutes",
// "13 min 9 s".
var minutes = regexp.MustCompile(`\b(\d+(?:\s*[–-]\s*\d+)?)\s*(?:minutes?|min)\b(?:\s+(\d+)\s*s\b)?`)

// The front page's headline table is the one whose header has this
// column; its rows are told apart by these words in their first cell.
const headlineColumn = "answered on the first try"

var headlineRows = []struct{ key, word string }{
	{"PR 9439 and dnsstandby", "dnsstandby"},
	{"LocalDNS with PR 9439", "9439"},
	{"LocalDNS as shipped", "shipped"},
}

// Figures returns the statements of the tracked figures in one Markdown
// document: durations next to what they time, and the cells of a
// crash-storm headline table.
func Figures(file, text string) []Statement {
	var out []Statement
	for _, u := range units(text) {
		out = append(out, durations(file, u)...)
	}
	return append(out, headline(file, text)...)
}

// A unit is a stretch of text a figure and its subject must share: a
// sentence of a paragraph, a line of code, a table row.
type unit struct {
	text string
	line int // where it starts
}

var sentenceEnd = regexp.MustCompile(`[.;]\s+`)

func units(text string) []unit {
	var out []unit
	var para []string
	start := 0
	flush := func() {
		if len(para) == 0 {
			return
		}
		joined := strings.Join(para, " ")
		for _, s := range sentenceEnd.Split(joined, -1) {
			out = append(out, unit{s, start})
		}
		para = nil
	}
	for i, l := range strings.Split(text, "\n") {
		n := i + 1
		switch t := strings.TrimSpace(l); {
		case t == "":
			flush()
		case strings.HasPrefix(l, "    "), strings.HasPrefix(t, "|"), strings.HasPrefix(t, "```"):
			flush()
			out = append(out, unit{l, n})
		default:
			if len(para) == 0 {
				start = n
			}
			para = append(para, t)
		}
	}
	flush()
	return out
}

// durations gives each duration in u to the subject named nearest before
// it (or, when none is, after it).
func durations(file string, u unit) []Statement {
	type mention struct {
		at     int
		figure string
	}
	var ms []mention
	taken := make([]bool, len(u.text))
	for _, s := range subjects {
		for _, loc := range s.re.FindAllStringIndex(u.text, -1) {
			if taken[loc[0]] {
				continue
			}
			for i := loc[0]; i < loc[1]; i++ {
				taken[i] = true
			}
			ms = append(ms, mention{loc[0], s.figure})
		}
	}
	if len(ms) == 0 {
		return nil
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].at < ms[j].at })
	var out []Statement
	for _, m := range minutes.FindAllStringSubmatchIndex(u.text, -1) {
		subject := ms[0].figure
		for _, s := range ms {
			if s.at < m[0] {
				subject = s.figure
			}
		}
		v := strings.Join(strings.Fields(u.text[m[2]:m[3]]), "") + " min"
		if m[4] >= 0 {
			v += " " + u.text[m[4]:m[5]] + " s"
		}
		out = append(out, Statement{Figure: subject, Value: strings.ReplaceAll(v, "-", "–"), File: file, Line: u.line})
	}
	return out
}

func cells(row string) []string {
	row = strings.Trim(strings.TrimSpace(row), "|")
	c := strings.Split(row, "|")
	for i := range c {
		c[i] = strings.TrimSpace(c[i])
	}
	return c
}

func headline(file, text string) []Statement {
	var out []Statement
	var header []string
	for i, l := range strings.Split(text, "\n") {
		t := strings.TrimSpace(l)
		if !strings.HasPrefix(t, "|") {
			header = nil
			continue
		}
		c := cells(t)
		switch {
		case header == nil:
			header = c
			if !strings.Contains(strings.ToLower(t), headlineColumn) {
				header = []string{} // a table, but not the headline
			}
		case len(header) == 0, strings.HasPrefix(c[0], "-"):
		default:
			row := ""
			for _, r := range headlineRows {
				if strings.Contains(c[0], r.word) {
					row = r.key
					break
				}
			}
			if row == "" {
				continue
			}
			for j := 1; j < len(c) && j < len(header); j++ {
				out = append(out, Statement{
					Figure: fmt.Sprintf("crash-storm table, %s: %s", row, strings.ToLower(header[j])),
					Value:  c[j], File: file, Line: i + 1,
				})
			}
		}
	}
	return out
}

// Conflicts returns one line per figure that is stated in more than one
// document, or with more than one value: each is to be stated once, and
// linked to from elsewhere.
func Conflicts(stmts []Statement) []string {
	by := map[string][]Statement{}
	for _, s := range stmts {
		by[s.Figure] = append(by[s.Figure], s)
	}
	var out []string
	for fig, ss := range by {
		files, values := map[string]bool{}, map[string]bool{}
		for _, s := range ss {
			files[s.File] = true
			values[s.Value] = true
		}
		if len(files) == 1 && len(values) == 1 {
			continue
		}
		var where []string
		for _, s := range ss {
			where = append(where, s.String())
		}
		sort.Strings(where)
		out = append(out, fmt.Sprintf("%s is stated %d times (%d values, %d documents), where it should be stated once and linked: %s",
			fig, len(ss), len(values), len(files), strings.Join(where, "; ")))
	}
	sort.Strings(out)
	return out
}
