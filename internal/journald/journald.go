// Package journald lets journald file each log line at its level. A
// service's stderr connected to the journal is a stream: journald takes
// a line's priority from a "<N>" prefix (sd-daemon(3)), and without one
// files every line at the unit's SyslogLevel= (info), so that
// `journalctl -p warning` finds nothing. Handler adds the prefix to every
// record of an slog handler; Connected says whether it is wanted.
package journald

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// StreamEnv is the variable systemd sets for a service whose stdout or
// stderr it connected to the journal: "DEVICE:INODE" of that stream.
const StreamEnv = "JOURNAL_STREAM"

// Connected reports whether f is the journal stream that stream (the value
// of JOURNAL_STREAM) names: systemd's documented test (systemd.exec(5)),
// for a variable inherited by a child whose stderr went elsewhere (a
// pipe, a terminal, a file) would otherwise put prefixes where nothing
// strips them.
func Connected(stream string, f *os.File) bool {
	if stream == "" || f == nil {
		return false
	}
	var dev, ino uint64
	if n, err := fmt.Sscanf(stream, "%d:%d", &dev, &ino); n != 2 || err != nil {
		return false
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return false
	}
	return uint64(st.Dev) == dev && st.Ino == ino
}

// Priority is the syslog priority journald files a record of level l at:
// ERROR and above 3 (err), WARN 4 (warning), INFO 6 (info), DEBUG and
// below 7 (debug); a level between two takes the lower one's.
func Priority(l slog.Level) int {
	switch {
	case l >= slog.LevelError:
		return 3
	case l >= slog.LevelWarn:
		return 4
	case l >= slog.LevelInfo:
		return 6
	}
	return 7
}

// prefixes are the "<N>" of each priority, made once.
var prefixes = [8]string{"<0>", "<1>", "<2>", "<3>", "<4>", "<5>", "<6>", "<7>"}

// NewHandler returns a handler that writes each record as the handler made
// by inner over its writer would, prefixed with the record's "<N>". inner
// is called once, with the writer the records go through (slog's JSON or
// text handler constructor, say); the handlers derived from the result
// (WithAttrs, WithGroup) share it. The prefix and the line go to w in one
// Write, as the line alone would, so lines of concurrent records do not
// interleave; no allocation is added per record.
func NewHandler(w io.Writer, inner func(io.Writer) slog.Handler) slog.Handler {
	pw := &prefixWriter{w: w}
	return &handler{inner: inner(pw), pw: pw}
}

// handler tells pw the level of the record inner is about to write.
type handler struct {
	inner slog.Handler // writes through pw
	pw    *prefixWriter
}

func (h *handler) Enabled(ctx context.Context, l slog.Level) bool { return h.inner.Enabled(ctx, l) }

func (h *handler) Handle(ctx context.Context, r slog.Record) error {
	// The lock spans the formatting too: slog formats outside its own
	// lock, so the level must not change under it. Log lines are events,
	// not per query: the serialized formatting costs nothing measurable.
	h.pw.mu.Lock()
	defer h.pw.mu.Unlock()
	h.pw.prefix = prefixes[Priority(r.Level)]
	return h.inner.Handle(ctx, r)
}

func (h *handler) WithAttrs(as []slog.Attr) slog.Handler {
	return &handler{inner: h.inner.WithAttrs(as), pw: h.pw}
}

func (h *handler) WithGroup(name string) slog.Handler {
	return &handler{inner: h.inner.WithGroup(name), pw: h.pw}
}

// maxKept bounds the buffer kept between lines; a line is a few hundred
// bytes.
const maxKept = 64 << 10

// prefixWriter writes each line after the prefix of the record being
// handled. Write is called only by a handler holding mu.
type prefixWriter struct {
	w io.Writer

	mu     sync.Mutex // guards the following, held by handler.Handle
	prefix string
	buf    []byte // reused: prefix and line, for one Write
}

func (p *prefixWriter) Write(line []byte) (int, error) {
	p.buf = append(append(p.buf[:0], p.prefix...), line...)
	_, err := p.w.Write(p.buf)
	if cap(p.buf) > maxKept {
		p.buf = nil // one huge line must not pin its buffer for good
	}
	if err != nil {
		return 0, err
	}
	return len(line), nil
}
