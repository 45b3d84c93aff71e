// Package admin is dnsstandby's control socket: a unix socket, readable
// and writable by root only, that takes one JSON request per connection
// (status, hold, release) and answers with one JSON response. The daemon
// serves it; `dnsstandby status|hold|release` are its clients. It also
// carries a surge handover's request ("handover"): the connection is
// then the Giver's, which passes its files over it (package handover).
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dnsstandby/dnsstandby/internal/unixsock"
	"github.com/dnsstandby/dnsstandby/status"
)

// Request is what a client sends.
type Request struct {
	Cmd string `json:"cmd"`           // "status", "hold", "release" or "handover"
	For string `json:"for,omitempty"` // hold: a Go duration; empty: until released
}

// Response is what the server answers. Status holds the daemon's status
// for "status" and the status after the change for "hold" and "release".
// Replaced, for "hold", is the hold it replaced.
type Response struct {
	OK       bool            `json:"ok"`
	Error    string          `json:"error,omitempty"`
	Status   json.RawMessage `json:"status,omitempty"`
	Replaced *Hold           `json:"replaced,omitempty"`
}

// Hold is an operator hold: none (Holding false), until Until, or until
// released (Until zero). A hold replaces the one in force, timed or not:
// the last one asked says how long.
type Hold struct {
	Holding bool      `json:"holding"`
	Until   time.Time `json:"until,omitzero"`
}

// StatusHold is the hold st reports.
func StatusHold(st status.Daemon) Hold {
	h := Hold{Holding: st.Holding}
	if st.HoldUntil != nil {
		h.Until = *st.HoldUntil
	}
	return h
}

// String says h for a person: "no hold", "until released", or "until
// 2026-12-04T04:00:30Z (timed)".
func (h Hold) String() string {
	switch {
	case !h.Holding:
		return "no hold"
	case h.Until.IsZero():
		return "until released"
	}
	return "until " + h.Until.UTC().Format(time.RFC3339) + " (timed)"
}

// DefaultSocket is where the daemon listens and its clients connect
// unless told otherwise.
const DefaultSocket = "/run/dnsstandby/admin.sock"

// Handler carries out requests.
type Handler interface {
	Status() status.Daemon
	Hold(d time.Duration) (replaced Hold, err error) // d 0: until released
	Release() error
}

// Giver is a Handler that can hand over to another process: Give runs on
// the connection of a "handover" request, from a root peer whose
// credentials are peer, and owns the connection until it returns (it
// sets its own deadlines).
type Giver interface {
	Give(c *net.UnixConn, peer *unix.Ucred) error
}

// Limits: a request is a few dozen bytes; a client that sends more, or
// takes longer, is not a client of ours.
const (
	maxRequest     = 4096
	requestTimeout = 2 * time.Second
)

// Server serves the admin socket.
type Server struct {
	ln   *net.UnixListener
	h    Handler
	log  *slog.Logger
	wg   sync.WaitGroup
	path string
}

// Listen creates the socket at path (replacing a stale one), readable and
// writable by its owner only, and serves root alone (SO_PEERCRED): hold
// and release steer every pod's DNS.
func Listen(path string, h Handler, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "admin")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("admin socket: %w", err)
	}
	if err := removeStale(path); err != nil {
		return nil, err
	}
	// 0600 from the moment the file exists (see unixsock.Listen), not
	// after listen, when a client could already have connected.
	ln, err := unixsock.Listen(path, 0o600)
	if err != nil {
		return nil, fmt.Errorf("admin socket: %w", err)
	}
	s := &Server{ln: ln, h: h, log: log, path: path}
	s.wg.Add(1)
	go s.serve()
	return s, nil
}

// removeStale deletes a socket left by a dnsstandby that died, but refuses
// to take over one a live dnsstandby still answers on.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("admin socket: %w", err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("admin socket: %s exists and is not a socket", path)
	}
	if c, err := net.DialTimeout("unix", path, 200*time.Millisecond); err == nil {
		c.Close()
		return fmt.Errorf("admin socket: %s is in use by another dnsstandby", path)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("admin socket: remove stale %s: %w", path, err)
	}
	return nil
}

func (s *Server) serve() {
	defer s.wg.Done()
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if err := rootPeer(c); err != nil {
			s.log.Warn("admin connection refused", slog.Any("err", err))
			c.Close()
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(requestTimeout))
			req, err := decode(io.LimitReader(c, maxRequest))
			if err == nil && req.Cmd == "handover" {
				s.give(c)
				return
			}
			resp := s.handle(req, err)
			_ = json.NewEncoder(c).Encode(resp)
		}()
	}
}

// rootPeer returns nil if c's peer was root when it connected. The file's
// mode keeps others out already; this holds as well where the mode does
// not, as when someone loosens it, or the socket is reached through a
// descriptor passed on: hold and release steer every pod's DNS.
func rootPeer(c *net.UnixConn) error {
	cred, err := unixsock.PeerCred(c)
	if err != nil {
		return err
	}
	if cred.Uid != 0 {
		return fmt.Errorf("peer uid %d (pid %d) is not root", cred.Uid, cred.Pid)
	}
	return nil
}

// give serves a handover request: the Giver takes the connection; a
// handler that cannot give answers with an error.
func (s *Server) give(c *net.UnixConn) {
	g, ok := s.h.(Giver)
	if !ok {
		_ = json.NewEncoder(c).Encode(Response{Error: "handover: this process cannot hand over"})
		return
	}
	cred, err := unixsock.PeerCred(c)
	if err != nil {
		s.log.Warn("handover request refused", slog.Any("err", err))
		return
	}
	if err := g.Give(c, cred); err != nil {
		s.log.Warn("handover not done: still serving", "peer_pid", cred.Pid, slog.Any("err", err))
	}
}

func decode(r io.Reader) (Request, error) {
	var req Request
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	err := dec.Decode(&req)
	return req, err
}

func (s *Server) handle(req Request, err error) Response {
	if err != nil {
		return Response{Error: fmt.Sprintf("malformed request: %v", err)}
	}
	var replaced *Hold
	switch req.Cmd {
	case "status":
	case "hold":
		var d time.Duration
		if req.For != "" {
			var err error
			if d, err = time.ParseDuration(req.For); err != nil || d <= 0 {
				return Response{Error: fmt.Sprintf("hold: bad duration %q", req.For)}
			}
		}
		was, err := s.h.Hold(d)
		if err != nil {
			return Response{Error: "hold: " + err.Error()}
		}
		replaced = &was
	case "release":
		if err := s.h.Release(); err != nil {
			return Response{Error: "release: " + err.Error()}
		}
		s.log.Info("operator release")
	default:
		return Response{Error: fmt.Sprintf("unknown command %q: want status, hold, release or handover", req.Cmd)}
	}
	st := s.h.Status()
	if replaced != nil {
		s.log.Info("operator hold", "for", req.For, "hold", StatusHold(st).String(), "replaced", replaced.String())
	}
	b, err := json.Marshal(st)
	if err != nil {
		return Response{Error: "status: " + err.Error()}
	}
	return Response{OK: true, Status: b, Replaced: replaced}
}

// Close stops serving and removes the socket; safe to call twice.
func (s *Server) Close() error {
	err := s.ln.Close()
	s.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// Do sends one request to the socket at path and returns the response; a
// response with OK false comes back as an error.
func Do(ctx context.Context, path string, req Request) (Response, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return Response{}, fmt.Errorf("admin socket %s: %w (is dnsstandby running, and are you root?)", path, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	} else {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	}
	if err := json.NewEncoder(c).Encode(req); err != nil {
		return Response{}, fmt.Errorf("admin socket %s: send: %w", path, err)
	}
	var resp Response
	if err := json.NewDecoder(io.LimitReader(c, 16<<20)).Decode(&resp); err != nil {
		return Response{}, fmt.Errorf("admin socket %s: read: %w", path, err)
	}
	if !resp.OK {
		return resp, errors.New(resp.Error)
	}
	return resp, nil
}

// DialHandover connects to the admin socket at path, checks that the
// process serving it is root (the taker will serve from the sockets it
// passes), and sends a handover request. The caller reads the offer from
// the connection (handover.ReadOffer) and answers it; peer is the
// giver's credentials as the kernel took them when it listened.
func DialHandover(ctx context.Context, path string) (c *net.UnixConn, peer *unix.Ucred, err error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, nil, fmt.Errorf("admin socket %s: %w", path, err)
	}
	c = nc.(*net.UnixConn)
	fail := func(err error) (*net.UnixConn, *unix.Ucred, error) {
		c.Close()
		return nil, nil, fmt.Errorf("admin socket %s: %w", path, err)
	}
	if peer, err = unixsock.PeerCred(c); err != nil {
		return fail(err)
	}
	if peer.Uid != 0 {
		return fail(fmt.Errorf("served by uid %d (pid %d), not root: no handover from it", peer.Uid, peer.Pid))
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if err := json.NewEncoder(c).Encode(Request{Cmd: "handover"}); err != nil {
		return fail(fmt.Errorf("send handover request: %w", err))
	}
	return c, peer, nil
}
