package journald

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dnsstandby/dnsstandby/internal/gendoc"
)

// testOptions log every level, without the time, so that two handlers'
// lines of one record compare equal.
var testOptions = &slog.HandlerOptions{
	Level: slog.LevelDebug - 4,
	ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) == 0 && a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	},
}

func jsonHandler(w io.Writer) slog.Handler { return slog.NewJSONHandler(w, testOptions) }

func textHandler(w io.Writer) slog.Handler { return slog.NewTextHandler(w, testOptions) }

// TestPrefix: each record's line starts with its level's priority, in
// both formats, through derived handlers too, and is otherwise the line
// the plain handler writes.
func TestPrefix(t *testing.T) {
	for _, format := range []struct {
		name  string
		inner func(io.Writer) slog.Handler
	}{{"json", jsonHandler}, {"text", textHandler}} {
		for _, tc := range []struct {
			level slog.Level
			want  string
		}{
			{slog.LevelError + 4, "<3>"},
			{slog.LevelError, "<3>"},
			{slog.LevelWarn + 2, "<4>"},
			{slog.LevelWarn, "<4>"},
			{slog.LevelInfo, "<6>"},
			{slog.LevelDebug, "<7>"},
			{slog.LevelDebug - 4, "<7>"},
		} {
			var got, plain bytes.Buffer
			log := slog.New(NewHandler(&got, format.inner)).With("component", "x").WithGroup("g")
			ref := slog.New(format.inner(&plain)).With("component", "x").WithGroup("g")
			log.Log(t.Context(), tc.level, "event", "k", 1)
			ref.Log(t.Context(), tc.level, "event", "k", 1)
			if line, ok := strings.CutPrefix(got.String(), tc.want); !ok || line != plain.String() || plain.Len() == 0 {
				t.Errorf("%s %v: got %q, want %q then %q", format.name, tc.level, got.String(), tc.want, plain.String())
			}
		}
	}
}

// TestPrefixConcurrent: records of every level logged at once each get
// their own prefix, one whole line per Write.
func TestPrefixConcurrent(t *testing.T) {
	var out lockedBuffer
	log := slog.New(NewHandler(&out, jsonHandler))
	levels := []slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn, slog.LevelError}
	var wg sync.WaitGroup
	for _, l := range levels {
		wg.Go(func() {
			sub := log.With("from", l.String())
			for i := range 200 {
				sub.Log(t.Context(), l, "event", "i", i)
			}
		})
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 200*len(levels) {
		t.Fatalf("%d lines, want %d", len(lines), 200*len(levels))
	}
	for _, line := range lines {
		var level string
		for _, l := range levels {
			if strings.Contains(line, `"level":"`+l.String()+`"`) {
				level = l.String()
				if want := fmt.Sprintf("<%d>{", Priority(l)); !strings.HasPrefix(line, want) {
					t.Fatalf("line %q: want prefix %q", line, want)
				}
			}
		}
		if !strings.Contains(line, `"from":"`+level+`"`) {
			t.Fatalf("line %q mixes records", line)
		}
	}
}

// TestAllocs: the prefix costs no allocation per record.
func TestAllocs(t *testing.T) {
	plain := slog.New(jsonHandler(io.Discard)).With("component", "x")
	prefixed := slog.New(NewHandler(io.Discard, jsonHandler)).With("component", "x")
	run := func(l *slog.Logger) float64 {
		return testing.AllocsPerRun(200, func() { l.Warn("event", "n", 1, "s", "text") })
	}
	if p, j := run(plain), run(prefixed); j > p {
		t.Errorf("allocations per record: %v prefixed, %v plain", j, p)
	}
}

// TestConnected: JOURNAL_STREAM names the stream by device and inode;
// only a file that is that stream matches.
func TestConnected(t *testing.T) {
	open := func(name string) *os.File {
		f, err := os.Create(filepath.Join(t.TempDir(), name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	f, other := open("stream"), open("other")
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	closed := open("closed")
	closed.Close()
	for _, tc := range []struct {
		name   string
		stream string
		f      *os.File
		want   bool
	}{
		{"same device and inode", fmt.Sprintf("%d:%d", st.Dev, st.Ino), f, true},
		{"another file", fmt.Sprintf("%d:%d", st.Dev, st.Ino), other, false},
		{"another inode", fmt.Sprintf("%d:%d", st.Dev, st.Ino+1), f, false},
		{"another device", fmt.Sprintf("%d:%d", st.Dev+1, st.Ino), f, false},
		{"unset", "", f, false},
		{"malformed", "journal", f, false},
		{"one number", fmt.Sprint(st.Ino), f, false},
		{"closed file", fmt.Sprintf("%d:%d", st.Dev, st.Ino), closed, false},
		{"no file", fmt.Sprintf("%d:%d", st.Dev, st.Ino), nil, false},
	} {
		if got := Connected(tc.stream, tc.f); got != tc.want {
			t.Errorf("%s: Connected(%q) = %v, want %v", tc.name, tc.stream, got, tc.want)
		}
	}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

// TestPriorityDocs keeps docs/operating.md's table of priorities in step
// with Priority.
func TestPriorityDocs(t *testing.T) {
	names := [8]string{3: "err", 4: "warning", 6: "info", 7: "debug"}
	var b strings.Builder
	b.WriteString("| log level | prefix | journald priority (`journalctl -p`) |\n|---|---|---|\n")
	for _, l := range []slog.Level{slog.LevelError, slog.LevelWarn, slog.LevelInfo, slog.LevelDebug} {
		p := Priority(l)
		fmt.Fprintf(&b, "| %s | `<%d>` | %d, %s |\n", l, p, p, names[p])
	}
	gendoc.Check(t, filepath.Join("..", "..", "docs", "operating.md"), "journald-priorities", b.String())
}
