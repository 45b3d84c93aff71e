// Package responder owns dnsstandby's sockets: for each listen address one
// UDP socket and one TCP listener that join LocalDNS's reuseport group,
// the read loops that feed queries to the pipeline and write its answers,
// and the TCP connection handling (framing, pipelining, limits).
//
// Data flows one way: listeners (this package) → pipeline → cache and
// upstreams. What to answer is the pipeline's business; the responder
// never reads the cache or asks an upstream itself. It does not decide
// whether dnsstandby serves either: takeover steers traffic to these
// sockets (it gets their descriptors from Sockets) and never reaches into
// the read loops, the pipeline, the cache or the upstreams; the loops
// only count their reads into a counter it hands them (CountReads).
package responder

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dnsstandby/dnsstandby/pipeline"
)

// Config configures a Server. Start from DefaultConfig and set Listen.
type Config struct {
	// Listen are the addresses to serve, each a specific address and a
	// non-zero port (LocalDNS's); at least one.
	Listen []netip.AddrPort

	// SocketsPerAddr is how many UDP sockets join each reuseport group.
	// More sockets take a larger share of the kernel's hash away from
	// LocalDNS. Must be positive.
	SocketsPerAddr int
	// ReadersPerSocket is how many read loops serve one UDP socket. Must
	// be positive.
	ReadersPerSocket int
	// Batch is how many datagrams one system call may receive or send,
	// from 1 to 1024 (the kernel's UIO_MAXIOV).
	Batch int
	// RcvBuf is the UDP receive buffer asked for, in bytes; 0 keeps the
	// kernel's default.
	RcvBuf int

	// MaxTCPConns caps open TCP connections. At the cap a new connection
	// takes the place of the longest idle one (no query waiting on an
	// upstream), or, when every one has a query waiting, of the oldest
	// connection of the address holding the most: a few addresses
	// holding slow queries on every connection lock no one else out.
	// Must be positive.
	MaxTCPConns int
	// MaxTCPConnsPerAddr caps the open TCP connections of one source
	// address; a new one past it takes the place of that address's
	// longest idle connection, else its oldest. Must be positive.
	MaxTCPConnsPerAddr int
	// TCPIdle closes a connection waiting this long for a query; TCPRead
	// is how long a started query has to arrive whole; TCPWrite is how
	// long an answer has to be written. All must be positive.
	TCPIdle  time.Duration
	TCPRead  time.Duration
	TCPWrite time.Duration
	// TCPPipeline caps the queries one connection may have in flight.
	// Must be positive.
	TCPPipeline int
	// TCPWriteQueue caps the bytes of answers one connection may have
	// waiting while an earlier answer is being written to it; an answer
	// past it closes the connection (its client is not reading). An
	// answer of any size is taken when nothing waits. Must be positive.
	TCPWriteQueue int

	// Inherit, if set, hands over sockets a previous process left (the
	// systemd file descriptor store): Listen takes those that fit before
	// binding new ones. Datagrams and connections queued on them while
	// no process read are then answered by this one.
	Inherit Inheritor

	// Logger is tagged component=responder; nil discards.
	Logger *slog.Logger
}

// Inheritor hands over already bound sockets. Each Take returns one that
// fits the listen address (reuseport, bound to it exactly), or nil.
type Inheritor interface {
	TakeUDP(ap netip.AddrPort) *net.UDPConn
	TakeTCP(ap netip.AddrPort) *net.TCPListener
}

// DefaultConfig returns defaults for everything but Listen.
func DefaultConfig() Config {
	return Config{
		// One socket: the smallest share of the reuseport hash that still
		// takes traffic over when LocalDNS's sockets close.
		SocketsPerAddr:   1,
		ReadersPerSocket: runtime.GOMAXPROCS(0),
		Batch:            32,
		// 8 MiB holds ~40,000 queued queries: a second of a busy node's
		// traffic, arriving while a crashed LocalDNS's share moves to us.
		RcvBuf:      8 << 20,
		MaxTCPConns: 1000,
		// A tenth of MaxTCPConns, as the pipeline's MaxPerClient is of
		// its MaxInflight: ten addresses to fill the cap. A pod's stub
		// opens one connection per truncated answer and closes it; the
		// node's address, shared by host-network pods, stays far below.
		MaxTCPConnsPerAddr: 100,
		// CoreDNS closes idle TCP connections after 10 s too; RFC 7766
		// §6.2.3 lets a server close idle ones earlier under pressure.
		TCPIdle:     10 * time.Second,
		TCPRead:     2 * time.Second,
		TCPWrite:    2 * time.Second,
		TCPPipeline: 32,
		// A pipeline's worth (32) of 2 KB answers: a client that reads
		// never comes near it; with the cap on connections, it bounds
		// what clients that do not read can make us hold.
		TCPWriteQueue: 64 << 10,
	}
}

// maxBatch is the kernel's UIO_MAXIOV, the most recvmmsg and sendmmsg take.
const maxBatch = 1024

// Validate checks c as Listen takes it; its errors name the Config field.
// The daemon calls it for `dnsstandby run --validate`.
func (c *Config) Validate() error {
	if err := c.validate(); err != nil {
		return fmt.Errorf("responder: %w", err)
	}
	return nil
}

func (c *Config) validate() error {
	if len(c.Listen) == 0 {
		return errors.New("Listen is empty")
	}
	for i, ap := range c.Listen {
		if !ap.IsValid() || ap.Addr().IsUnspecified() || ap.Port() == 0 {
			return fmt.Errorf("Listen[%d] %s: want a specific address and port (dnsstandby shares LocalDNS's socket, which is bound to one)", i, ap)
		}
	}
	switch {
	case c.SocketsPerAddr <= 0:
		return fmt.Errorf("SocketsPerAddr must be positive, got %d", c.SocketsPerAddr)
	case c.ReadersPerSocket <= 0:
		return fmt.Errorf("ReadersPerSocket must be positive, got %d", c.ReadersPerSocket)
	case c.Batch < 1 || c.Batch > maxBatch:
		return fmt.Errorf("Batch must be from 1 to %d, got %d", maxBatch, c.Batch)
	case c.RcvBuf < 0:
		return fmt.Errorf("RcvBuf must not be negative, got %d", c.RcvBuf)
	case c.MaxTCPConns <= 0:
		return fmt.Errorf("MaxTCPConns must be positive, got %d", c.MaxTCPConns)
	case c.MaxTCPConnsPerAddr <= 0:
		return fmt.Errorf("MaxTCPConnsPerAddr must be positive, got %d", c.MaxTCPConnsPerAddr)
	case c.TCPIdle <= 0:
		return fmt.Errorf("TCPIdle must be positive, got %s", c.TCPIdle)
	case c.TCPRead <= 0:
		return fmt.Errorf("TCPRead must be positive, got %s", c.TCPRead)
	case c.TCPWrite <= 0:
		return fmt.Errorf("TCPWrite must be positive, got %s", c.TCPWrite)
	case c.TCPPipeline <= 0:
		return fmt.Errorf("TCPPipeline must be positive, got %d", c.TCPPipeline)
	case c.TCPWriteQueue <= 0:
		return fmt.Errorf("TCPWriteQueue must be positive, got %d", c.TCPWriteQueue)
	}
	return nil
}

// Server is a set of listeners, each feeding the pipeline of its listen
// address: LocalDNS serves each address from its own server blocks, so
// dnsstandby answers each from its own routes and cache.
type Server struct {
	cfg   Config
	pipes map[netip.AddrPort]*pipeline.Pipeline // one per listen address
	log   *slog.Logger                          // always non-nil, tagged component=responder

	udp       []*net.UDPConn
	tcp       []*tcpServer
	inherited int // sockets taken from Config.Inherit

	loops   []*udpLoop
	readers sync.WaitGroup // UDP read loops and TCP accept loops

	stats serverStats
}

// Listen validates cfg, taken as given, and opens every socket, so that
// address and permission errors surface before the daemon reports ready.
// pipes holds the pipeline of each listen address. It starts nothing.
func Listen(cfg Config, pipes map[netip.AddrPort]*pipeline.Pipeline) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	for _, ap := range cfg.Listen {
		if pipes[ap] == nil {
			return nil, fmt.Errorf("responder: no pipeline for listen address %s", ap)
		}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, pipes: pipes, log: log.With("component", "responder")}
	for _, ap := range cfg.Listen {
		for range cfg.SocketsPerAddr {
			conn, err := s.udpSocket(ap)
			if err != nil {
				s.closeAll()
				return nil, fmt.Errorf("responder: %w", err)
			}
			s.udp = append(s.udp, conn)
		}
		ln, err := s.tcpListener(ap)
		if err != nil {
			s.closeAll()
			return nil, fmt.Errorf("responder: %w", err)
		}
		s.tcp = append(s.tcp, newTCPServer(s, ln, pipes[ap]))
	}
	return s, nil
}

// udpSocket takes an inherited UDP socket for ap, else binds one.
func (s *Server) udpSocket(ap netip.AddrPort) (*net.UDPConn, error) {
	if s.cfg.Inherit != nil {
		if conn := s.cfg.Inherit.TakeUDP(ap); conn != nil {
			setRcvbuf(conn, s.cfg.RcvBuf)
			s.inherited++
			return conn, nil
		}
	}
	return listenUDP(ap, s.cfg.RcvBuf)
}

// tcpListener takes an inherited TCP listener for ap, else binds one.
func (s *Server) tcpListener(ap netip.AddrPort) (*net.TCPListener, error) {
	if s.cfg.Inherit != nil {
		if ln := s.cfg.Inherit.TakeTCP(ap); ln != nil {
			s.inherited++
			return ln, nil
		}
	}
	return listenTCP(ap)
}

// Inherited is how many of the sockets Listen took from Config.Inherit
// rather than bound.
func (s *Server) Inherited() int { return s.inherited }

// Start launches the read and accept loops.
func (s *Server) Start() error {
	for _, conn := range s.udp {
		rc, err := conn.SyscallConn()
		if err != nil {
			return fmt.Errorf("responder: %w", err)
		}
		pipe := s.pipes[conn.LocalAddr().(*net.UDPAddr).AddrPort()]
		for range s.cfg.ReadersPerSocket {
			l := &udpLoop{
				s:      s,
				conn:   conn,
				pipe:   pipe,
				b:      newBatch(rc, s.cfg.Batch, maxQuery, pipeline.MaxUDPAnswer),
				worker: pipe.NewWorker(),
			}
			s.loops = append(s.loops, l)
			s.readers.Add(1)
			go func() { defer s.readers.Done(); l.run() }()
		}
	}
	for _, t := range s.tcp {
		s.readers.Add(1)
		go func() { defer s.readers.Done(); t.acceptLoop() }()
	}
	s.log.Info("listening", slog.String("listen", fmt.Sprint(s.cfg.Listen)), slog.Int("udp_sockets", len(s.udp)),
		slog.Int("udp_readers", len(s.loops)), slog.Int("batch", s.cfg.Batch), slog.Int("inherited", s.inherited))
	return nil
}

// Shutdown stops reading, lets the pipeline finish the queries in flight
// (bounded by ctx), and closes every socket: Drain, then Close. Datagrams
// still queued on our sockets at that moment are lost, unless another
// copy of the socket (systemd's file descriptor store) keeps it open for
// the next process; the kernel sends later ones to the rest of the
// reuseport group (LocalDNS).
func (s *Server) Shutdown(ctx context.Context) {
	s.Drain(ctx)
	s.Close()
}

// Drain stops reading and accepting, lets the pipeline finish the queries
// in flight (bounded by ctx) and closes TCP connections; the sockets stay
// open, so the caller can detach its steering program from the groups
// before they close.
func (s *Server) Drain(ctx context.Context) {
	for _, t := range s.tcp {
		t.stopAccepting()
	}
	for _, conn := range s.udp {
		_ = conn.SetReadDeadline(time.Now())
	}
	s.readers.Wait()
	for _, p := range s.pipes {
		p.Drain(ctx)
	}
	for _, t := range s.tcp {
		t.closeConns()
	}
}

// Close closes every socket.
func (s *Server) Close() { s.closeAll() }

func (s *Server) closeAll() {
	for _, conn := range s.udp {
		_ = conn.Close()
	}
	for _, t := range s.tcp {
		_ = t.ln.Close()
	}
}

// CountReads has every read loop of the UDP sockets on listen add 1 to
// reads per batch it receives: one atomic add, no system call and no
// allocation per batch. Takeover passes the steering program's read
// counter (steer.Steerer.Reads), whose read test then takes the traffic
// away from a dnsstandby that stops reading. Call it after Start; nil
// stops the counting.
func (s *Server) CountReads(listen netip.AddrPort, reads *atomic.Uint64) {
	for _, l := range s.loops {
		if l.conn.LocalAddr().(*net.UDPAddr).AddrPort() == listen {
			l.reads.Store(reads)
		}
	}
}

// UDPReceived returns how many datagrams the UDP sockets have received,
// over every listen address: what takeover compares with the queries the
// packet tap saw arrive for them, to notice queries taken elsewhere
// before any socket (AKS's nat fallback).
func (s *Server) UDPReceived() uint64 { return s.stats.udpReceived.Load() }

// stuckAfter is how long a read loop may spend on one batch before the
// server counts as unhealthy: a batch normally takes microseconds.
const stuckAfter = 5 * time.Second

// Healthy returns an error if a read loop is stuck inside a batch.
func (s *Server) Healthy() error {
	now := time.Now().UnixNano()
	for i, l := range s.loops {
		if since := l.busySince.Load(); since != 0 && now-since > int64(stuckAfter) {
			return fmt.Errorf("udp read loop %d stuck for %s", i, time.Duration(now-since).Round(time.Millisecond))
		}
	}
	return nil
}

// Socket is one of the server's sockets, for the steering program and the
// peer watch, which need their file descriptors and inodes.
type Socket struct {
	Addr netip.AddrPort
	UDP  bool
	Conn syscall.RawConn
}

// Sockets returns every UDP socket and TCP listener.
func (s *Server) Sockets() ([]Socket, error) {
	var out []Socket
	for _, c := range s.udp {
		rc, err := c.SyscallConn()
		if err != nil {
			return nil, fmt.Errorf("responder: %w", err)
		}
		out = append(out, Socket{Addr: c.LocalAddr().(*net.UDPAddr).AddrPort(), UDP: true, Conn: rc})
	}
	for _, t := range s.tcp {
		rc, err := t.ln.SyscallConn()
		if err != nil {
			return nil, fmt.Errorf("responder: %w", err)
		}
		out = append(out, Socket{Addr: t.ln.Addr().(*net.TCPAddr).AddrPort(), UDP: false, Conn: rc})
	}
	return out, nil
}

// SendTo sends b to client from a UDP socket bound to listen, so that it
// leaves with the listen address and port as its source, as an answer to
// a query sent there must (hedged answers to queries LocalDNS left
// unanswered go out this way). It does not block for long: UDP sends only
// wait for buffer space.
func (s *Server) SendTo(listen, client netip.AddrPort, b []byte) error {
	for _, c := range s.udp {
		if c.LocalAddr().(*net.UDPAddr).AddrPort() != listen {
			continue
		}
		if _, err := c.WriteToUDPAddrPort(b, client); err != nil {
			s.stats.udpSendFailures.Add(1)
			return fmt.Errorf("responder: send to %s from %s: %w", client, listen, err)
		}
		return nil
	}
	return fmt.Errorf("responder: no UDP socket on %s", listen)
}

// Addrs returns the UDP sockets' local addresses, in Listen order.
func (s *Server) Addrs() []netip.AddrPort {
	out := make([]netip.AddrPort, 0, len(s.udp))
	for _, c := range s.udp {
		out = append(out, c.LocalAddr().(*net.UDPAddr).AddrPort())
	}
	return out
}

// serverStats are the responder's own counters; answers are counted by
// the pipeline.
type serverStats struct {
	udpReceived         atomic.Uint64
	udpTruncatedQueries atomic.Uint64
	udpSendFailures     atomic.Uint64
	udpReadErrors       atomic.Uint64
	tcpAccepted         atomic.Uint64
	tcpEvicted          [numEvictions]atomic.Uint64
	tcpRejected         atomic.Uint64
	tcpOversized        atomic.Uint64
	tcpWriteOverflows   atomic.Uint64
	tcpOpen             atomic.Int64
}
