package dnstap

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	tap "github.com/dnstap/golang-dnstap"
	fs "github.com/farsightsec/golang-framestream"
	"github.com/miekg/dns"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/dnsstandby/dnsstandby/cache"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// TestRecords sends records of every kind through golang-framestream's
// writer (as CoreDNS does) into a real cache and counts them by result and
// reason.
func TestRecords(t *testing.T) {
	truncated := func(t testing.TB) []byte {
		m := new(dns.Msg)
		m.SetQuestion("big.example.com.", dns.TypeA)
		m.Response, m.Truncated = true, true
		return pack(t, m)
	}
	query := func(t testing.TB) []byte {
		m := new(dns.Msg)
		m.SetQuestion("q.example.com.", dns.TypeA)
		return pack(t, m)
	}
	noType := func(t testing.TB) []byte { // Dnstap.type is required
		typ := tap.Message_CLIENT_RESPONSE
		b, err := proto.MarshalOptions{AllowPartial: true}.Marshal(&tap.Dnstap{Message: &tap.Message{Type: &typ, ResponseMessage: reply(t, "x.example.com")}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	tests := []struct {
		name     string
		frames   func(t testing.TB) [][]byte
		sinkErr  error // a sink failing with this instead of a cache
		accepted uint64
		rejected map[string]uint64
	}{
		{name: "client response", accepted: 2, frames: func(t testing.TB) [][]byte {
			return [][]byte{tapFrame(t, tap.Message_CLIENT_RESPONSE, reply(t, "a.example.com")), tapFrame(t, tap.Message_CLIENT_RESPONSE, reply(t, "b.example.com"))}
		}},
		{name: "client query", rejected: map[string]uint64{ReasonNotClientResponse: 1}, frames: func(t testing.TB) [][]byte {
			return [][]byte{tapFrame(t, tap.Message_CLIENT_QUERY, nil)}
		}},
		{name: "auth response with a reply", rejected: map[string]uint64{ReasonNotClientResponse: 1}, frames: func(t testing.TB) [][]byte {
			return [][]byte{tapFrame(t, tap.Message_AUTH_RESPONSE, reply(t, "a.example.com"))}
		}},
		{name: "client response without full", rejected: map[string]uint64{ReasonNoResponseMessage: 1}, frames: func(t testing.TB) [][]byte {
			return [][]byte{tapFrame(t, tap.Message_CLIENT_RESPONSE, nil)}
		}},
		{name: "garbage protobuf", rejected: map[string]uint64{ReasonBadProtobuf: 2}, frames: func(t testing.TB) [][]byte {
			return [][]byte{[]byte("\xff\xff\xff\xff not a protobuf"), noType(t)}
		}},
		{name: "cache rejects", rejected: map[string]uint64{cache.ReasonTruncated.String(): 1, cache.ReasonNotResponse.String(): 1, cache.ReasonMalformed.String(): 1}, frames: func(t testing.TB) [][]byte {
			return [][]byte{
				tapFrame(t, tap.Message_CLIENT_RESPONSE, truncated(t)),
				tapFrame(t, tap.Message_CLIENT_RESPONSE, query(t)),
				tapFrame(t, tap.Message_CLIENT_RESPONSE, []byte{}), // present but empty
			}
		}},
		{name: "sink error", sinkErr: errors.New("full"), rejected: map[string]uint64{ReasonSinkError: 1}, frames: func(t testing.TB) [][]byte {
			return [][]byte{tapFrame(t, tap.Message_CLIENT_RESPONSE, reply(t, "a.example.com"))}
		}},
		{name: "wrapped reject error", sinkErr: fmtWrap(&cache.RejectError{Reason: cache.ReasonRcode}), rejected: map[string]uint64{"rcode": 1}, frames: func(t testing.TB) [][]byte {
			return [][]byte{tapFrame(t, tap.Message_CLIENT_RESPONSE, reply(t, "a.example.com"))}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCache(t)
			sink := c.Insert
			if tt.sinkErr != nil {
				sink = func([]byte) error { return tt.sinkErr }
			}
			r := listen(t, testConfig(t), sink)
			s := dialSender(t, r.Addr())
			s.send(t, tt.frames(t)...)
			s.stop(t)
			st := waitClosed(t, r, 1)

			if st.Disconnects["stop"] != 1 {
				t.Errorf("disconnects %v, want one stop", st.Disconnects)
			}
			if st.Accepted != tt.accepted {
				t.Errorf("accepted %d, want %d", st.Accepted, tt.accepted)
			}
			want := map[string]uint64{ReasonNotClientResponse: 0, ReasonNoResponseMessage: 0, ReasonBadProtobuf: 0, ReasonBadFrame: 0, ReasonSinkError: 0}
			maps.Copy(want, tt.rejected)
			if !maps.Equal(st.Rejected, want) {
				t.Errorf("rejected %v, want %v", st.Rejected, want)
			}
			if tt.sinkErr == nil && uint64(c.Len()) != tt.accepted {
				t.Errorf("cache holds %d entries, want %d", c.Len(), tt.accepted)
			}
		})
	}
}

func fmtWrap(err error) error { return errors.Join(errors.New("insert"), err) }

// TestBadStreams writes hand-made byte streams and checks that each ends
// its connection with the right cause, counts, and leaves the receiver
// serving.
func TestBadStreams(t *testing.T) {
	good := func(t testing.TB) []byte {
		return dataFrame(tapFrame(t, tap.Message_CLIENT_RESPONSE, reply(t, "ok.example.com")))
	}
	cat := func(parts ...[]byte) []byte {
		var b []byte
		for _, p := range parts {
			b = append(b, p...)
		}
		return b
	}
	tests := []struct {
		name     string
		stream   func(t testing.TB) []byte
		cause    string
		badFrame uint64
		accepted uint64
	}{
		{name: "closed at once", cause: "eof", stream: func(testing.TB) []byte { return nil }},
		{name: "garbage instead of handshake", cause: "protocol", badFrame: 1, stream: func(testing.TB) []byte {
			return []byte("GET / HTTP/1.1\r\n\r\n")
		}},
		{name: "data before START", cause: "protocol", badFrame: 1, stream: func(t testing.TB) []byte {
			return cat(ctlFrame(fs.CONTROL_READY, ContentType), good(t))
		}},
		{name: "START missing after READY", cause: "protocol", badFrame: 1, stream: func(t testing.TB) []byte {
			return cat(ctlFrame(fs.CONTROL_READY, ContentType), ctlFrame(fs.CONTROL_STOP))
		}},
		{name: "wrong content type", cause: "content_type", stream: func(testing.TB) []byte {
			return ctlFrame(fs.CONTROL_READY, "protobuf:something.Else")
		}},
		{name: "no content type", cause: "content_type", stream: func(testing.TB) []byte {
			return ctlFrame(fs.CONTROL_READY)
		}},
		{name: "oversize control frame", cause: "oversize", badFrame: 1, stream: func(testing.TB) []byte {
			return cat([]byte{0, 0, 0, 0, 0, 0, 2, 1}, make([]byte, 513))
		}},
		{name: "control frame without type", cause: "protocol", badFrame: 1, stream: func(testing.TB) []byte {
			return []byte{0, 0, 0, 0, 0, 0, 0, 2, 0, 0}
		}},
		{name: "unknown control field", cause: "protocol", badFrame: 1, stream: func(testing.TB) []byte {
			return []byte{0, 0, 0, 0, 0, 0, 0, 12, 0, 0, 0, fs.CONTROL_READY, 0, 0, 0, 9, 0, 0, 0, 0}
		}},
		{name: "content type overruns", cause: "protocol", badFrame: 1, stream: func(testing.TB) []byte {
			return []byte{0, 0, 0, 0, 0, 0, 0, 12, 0, 0, 0, fs.CONTROL_READY, 0, 0, 0, 1, 0, 0, 0, 99}
		}},
		{name: "oversize data frame", cause: "oversize", badFrame: 1, accepted: 1, stream: func(t testing.TB) []byte {
			return cat(handshakeBytes(), good(t), []byte{0, 0x10, 0, 1}, make([]byte, 100))
		}},
		{name: "data frame cut short", cause: "truncated", badFrame: 1, accepted: 1, stream: func(t testing.TB) []byte {
			f := good(t)
			return cat(handshakeBytes(), f, f[:len(f)-3])
		}},
		{name: "length cut short", cause: "truncated", badFrame: 1, accepted: 1, stream: func(t testing.TB) []byte {
			return cat(handshakeBytes(), good(t), []byte{0, 0})
		}},
		{name: "READY after START", cause: "protocol", badFrame: 1, accepted: 1, stream: func(t testing.TB) []byte {
			return cat(handshakeBytes(), good(t), ctlFrame(fs.CONTROL_READY, ContentType))
		}},
		{name: "closed without STOP", cause: "eof", accepted: 2, stream: func(t testing.TB) []byte {
			return cat(handshakeBytes(), good(t), good(t))
		}},
		{name: "unidirectional", cause: "stop", accepted: 1, stream: func(t testing.TB) []byte {
			return cat(ctlFrame(fs.CONTROL_START, ContentType), good(t), ctlFrame(fs.CONTROL_STOP))
		}},
		{name: "START without content type", cause: "stop", accepted: 1, stream: func(t testing.TB) []byte {
			return cat(ctlFrame(fs.CONTROL_READY, "other", ContentType), ctlFrame(fs.CONTROL_START), good(t), ctlFrame(fs.CONTROL_STOP))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.MaxFrameSize = 1 << 20
			r := listen(t, cfg, newCache(t).Insert)
			conn, err := net.Dial("unix", r.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := conn.Write(tt.stream(t)); err != nil {
				t.Fatal(err)
			}
			conn.(*net.UnixConn).CloseWrite()
			st := waitClosed(t, r, 1)
			if st.Disconnects[tt.cause] != 1 {
				t.Errorf("disconnects %v, want one %s", st.Disconnects, tt.cause)
			}
			if st.Rejected[ReasonBadFrame] != tt.badFrame || st.Accepted != tt.accepted {
				t.Errorf("bad_frame %d accepted %d, want %d and %d", st.Rejected[ReasonBadFrame], st.Accepted, tt.badFrame, tt.accepted)
			}
			// The receiver still serves.
			s := dialSender(t, r.Addr())
			s.send(t, tapFrame(t, tap.Message_CLIENT_RESPONSE, reply(t, "after.example.com")))
			s.stop(t)
			testkit.Eventually(t, testTimeout, "the next connection's record", func() bool { return r.Stats().Accepted == tt.accepted+1 })
		})
	}
}

// TestMaxFrameSize: a frame over MaxFrameSize closes the stream; one at the limit
// does not.
func TestMaxFrameSize(t *testing.T) {
	sink := &countingSink{}
	cfg := testConfig(t)
	cfg.MaxFrameSize = 1000
	r := listen(t, cfg, sink.sink)
	// An unknown field (number 16) pads the frame to exactly the limit.
	base := tapFrame(t, tap.Message_CLIENT_RESPONSE, reply(t, "a.example.com"))
	var f []byte
	for k := 0; len(f) != 1000; k++ {
		if k > 1000 {
			t.Fatal("cannot pad the frame to 1000 bytes")
		}
		f = protowire.AppendBytes(protowire.AppendTag(bytes.Clone(base), 16, protowire.BytesType), make([]byte, k))
	}
	s := dialSender(t, r.Addr())
	s.send(t, f)
	testkit.Eventually(t, testTimeout, "the frame at the limit", func() bool { return sink.n() == 1 })
	s.send(t, append(f, 0))
	st := waitClosed(t, r, 1)
	if st.Disconnects["oversize"] != 1 || st.Rejected[ReasonBadFrame] != 1 {
		t.Errorf("stats %+v, want one oversize disconnect and bad_frame", st)
	}
}

// TestHandshakeTimeout: a connection that never handshakes is closed after
// HandshakeTimeout; one idle for longer after its handshake is kept.
func TestHandshakeTimeout(t *testing.T) {
	const timeout = 100 * time.Millisecond
	sink := &countingSink{}
	cfg := testConfig(t)
	cfg.HandshakeTimeout = timeout
	r := listen(t, cfg, sink.sink)

	idle := dialSender(t, r.Addr()) // handshakes, then stays quiet
	silent, err := net.Dial("unix", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	half, err := net.Dial("unix", r.Addr()) // READY, then nothing
	if err != nil {
		t.Fatal(err)
	}
	defer half.Close()
	half.Write(ctlFrame(fs.CONTROL_READY, ContentType))

	start := time.Now()
	st := waitClosed(t, r, 2)
	if took := time.Since(start); took > timeout+time.Second {
		t.Errorf("silent connections closed after %v, want about %v", took, timeout)
	}
	if st.Disconnects["handshake_timeout"] != 2 {
		t.Errorf("disconnects %v, want two handshake_timeout", st.Disconnects)
	}
	expectClosed(t, silent)

	// No sleep is needed to show that the idle connection outlives the
	// timeout: its handshake deadline was set before dialSender returned,
	// the silent ones' after, and they have expired. Had the receiver kept
	// the deadline after START, the idle one's read would fail now.
	idle.send(t, tapFrame(t, tap.Message_CLIENT_RESPONSE, reply(t, "late.example.com")))
	testkit.Eventually(t, testTimeout, "the idle connection's record", func() bool { return sink.n() == 1 })
	if st := r.Stats(); st.Connections != 1 {
		t.Errorf("%d connections open, want the idle one", st.Connections)
	}
}

// TestMaxConnsEvictsIdlest: at MaxConns a new connection evicts the one
// that has gone longest without a frame.
func TestMaxConnsEvictsIdlest(t *testing.T) {
	sink := &countingSink{}
	cfg := testConfig(t)
	cfg.MaxConns = 2
	r := listen(t, cfg, sink.sink)
	frame := func(name string) []byte { return tapFrame(t, tap.Message_CLIENT_RESPONSE, reply(t, name)) }

	old := dialSender(t, r.Addr()) // handshakes, then never sends: like a connection CoreDNS abandoned
	busy := dialSender(t, r.Addr())
	busy.send(t, frame("busy.example.com"))
	testkit.Eventually(t, testTimeout, "the busy connection's record", func() bool { return sink.n() == 1 })

	fresh := dialSender(t, r.Addr())
	st := waitClosed(t, r, 1)
	if st.Disconnects["evicted"] != 1 {
		t.Fatalf("disconnects %v, want one evicted", st.Disconnects)
	}
	expectClosed(t, old.conn)
	busy.send(t, frame("busy2.example.com"))
	fresh.send(t, frame("fresh.example.com"))
	testkit.Eventually(t, testTimeout, "both survivors' records", func() bool { return sink.n() == 3 })
	if st := r.Stats(); st.Connections != 2 || st.ConnectionsTotal != 3 {
		t.Errorf("open %d total %d, want 2 and 3", st.Connections, st.ConnectionsTotal)
	}
}

// TestConcurrentSenders: several connections at once, each with its own
// goroutine, all records counted once.
func TestConcurrentSenders(t *testing.T) {
	const senders, records = 6, 300
	c := newCache(t)
	r := listen(t, testConfig(t), c.Insert)
	frames := make([][]byte, records)
	for i := range frames {
		frames[i] = tapFrame(t, tap.Message_CLIENT_RESPONSE, reply(t, "n"+strconv.Itoa(i)+".example.com"))
	}
	var wg sync.WaitGroup
	for range senders {
		s := dialSender(t, r.Addr())
		wg.Go(func() {
			for _, f := range frames {
				if _, err := s.w.WriteFrame(f); err != nil {
					t.Error(err)
					return
				}
			}
			s.w.Flush()
			s.w.Close()
		})
	}
	wg.Wait()
	st := waitClosed(t, r, senders)
	if st.Accepted != senders*records || st.Disconnects["stop"] != senders {
		t.Errorf("accepted %d stops %d, want %d and %d", st.Accepted, st.Disconnects["stop"], senders*records, senders)
	}
	if c.Len() != records {
		t.Errorf("cache holds %d entries, want %d", c.Len(), records)
	}
}

// TestRestart: the receiver closes while a sender is connected and listens
// again on the same path; the sender's next write fails, and a new
// connection works (what CoreDNS does is measured in TestCoreDNS).
func TestRestart(t *testing.T) {
	cfg := testConfig(t)
	path := cfg.Path
	sink := &countingSink{}
	r1, err := Listen(context.Background(), cfg, sink.sink)
	if err != nil {
		t.Fatal(err)
	}
	s := dialSender(t, path)
	s.send(t, tapFrame(t, tap.Message_CLIENT_RESPONSE, reply(t, "one.example.com")))
	testkit.Eventually(t, testTimeout, "the first record", func() bool { return sink.n() == 1 })
	if err := r1.Close(); err != nil {
		t.Fatal(err)
	}
	if st := r1.Stats(); st.Disconnects["shutdown"] != 1 || st.Connections != 0 {
		t.Errorf("after close: %+v", st)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket file after Close: %v", err)
	}
	r2 := listen(t, cfg, sink.sink)
	// The old connection is dead: the first flush may still land in the
	// kernel buffer of a closed socket, a later one fails.
	lost := tapFrame(t, tap.Message_CLIENT_RESPONSE, reply(t, "lost.example.com"))
	testkit.Eventually(t, testTimeout, "a write on the closed receiver's connection to fail", func() bool {
		_, err := s.w.WriteFrame(lost)
		if err == nil {
			err = s.w.Flush()
		}
		return err != nil
	})
	s2 := dialSender(t, path)
	s2.send(t, tapFrame(t, tap.Message_CLIENT_RESPONSE, reply(t, "two.example.com")))
	s2.stop(t)
	testkit.Eventually(t, testTimeout, "the record after the restart", func() bool { return r2.Stats().Accepted == 1 })
	if sink.n() != 2 {
		t.Errorf("sink got %d records, want 2", sink.n())
	}
}

// TestSocketFile covers what Listen does with the path and Close with the
// file.
func TestSocketFile(t *testing.T) {
	nop := func([]byte) error { return nil }
	tests := []struct {
		name    string
		prepare func(t *testing.T, path string)
		mode    os.FileMode
		wantErr error // nil: Listen succeeds
	}{
		{name: "fresh", mode: 0o600},
		{name: "configured mode", mode: 0o660},
		{name: "missing directory", mode: 0o600, prepare: func(t *testing.T, path string) {
			os.Remove(filepath.Dir(path))
		}},
		{name: "stale socket", mode: 0o600, prepare: func(t *testing.T, path string) {
			ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			ln.SetUnlinkOnClose(false)
			ln.Close() // the file stays, nobody listens: a killed dnsstandby's
		}},
		{name: "live socket", wantErr: ErrInUse, prepare: func(t *testing.T, path string) {
			ln, err := net.Listen("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
		}},
		{name: "live receiver", wantErr: ErrInUse, prepare: func(t *testing.T, path string) {
			cfg := testConfig(t)
			cfg.Path = path
			listen(t, cfg, nop)
		}},
		{name: "regular file", wantErr: ErrNotSocket, prepare: func(t *testing.T, path string) {
			if err := os.WriteFile(path, []byte("precious"), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "directory", wantErr: ErrNotSocket, prepare: func(t *testing.T, path string) {
			if err := os.Mkdir(path, 0o755); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "run", "dnstap.sock")
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if tt.prepare != nil {
				tt.prepare(t, path)
			}
			before, _ := os.Lstat(path)
			cfg := testConfig(t)
			cfg.Path, cfg.Mode = path, tt.mode
			r, err := Listen(context.Background(), cfg, nop)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Listen: %v, want %v", err, tt.wantErr)
				}
				after, err := os.Lstat(path)
				if err != nil || !os.SameFile(before, after) {
					t.Errorf("Listen touched the file it refused: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			fi, err := os.Lstat(path)
			if err != nil || fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != tt.mode {
				t.Errorf("socket file %v (%v), want a socket with mode %v", fi.Mode(), err, tt.mode)
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			if err := r.Close(); err != nil {
				t.Errorf("second Close: %v", err)
			}
			if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("socket file after Close: %v", err)
			}
		})
	}
}

// TestCloseKeepsAReplacedFile: Close removes only the file Listen made.
func TestCloseKeepsAReplacedFile(t *testing.T) {
	cfg := testConfig(t)
	path := cfg.Path
	r, err := Listen(context.Background(), cfg, func([]byte) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(path)
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); err != nil {
		t.Errorf("Close removed a file that was not its own: %v", err)
	}
}

// TestContextCancelCloses: the receiver closes when Listen's context ends.
func TestContextCancelCloses(t *testing.T) {
	cfg := testConfig(t)
	path := cfg.Path
	ctx, cancel := context.WithCancel(context.Background())
	r, err := Listen(ctx, cfg, func([]byte) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	s := dialSender(t, path)
	cancel()
	testkit.Eventually(t, testTimeout, "the socket file to go", func() bool {
		_, err := os.Lstat(path)
		return errors.Is(err, os.ErrNotExist)
	})
	if err := r.Close(); err != nil {
		t.Errorf("Close after cancel: %v", err)
	}
	if st := r.Stats(); st.Disconnects["shutdown"] != 1 || st.Connections != 0 {
		t.Errorf("stats after cancel: %+v", st)
	}
	expectClosed(t, s.conn)
}

// TestListenWithEndedContext: a context that has already ended closes the
// receiver at once.
func TestListenWithEndedContext(t *testing.T) {
	cfg := testConfig(t)
	path := cfg.Path
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r, err := Listen(ctx, cfg, func([]byte) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, testTimeout, "the socket file to go", func() bool {
		_, err := os.Lstat(path)
		return errors.Is(err, os.ErrNotExist)
	})
	r.Close()
}

// TestConfig: Listen takes DefaultConfig with a Path, and refuses each
// invalid field by name, before it touches the path.
func TestConfig(t *testing.T) {
	nop := func([]byte) error { return nil }
	tests := []struct {
		name    string
		set     func(c *Config)
		sink    Sink
		wantErr string // "" for success
	}{
		{name: "defaults", set: func(*Config) {}, sink: nop},
		{name: "mode 0", set: func(c *Config) { c.Mode = 0 }, sink: nop},
		{name: "no path", set: func(c *Config) { c.Path = "" }, sink: nop, wantErr: "dnstap: Path is empty"},
		{name: "path too long", set: func(c *Config) { c.Path = "/" + strings.Repeat("x", 200) }, sink: nop, wantErr: "dnstap: Path "},
		{name: "zero conns", set: func(c *Config) { c.MaxConns = 0 }, sink: nop, wantErr: "dnstap: MaxConns must be positive, got 0"},
		{name: "negative frame", set: func(c *Config) { c.MaxFrameSize = -1 }, sink: nop, wantErr: "dnstap: MaxFrameSize must be positive, got -1"},
		{name: "zero frame", set: func(c *Config) { c.MaxFrameSize = 0 }, sink: nop, wantErr: "dnstap: MaxFrameSize must be positive, got 0"},
		{name: "zero timeout", set: func(c *Config) { c.HandshakeTimeout = 0 }, sink: nop, wantErr: "dnstap: HandshakeTimeout must be positive, got 0s"},
		{name: "mode with type bits", set: func(c *Config) { c.Mode = os.ModeSocket | 0o600 }, sink: nop, wantErr: "dnstap: Mode "},
		{name: "nil sink", set: func(*Config) {}, wantErr: "dnstap: nil sink"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Path = socketPath(t)
			tt.set(&cfg)
			r, err := Listen(context.Background(), cfg, tt.sink)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Listen: %v", err)
				}
				if err := r.Close(); err != nil {
					t.Error(err)
				}
				return
			}
			if err == nil {
				r.Close()
				t.Fatalf("Listen succeeded, want an error starting %q", tt.wantErr)
			}
			if !strings.HasPrefix(err.Error(), tt.wantErr) {
				t.Errorf("Listen: %q, want it to start %q", err, tt.wantErr)
			}
			if cfg.Path != "" && len(cfg.Path) <= maxSocketPath {
				if _, err := os.Lstat(cfg.Path); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("a refused Config left %s: %v", cfg.Path, err)
				}
			}
		})
	}
}

// BenchmarkStream measures the receiver's whole path per CoreDNS reply:
// socket read, framing, extraction, accounting, and the sink (a no-op, or
// the real cache's Insert).
func BenchmarkStream(b *testing.B) {
	for _, bc := range []struct {
		name string
		sink func(b *testing.B) Sink
	}{
		{"nop", func(*testing.B) Sink { return func([]byte) error { return nil } }},
		{"cache", func(b *testing.B) Sink { return newCache(b).Insert }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.Path = socketPath(b)
			r := listen(b, cfg, bc.sink(b))
			s := dialSender(b, r.Addr())
			frames := make([][]byte, 1000)
			for i := range frames {
				frames[i] = tapFrame(b, tap.Message_CLIENT_RESPONSE, reply(b, "n"+strconv.Itoa(i)+".example.com"))
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if _, err := s.w.WriteFrame(frames[i%len(frames)]); err != nil {
					b.Fatal(err)
				}
			}
			s.stop(b) // FINISH comes after every frame was handled
			b.StopTimer()
			if st := r.Stats(); st.Accepted != uint64(b.N) {
				b.Fatalf("accepted %d of %d", st.Accepted, b.N)
			}
		})
	}
}
