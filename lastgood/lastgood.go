// Package lastgood keeps the last LocalDNS configuration dnsstandby
// applied — the Corefile's server blocks, where they came from, their
// hash and when they were first applied — in the state directory, so
// that a dnsstandby that starts while the Corefile is missing or refused
// (the usual cause of a LocalDNS that never comes back) still serves as
// LocalDNS last did. It owns one file and its format; deciding when to
// use it is the daemon's.
package lastgood

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/dnsstandby/dnsstandby/corefile"
	"github.com/dnsstandby/dnsstandby/internal/atomicfile"
)

// FileName is the record's file in the state directory.
const FileName = "corefile.last-good.json"

// format is the version of the file's layout; a reader refuses others.
const format = 1

// maxSize bounds what is read: a Corefile is at most 16 MiB
// (corefile.ReadFrom), its tokens as JSON about three times that.
const maxSize = 64 << 20

// Record is one configuration as dnsstandby applied it.
type Record struct {
	Format int `json:"format"`
	// Applied is when dnsstandby first applied this content (by its
	// hash): its age says how old what it stands in for is.
	Applied time.Time `json:"applied"`
	// Source is the Corefile: its path (Source.File), hash and blocks.
	Source *corefile.Source `json:"source"`
}

// New returns the record of src, applied at t.
func New(src *corefile.Source, t time.Time) Record {
	return Record{Format: format, Applied: t.UTC().Round(0), Source: src}
}

// Path is the record's file in the state directory dir.
func Path(dir string) string { return filepath.Join(dir, FileName) }

// ErrNone is wrapped when dir holds no record.
var ErrNone = errors.New("no last known good configuration")

// Load reads the record in dir and checks it as a Corefile is checked for
// build (corefile.Build.Check), so that a file damaged on disk, or one a
// newer rule refuses, is never used.
func Load(dir string, build corefile.Build) (Record, error) {
	f, err := os.Open(Path(dir))
	if errors.Is(err, os.ErrNotExist) {
		return Record{}, fmt.Errorf("%w in %s", ErrNone, dir)
	}
	if err != nil {
		return Record{}, fmt.Errorf("last known good: %w", err)
	}
	defer f.Close()
	r, err := Decode(f, build)
	if err != nil {
		return Record{}, fmt.Errorf("last known good %s: %w", Path(dir), err)
	}
	return r, nil
}

// Decode reads a record written by Encode and checks it for build.
func Decode(rd io.Reader, build corefile.Build) (Record, error) {
	b, err := io.ReadAll(io.LimitReader(rd, maxSize+1))
	if err != nil {
		return Record{}, err
	}
	if len(b) > maxSize {
		return Record{}, fmt.Errorf("larger than %d bytes", maxSize)
	}
	var r Record
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return Record{}, fmt.Errorf("decode: %w", err)
	}
	switch {
	case r.Format != format:
		return Record{}, fmt.Errorf("format %d, want %d", r.Format, format)
	case r.Source == nil:
		return Record{}, errors.New("no Corefile in the record")
	case r.Applied.IsZero():
		return Record{}, errors.New("no time applied in the record")
	}
	if err := build.Check(r.Source); err != nil {
		return Record{}, fmt.Errorf("refused: %w", err)
	}
	return r, nil
}

// Encode writes r as JSON.
func Encode(w io.Writer, r Record) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", " ")
	return enc.Encode(r)
}

// Save writes r into dir atomically: a crash leaves the old record or
// the new one.
func Save(dir string, r Record) error {
	r.Format = format
	return atomicfile.Write(Path(dir), func(w io.Writer) error { return Encode(w, r) })
}
