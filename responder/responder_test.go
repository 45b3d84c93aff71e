package responder

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/cache"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
	"github.com/dnsstandby/dnsstandby/pipeline"
	"github.com/dnsstandby/dnsstandby/wire"
)

// tableUpstream answers A queries for names under "example." with
// 192.0.2.1 after delay; it stands in for kube-dns in these socket-level
// tests (the integration tests use a real CoreDNS). If entered is set, an
// exchange starting signals on it when it has room.
type tableUpstream struct {
	delay   time.Duration
	entered chan struct{}
	mu      sync.Mutex
	calls   int
}

func (u *tableUpstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls
}

func (u *tableUpstream) Exchange(ctx context.Context, req *dns.Msg) (*dns.Msg, error) {
	u.mu.Lock()
	u.calls++
	u.mu.Unlock()
	if u.entered != nil {
		select {
		case u.entered <- struct{}{}:
		default: // the test is waiting for the first only
		}
	}
	select {
	case <-time.After(u.delay):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	resp := new(dns.Msg)
	resp.SetReply(req)
	rr, _ := dns.NewRR(req.Question[0].Name + " 60 IN A 192.0.2.1")
	resp.Answer = []dns.RR{rr}
	return resp, nil
}

func startServer(t testing.TB, ap netip.AddrPort, up pipeline.Exchanger, mod func(*Config)) (*Server, *pipeline.Pipeline) {
	t.Helper()
	return startServerWith(t, ap, up, mod, nil)
}

// startServerWith is startServer with the pipeline's Config changed by
// pmod too.
func startServerWith(t testing.TB, ap netip.AddrPort, up pipeline.Exchanger, mod func(*Config), pmod func(*pipeline.Config)) (*Server, *pipeline.Pipeline) {
	t.Helper()
	c, err := cache.New(cache.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	pcfg := pipeline.DefaultConfig()
	pcfg.Routes = []pipeline.Route{{Zone: ".", Upstream: up, Cache: c}}
	pcfg.Logger = testkit.Logger(t)
	if pmod != nil {
		pmod(&pcfg)
	}
	p, err := pipeline.New(pcfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Listen = []netip.AddrPort{ap}
	cfg.ReadersPerSocket = 2
	cfg.Logger = testkit.Logger(t)
	if mod != nil {
		mod(&cfg)
	}
	s, err := Listen(cfg, everyAddr(cfg, p))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	})
	return s, p
}

func exchange(t *testing.T, network string, ap netip.AddrPort, name string) *dns.Msg {
	t.Helper()
	c := &dns.Client{Net: network, Timeout: 2 * time.Second}
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	r, _, err := c.Exchange(m, ap.String())
	if err != nil {
		t.Fatalf("%s exchange %s: %v", network, name, err)
	}
	return r
}

func TestUDPAndTCPAnswer(t *testing.T) {
	ap := nstest.FreeLoopbackAddr(t)
	up := &tableUpstream{}
	startServer(t, ap, up, nil)
	for _, network := range []string{"udp", "tcp"} {
		for i := range 3 { // miss, then hits
			r := exchange(t, network, ap, "Host-"+network+".example.")
			if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || r.Question[0].Name != "Host-"+network+".example." {
				t.Fatalf("%s query %d: %v", network, i, r)
			}
		}
	}
	if n := up.count(); n != 2 {
		t.Fatalf("upstream called %d times for 2 names", n)
	}
}

func TestManyDatagramsAllAnswered(t *testing.T) {
	ap := nstest.FreeLoopbackAddr(t)
	srv, _ := startServer(t, ap, &tableUpstream{}, nil)
	conn, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(ap))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Warm the cache for 10 names, then keep a window of queries in flight:
	// enough that reads and writes come in batches, few enough that no
	// kernel buffer can overflow on a loaded CI machine, so every loss is ours.
	for i := range 10 {
		exchange(t, "udp", ap, fmt.Sprintf("n%d.example.", i))
	}
	const total, window = 2000, 64
	inFlight := make(chan struct{}, window)
	got := make(chan uint16, total)
	go func() {
		defer close(got)
		buf := make([]byte, 512)
		for {
			_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			var m dns.Msg
			if m.Unpack(buf[:n]) == nil && len(m.Answer) == 1 {
				got <- m.Id
				<-inFlight
			}
		}
	}()
	for i := range total {
		select {
		case inFlight <- struct{}{}:
		case <-time.After(5 * time.Second):
			t.Fatalf("window stalled after %d queries: answers lost", i)
		}
		m := new(dns.Msg)
		m.SetQuestion(fmt.Sprintf("n%d.example.", i%10), dns.TypeA)
		m.Id = uint16(i)
		b, _ := m.Pack()
		if _, err := conn.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	seen := make(map[uint16]bool)
	for id := range got {
		seen[id] = true
		if len(seen) == total {
			break
		}
	}
	if len(seen) != total {
		t.Fatalf("%d of %d queries answered", len(seen), total)
	}
	// Every datagram read is counted (takeover compares the count with
	// the queries the tap saw arrive).
	if got := srv.UDPReceived(); got != total+10 {
		t.Errorf("UDPReceived = %d, want %d", got, total+10)
	}
}

func TestReuseportGroupShared(t *testing.T) {
	ap := nstest.FreeLoopbackAddr(t)
	_, p1 := startServer(t, ap, &tableUpstream{}, nil)
	_, p2 := startServer(t, ap, &tableUpstream{}, nil) // must bind: same group
	// Queries from many source ports spread over both members.
	for i := range 200 {
		exchange(t, "udp", ap, fmt.Sprintf("r%d.example.", i))
	}
	a1, a2 := p1.Answered()["upstream"], p2.Answered()["upstream"]
	if a1+a2 != 200 || a1 < 40 || a2 < 40 {
		t.Fatalf("answers split %d/%d, want both members to get a share of 200", a1, a2)
	}
}

// TestListen: Listen takes the Config as given, and its errors name the
// field it rejects.
func TestListen(t *testing.T) {
	c, err := cache.New(cache.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	pcfg := pipeline.DefaultConfig()
	pcfg.Routes = []pipeline.Route{{Zone: ".", Upstream: &tableUpstream{}, Cache: c}}
	p, err := pipeline.New(pcfg)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		mod     func(*Config)
		wantErr string // "" for success
	}{
		{"defaults", func(*Config) {}, ""},
		{"kernel's receive buffer", func(c *Config) { c.RcvBuf = 0 }, ""},
		{"no address", func(c *Config) { c.Listen = nil }, "responder: Listen is empty"},
		{"unspecified v4", func(c *Config) { c.Listen = []netip.AddrPort{netip.MustParseAddrPort("0.0.0.0:5353")} }, "responder: Listen[0] 0.0.0.0:5353: want a specific address"},
		{"unspecified v6", func(c *Config) { c.Listen = append(c.Listen, netip.MustParseAddrPort("[::]:5353")) }, "responder: Listen[1] [::]:5353"},
		{"port 0", func(c *Config) { c.Listen = []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:0")} }, "responder: Listen[0] 127.0.0.1:0"},
		{"zero sockets", func(c *Config) { c.SocketsPerAddr = 0 }, "responder: SocketsPerAddr must be positive, got 0"},
		{"zero readers", func(c *Config) { c.ReadersPerSocket = 0 }, "responder: ReadersPerSocket must be positive, got 0"},
		{"zero batch", func(c *Config) { c.Batch = 0 }, "responder: Batch must be from 1 to 1024, got 0"},
		{"batch past UIO_MAXIOV", func(c *Config) { c.Batch = 1025 }, "responder: Batch must be from 1 to 1024, got 1025"},
		{"negative receive buffer", func(c *Config) { c.RcvBuf = -1 }, "responder: RcvBuf must not be negative, got -1"},
		{"zero TCP connections", func(c *Config) { c.MaxTCPConns = 0 }, "responder: MaxTCPConns must be positive, got 0"},
		{"zero TCP idle", func(c *Config) { c.TCPIdle = 0 }, "responder: TCPIdle must be positive, got 0s"},
		{"zero TCP read", func(c *Config) { c.TCPRead = 0 }, "responder: TCPRead must be positive, got 0s"},
		{"zero TCP write", func(c *Config) { c.TCPWrite = 0 }, "responder: TCPWrite must be positive, got 0s"},
		{"zero TCP pipeline", func(c *Config) { c.TCPPipeline = 0 }, "responder: TCPPipeline must be positive, got 0"},
		{"zero TCP write queue", func(c *Config) { c.TCPWriteQueue = 0 }, "responder: TCPWriteQueue must be positive, got 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Listen = []netip.AddrPort{nstest.FreeLoopbackAddr(t)}
			tt.mod(&cfg)
			s, err := Listen(cfg, everyAddr(cfg, p))
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Listen: %v", err)
				}
				defer s.Close()
				if s.cfg.RcvBuf != cfg.RcvBuf || s.cfg.Batch != cfg.Batch || s.cfg.ReadersPerSocket != cfg.ReadersPerSocket {
					t.Errorf("config changed by Listen: %+v", s.cfg)
				}
				return
			}
			if err == nil {
				s.Close()
				t.Fatalf("Listen succeeded, want error containing %q", tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Listen: %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
	cfg := DefaultConfig()
	cfg.Listen = []netip.AddrPort{nstest.FreeLoopbackAddr(t)}
	if _, err := Listen(cfg, nil); err == nil || !strings.Contains(err.Error(), "responder: no pipeline for listen address "+cfg.Listen[0].String()) {
		t.Errorf("Listen without a pipeline: %v", err)
	}
}

func writeFramed(t *testing.T, c net.Conn, name string, id uint16) {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	m.Id = id
	b, _ := m.Pack()
	out := binary.BigEndian.AppendUint16(nil, uint16(len(b)))
	if _, err := c.Write(append(out, b...)); err != nil {
		t.Fatal(err)
	}
}

func readFramed(c net.Conn) (*dns.Msg, error) {
	var l [2]byte
	if _, err := io.ReadFull(c, l[:]); err != nil {
		return nil, err
	}
	b := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(c, b); err != nil {
		return nil, err
	}
	m := new(dns.Msg)
	return m, m.Unpack(b)
}

func TestTCPPipelinedOutOfOrder(t *testing.T) {
	ap := nstest.FreeLoopbackAddr(t)
	startServer(t, ap, &tableUpstream{delay: 50 * time.Millisecond}, nil)
	exchange(t, "tcp", ap, "cached.example.")
	c, err := net.Dial("tcp", ap.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// A slow miss first, then a hit: the hit's answer must not wait.
	writeFramed(t, c, "slow.example.", 1)
	writeFramed(t, c, "cached.example.", 2)
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	first, err := readFramed(c)
	if err != nil {
		t.Fatal(err)
	}
	second, err := readFramed(c)
	if err != nil {
		t.Fatal(err)
	}
	if first.Id != 2 || second.Id != 1 {
		t.Fatalf("answers in order %d, %d; want the hit (2) first", first.Id, second.Id)
	}
}

func TestTCPTimeoutsAndCap(t *testing.T) {
	ap := nstest.FreeLoopbackAddr(t)
	s, _ := startServer(t, ap, &tableUpstream{}, func(c *Config) {
		c.TCPIdle = 200 * time.Millisecond
		c.TCPRead = 100 * time.Millisecond
		c.MaxTCPConns = 5
	})

	t.Run("idle connection closed", func(t *testing.T) {
		c, err := net.Dial("tcp", ap.String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatal("idle connection got data instead of being closed")
		}
	})
	t.Run("slowloris closed", func(t *testing.T) {
		c, err := net.Dial("tcp", ap.String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		start := time.Now()
		_, _ = c.Write([]byte{0, 40, 0, 0}) // a length, then 2 bytes of 40
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err = c.Read(make([]byte, 1))
		if err == nil || time.Since(start) > time.Second {
			t.Fatalf("trickling client kept for %s (err %v)", time.Since(start), err)
		}
	})
	t.Run("idle connections evicted at the cap", func(t *testing.T) {
		var idle []net.Conn
		for range 5 {
			c, err := net.Dial("tcp", ap.String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			idle = append(idle, c)
		}
		// The signal that the server holds all five, not a pause.
		testkit.Eventually(t, 2*time.Second, "five open connections", func() bool { return s.stats.tcpOpen.Load() == 5 })
		r := exchange(t, "tcp", ap, "past-cap.example.")
		if len(r.Answer) != 1 {
			t.Fatalf("query past the cap: %v", r)
		}
		if n := s.stats.tcpEvicted[evictIdle].Load() + s.stats.tcpEvicted[evictBusy].Load(); n == 0 {
			t.Fatal("no connection was evicted")
		}
	})
}

// heldUpstream answers nothing until the test ends: every miss it gets
// stays in flight.
type heldUpstream struct{ released chan struct{} }

func (u heldUpstream) Exchange(ctx context.Context, _ *dns.Msg) (*dns.Msg, error) {
	select {
	case <-u.released:
	case <-ctx.Done():
	}
	return nil, errors.New("held")
}

// TestTCPEviction: at a cap, which connection makes room for a new one.
// Clients are loopback addresses (127.0.0.N); a busy connection has a
// query waiting on an upstream that does not answer, an idle one has
// asked and been answered (REFUSED, from the hot path), a new one has not
// asked yet. The new connection gets in and is answered; exactly the one
// chosen is closed.
func TestTCPEviction(t *testing.T) {
	type conn struct {
		from  byte   // 127.0.0.from
		state string // busy, idle or new
	}
	tests := []struct {
		name      string
		perAddr   int
		max       int
		graceless bool // idle at once, not after idleGraceDefault
		open      []conn
		newFrom   byte
		evicted   int // index into open
		reason    int
	}{
		{"address cap: that address's oldest, though others are idle", 3, 100, true,
			[]conn{{2, "busy"}, {3, "idle"}, {2, "busy"}, {2, "busy"}}, 2, 0, evictAddress},
		{"address cap: that address's idle before its busy", 3, 100, true,
			[]conn{{2, "busy"}, {2, "idle"}, {2, "busy"}}, 2, 1, evictAddress},
		{"server cap: the idle one, though its address holds the fewest", 100, 4, true,
			[]conn{{2, "busy"}, {2, "busy"}, {3, "idle"}, {2, "busy"}}, 4, 2, evictIdle},
		{"server cap, none idle: the oldest of the address holding the most", 100, 5, true,
			[]conn{{3, "busy"}, {2, "busy"}, {2, "busy"}, {2, "busy"}, {4, "busy"}}, 5, 1, evictBusy},
		{"server cap: a connection quiet under the grace is not idle", 100, 4, false,
			[]conn{{2, "busy"}, {2, "busy"}, {3, "new"}, {2, "busy"}}, 4, 0, evictBusy},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ap := nstest.FreeLoopbackAddr(t)
			up := heldUpstream{released: make(chan struct{})}
			s, p := startServerWith(t, ap, up, func(c *Config) {
				c.MaxTCPConnsPerAddr, c.MaxTCPConns = tt.perAddr, tt.max
			}, func(c *pipeline.Config) { c.UpstreamTimeout = time.Minute })
			// Registered after the server's cleanup, so run before it:
			// its Shutdown waits for the flights.
			t.Cleanup(func() { close(up.released) })
			ts := s.tcp[0]
			if tt.graceless {
				ts.mu.Lock()
				ts.idleGrace = 0
				ts.mu.Unlock()
			}
			var conns []net.Conn
			busy := 0
			for i, c := range tt.open {
				conn := dialFrom(t, c.from, ap)
				conns = append(conns, conn)
				switch c.state {
				case "busy":
					writeFramed(t, conn, fmt.Sprintf("busy%d.example.", i), uint16(i))
					busy++
					testkit.Eventually(t, 2*time.Second, "the query in flight", func() bool { return p.Inflight() == busy })
				case "idle":
					askRefused(t, conn)
				}
			}
			testkit.Eventually(t, 2*time.Second, "every connection registered", func() bool { return s.stats.tcpOpen.Load() == int64(len(tt.open)) })

			askRefused(t, dialFrom(t, tt.newFrom, ap))
			open := openClients(ts)
			for i, c := range conns {
				client := netip.MustParseAddrPort(c.LocalAddr().String())
				if _, ok := open[client]; ok == (i == tt.evicted) {
					t.Errorf("connection %d (%s, %s): open %v, want %v", i, client, tt.open[i].state, ok, i != tt.evicted)
				}
			}
			for r := range s.stats.tcpEvicted {
				want := uint64(0)
				if r == tt.reason {
					want = 1
				}
				if got := s.stats.tcpEvicted[r].Load(); got != want {
					t.Errorf("evicted for %s: %d, want %d", evictionNames[r], got, want)
				}
			}
		})
	}
}

// dialFrom connects to ap from 127.0.0.from.
func dialFrom(t *testing.T, from byte, ap netip.AddrPort) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, from)}}
	c, err := d.Dial("tcp", ap.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// askRefused asks for a zone transfer on c, which the hot path refuses at
// once, and reads the answer.
func askRefused(t *testing.T, c net.Conn) {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion("example.", dns.TypeAXFR)
	b, _ := m.Pack()
	if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(b))), b...)); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	r, err := readFramed(c)
	if err != nil || r.Rcode != dns.RcodeRefused {
		t.Fatalf("zone transfer from %s: %v %v", c.LocalAddr(), r, err)
	}
}

// openClients is the client address of every connection ts holds.
func openClients(ts *tcpServer) map[netip.AddrPort]struct{} {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	out := make(map[netip.AddrPort]struct{}, len(ts.conns))
	for c := range ts.conns {
		out[c.client] = struct{}{}
	}
	return out
}

// TestTCPQueryLength: a query of wire.MaxQueryLen bytes is answered; a
// connection announcing a longer one is closed before its body is read,
// whatever follows, and counted.
func TestTCPQueryLength(t *testing.T) {
	ap := nstest.FreeLoopbackAddr(t)
	s, _ := startServer(t, ap, &tableUpstream{}, nil)
	// padded is a query for name padded with EDNS padding to size bytes.
	padded := func(name string, size int) []byte {
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		m.SetEdns0(1232, false)
		m.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_PADDING{Padding: make([]byte, size-m.Len()-4)}}
		b, err := m.Pack()
		if err != nil || len(b) != size {
			t.Fatalf("pack %d bytes: %d, %v", size, len(b), err)
		}
		return b
	}
	tests := []struct {
		name       string
		length     int    // the length prefix sent
		body       []byte // what follows it
		wantAnswer bool
	}{
		{"512 bytes", wire.MaxQueryLen, padded("at-bound.example.", wire.MaxQueryLen), true},
		{"513 bytes", wire.MaxQueryLen + 1, padded("past-bound.example.", wire.MaxQueryLen+1), false},
		{"65535 announced, nothing sent", 65535, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := s.stats.tcpOversized.Load()
			c, err := net.Dial("tcp", ap.String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(tt.length)), tt.body...)); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			r, err := readFramed(c)
			switch {
			case tt.wantAnswer && (err != nil || len(r.Answer) != 1):
				t.Fatalf("answer %v, err %v", r, err)
			case !tt.wantAnswer && !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET):
				t.Fatalf("got %v, err %v; want the connection closed", r, err)
			}
			want := before
			if !tt.wantAnswer {
				want++
			}
			if got := s.stats.tcpOversized.Load(); got != want {
				t.Errorf("oversized counter %d, want %d", got, want)
			}
		})
	}
}

// TestTCPSendNeverWaits: answers for a client that does not read are
// handed over without waiting — the flight answering them goes on to its
// other clients — and past TCPWriteQueue the connection is closed with
// what it queued, every pipeline slot given back.
func TestTCPSendNeverWaits(t *testing.T) {
	ap := nstest.FreeLoopbackAddr(t)
	s, _ := startServer(t, ap, &tableUpstream{}, nil)
	ts := s.tcp[0]
	// A connection of the test's own, whose client never reads and whose
	// server end has a small send buffer: writes to it block at once.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	conn := c.(*net.TCPConn)
	if err := conn.SetWriteBuffer(4096); err != nil {
		t.Fatal(err)
	}
	tc := &tcpConn{c: conn, slots: make(chan struct{}, s.cfg.TCPPipeline), done: make(chan struct{})}
	answer := make([]byte, 60000)
	start := time.Now()
	for range s.cfg.TCPPipeline {
		tc.slots <- struct{}{} // as the reader takes one for each query
		ts.send(tc, answer, nil)
	}
	if took := time.Since(start); took > time.Second/2 {
		t.Errorf("%d answers handed over in %s: send waited on the client", s.cfg.TCPPipeline, took)
	}
	tc.writer.Wait()
	tc.mu.Lock()
	closed := tc.closed
	tc.mu.Unlock()
	if !closed || len(tc.slots) != 0 || s.stats.tcpWriteOverflows.Load() != 1 {
		t.Errorf("closed %v, %d slots held, %d overflows; want closed, none held, 1", closed, len(tc.slots), s.stats.tcpWriteOverflows.Load())
	}
}

// TestTCPPipelineAnswered: a client that reads gets every answer to a
// full pipeline of queries, hits and misses mixed: the write queue's
// bound is no bound on a client that reads.
func TestTCPPipelineAnswered(t *testing.T) {
	ap := nstest.FreeLoopbackAddr(t)
	s, _ := startServer(t, ap, &tableUpstream{delay: 20 * time.Millisecond}, nil)
	for i := range 8 {
		exchange(t, "tcp", ap, fmt.Sprintf("hit%d.example.", i))
	}
	c, err := net.Dial("tcp", ap.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const n = 200 // some 6 KB of queries, written before any answer is read
	for i := range n {
		name := fmt.Sprintf("miss%d.example.", i)
		if i%2 == 0 {
			name = fmt.Sprintf("hit%d.example.", i%8)
		}
		writeFramed(t, c, name, uint16(i))
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	seen := map[uint16]bool{}
	for range n {
		r, err := readFramed(c)
		if err != nil {
			t.Fatalf("after %d answers: %v", len(seen), err)
		}
		seen[r.Id] = true
	}
	if len(seen) != n || s.stats.tcpWriteOverflows.Load() != 0 {
		t.Errorf("%d distinct answers, %d overflows; want %d and none", len(seen), s.stats.tcpWriteOverflows.Load(), n)
	}
}

func TestShutdownAnswersInflight(t *testing.T) {
	ap := nstest.FreeLoopbackAddr(t)
	c, err := cache.New(cache.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	pcfg := pipeline.DefaultConfig()
	up := &tableUpstream{delay: 100 * time.Millisecond, entered: make(chan struct{}, 1)}
	pcfg.Routes = []pipeline.Route{{Zone: ".", Upstream: up, Cache: c}}
	pcfg.Logger = testkit.Logger(t)
	p, err := pipeline.New(pcfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Listen = []netip.AddrPort{ap}
	cfg.Logger = testkit.Logger(t)
	s, err := Listen(cfg, everyAddr(cfg, p))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan *dns.Msg, 1)
	go func() { done <- exchange(t, "udp", ap, "inflight.example.") }()
	select {
	case <-up.entered: // the query is upstream now
	case <-time.After(3 * time.Second):
		t.Fatal("the query never reached the upstream")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s.Shutdown(ctx)
	select {
	case r := <-done:
		if len(r.Answer) != 1 {
			t.Fatalf("in-flight answer %v", r)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("in-flight query not answered across shutdown")
	}
	// And the sockets are gone: the address can be bound without reuseport.
	u, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(ap))
	if err != nil {
		t.Fatalf("UDP socket still bound after Shutdown: %v", err)
	}
	u.Close()
}

// everyAddr gives every listen address of cfg the pipeline p.
func everyAddr(cfg Config, p *pipeline.Pipeline) map[netip.AddrPort]*pipeline.Pipeline {
	m := make(map[netip.AddrPort]*pipeline.Pipeline, len(cfg.Listen))
	for _, ap := range cfg.Listen {
		m[ap] = p
	}
	return m
}

// TestSendTo: a hedged answer leaves from the listen address and port, as
// the client's resolver requires of an answer; an address the server does
// not listen on is an error.
func TestSendTo(t *testing.T) {
	ap := nstest.FreeLoopbackAddr(t)
	s, _ := startServer(t, ap, &tableUpstream{}, nil)
	client, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	to := client.LocalAddr().(*net.UDPAddr).AddrPort()
	if err := s.SendTo(ap, to, []byte("hedge")); err != nil {
		t.Fatalf("SendTo: %v", err)
	}
	_ = client.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 16)
	n, from, err := client.ReadFromUDPAddrPort(buf)
	if err != nil || string(buf[:n]) != "hedge" || from != ap {
		t.Fatalf("got %q from %v (%v), want \"hedge\" from %v", buf[:n], from, err, ap)
	}
	other := netip.AddrPortFrom(ap.Addr(), ap.Port()+1)
	if err := s.SendTo(other, to, []byte("x")); err == nil || !strings.Contains(err.Error(), "no UDP socket on "+other.String()) {
		t.Fatalf("SendTo from an address not served: %v", err)
	}
}

// TestCountReads: with a read counter set, each batch a read loop
// receives adds one (a query at a time: one per query); another address's
// counter gets nothing; nil stops the counting.
func TestCountReads(t *testing.T) {
	ap := nstest.FreeLoopbackAddr(t)
	s, _ := startServer(t, ap, &tableUpstream{}, nil)
	var reads, other atomic.Uint64
	s.CountReads(ap, &reads)
	s.CountReads(netip.AddrPortFrom(ap.Addr(), ap.Port()+1), &other)
	const n = 20
	for i := range n {
		exchange(t, "udp", ap, fmt.Sprintf("count-%d.example.", i%3))
	}
	if got := reads.Load(); got != n {
		t.Errorf("%d reads counted for %d queries sent one at a time, want %d", got, n, n)
	}
	if got := other.Load(); got != 0 {
		t.Errorf("another address's counter got %d", got)
	}
	s.CountReads(ap, nil)
	exchange(t, "udp", ap, "count-0.example.")
	if got := reads.Load(); got != n {
		t.Errorf("after CountReads(nil): %d, want %d", got, n)
	}
}
