// Package dnstap mirrors LocalDNS's replies into the cache through dnstap:
// LocalDNS's CoreDNS, configured with `dnstap PATH full`, connects to a
// unix socket the Receiver listens on and streams a CLIENT_RESPONSE message,
// carrying the wire-format reply, for every reply it wrote. The Receiver
// speaks the Frame Streams protocol (bidirectional handshake), takes only
// those replies, and hands each to a Sink, usually (*cache.Cache).Insert.
//
// Every input is bounded: frame sizes, connections, the handshake's
// duration. A bad stream closes its own connection and nothing else.
package dnstap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/dnsstandby/dnsstandby/cache"
	"github.com/dnsstandby/dnsstandby/internal/unixsock"
)

// There is no read deadline once a stream has started, on purpose. CoreDNS
// 1.13.1 (plugin/dnstap/io.go) sends nothing while it has nothing to tap
// (its 1 s flush of an empty buffer writes no bytes), and it learns that we
// closed a connection only when a later write fails: the replies buffered
// in its 4 KiB framestream writer meanwhile are lost, and a failure while
// it has no connection at all is retried only after a second with no
// reply to tap. An idle timeout would therefore drop the first replies
// after every quiet spell. A stream that stays silent after its handshake
// costs one goroutine and one connection slot; when the slots run out, the
// longest-idle connection is evicted to admit the new one (see admit),
// which also reclaims the connections CoreDNS abandons without closing when
// it redials.

const (
	// finishTimeout bounds writing FINISH after STOP. CoreDNS waits 4 s
	// for it; the write goes into an empty socket buffer and is immediate.
	finishTimeout = time.Second
	// probeTimeout bounds the connect that tells a live socket from a
	// stale one: a listener on the same host accepts at once.
	probeTimeout = time.Second
	// acceptBackoffMax caps the pause after a failed accept (EMFILE and the
	// like), as net/http does, so that a file-descriptor shortage is not a
	// busy loop.
	acceptBackoffMax = time.Second
)

// Config says where and how to listen. Start from DefaultConfig and set
// Path.
type Config struct {
	// Path is the unix socket's path, at most 107 bytes; Listen creates
	// it and Close removes it. Required.
	Path string
	// Mode is the socket file's permissions (permission bits only), in
	// place from the moment the file exists.
	Mode os.FileMode
	// PeerUID is the user LocalDNS's CoreDNS runs as. A connection from
	// any other user but root (SO_PEERCRED, as the peer connected) is
	// closed at accept, before it can take a connection slot or evict
	// LocalDNS's stream; Mode alone is one chmod away from letting a pod's
	// process feed the cache.
	PeerUID uint32
	// Logger receives lifecycle and connection lines; nil discards.
	Logger *slog.Logger
	// MaxConns bounds concurrent connections, at least 1; at the bound
	// the longest-idle one is evicted to admit a new one.
	MaxConns int
	// MaxFrameSize bounds a data frame, in bytes, at least 1; a larger
	// frame closes its connection.
	MaxFrameSize int
	// HandshakeTimeout bounds READY through START; positive.
	HandshakeTimeout time.Duration
}

// DefaultConfig returns the receiver's limits for CoreDNS's dnstap plugin;
// Path is left for the caller.
func DefaultConfig() Config {
	return Config{
		// Only root may connect: LocalDNS's CoreDNS runs as root
		// (localdns.service has no User=).
		Mode:    0o600,
		PeerUID: 0,
		// CoreDNS opens one connection per dnstap directive (one per
		// server block that has it: one for the .11 block), and briefly a
		// second during a reload; 8 is ample.
		MaxConns: 8,
		// CoreDNS's CLIENT_RESPONSE carries one packed reply (at most
		// 65,535 bytes) plus addresses, times, identity and version (a few
		// hundred bytes); 128 KiB leaves room for a sender that also
		// includes the query.
		MaxFrameSize: 128 << 10,
		// CoreDNS sends READY as soon as it connects and START as soon as
		// ACCEPT arrives, and gives up itself after 4 s (its tcpTimeout),
		// so a sender still silent after 5 s never will be.
		HandshakeTimeout: 5 * time.Second,
	}
}

// maxSocketPath is the longest path a unix socket address holds
// (sun_path is 108 bytes with its terminating NUL).
const maxSocketPath = 107

// Validate checks c as Listen takes it; errors name the field.
func (c *Config) Validate() error {
	switch {
	case c.Path == "":
		return errors.New("dnstap: Path is empty")
	case len(c.Path) > maxSocketPath:
		return fmt.Errorf("dnstap: Path %q is %d bytes, longer than a unix socket address holds (%d)", c.Path, len(c.Path), maxSocketPath)
	case c.Mode&^os.ModePerm != 0:
		return fmt.Errorf("dnstap: Mode %v has bits other than permissions", c.Mode)
	case c.MaxConns < 1:
		return fmt.Errorf("dnstap: MaxConns must be positive, got %d", c.MaxConns)
	case c.MaxFrameSize < 1:
		return fmt.Errorf("dnstap: MaxFrameSize must be positive, got %d", c.MaxFrameSize)
	case c.HandshakeTimeout <= 0:
		return fmt.Errorf("dnstap: HandshakeTimeout must be positive, got %s", c.HandshakeTimeout)
	}
	return nil
}

// Sink takes one wire-format reply. resp is valid only during the call
// (it is the connection's read buffer). A *cache.RejectError anywhere in
// the returned error's tree counts the record as rejected with the
// cache's reason. The sink is called from the connections' goroutines,
// concurrently; it must not call Close.
type Sink func(resp []byte) error

// Receiver accepts Frame Streams connections on a unix socket and mirrors
// the CLIENT_RESPONSE replies they carry into a Sink.
type Receiver struct {
	cfg  Config            // as Listen was given it, valid
	sink Sink              // always non-nil
	log  *slog.Logger      // always non-nil
	ln   *net.UnixListener // always non-nil
	sock os.FileInfo       // the socket file Listen made; Close removes only this one

	done  chan struct{}  // closed when Close begins
	wg    sync.WaitGroup // the accept loop and every connection's goroutine
	stats stats

	closeOnce sync.Once
	closeErr  error

	mu      sync.Mutex  // guards following
	stopCtx func() bool // unregisters the context.AfterFunc that closes us
	closed  bool
	conns   map[*conn]struct{}
	nextID  uint64
}

// Listen creates the socket at cfg.Path and accepts connections on it
// until ctx ends or Close is called. A socket file left by a dead process
// is removed; a socket another process still listens on, and a file that
// is no socket, are refused (ErrInUse, ErrNotSocket). A missing parent
// directory is created with mode 0750. cfg is taken as given (start from
// DefaultConfig); an invalid one is an error naming the field.
func Listen(ctx context.Context, cfg Config, sink Sink) (*Receiver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if sink == nil {
		return nil, errors.New("dnstap: nil sink")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ln, sock, err := listenUnix(cfg.Path, cfg.Mode)
	if err != nil {
		return nil, err
	}
	r := &Receiver{
		cfg:   cfg,
		sink:  sink,
		log:   log.With("component", "dnstap", "listen", cfg.Path),
		ln:    ln,
		sock:  sock,
		done:  make(chan struct{}),
		conns: make(map[*conn]struct{}),
	}
	r.wg.Go(r.acceptLoop)
	// Under mu: if ctx has already ended, the Close this schedules waits
	// for stopCtx to be set.
	r.mu.Lock()
	r.stopCtx = context.AfterFunc(ctx, func() { r.Close() })
	r.mu.Unlock()
	r.log.Info("dnstap receiver listening", "mode", cfg.Mode.String(), "peer_uid", cfg.PeerUID, "max_conns", cfg.MaxConns, "max_frame", cfg.MaxFrameSize,
		"handshake_timeout", cfg.HandshakeTimeout.String())
	return r, nil
}

// Addr is the socket's path.
func (r *Receiver) Addr() string { return r.cfg.Path }

// Close stops accepting, closes every connection, waits for their
// goroutines, and removes the socket file (if it is still the one Listen
// made). It is safe to call more than once and concurrently; later calls
// return nil once the first has finished.
func (r *Receiver) Close() error {
	first := false
	r.closeOnce.Do(func() {
		first = true
		r.closeErr = r.shutdown()
	})
	if !first {
		return nil
	}
	return r.closeErr
}

// shutdown is Close's work, done once.
func (r *Receiver) shutdown() error {
	close(r.done)
	r.mu.Lock()
	r.stopCtx()
	r.closed = true
	err := r.ln.Close()
	for c := range r.conns {
		c.shut(causeShutdown)
	}
	r.mu.Unlock()
	r.wg.Wait()
	err = errors.Join(err, removeSocket(r.cfg.Path, r.sock))
	if err != nil {
		r.log.Warn("dnstap receiver closed", slog.Any("err", err))
	} else {
		r.log.Info("dnstap receiver closed")
	}
	return err
}

// acceptLoop runs until the listener is closed.
func (r *Receiver) acceptLoop() {
	var backoff time.Duration
	for {
		nc, err := r.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), acceptBackoffMax)
			r.log.Warn("dnstap accept failed; retrying", slog.Any("err", err), "retry_in", backoff.String())
			select {
			case <-r.done:
				return
			case <-time.After(backoff):
			}
			continue
		}
		backoff = 0
		if err := r.checkPeer(nc); err != nil {
			r.stats.refused.Add(1)
			r.log.Warn("dnstap connection refused", slog.Any("err", err))
			nc.Close()
			continue
		}
		r.admit(nc)
	}
}

// checkPeer returns nil if nc's peer ran as PeerUID or root when it
// connected.
func (r *Receiver) checkPeer(nc *net.UnixConn) error {
	cred, err := unixsock.PeerCred(nc)
	if err != nil {
		return err
	}
	if cred.Uid != r.cfg.PeerUID && cred.Uid != 0 {
		return fmt.Errorf("peer uid %d (pid %d) is neither PeerUID %d nor root", cred.Uid, cred.Pid, r.cfg.PeerUID)
	}
	return nil
}

// admit starts serving nc on a goroutine of its own. At MaxConns it first
// evicts the connection that has gone longest without a frame: a new
// connection is most likely CoreDNS redialing, and the idle ones are most
// likely the connections CoreDNS 1.13.1 abandoned, unclosed, when it
// redialed after a failed write (it replaces its encoder without closing
// the old connection).
func (r *Receiver) admit(nc *net.UnixConn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		nc.Close()
		return
	}
	if len(r.conns) >= r.cfg.MaxConns {
		var victim *conn
		for c := range r.conns {
			if victim == nil || c.lastFrame.Load() < victim.lastFrame.Load() {
				victim = c
			}
		}
		// It leaves the map now, so the bound holds for the new one; its
		// goroutine ends as soon as its blocked read fails (until then the
		// open-connections gauge counts it too).
		delete(r.conns, victim)
		victim.shut(causeEvicted)
		r.log.Info("dnstap connection limit reached; evicted the longest idle connection",
			"max_conns", r.cfg.MaxConns, "evicted", victim.id, "idle", time.Since(time.Unix(0, victim.lastFrame.Load())).Round(time.Millisecond).String())
	}
	r.nextID++
	c := newConn(r, nc, r.nextID)
	r.conns[c] = struct{}{}
	r.stats.conns.Add(1)
	r.stats.open.Add(1)
	r.wg.Go(c.serve)
}

// forget drops c from the open connections (if eviction has not already).
func (r *Receiver) forget(c *conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
	r.stats.open.Add(-1)
}

// record handles one data frame: it extracts the reply and hands it to the
// sink, and counts the outcome.
func (r *Receiver) record(frame []byte) {
	resp, v := extract(frame)
	switch v {
	case verdictNotClientResponse:
		r.stats.notClient.Add(1)
		return
	case verdictNoResponseMessage:
		r.stats.noResponse.Add(1)
		return
	case verdictBadProtobuf:
		r.stats.badProtobuf.Add(1)
		return
	}
	err := r.sink(resp)
	if err == nil {
		r.stats.accepted.Add(1)
		return
	}
	if re, ok := errors.AsType[*cache.RejectError](err); ok {
		r.stats.cacheRejects[re.Reason].Add(1)
		return
	}
	// Counted, not logged: this runs per record (the cache's sink
	// returns nothing but *cache.RejectError).
	r.stats.sinkErrors.Add(1)
}
