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

	mu      sync.Mutex // guards following
	conns   map[*tcpConn]struct{}
	perAddr map[netip.Addr]int // open connections by client address
	closed  bool
	// idleGrace is idleGraceDefault; tests shorten it.
	idleGrace time.Duration

	handlers sync.WaitGroup
}

type tcpConn struct {
	c          *net.TCPConn
	client     netip.AddrPort
	opened     int64         // unix ns of the accept
	inflight   atomic.Int32  // queries handed to the pipeline, not yet answered
	lastActive atomic.Int64  // unix ns of the last query or answer
	slots      chan struct{} // one token per query not yet answered on the wire: the pipeline cap
	// in holds the query being handled: the pipeline keeps nothing of it
	// once Answer or Resolve returns, so one buffer serves them all.
	in [wire.MaxQueryLen]byte

	// Answers go out through a queue, so that no one who answers waits
	// on this client reading: a flight answering many clients hands each
	// its answer and moves on (see send).
	mu      sync.Mutex // guards following
	queue   [][]byte   // framed answers waiting to be written
	queued  int        // their bytes
	writing bool       // a goroutine is writing: the reader, or writer
	closed  bool
	done    chan struct{} // closed by shut
	// writer is the goroutine send starts for answers that come while
	// the reader is not writing; serve waits for it.
	writer sync.WaitGroup
}

func newTCPServer(s *Server, ln *net.TCPListener, pipe *pipeline.Pipeline) *tcpServer {
	t := &tcpServer{
		s:         s,
		ln:        ln,
		pipe:      pipe,
		workers:   make(chan *pipeline.Worker, s.cfg.ReadersPerSocket),
		conns:     make(map[*tcpConn]struct{}),
		perAddr:   make(map[netip.Addr]int),
		idleGrace: idleGraceDefault,
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
		tc := &tcpConn{c: c, slots: make(chan struct{}, t.s.cfg.TCPPipeline), done: make(chan struct{})}
		if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
			tc.client = ap
		}
		tc.opened = time.Now().UnixNano()
		tc.lastActive.Store(tc.opened)
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

// admit registers tc, making room for it when its address or the server
// is at its cap; it fails only once the server stops accepting.
//
// Room is made by closing a connection, and the one closed is chosen so
// that no address can keep others out. At the address's own cap, it is
// one of that address's: its longest idle, else its oldest. At the
// server's cap, the longest idle one, which costs its client only a new
// connection (RFC 7766 §6.2.3 lets a server close idle connections under
// pressure); a connection quiet for less than idleGraceDefault is not idle but
// a client about to ask, which a stream of new connections must not
// close before it can. With none idle, the oldest connection of the
// address holding the most goes. A busy connection closed takes its
// waiting queries with it: their answers are dropped when they come, and
// the client asks again, as after any closed connection.
func (t *tcpServer) admit(tc *tcpConn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	cfg := &t.s.cfg
	addr := tc.client.Addr()
	switch {
	case t.perAddr[addr] >= cfg.MaxTCPConnsPerAddr:
		same := func(c *tcpConn) bool { return c.client.Addr() == addr }
		victim := t.idlestLocked(same, tc.opened)
		if victim == nil {
			victim = t.oldestLocked(same)
		}
		t.evictLocked(victim, evictAddress)
	case len(t.conns) >= cfg.MaxTCPConns:
		if victim := t.idlestLocked(nil, tc.opened-int64(t.idleGrace)); victim != nil {
			t.evictLocked(victim, evictIdle)
			break
		}
		top := t.topAddrLocked()
		t.evictLocked(t.oldestLocked(func(c *tcpConn) bool { return c.client.Addr() == top }), evictBusy)
	}
	t.conns[tc] = struct{}{}
	t.perAddr[addr]++
	t.s.stats.tcpOpen.Add(1)
	return true
}

// Why a connection was closed to admit another: the reason label of
// dnsstandby_tcp_connections_evicted_total.
const (
	evictIdle    = iota // the longest idle, at the server's cap
	evictBusy           // none idle: the oldest of the address holding the most
	evictAddress        // at its address's cap: one of the same address's
	numEvictions
)

var evictionNames = [numEvictions]string{"idle", "busy", "address"}

// idleGraceDefault is how long a connection with nothing in flight must have
// been quiet to count as idle at the server's cap: a client asks within a
// round trip of connecting, and asks its next question within one of an
// answer.
const idleGraceDefault = time.Second

// idlestLocked returns the connection with nothing in flight that has
// been quiet longest, quiet since before quietBefore (unix ns), among
// those match accepts (nil: all); or nil if there is none.
func (t *tcpServer) idlestLocked(match func(*tcpConn) bool, quietBefore int64) *tcpConn {
	var idlest *tcpConn
	for c := range t.conns {
		last := c.lastActive.Load()
		if (match == nil || match(c)) && c.inflight.Load() == 0 && last < quietBefore && (idlest == nil || last < idlest.lastActive.Load()) {
			idlest = c
		}
	}
	return idlest
}

// oldestLocked returns the connection accepted first among those match
// accepts, or nil if there is none.
func (t *tcpServer) oldestLocked(match func(*tcpConn) bool) *tcpConn {
	var oldest *tcpConn
	for c := range t.conns {
		if match(c) && (oldest == nil || c.opened < oldest.opened) {
			oldest = c
		}
	}
	return oldest
}

// topAddrLocked returns the address with the most open connections.
func (t *tcpServer) topAddrLocked() netip.Addr {
	var top netip.Addr
	most := 0
	for a, n := range t.perAddr {
		if n > most {
			top, most = a, n
		}
	}
	return top
}

// evictLocked closes c to make room for another connection; its handler
// sees the error and exits.
func (t *tcpServer) evictLocked(c *tcpConn, why int) {
	if c == nil {
		return
	}
	t.removeLocked(c)
	c.shut()
	t.s.stats.tcpEvicted[why].Add(1)
}

// removeLocked unregisters c, if it still is.
func (t *tcpServer) removeLocked(c *tcpConn) {
	if _, ok := t.conns[c]; !ok {
		return
	}
	delete(t.conns, c)
	addr := c.client.Addr()
	if n := t.perAddr[addr] - 1; n > 0 {
		t.perAddr[addr] = n
	} else {
		delete(t.perAddr, addr)
	}
}

func (t *tcpServer) forget(tc *tcpConn) {
	t.mu.Lock()
	t.removeLocked(tc)
	t.mu.Unlock()
	t.s.stats.tcpOpen.Add(-1)
}

// serve reads queries from one connection until it closes, times out or
// sends something that is not DNS.
func (t *tcpServer) serve(tc *tcpConn) {
	defer t.forget(tc)
	defer tc.writer.Wait()
	defer tc.shut()
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
		// until one is answered.
		select {
		case tc.slots <- struct{}{}:
		case <-tc.done:
			return
		}
		bp := t.bufs.Get().(*[]byte)
		w := <-t.workers
		k, act := w.Answer((*bp)[2:], msg, false)
		t.workers <- w
		switch act {
		case pipeline.Reply:
			t.send(tc, (*bp)[2:2+k], bp)
		case pipeline.Resolve:
			t.bufs.Put(bp)
			tc.inflight.Add(1)
			t.pipe.Resolve(msg, tc.client, false, func(reply []byte) {
				t.send(tc, reply, nil)
				tc.inflight.Add(-1)
			})
		default:
			t.bufs.Put(bp)
			<-tc.slots
		}
	}
}

// send puts one answer on the wire, or on its way there, without ever
// waiting for the client to read: a flight answering many clients calls
// it for each in turn, and one client that does not read must not delay
// the others (nor shutdown). If the answer sits framed in the pool
// buffer framed ((*framed)[2:]), send is called by the reader; else by a
// flight, and answer is copied.
//
// Whoever finds nobody writing writes: the reader at once, on its own
// goroutine (a client that does not read stops its own reads, no one
// else's); a flight through a writer goroutine it starts. Others queue
// a copy. The queue holds at most TCPWriteQueue bytes besides what is
// being written, and an answer is always taken into an empty one: past
// that the client is not reading, and the connection is closed with
// what it queued.
func (t *tcpServer) send(tc *tcpConn, answer []byte, framed *[]byte) {
	tc.mu.Lock()
	if tc.closed {
		tc.mu.Unlock()
		if framed != nil {
			t.bufs.Put(framed)
		}
		<-tc.slots
		return
	}
	if !tc.writing && framed != nil {
		tc.writing = true
		tc.mu.Unlock()
		out := (*framed)[:2+len(answer)]
		binary.BigEndian.PutUint16(out, uint16(len(answer)))
		err := t.write(tc, [][]byte{out})
		t.bufs.Put(framed)
		t.wrote(tc, 1, err)
		t.flush(tc)
		return
	}
	n := 2 + len(answer)
	if tc.queued > 0 && tc.queued+n > t.s.cfg.TCPWriteQueue {
		tc.mu.Unlock()
		if framed != nil {
			t.bufs.Put(framed)
		}
		<-tc.slots
		t.s.stats.tcpWriteOverflows.Add(1)
		tc.shut()
		return
	}
	out := make([]byte, n)
	binary.BigEndian.PutUint16(out, uint16(len(answer)))
	copy(out[2:], answer)
	if framed != nil {
		t.bufs.Put(framed)
	}
	tc.queue = append(tc.queue, out)
	tc.queued += n
	if !tc.writing {
		tc.writing = true
		tc.writer.Add(1) // before shut, which sets closed under mu: serve waits after
		go func() {
			defer tc.writer.Done()
			t.flush(tc)
		}()
	}
	tc.mu.Unlock()
}

// flush writes what is queued until the queue is empty or the connection
// closes, then gives up writing. The caller set tc.writing.
func (t *tcpServer) flush(tc *tcpConn) {
	for {
		tc.mu.Lock()
		batch := tc.queue
		tc.queue, tc.queued = nil, 0
		if len(batch) == 0 || tc.closed {
			tc.writing = false
			tc.mu.Unlock()
			return
		}
		tc.mu.Unlock()
		if err := t.write(tc, batch); err != nil {
			t.wrote(tc, len(batch), err)
			tc.mu.Lock()
			tc.writing = false
			tc.mu.Unlock()
			return
		}
		t.wrote(tc, len(batch), nil)
	}
}

// write sends framed answers with one system call (writev), within the
// write timeout.
func (t *tcpServer) write(tc *tcpConn, frames [][]byte) error {
	_ = tc.c.SetWriteDeadline(time.Now().Add(t.s.cfg.TCPWrite))
	bufs := net.Buffers(frames)
	_, err := bufs.WriteTo(tc.c)
	return err
}

// wrote ends n answers' claim on the connection's pipeline; after err,
// the connection closes: a client that does not read its answers goes.
func (t *tcpServer) wrote(tc *tcpConn, n int, err error) {
	for range n {
		<-tc.slots
	}
	if err != nil {
		tc.shut()
		return
	}
	tc.lastActive.Store(time.Now().UnixNano())
}

// shut closes the connection and drops the answers queued for it; answers
// that come later are dropped too. It is safe to call more than once.
func (tc *tcpConn) shut() {
	tc.mu.Lock()
	if tc.closed {
		tc.mu.Unlock()
		return
	}
	tc.closed = true
	dropped := len(tc.queue)
	tc.queue, tc.queued = nil, 0
	close(tc.done)
	tc.mu.Unlock()
	for range dropped {
		<-tc.slots
	}
	_ = tc.c.Close()
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
		c.shut()
	}
	t.mu.Unlock()
	t.handlers.Wait()
}
