package responder

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"time"

	"github.com/dnsstandby/dnsstandby/pipeline"
)

// maxQuery is the largest UDP query taken: a query is one question and an
// OPT, far below this; anything longer is dropped and counted.
const maxQuery = 4096

// udpLoop is one reader of one UDP socket: it receives a batch, answers
// what the pipeline can answer at once into the batch's reply slots, sends
// those with one system call, and hands misses to the pipeline with a
// reply function that writes to the same socket later.
type udpLoop struct {
	s      *Server
	conn   *net.UDPConn
	pipe   *pipeline.Pipeline // the listen address's
	b      *batch
	worker *pipeline.Worker

	// busySince is when the current batch started (unix ns), 0 while the
	// loop waits for datagrams; Healthy reads it.
	busySince atomic.Int64
	// reads, once set (CountReads), gets 1 added per batch received: the
	// steering program's read test (takeover/steer) reads it.
	reads atomic.Pointer[atomic.Uint64]
}

func (l *udpLoop) run() {
	var backoff time.Duration
	for {
		n, err := l.b.recv()
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, net.ErrClosed) {
				return // Shutdown
			}
			// Transient errors (ENOMEM, ICMP-reported errors) must not
			// spin the loop.
			l.s.stats.udpReadErrors.Add(1)
			backoff = min(max(2*backoff, time.Millisecond), 100*time.Millisecond)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		// Counted as soon as the batch is in: what the steering program
		// gave this socket before it has been read, and a loop stuck in
		// the batch below reads nothing more.
		if c := l.reads.Load(); c != nil {
			c.Add(1)
		}
		l.s.stats.udpReceived.Add(uint64(n))
		l.busySince.Store(time.Now().UnixNano())
		out := 0
		for i := range n {
			msg, truncated := l.b.datagram(i)
			if truncated {
				l.s.stats.udpTruncatedQueries.Add(1) // no DNS query is that large
				continue
			}
			k, act := l.worker.Answer(l.b.outBuf[out], msg, true)
			switch act {
			case pipeline.Reply:
				l.b.queueReply(out, i, k)
				out++
			case pipeline.Resolve:
				l.resolve(msg, l.b.source(i))
			}
		}
		if out > 0 {
			if failed, err := l.b.send(out); failed > 0 || err != nil {
				l.s.stats.udpSendFailures.Add(uint64(failed))
			}
		}
		l.busySince.Store(0)
	}
}

// resolve passes a miss to the pipeline, which reads msg (the batch's
// buffer) during the call only.
func (l *udpLoop) resolve(msg []byte, src netip.AddrPort) {
	if !src.IsValid() {
		return
	}
	conn := l.conn
	stats := &l.s.stats
	l.pipe.Resolve(msg, src, true, func(reply []byte) {
		if _, err := conn.WriteToUDPAddrPort(reply, src); err != nil {
			stats.udpSendFailures.Add(1)
		}
	})
}
