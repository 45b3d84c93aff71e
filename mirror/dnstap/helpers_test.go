package dnstap

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	tap "github.com/dnstap/golang-dnstap"
	fs "github.com/farsightsec/golang-framestream"
	"github.com/miekg/dns"
	"google.golang.org/protobuf/proto"

	"github.com/dnsstandby/dnsstandby/cache"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// testTimeout bounds every wait in these tests; each normally takes
// milliseconds.
const testTimeout = 10 * time.Second

// socketPath returns a fresh socket path in the test's temp directory.
func socketPath(t testing.TB) string {
	return filepath.Join(t.TempDir(), "dnstap.sock")
}

// testConfig is DefaultConfig with a fresh socket path and the test's
// logger.
func testConfig(t testing.TB) Config {
	cfg := DefaultConfig()
	cfg.Path = socketPath(t)
	cfg.Logger = testkit.Logger(t)
	return cfg
}

// newCache returns a real cache with the default configuration.
func newCache(t testing.TB) *cache.Cache {
	t.Helper()
	c, err := cache.New(cache.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// listen starts a receiver with cfg as given, closing it at the end of the
// test.
func listen(t testing.TB, cfg Config, sink Sink) *Receiver {
	t.Helper()
	r, err := Listen(context.Background(), cfg, sink)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return r
}

// waitClosed waits until the receiver has closed n connections in all.
func waitClosed(t testing.TB, r *Receiver, n uint64) Stats {
	t.Helper()
	var s Stats
	testkit.Eventually(t, testTimeout, "connections to close", func() bool {
		s = r.Stats()
		var closed uint64
		for _, v := range s.Disconnects {
			closed += v
		}
		return closed >= n
	})
	return s
}

// sender is a fake CoreDNS: golang-framestream's bidirectional writer with
// CoreDNS's options, on a unix connection.
type sender struct {
	conn net.Conn
	w    *fs.Writer
}

func dialSender(t testing.TB, path string) *sender {
	t.Helper()
	conn, err := net.DialTimeout("unix", path, testTimeout)
	if err != nil {
		t.Fatal(err)
	}
	w, err := fs.NewWriter(conn, &fs.WriterOptions{
		ContentTypes:  [][]byte{[]byte(ContentType)},
		Bidirectional: true,
		Timeout:       testTimeout,
	})
	if err != nil {
		conn.Close()
		t.Fatalf("handshake: %v", err)
	}
	s := &sender{conn: conn, w: w}
	t.Cleanup(func() { conn.Close() })
	return s
}

// send writes frames and flushes them.
func (s *sender) send(t testing.TB, frames ...[]byte) {
	t.Helper()
	for _, f := range frames {
		if _, err := s.w.WriteFrame(f); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.w.Flush(); err != nil {
		t.Fatal(err)
	}
}

// stop sends STOP and waits for FINISH.
func (s *sender) stop(t testing.TB) {
	t.Helper()
	if err := s.w.Close(); err != nil {
		t.Fatalf("STOP/FINISH: %v", err)
	}
	s.conn.Close()
}

// reply returns a packed cacheable reply for name (A 192.0.2.1).
func reply(t testing.TB, name string) []byte {
	t.Helper()
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	m := new(dns.Msg)
	m.SetReply(q)
	rr, err := dns.NewRR(dns.Fqdn(name) + " 300 IN A 192.0.2.1")
	if err != nil {
		t.Fatal(err)
	}
	m.Answer = append(m.Answer, rr)
	return pack(t, m)
}

func pack(t testing.TB, m *dns.Msg) []byte {
	t.Helper()
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// tapFrame marshals a dnstap MESSAGE of type typ carrying resp as its
// response_message (none if resp is nil).
func tapFrame(t testing.TB, typ tap.Message_Type, resp []byte) []byte {
	t.Helper()
	dt := tap.Dnstap_MESSAGE
	m := &tap.Message{Type: &typ, ResponseMessage: resp}
	b, err := proto.Marshal(&tap.Dnstap{Type: &dt, Message: m, Identity: []byte("localdns"), Version: []byte("CoreDNS-1.13.1")})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Hand-made Frame Streams pieces, for streams golang-framestream's writer
// would not send.

func ctlFrame(typ uint32, contentTypes ...string) []byte {
	return appendControl(nil, typ, contentTypes...)
}

func dataFrame(payload []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(payload))), payload...)
}

// handshakeBytes is what a bidirectional sender writes before data: READY
// and START (ACCEPT, from the receiver, is left unread in the socket).
func handshakeBytes() []byte {
	return append(ctlFrame(fs.CONTROL_READY, ContentType), ctlFrame(fs.CONTROL_START, ContentType)...)
}

// countingSink records what it was handed.
type countingSink struct {
	mu    sync.Mutex
	resps [][]byte
	err   error // returned for every call
}

func (s *countingSink) sink(resp []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.resps = append(s.resps, bytes.Clone(resp))
	return s.err
}

func (s *countingSink) n() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.resps)
}

// expectClosed checks that the peer closed conn: EOF, or a reset when the
// peer closed with our last bytes unread.
func expectClosed(t testing.TB, conn net.Conn) {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(testTimeout))
	_, err := conn.Read(make([]byte, 1))
	if err != io.EOF && !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("read on a connection the receiver closed: %v, want EOF or a reset", err)
	}
}
