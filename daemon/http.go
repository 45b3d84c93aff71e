package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
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
// mode changes) on MetricsAddr, from a goroutine in wg.
func (d *Daemon) serveHTTP(wg *sync.WaitGroup, reg *prometheus.Registry, ready *readiness) (*http.Server, error) {
	ln, err := net.Listen("tcp", d.cfg.MetricsAddr)
	if err != nil {
		return nil, fmt.Errorf("metrics listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := d.srv.Healthy(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.get() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/debug/events", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(d.ctrl.Events())
	})
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	wg.Go(func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("HTTP server stopped", slog.Any("err", err))
		}
	})
	return hs, nil
}
