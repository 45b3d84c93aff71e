package upstream

import (
	"net"
	"sync"
	"time"
)

// pool holds one server's idle TCP connections. A connection is used by
// one query at a time: taken out, used, put back.
type pool struct {
	mu     sync.Mutex // guards following
	idle   []idleConn // oldest first; get takes the newest
	closed bool
}

type idleConn struct {
	c    net.Conn
	used time.Time // when it was put back
}

// get returns the most recently used idle connection that is younger than
// expire, or nil. Older ones are closed: the rest of the stack is older
// still.
func (p *pool) get(now time.Time, expire time.Duration) net.Conn {
	p.mu.Lock()
	n := len(p.idle)
	if n == 0 {
		p.mu.Unlock()
		return nil
	}
	ic := p.idle[n-1]
	if now.Sub(ic.used) < expire {
		p.idle[n-1] = idleConn{}
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return ic.c
	}
	stale := p.idle
	p.idle = nil
	p.mu.Unlock()
	closeAll(stale)
	return nil
}

// put returns c to the pool, or closes it when the pool is full or closed.
func (p *pool) put(c net.Conn, now time.Time) {
	p.mu.Lock()
	if p.closed || len(p.idle) >= maxIdleTCP {
		p.mu.Unlock()
		c.Close()
		return
	}
	p.idle = append(p.idle, idleConn{c: c, used: now})
	p.mu.Unlock()
}

// expire closes connections idle for expire or longer.
func (p *pool) expire(now time.Time, expire time.Duration) {
	p.mu.Lock()
	i := 0
	for i < len(p.idle) && now.Sub(p.idle[i].used) >= expire {
		i++
	}
	if i == 0 {
		p.mu.Unlock()
		return
	}
	stale := make([]idleConn, i)
	copy(stale, p.idle[:i])
	p.idle = append(p.idle[:0], p.idle[i:]...)
	clear(p.idle[len(p.idle) : i+len(p.idle)])
	p.mu.Unlock()
	closeAll(stale)
}

// flush closes every idle connection. A server that closed one pooled
// connection has most likely closed the others too (it restarted, or its
// idle timeout reached the older ones first).
func (p *pool) flush() {
	p.mu.Lock()
	stale := p.idle
	p.idle = nil
	p.mu.Unlock()
	closeAll(stale)
}

// close closes every idle connection, and those put back later.
func (p *pool) close() {
	p.mu.Lock()
	p.closed = true
	stale := p.idle
	p.idle = nil
	p.mu.Unlock()
	closeAll(stale)
}

// len returns the number of idle connections.
func (p *pool) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}

func closeAll(conns []idleConn) {
	for _, ic := range conns {
		ic.c.Close()
	}
}
