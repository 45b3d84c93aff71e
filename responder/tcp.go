package responder

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dnsstandby/dnsstandby/pipeline"
	"github.com/dnsstandby/dnsstandby/wire"
)

// tcpServer serves one TCP listener: DNS over TCP with 2-byte length
// framing (RFC 1035 §4.2.2), several queries in flight per connection and
// answered as they complete (RFC 7766 §6.2.1.1), a cap on connections, and
// timeouts so that idle or trickling clients (slowloris) cannot pin them.
type tcpServer struct {
	s    *Server
	ln   *net.TCPListener
	pipe *pipeline.Pipeline // the listen address's

	// workers are the pipeline handles connections borrow per query; a
	// channel pool keeps their number fixed however many connections come.
	workers chan *pipeline.Worker
	bufs    sync.Pool // *[]byte of 2+MaxMsgLen: framed answers

	mu     sync.Mutex // guards following
	conns  map[*tcpConn]struct{}
	closed bool

	handlers sync.WaitGroup
}

type tcpConn struct {
	c          *net.TCPConn
	client     netip.AddrPort
	writeMu    sync.Mutex    // one answer at a time on the wire
	inflight   atomic.Int32  // queries handed to the pipeline, not yet answered
	lastActive atomic.Int64  // unix ns of the last query or answer
	slots      chan struct{} // one token per query in flight: the pipeline cap
	// in holds the query being handled: the pipeline keeps nothing of it
	// once Answer or Resolve returns, so one buffer serves them all.
	in [wire.MaxQueryLen]byte
}

func newTCPServer(s *Server, ln *net.TCPListener, pipe *pipeline.Pipeline) *tcpServer {
	t := &tcpServer{
		s:       s,
		ln:      ln,
		pipe:    pipe,
		workers: make(chan *pipeline.Worker, s.cfg.ReadersPerSocket),
		conns:   make(map[*tcpConn]struct{}),
	}
	for range cap(t.workers) {
		t.workers <- pipe.NewWorker()
	}
	t.bufs.New = func() any { b := make([]byte, 2+wire.MaxMsgLen); return &b }
	return t
}

func (t *tcpServer) acceptLoop() {
	var backoff time.Duration
	for {
		c, err := t.ln.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrDeadlineExceeded) && t.stopped() {
				return
			}
			// EMFILE and friends: wait, do not spin.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		t.s.stats.tcpAccepted.Add(1)
		tc := &tcpConn{c: c, slots: make(chan struct{}, t.s.cfg.TCPPipeline)}
		if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
			tc.client = ap
		}
		tc.lastActive.Store(time.Now().UnixNano())
		if !t.admit(tc) {
			t.s.stats.tcpRejected.Add(1)
			_ = c.Close()
			continue
		}
		t.handlers.Add(1)
		go func() {
			defer t.handlers.Done()
			t.serve(tc)
		}()
	}
}

// admit registers tc, closing the longest-idle connection with nothing in
// flight if the cap is reached. It fails if every connection is busy.
func (t *tcpServer) admit(tc *tcpConn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	if len(t.conns) >= t.s.cfg.MaxTCPConns {
		var idlest *tcpConn
		for c := range t.conns {
			if c.inflight.Load() == 0 && (idlest == nil || c.lastActive.Load() < idlest.lastActive.Load()) {
				idlest = c
			}
		}
		if idlest == nil {
			return false
		}
		delete(t.conns, idlest)
		_ = idlest.c.Close() // its handler sees the error and exits
		t.s.stats.tcpEvicted.Add(1)
	}
	t.conns[tc] = struct{}{}
	t.s.stats.tcpOpen.Add(1)
	return true
}

func (t *tcpServer) forget(tc *tcpConn) {
	t.mu.Lock()
	delete(t.conns, tc)
	t.mu.Unlock()
	t.s.stats.tcpOpen.Add(-1)
}

// serve reads queries from one connection until it closes, times out or
// sends something that is not DNS.
func (t *tcpServer) serve(tc *tcpConn) {
	defer t.forget(tc)
	defer tc.c.Close()
	cfg := &t.s.cfg
	var lenBuf [2]byte
	for {
		// Waiting for a query: the idle timeout. Once it starts, the rest
		// must follow within the read timeout.
		_ = tc.c.SetReadDeadline(time.Now().Add(cfg.TCPIdle))
		if _, err := io.ReadFull(tc.c, lenBuf[:1]); err != nil {
			return
		}
		_ = tc.c.SetReadDeadline(time.Now().Add(cfg.TCPRead))
		if _, err := io.ReadFull(tc.c, lenBuf[1:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint16(lenBuf[:]))
		if n < wire.HeaderLen {
			return // not DNS; nothing sensible to answer
		}
		if n > wire.MaxQueryLen {
			// Longer than any query: padding, sent to make us hold it.
			// Closing costs a legitimate client nothing it could have
			// had from LocalDNS over UDP.
			t.s.stats.tcpOversized.Add(1)
			return
		}
		msg := tc.in[:n]
		if _, err := io.ReadFull(tc.c, msg); err != nil {
			return
		}
		tc.lastActive.Store(time.Now().UnixNano())

		// Cap the queries in flight on this connection: stop reading
		// until one completes.
		tc.slots <- struct{}{}
		bp := t.bufs.Get().(*[]byte)
		w := <-t.workers
		k, act := w.Answer((*bp)[2:], msg, false)
		t.workers <- w
		switch act {
		case pipeline.Reply:
			t.write(tc, (*bp)[2:2+k], bp)
			<-tc.slots
		case pipeline.Resolve:
			t.bufs.Put(bp)
			tc.inflight.Add(1)
			t.pipe.Resolve(msg, tc.client, false, func(reply []byte) {
				t.write(tc, reply, nil)
				tc.inflight.Add(-1)
				<-tc.slots
			})
		default:
			t.bufs.Put(bp)
			<-tc.slots
		}
	}
}

// write frames and sends one answer. If framed is non-nil, the answer
// already sits at (*framed)[2:] and framed goes back to the pool.
func (t *tcpServer) write(tc *tcpConn, answer []byte, framed *[]byte) {
	var out []byte
	if framed != nil {
		out = (*framed)[:2+len(answer)]
		defer t.bufs.Put(framed)
	} else {
		out = make([]byte, 2+len(answer))
		copy(out[2:], answer)
	}
	binary.BigEndian.PutUint16(out, uint16(len(answer)))
	tc.writeMu.Lock()
	defer tc.writeMu.Unlock()
	_ = tc.c.SetWriteDeadline(time.Now().Add(t.s.cfg.TCPWrite))
	if _, err := tc.c.Write(out); err != nil {
		_ = tc.c.Close() // a client that does not read its answers goes
		return
	}
	tc.lastActive.Store(time.Now().UnixNano())
}

// stopAccepting stops the accept loop but leaves the listener open: it
// stays a member of the reuseport group until Close, so that the steering
// program can still be detached through it.
func (t *tcpServer) stopAccepting() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	_ = t.ln.SetDeadline(time.Now())
}

func (t *tcpServer) stopped() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// closeConns closes every connection and waits for their handlers.
func (t *tcpServer) closeConns() {
	t.mu.Lock()
	for c := range t.conns {
		_ = c.c.Close()
	}
	t.mu.Unlock()
	t.handlers.Wait()
}
