package upstream

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// udpHandler deals with one UDP query; it may send any datagrams, or none.
type udpHandler func(s *testServer, from netip.AddrPort, q *dns.Msg)

// tcpHandler returns the reply to a TCP query, or nil for silence.
type tcpHandler func(q *dns.Msg) *dns.Msg

// tcpMode says how the test server treats its TCP connections.
type tcpMode int

const (
	tcpKeep          tcpMode = iota // serve queries until the client closes
	tcpCloseAfterOne                // close (FIN) right after the first reply, as on idle timeout
	tcpResetOnSecond                // answer a second query with a reset, as a restarted server would
)

// testServer is a scripted DNS server on 127.0.0.1, UDP and TCP on one
// port, written on raw sockets so that tests control every byte it sends.
type testServer struct {
	t    testing.TB
	addr netip.AddrPort
	pc   *net.UDPConn
	ln   *net.TCPListener

	mu      sync.Mutex // guards following
	udp     udpHandler
	tcp     tcpHandler
	tcpMode tcpMode
	conns   map[net.Conn]bool
	stopped bool

	udpQueries atomic.Int64 // not counting health probes
	tcpQueries atomic.Int64 // not counting health probes
	probes     atomic.Int64 // health probes: NS queries for "." or testProbeDomain
	lastProbe  atomic.Pointer[dns.Msg]
	accepts    atomic.Int64
	wg         sync.WaitGroup
}

// newServer starts a server on 127.0.0.1 answering every query with
// answer("192.0.2.1").
func newServer(t testing.TB) *testServer {
	t.Helper()
	return newServerOn(t, net.IPv4(127, 0, 0, 1))
}

// newServerOn starts the server on a loopback address of the test's choice.
func newServerOn(t testing.TB, ip net.IP) *testServer {
	t.Helper()
	s := &testServer{t: t, conns: make(map[net.Conn]bool)}
	s.udp = replyUDP(answer("192.0.2.1"))
	s.tcp = answer("192.0.2.1")
	for try := 0; ; try++ {
		pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: ip})
		if err != nil {
			t.Fatalf("listen udp: %v", err)
		}
		s.addr = pc.LocalAddr().(*net.UDPAddr).AddrPort()
		ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(s.addr))
		if err != nil {
			pc.Close()
			if try < 20 {
				continue // the port is taken for TCP; pick another
			}
			t.Fatalf("listen tcp: %v", err)
		}
		s.pc, s.ln = pc, ln
		break
	}
	s.wg.Add(2)
	go s.serveUDP()
	go s.serveTCP()
	t.Cleanup(s.stop)
	return s
}

func (s *testServer) setUDP(h udpHandler) { s.mu.Lock(); s.udp = h; s.mu.Unlock() }
func (s *testServer) setTCP(h tcpHandler) { s.mu.Lock(); s.tcp = h; s.mu.Unlock() }
func (s *testServer) setBoth(h tcpHandler) {
	s.mu.Lock()
	s.udp, s.tcp = replyUDP(h), h
	s.mu.Unlock()
}

// stop closes the sockets and every connection and waits for the
// server's goroutines.
func (s *testServer) stop() {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.stopped = true
	s.pc.Close()
	s.ln.Close()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// testProbeDomain is the HealthCheckDomain tests set other than ".".
const testProbeDomain = "health.local."

// isProbe reports whether q is a health probe: tests ask no NS query for
// either name.
func isProbe(q *dns.Msg) bool {
	if len(q.Question) != 1 || q.Question[0].Qtype != dns.TypeNS {
		return false
	}
	n := q.Question[0].Name // in random case (0x20)
	return n == "." || strings.EqualFold(n, testProbeDomain)
}

func (s *testServer) serveUDP() {
	defer s.wg.Done()
	buf := make([]byte, 65535)
	for {
		n, from, err := s.pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		q := new(dns.Msg)
		if q.Unpack(buf[:n]) != nil {
			continue
		}
		if isProbe(q) {
			s.probes.Add(1)
			s.lastProbe.Store(q)
		} else {
			s.udpQueries.Add(1)
		}
		s.mu.Lock()
		h := s.udp
		s.mu.Unlock()
		h(s, from, q)
	}
}

func (s *testServer) serveTCP() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.stopped {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = true
		s.mu.Unlock()
		s.accepts.Add(1)
		s.wg.Add(1)
		go s.serveConn(c)
	}
}

func (s *testServer) serveConn(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	served := 0
	for {
		var l [2]byte
		if _, err := io.ReadFull(c, l[:]); err != nil {
			return
		}
		b := make([]byte, binary.BigEndian.Uint16(l[:]))
		if _, err := io.ReadFull(c, b); err != nil {
			return
		}
		q := new(dns.Msg)
		if q.Unpack(b) != nil {
			return
		}
		served++
		if isProbe(q) {
			s.probes.Add(1)
			s.lastProbe.Store(q)
		} else {
			s.tcpQueries.Add(1)
		}
		s.mu.Lock()
		h, mode := s.tcp, s.tcpMode
		s.mu.Unlock()
		if mode == tcpResetOnSecond && served == 2 {
			c.(*net.TCPConn).SetLinger(0)
			return
		}
		r := h(q)
		if r == nil {
			continue
		}
		out := mustPack(s.t, r)
		framed := binary.BigEndian.AppendUint16(nil, uint16(len(out)))
		if _, err := c.Write(append(framed, out...)); err != nil {
			return
		}
		if mode == tcpCloseAfterOne {
			return
		}
	}
}

// sendUDP sends m to a client from the server's socket.
func (s *testServer) sendUDP(to netip.AddrPort, m *dns.Msg) {
	s.sendRawUDP(to, mustPack(s.t, m))
}

func (s *testServer) sendRawUDP(to netip.AddrPort, b []byte) {
	if _, err := s.pc.WriteToUDPAddrPort(b, to); err != nil {
		s.t.Logf("test server send: %v", err)
	}
}

// replyUDP makes a UDP handler of a reply function.
func replyUDP(h tcpHandler) udpHandler {
	return func(s *testServer, from netip.AddrPort, q *dns.Msg) {
		if r := h(q); r != nil {
			s.sendUDP(from, r)
		}
	}
}

// answer replies with one A record holding ip.
func answer(ip string) tcpHandler {
	return func(q *dns.Msg) *dns.Msg {
		m := new(dns.Msg)
		m.SetReply(q)
		m.RecursionAvailable = true
		if !isProbe(q) {
			m.Answer = []dns.RR{&dns.A{
				Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30},
				A:   net.ParseIP(ip).To4(),
			}}
		}
		return m
	}
}

// rcodeReply replies with rcode and no records.
func rcodeReply(rcode int) tcpHandler {
	return func(q *dns.Msg) *dns.Msg {
		m := new(dns.Msg)
		m.SetRcode(q, rcode)
		return m
	}
}

func silent(*dns.Msg) *dns.Msg { return nil }

// closedAddr returns a loopback address where nothing listens, so UDP gets
// ICMP port unreachable and TCP a reset.
func closedAddr(t testing.TB) netip.AddrPort {
	t.Helper()
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	a := pc.LocalAddr().(*net.UDPAddr).AddrPort()
	pc.Close()
	return a
}

// newGroup returns a group with test-sized timings, closed at cleanup, and
// the records it logged.
func newGroup(t testing.TB, mod func(*Config), servers ...netip.AddrPort) (*Group, *logRecords) {
	t.Helper()
	logs := new(logRecords)
	cfg := DefaultConfig()
	cfg.Servers = servers
	cfg.Timeout = 150 * time.Millisecond
	cfg.HealthCheck = 20 * time.Millisecond
	// The tests of CoreDNS's semantics ask one attempt at a time; those
	// of speculative attempts turn them on (speculate_test.go).
	cfg.SpeculativeRate = 0
	cfg.Logger = slog.New(&recordingHandler{Handler: testkit.Logger(t).Handler(), logs: logs})
	if mod != nil {
		mod(&cfg)
	}
	g, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { g.Close() })
	return g, logs
}

// logRecords keeps what a group logged, so that tests can check the
// level and attributes of its lines; the lines still go to the test's
// output through testkit.Logger.
type logRecords struct {
	mu      sync.Mutex
	records []logRecord
}

// logRecord is one line: level, message, and every attribute (the
// handler's own, such as component, included) as strings.
type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

// with returns the records whose message contains sub.
func (l *logRecords) with(sub string) []logRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []logRecord
	for _, r := range l.records {
		if strings.Contains(r.msg, sub) {
			out = append(out, r)
		}
	}
	return out
}

// recordingHandler passes records on to Handler and keeps a copy in logs.
type recordingHandler struct {
	slog.Handler
	logs  *logRecords
	attrs []slog.Attr // from WithAttrs; the group does not use WithGroup
}

func (h *recordingHandler) Handle(ctx context.Context, r slog.Record) error {
	rec := logRecord{level: r.Level, msg: r.Message, attrs: make(map[string]string)}
	for _, a := range h.attrs {
		rec.attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.String()
		return true
	})
	h.logs.mu.Lock()
	h.logs.records = append(h.logs.records, rec)
	h.logs.mu.Unlock()
	return h.Handler.Handle(ctx, r)
}

func (h *recordingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &recordingHandler{Handler: h.Handler.WithAttrs(as), logs: h.logs, attrs: append(slices.Clone(h.attrs), as...)}
}

// swapCase returns name with the case of every letter inverted: another
// case than name's, whatever that was.
func swapCase(name string) string {
	b := []byte(name)
	for i, c := range b {
		if l := c | 0x20; 'a' <= l && l <= 'z' {
			b[i] = c ^ 0x20
		}
	}
	return string(b)
}

func newReq(name string, qtype uint16) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	m.Id = 0x4242
	return m
}

func mustPack(t testing.TB, m *dns.Msg) []byte {
	t.Helper()
	b, err := m.Pack()
	if err != nil {
		t.Fatalf("pack: %v", err)
	}
	return b
}

func exchange(t testing.TB, g *Group, req *dns.Msg) (*dns.Msg, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return g.Exchange(ctx, req)
}

// mustAnswer exchanges req and checks the reply is a well-formed answer
// to it carrying want, or no records when want is "".
func mustAnswer(t testing.TB, g *Group, req *dns.Msg, want string) *dns.Msg {
	t.Helper()
	r, err := exchange(t, g, req)
	if err != nil {
		t.Fatalf("Exchange: %v", err)
	}
	if r.Id != req.Id || len(r.Question) != 1 || r.Question[0] != req.Question[0] || !r.Response {
		t.Fatalf("reply does not answer the request: id %#x question %v", r.Id, r.Question)
	}
	if want != "" && (len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != want) {
		t.Fatalf("answer %v, want %s", r.Answer, want)
	}
	return r
}

// stats returns the counters of server i.
func stats(g *Group, i int) ServerStats { return g.Stats()[i] }

// groupGoroutines returns the stacks of goroutines running the package's
// own code (methods of Group, including context.AfterFunc wake-ups).
func groupGoroutines() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "dnsstandby/upstream.(*Group)") || strings.Contains(g, "dnsstandby/upstream.(*pool)") {
			out = append(out, g)
		}
	}
	return out
}

// isFailure reports whether err holds a failure of reason why.
func isFailure(err error, why reason) bool {
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	for _, f := range e.Failures {
		var ff *failure
		if errors.As(f, &ff) && ff.why == why {
			return true
		}
	}
	return false
}
