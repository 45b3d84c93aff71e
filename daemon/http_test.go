package daemon

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// httpLab is serveHTTP on a loopback address, with limits of the test's
// own. Loopback has every 127/8 address, so a client bound to 127.0.0.2
// is another peer (as a pod is), and one bound to the server's own
// 127.0.0.1 is the node itself (as the kubelet's probes are).
type httpLab struct {
	t    *testing.T
	addr netip.AddrPort
	lim  HTTPLimits
}

func startHTTP(t *testing.T, lim HTTPLimits) *httpLab {
	t.Helper()
	cfg := DefaultConfig()
	cfg.MetricsAddr = nstest.FreeLoopbackAddr(t).String()
	cfg.HTTP = lim
	if err := cfg.HTTP.Validate(); err != nil {
		t.Fatal(err)
	}
	d := newUnchecked(cfg, testkit.Logger(t))
	var wg sync.WaitGroup
	hs, err := d.serveHTTP(&wg, prometheus.NewRegistry(), &readiness{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hs.Close(); wg.Wait() })
	return &httpLab{t: t, addr: netip.MustParseAddrPort(cfg.MetricsAddr), lim: lim}
}

// dial connects from the loopback address from.
func (l *httpLab) dial(from string) net.Conn {
	l.t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 2 * time.Second}
	c, err := d.Dial("tcp", l.addr.String())
	if err != nil {
		l.t.Fatalf("dial from %s: %v", from, err)
	}
	l.t.Cleanup(func() { c.Close() })
	return c
}

// get sends GET /metrics on c, keeping the connection alive, and reads the
// response.
func (l *httpLab) get(c net.Conn, br *bufio.Reader) int {
	l.t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(c, "GET /metrics HTTP/1.1\r\nHost: %s\r\n\r\n", l.addr); err != nil {
		l.t.Fatalf("send request: %v", err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		l.t.Fatalf("read response: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// closedWithin reads c until the server closes it and returns how long
// that took; it fails the test if c is still open after within.
func closedWithin(t *testing.T, c net.Conn, br *bufio.Reader, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	c.SetReadDeadline(start.Add(within))
	_, err := io.Copy(io.Discard, br)
	took := time.Since(start)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("connection still open after %s", within)
	}
	return took
}

// serverConns counts the server's established TCP sockets (accepted or
// waiting to be), from /proc/net/tcp: each is a connection it holds.
func (l *httpLab) serverConns() int {
	l.t.Helper()
	b, err := os.ReadFile("/proc/self/net/tcp")
	if err != nil {
		l.t.Fatal(err)
	}
	ip := l.addr.Addr().As4()
	local := fmt.Sprintf("%08X:%04X", binary.NativeEndian.Uint32(ip[:]), l.addr.Port())
	n := 0
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 3 && f[1] == local && f[3] == "01" { // TCP_ESTABLISHED
			n++
		}
	}
	return n
}

// TestHTTPLimits: the metrics server, which the DaemonSet puts on the node
// IP where every pod can reach it, closes idle and slow connections, and
// caps the connections one address and all addresses can hold, while the
// node's own connections (the kubelet's probes) are still served.
func TestHTTPLimits(t *testing.T) {
	// Long timeouts, so that only the caps can close a connection quickly.
	caps := HTTPLimits{ReadHeaderTimeout: 30 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second,
		IdleTimeout: 30 * time.Second, MaxHeaderBytes: 1024, MaxConns: 4, MaxConnsPerAddr: 2}
	short := caps
	short.ReadHeaderTimeout, short.IdleTimeout = 300*time.Millisecond, 300*time.Millisecond

	tests := []struct {
		name string
		lim  HTTPLimits
		run  func(t *testing.T, l *httpLab)
	}{
		{"idle keep-alive connection closed after IdleTimeout", short, func(t *testing.T, l *httpLab) {
			c := l.dial("127.0.0.2")
			br := bufio.NewReader(c)
			if code := l.get(c, br); code != http.StatusOK {
				t.Fatalf("GET /metrics: %d", code)
			}
			took := closedWithin(t, c, br, 5*time.Second)
			t.Logf("idle connection closed after %s", took)
		}},
		{"slow headers closed after ReadHeaderTimeout", short, func(t *testing.T, l *httpLab) {
			c := l.dial("127.0.0.2")
			if _, err := io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: x\r\n"); err != nil {
				t.Fatal(err)
			}
			closedWithin(t, c, bufio.NewReader(c), 5*time.Second)
		}},
		{"headers over MaxHeaderBytes refused", caps, func(t *testing.T, l *httpLab) {
			c := l.dial("127.0.0.2")
			c.SetDeadline(time.Now().Add(5 * time.Second))
			fmt.Fprintf(c, "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: %s\r\n\r\n", strings.Repeat("a", 8<<10))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
				t.Fatalf("status %d, want 431", resp.StatusCode)
			}
		}},
		{"one address holds at most MaxConnsPerAddr", caps, func(t *testing.T, l *httpLab) {
			l.dial("127.0.0.2")
			l.dial("127.0.0.2")
			c := l.dial("127.0.0.2")
			closedWithin(t, c, bufio.NewReader(c), 5*time.Second)
			// Another address still gets in.
			c = l.dial("127.0.0.3")
			if code := l.get(c, bufio.NewReader(c)); code != http.StatusOK {
				t.Fatalf("GET from another address: %d", code)
			}
		}},
		{"all addresses hold at most MaxConns; the node is still served", caps, func(t *testing.T, l *httpLab) {
			for _, from := range []string{"127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3"} {
				l.dial(from)
			}
			c := l.dial("127.0.0.4")
			closedWithin(t, c, bufio.NewReader(c), 5*time.Second)
			// The node's own address (the server's) is not in MaxConns.
			for range 2 {
				c := l.dial("127.0.0.1")
				if code := l.get(c, bufio.NewReader(c)); code != http.StatusOK {
					t.Fatalf("GET from the node while pods hold every slot: %d", code)
				}
			}
		}},
		{"a flood of idle connections stays capped", caps, func(t *testing.T, l *httpLab) {
			const n = 600
			// Each sends a request and then idles, as a keep-alive
			// client between scrapes does (a connection that sends
			// nothing is closed at ReadHeaderTimeout anyway).
			for i := range n {
				c := l.dial(fmt.Sprintf("127.0.%d.%d", 1+i/200, 1+i%200))
				fmt.Fprintf(c, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
			}
			testkit.Eventually(t, 10*time.Second, "server connections down to MaxConns", func() bool {
				return l.serverConns() <= l.lim.MaxConns
			})
			t.Logf("%d idle connections opened, the server holds %d", n, l.serverConns())
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.run(t, startHTTP(t, tt.lim))
		})
	}
}
