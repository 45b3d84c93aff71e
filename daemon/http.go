package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// readiness is what /readyz reports: true between start and shutdown.
type readiness struct{ ok atomic.Bool }

func (r *readiness) set(v bool) { r.ok.Store(v) }
func (r *readiness) get() bool  { return r.ok.Load() }

// serveHTTP serves /metrics, /healthz (the read loops make progress),
// /readyz (listening and not shutting down) and /debug/events (takeover's
// mode changes) on MetricsAddr, from a goroutine in wg, under HTTP's
// limits: on the node IP every pod can connect, and without them idle
// keep-alive connections alone grew the heap without bound.
func (d *Daemon) serveHTTP(wg *sync.WaitGroup, reg *prometheus.Registry, ready *readiness) (*http.Server, error) {
	lim := d.cfg.HTTP
	ln, err := net.Listen("tcp", d.cfg.MetricsAddr)
	if err != nil {
		return nil, fmt.Errorf("metrics listener: %w", err)
	}
	cl := newConnLimiter(ln, lim, d.log)
	if err := reg.Register(cl); err != nil {
		ln.Close()
		return nil, fmt.Errorf("register HTTP metrics: %w", err)
	}
	mux := http.NewServeMux()
	// GET only (HEAD too, as the mux pattern implies): nothing here
	// changes state, and other methods are refused before any handler.
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := d.srv.Healthy(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.get() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /debug/events", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(d.ctrl.Events())
	})
	hs := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: lim.ReadHeaderTimeout,
		ReadTimeout:       lim.ReadTimeout,
		WriteTimeout:      lim.WriteTimeout,
		IdleTimeout:       lim.IdleTimeout,
		MaxHeaderBytes:    lim.MaxHeaderBytes,
		// The server's own complaints (TLS handshakes on a plain port,
		// header errors) are a pod's to provoke: DEBUG, not a line each
		// at the levels an operator reads.
		ErrorLog: slog.NewLogLogger(d.log.Handler(), slog.LevelDebug),
	}
	wg.Go(func() {
		if err := hs.Serve(cl); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("HTTP server stopped", slog.Any("err", err))
		}
	})
	return hs, nil
}

// connLimiter is the metrics listener with HTTPLimits' connection caps. A
// connection over a cap is closed as soon as it is accepted, not left in
// the kernel's backlog as netutil.LimitListener leaves it: there it would
// wait in line with the kubelet's probes, which a backlog full of a pod's
// connections would time out.
type connLimiter struct {
	net.Listener
	lim HTTPLimits
	log *slog.Logger

	refused atomic.Uint64 // connections closed at accept for a cap

	mu         sync.Mutex         // guards following
	shared     int                // open connections counted in MaxConns
	perAddr    map[netip.Addr]int // open connections per source address
	lastLogged time.Time          // of the last "refused" line
	unlogged   uint64             // refusals since that line
}

// refusedLogEvery spaces the lines about refused connections: a pod that
// keeps reconnecting would otherwise write one per connection.
const refusedLogEvery = time.Minute

func newConnLimiter(ln net.Listener, lim HTTPLimits, log *slog.Logger) *connLimiter {
	return &connLimiter{Listener: ln, lim: lim, log: log, perAddr: make(map[netip.Addr]int)}
}

// Accept returns the next connection within the caps, closing those over
// them.
func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if lc, ok := l.admit(c); ok {
			return lc, nil
		}
		c.Close()
	}
}

// admit counts c against the caps, or reports that it is over one.
func (l *connLimiter) admit(c net.Conn) (net.Conn, bool) {
	from, node := peerOf(c)
	l.mu.Lock()
	defer l.mu.Unlock()
	why := ""
	switch {
	case l.perAddr[from] >= l.lim.MaxConnsPerAddr:
		why = "MaxConnsPerAddr"
	case !node && l.shared >= l.lim.MaxConns:
		why = "MaxConns"
	}
	if why != "" {
		l.refused.Add(1)
		l.unlogged++
		if now := time.Now(); now.Sub(l.lastLogged) >= refusedLogEvery {
			l.log.Warn("metrics server at its connection limit: refusing connections",
				"limit", why, "client", from.String(), "refused", l.unlogged)
			l.lastLogged, l.unlogged = now, 0
		}
		return nil, false
	}
	l.perAddr[from]++
	if !node {
		l.shared++
	}
	return &limitedConn{Conn: c, release: func() { l.release(from, node) }}, true
}

func (l *connLimiter) release(from netip.Addr, node bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := l.perAddr[from] - 1; n > 0 {
		l.perAddr[from] = n
	} else {
		delete(l.perAddr, from)
	}
	if !node {
		l.shared--
	}
}

// peerOf returns c's source address, and whether it is the node itself:
// a connection from the very address it reached (the kubelet probing a
// hostNetwork pod at the node IP, curl on the node to 127.0.0.1). A pod
// cannot pass for that: TCP's handshake needs the replies, and the
// kernel drops packets arriving with one of its own addresses as source.
func peerOf(c net.Conn) (from netip.Addr, node bool) {
	r, _ := c.RemoteAddr().(*net.TCPAddr)
	l, _ := c.LocalAddr().(*net.TCPAddr)
	if r == nil || l == nil {
		return netip.Addr{}, false
	}
	from = r.AddrPort().Addr().Unmap()
	return from, from == l.AddrPort().Addr().Unmap()
}

// limitedConn gives its slot back on its first Close.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// CloseWrite lets net/http half-close the connection after an error
// response (431, 408), so that the client reads it before the close, as
// it does on a plain *net.TCPConn.
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

var (
	descHTTPOpen    = prometheus.NewDesc("dnsstandby_http_connections_open", "Connections open to the metrics server that count against its MaxConns (those from the node itself do not).", nil, nil)
	descHTTPRefused = prometheus.NewDesc("dnsstandby_http_connections_refused_total", "Connections to the metrics server closed at accept because their address or all addresses held the most allowed.", nil, nil)
)

// Describe implements prometheus.Collector.
func (l *connLimiter) Describe(ch chan<- *prometheus.Desc) {
	ch <- descHTTPOpen
	ch <- descHTTPRefused
}

// Collect implements prometheus.Collector.
func (l *connLimiter) Collect(ch chan<- prometheus.Metric) {
	l.mu.Lock()
	open := l.shared
	l.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(descHTTPOpen, prometheus.GaugeValue, float64(open))
	ch <- prometheus.MustNewConstMetric(descHTTPRefused, prometheus.CounterValue, float64(l.refused.Load()))
}
