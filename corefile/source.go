package corefile

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/coredns/caddy/caddyfile"
)

// Source is a Corefile that CoreDNS would run, as its server blocks: the
// tokens of each block after imports, snippets and environment variables
// were expanded, with their places. It is plain data (it marshals to
// JSON), so that a configuration once applied can be kept and read again
// without the files it came from: Settings reads it for any listen
// addresses.
//
// Read and ReadFrom return a Source only for a Corefile that passes
// Check; a Source decoded from elsewhere must pass Check before use.
type Source struct {
	// File is the name the Corefile was read under.
	File string `json:"file"`
	// SHA256 is the hex SHA-256 of the main file's bytes, as read.
	SHA256 string `json:"sha256"`
	// Blocks are the server blocks in file order, snippets left out.
	Blocks []Block `json:"blocks"`
}

// Block is one server block of a Source.
type Block struct {
	Keys []string `json:"keys"`
	File string   `json:"file"` // file the keys are in (differs from Source.File for imports)
	Line int      `json:"line"` // line of the keys (of the first directive for imported blocks)
	// Directives maps each directive to all its tokens in the block, in
	// order, as the Caddyfile parser groups them.
	Directives map[string][]Token `json:"directives"`
}

// Token is one word of a Corefile and where it is.
type Token struct {
	File string `json:"file,omitempty"` // "" for the main file
	Line int    `json:"line"`
	Text string `json:"text"`
}

// Build is what one CoreDNS build accepts: its directives. The zero
// Build is CoreDNS 1.13.1's standard build (Directives); LocalDNS's own
// binary may have more or fewer (`coredns -plugins` lists them).
type Build struct {
	Directives []string // nil: Directives
	From       string   // where the list came from, for messages; "" for the standard build
}

func (b Build) directives() []string {
	if b.Directives == nil {
		return Directives
	}
	return b.Directives
}

// String says which build b is.
func (b Build) String() string {
	if b.From == "" {
		return fmt.Sprintf("CoreDNS 1.13.1's standard build (%d directives)", len(Directives))
	}
	return fmt.Sprintf("%s (%d directives)", b.From, len(b.directives()))
}

// Read reads the Corefile at path for the standard build.
func Read(path string) (*Source, error) { return Build{}.Read(path) }

// ReadFrom reads a Corefile from r for the standard build.
func ReadFrom(filename string, r io.Reader) (*Source, error) { return Build{}.ReadFrom(filename, r) }

// Check is Build{}.Check(s): s as the standard build checks it.
func (s *Source) Check() error { return Build{}.Check(s) }

// Read reads the Corefile at path: ReadFrom of its content.
func (b Build) Read(path string) (*Source, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("load corefile: %w", err)
	}
	defer f.Close()
	return b.ReadFrom(path, f)
}

// ReadFrom reads a Corefile from r as CoreDNS 1.13.1 reads its own: the
// Caddyfile parser CoreDNS is built with, the build's directive list, and
// Check of every server block. filename names the input in errors and is
// where relative `import` paths start from, as in CoreDNS.
//
// A Corefile that CoreDNS would refuse to start with gives an *Error
// (see Reason for what kind of refusal); one that cannot be read gives
// the reader's error.
func (b Build) ReadFrom(filename string, r io.Reader) (*Source, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxCorefileSize+1))
	if err != nil {
		return nil, &Error{File: filename, Err: fmt.Errorf("read: %w", err)}
	}
	if len(data) > maxCorefileSize {
		return nil, &Error{File: filename, Err: fmt.Errorf("larger than %d bytes", maxCorefileSize)}
	}
	blocks, err := caddyfile.Parse(filename, bytes.NewReader(data), b.directives())
	if err != nil {
		return nil, syntaxError(filename, err)
	}
	sum := sha256.Sum256(data)
	s := &Source{File: filename, SHA256: hex.EncodeToString(sum[:])}
	lines := keyLines(filename, data)
	for _, sb := range blocks {
		var (
			line int
			file string
		)
		line, file, lines = blockLine(sb, filename, lines)
		s.Blocks = append(s.Blocks, newBlock(filename, sb, file, line))
	}
	if err := b.Check(s); err != nil {
		return nil, err
	}
	return s, nil
}

// newBlock copies a parsed server block, its tokens' file names relative
// to the main file ("" when the same).
func newBlock(filename string, b caddyfile.ServerBlock, file string, line int) Block {
	out := Block{Keys: slices.Clone(b.Keys), Line: line, Directives: make(map[string][]Token, len(b.Tokens))}
	if file != filename {
		out.File = file
	}
	for name, toks := range b.Tokens {
		ts := make([]Token, len(toks))
		for i, t := range toks {
			ts[i] = Token{Line: t.Line, Text: t.Text}
			if t.File != filename {
				ts[i].File = t.File
			}
		}
		out.Directives[name] = ts
	}
	return out
}

// file is the name of the file b's keys are in.
func (b *Block) file(main string) string { return cmp.Or(b.File, main) }

// tokens returns the caddyfile tokens of directive name in b.
func (b *Block) tokens(main, name string) []caddyfile.Token {
	ts := b.Directives[name]
	if len(ts) == 0 {
		return nil
	}
	out := make([]caddyfile.Token, len(ts))
	for i, t := range ts {
		out[i] = caddyfile.Token{File: cmp.Or(t.File, main), Line: t.Line, Text: t.Text}
	}
	return out
}

// Check says whether the build would start with s, as far as the
// Corefile decides it: every directive known to the build, every server
// block key valid, no zone served twice on one address and port, and
// every plugin's arguments as its setup accepts them, in every block —
// a block dnsstandby never serves included, since CoreDNS refuses the
// whole file for it. What this package does differently, and why, is in
// its README. The error is an *Error naming the place.
func (bd Build) Check(s *Source) error {
	if s == nil {
		return &Error{Err: fmt.Errorf("no Corefile")}
	}
	var notes []Note // Settings makes the notes of the blocks it takes
	p := parser{file: s.File, notes: &notes}
	var all []blockZones
	for i := range s.Blocks {
		b := &s.Blocks[i]
		if len(b.Keys) == 0 {
			return &Error{File: b.file(s.File), Line: b.Line, Kind: KindServerBlock, Err: fmt.Errorf("server block without keys")}
		}
		for name, toks := range b.Directives {
			if !slices.Contains(bd.directives(), name) {
				return &Error{File: b.file(s.File), Line: b.Line, Kind: KindDirective, Err: fmt.Errorf("unknown directive '%s'", name)}
			}
			// As the Caddyfile parser groups them; only a Source made
			// elsewhere can differ.
			if len(toks) == 0 || toks[0].Text != name {
				return &Error{File: b.file(s.File), Line: b.Line, Kind: KindSyntax, Err: fmt.Errorf("the tokens of directive %s do not start with it", name)}
			}
		}
		h, err := p.readHead(s.File, b)
		if err != nil {
			return err
		}
		if _, err := p.plugins(s.File, b, h); err != nil {
			return err
		}
		_, view := b.Directives["view"]
		all = append(all, blockZones{head: h, view: view, file: b.file(s.File), line: b.Line})
	}
	return checkAddresses(all)
}
