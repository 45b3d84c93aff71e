// Package responder owns dnsstandby's sockets: for each listen address one
// UDP socket and one TCP listener that join LocalDNS's reuseport group,
// the read loops that feed queries to the pipeline and write its answers,
// and the TCP connection handling (framing, pipelining, limits). What to
// answer is the pipeline's business.
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

// Config configures a Server.
type Config struct {
	Listen []netip.AddrPort // specific addresses; at least one

	// SocketsPerAddr is how many UDP sockets join each reuseport group.
	// More sockets take a larger share of the kernel's hash away from
	// LocalDNS, so the default is 1.
	SocketsPerAddr int
	// ReadersPerSocket is how many read loops serve one UDP socket; the
	// default is GOMAXPROCS.
	ReadersPerSocket int
	// Batch is how many datagrams one system call may receive or send.
	Batch int
	// RcvBuf is the UDP receive buffer asked for, in bytes.
	RcvBuf int

	MaxTCPConns int           // open TCP connections; at the cap the idlest is closed
	TCPIdle     time.Duration // a connection waiting this long for a query is closed
	TCPRead     time.Duration // a started query must arrive whole within this
	TCPWrite    time.Duration // an answer must be written within this
	// TCPPipeline caps the queries one connection may have in flight.
	TCPPipeline int

	Logger *slog.Logger // or nil
}

// DefaultConfig returns defaults for everything but Listen.
func DefaultConfig() Config {
	return Config{
		SocketsPerAddr:   1,
		ReadersPerSocket: runtime.GOMAXPROCS(0),
		Batch:            32,
		// 8 MiB holds ~40,000 queued queries: a second of a busy node's
		// traffic, arriving while a crashed LocalDNS's share moves to us.
		RcvBuf:      8 << 20,
		MaxTCPConns: 1000,
		// CoreDNS closes idle TCP connections after 10 s too; RFC 7766
		// §6.2.3 lets a server close idle ones earlier under pressure.
		TCPIdle:     10 * time.Second,
		TCPRead:     2 * time.Second,
		TCPWrite:    2 * time.Second,
		TCPPipeline: 32,
	}
}

// Server is a set of listeners feeding one pipeline.
type Server struct {
	cfg  Config
	pipe *pipeline.Pipeline // always non-nil
	log  *slog.Logger       // always non-nil

	udp []*net.UDPConn
	tcp []*tcpServer

	loops   []*udpLoop
	readers sync.WaitGroup // UDP read loops and TCP accept loops

	stats serverStats
}

// Listen opens every socket, so that address and permission errors surface
// before the daemon reports ready. It starts nothing.
func Listen(cfg Config, p *pipeline.Pipeline) (*Server, error) {
	if len(cfg.Listen) == 0 {
		return nil, errors.New("responder: no listen address")
	}
	if p == nil {
		return nil, errors.New("responder: no pipeline")
	}
	def := DefaultConfig()
	if cfg.SocketsPerAddr <= 0 {
		cfg.SocketsPerAddr = def.SocketsPerAddr
	}
	if cfg.ReadersPerSocket <= 0 {
		cfg.ReadersPerSocket = def.ReadersPerSocket
	}
	if cfg.Batch <= 0 {
		cfg.Batch = def.Batch
	}
	if cfg.MaxTCPConns <= 0 || cfg.TCPIdle <= 0 || cfg.TCPRead <= 0 || cfg.TCPWrite <= 0 || cfg.TCPPipeline <= 0 {
		return nil, errors.New("responder: TCP limits must be positive")
	}
	s := &Server{cfg: cfg, pipe: p, log: cfg.Logger}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	for _, ap := range cfg.Listen {
		if !ap.IsValid() || ap.Addr().IsUnspecified() || ap.Port() == 0 {
			s.closeAll()
			return nil, fmt.Errorf("responder: listen address %s: want a specific address and port (dnsstandby shares LocalDNS's socket, which is bound to one)", ap)
		}
		for range cfg.SocketsPerAddr {
			conn, err := listenUDP(ap, cfg.RcvBuf)
			if err != nil {
				s.closeAll()
				return nil, fmt.Errorf("responder: %w", err)
			}
			s.udp = append(s.udp, conn)
		}
		ln, err := listenTCP(ap)
		if err != nil {
			s.closeAll()
			return nil, fmt.Errorf("responder: %w", err)
		}
		s.tcp = append(s.tcp, newTCPServer(s, ln))
	}
	return s, nil
}

// Start launches the read and accept loops.
func (s *Server) Start() error {
	for _, conn := range s.udp {
		rc, err := conn.SyscallConn()
		if err != nil {
			return fmt.Errorf("responder: %w", err)
		}
		for range s.cfg.ReadersPerSocket {
			l := &udpLoop{
				s:      s,
				conn:   conn,
				b:      newBatch(rc, s.cfg.Batch, maxQuery, pipeline.MaxUDPAnswer),
				worker: s.pipe.NewWorker(),
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
	s.log.Info("listening", "addresses", fmt.Sprint(s.cfg.Listen), "udp_sockets", len(s.udp),
		"udp_readers", len(s.loops), "batch", s.cfg.Batch)
	return nil
}

// Shutdown stops reading, lets the pipeline finish the queries in flight
// (bounded by ctx), and closes every socket: Drain, then Close. Datagrams
// still queued on our sockets at that moment are lost; the kernel sends
// later ones to the rest of the reuseport group (LocalDNS).
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
	s.pipe.Drain(ctx)
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
	udpTruncatedQueries atomic.Uint64
	udpSendFailures     atomic.Uint64
	udpReadErrors       atomic.Uint64
	tcpAccepted         atomic.Uint64
	tcpEvicted          atomic.Uint64
	tcpRejected         atomic.Uint64
	tcpOpen             atomic.Int64
}
