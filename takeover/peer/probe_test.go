package peer_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/takeover/peer"
)

// TestProbeLoopback runs the prober against fake servers on the host's
// loopback: no root needed.
func TestProbeLoopback(t *testing.T) {
	const timeout = 150 * time.Millisecond
	tests := []struct {
		name   string
		reply  reply // nil: nothing listens on the port
		ctx    time.Duration
		ok     bool
		nsid   string
		rcode  int
		errIs  error  // errors.Is target when !ok
		errHas string // substring of the error when !ok
	}{
		{name: "localdns", reply: withNSID("localdns-pod"), ok: true, nsid: "localdns-pod"},
		{name: "no-nsid", reply: withNSID(""), ok: true},
		{name: "servfail-still-answers", reply: withRcode("localdns-pod", dns.RcodeServerFailure), ok: true, nsid: "localdns-pod", rcode: dns.RcodeServerFailure},
		{name: "self", reply: withNSID(peer.SelfNSID), nsid: peer.SelfNSID, errIs: peer.ErrSelfReply},
		{name: "stale-id-first", ok: true, nsid: "localdns-pod", reply: func(q *dns.Msg) [][]byte {
			stale := answer(q, "localdns-pod", dns.RcodeSuccess)
			stale.Id++
			return [][]byte{pack(stale), pack(answer(q, "localdns-pod", dns.RcodeSuccess))}
		}},
		{name: "other-question", errIs: os.ErrDeadlineExceeded, reply: func(q *dns.Msg) [][]byte {
			r := answer(q, "localdns-pod", dns.RcodeSuccess)
			r.Question[0].Name = "other.example."
			return [][]byte{pack(r)}
		}},
		{name: "query-echoed", errIs: os.ErrDeadlineExceeded, reply: func(q *dns.Msg) [][]byte {
			return [][]byte{pack(q)} // not a response
		}},
		{name: "garbage", errIs: os.ErrDeadlineExceeded, errHas: "malformed", reply: func(q *dns.Msg) [][]byte {
			return [][]byte{{0xde, 0xad, 0xbe, 0xef}}
		}},
		{name: "silent", errIs: os.ErrDeadlineExceeded, reply: func(*dns.Msg) [][]byte { return nil }},
		{name: "unbound", errIs: syscall.ECONNREFUSED},
		{name: "context", ctx: 20 * time.Millisecond, errIs: context.DeadlineExceeded, reply: func(*dns.Msg) [][]byte { return nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			must(t, err)
			server := conn.LocalAddr().(*net.UDPAddr).AddrPort()
			var fake *fakeServer
			if tt.reply != nil {
				fake = serveFake(t, conn, tt.reply)
			} else {
				conn.Close()
			}
			p, err := peer.NewProber(probeConfig(server, func(c *peer.ProbeConfig) { c.Timeout = timeout }))
			must(t, err)
			defer p.Close()
			ctx := context.Background()
			if tt.ctx > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.ctx)
				defer cancel()
			}
			start := time.Now()
			res := p.Probe(ctx)
			took := time.Since(start)
			if res.OK != tt.ok {
				t.Fatalf("OK = %v (err %v), want %v", res.OK, res.Err, tt.ok)
			}
			if res.NSID != tt.nsid {
				t.Errorf("NSID %q, want %q", res.NSID, tt.nsid)
			}
			if tt.ok || errors.Is(tt.errIs, peer.ErrSelfReply) {
				if res.Rcode != tt.rcode || res.RTT <= 0 || res.RTT > took {
					t.Errorf("Rcode %d RTT %v (probe took %v), want rcode %d", res.Rcode, res.RTT, took, tt.rcode)
				}
			} else if res.Rcode != -1 {
				t.Errorf("Rcode %d without a reply, want -1", res.Rcode)
			}
			if tt.ok {
				if res.Err != nil {
					t.Errorf("OK with error %v", res.Err)
				}
			} else if !errors.Is(res.Err, tt.errIs) || !strings.Contains(errText(res.Err), tt.errHas) {
				t.Errorf("error %v, want one matching %v containing %q", res.Err, tt.errIs, tt.errHas)
			}
			if errors.Is(tt.errIs, os.ErrDeadlineExceeded) && (took < timeout || took > timeout+250*time.Millisecond) {
				t.Errorf("timed out after %v, want about %v", took, timeout)
			}
			if tt.ctx > 0 && took > tt.ctx+250*time.Millisecond {
				t.Errorf("context of %v ended the probe after %v", tt.ctx, took)
			}
			if fake != nil {
				checkQueries(t, fake.got(), 1)
			}
		})
	}
}

// checkQueries checks what the prober sent: n queries for the default name
// with EDNS and an empty NSID option.
func checkQueries(t *testing.T, qs []*dns.Msg, n int) {
	t.Helper()
	if len(qs) != n {
		t.Fatalf("server got %d queries, want %d", len(qs), n)
	}
	for _, q := range qs {
		if q.Question[0].Name != peer.DefaultProbeConfig().Name || q.Question[0].Qtype != dns.TypeA {
			t.Errorf("question %v, want %s A", q.Question[0], peer.DefaultProbeConfig().Name)
		}
		opt := q.IsEdns0()
		if opt == nil {
			t.Fatal("query without EDNS")
		}
		var nsid bool
		for _, o := range opt.Option {
			if n, ok := o.(*dns.EDNS0_NSID); ok && n.Nsid == "" {
				nsid = true
			}
		}
		if !nsid {
			t.Errorf("query without an empty NSID option: %v", opt)
		}
	}
}

// TestProbeSourcePort checks that the source port is chosen once, kept for
// every probe, and can be fixed, that Source has the address with it; and
// that IDs vary.
func TestProbeSourcePort(t *testing.T) {
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	must(t, err)
	server := conn.LocalAddr().(*net.UDPAddr).AddrPort()
	fake := serveFake(t, conn, withNSID("localdns-pod"))

	p, err := peer.NewProber(probeConfig(server, nil))
	must(t, err)
	port := p.SourcePort()
	if port == 0 {
		t.Fatal("SourcePort 0 after bind")
	}
	// The address too, for the steering program: the one the kernel
	// chose to reach the server (here the server's own, 127.0.0.1).
	if src := p.Source(); src.Port() != port || src.Addr() != server.Addr() {
		t.Errorf("Source %v, want %v port %d", src, server.Addr(), port)
	}
	for range 5 {
		if res := p.Probe(context.Background()); !res.OK {
			t.Fatal(res.Err)
		}
	}
	must(t, p.Close())
	must(t, p.Close()) // twice is fine
	if res := p.Probe(context.Background()); res.OK || res.Err == nil {
		t.Errorf("probe after Close: %+v", res)
	}

	fixed, err := peer.NewProber(probeConfig(server, func(c *peer.ProbeConfig) { c.SourcePort, c.Name = port, "Probe.Example" }))
	must(t, err)
	defer fixed.Close()
	if fixed.SourcePort() != port {
		t.Errorf("SourcePort %d, want the fixed %d", fixed.SourcePort(), port)
	}
	if res := fixed.Probe(context.Background()); !res.OK {
		t.Fatal(res.Err)
	}
	if _, err := peer.NewProber(probeConfig(server, func(c *peer.ProbeConfig) { c.SourcePort = port })); err == nil {
		t.Error("second prober on the same fixed port: no error")
	}

	qs := fake.got()
	ids := map[uint16]bool{}
	for _, q := range qs {
		ids[q.Id] = true
	}
	if len(qs) != 6 || len(ids) < 5 {
		t.Errorf("%d queries with %d distinct IDs, want 6 with (almost surely) 6", len(qs), len(ids))
	}
	if got := qs[5].Question[0].Name; got != "Probe.Example." {
		t.Errorf("configured name sent as %q", got)
	}
}

func TestNewProberErrors(t *testing.T) {
	server := netipMust("127.0.0.1:53")
	tests := []struct {
		name    string
		cfg     peer.ProbeConfig
		wantErr string
	}{
		{"no server", peer.DefaultProbeConfig(), "peer: Server must be set"},
		{"bad name", probeConfig(server, func(c *peer.ProbeConfig) { c.Name = "a..b" }), `peer: Name "a..b"`},
		{"no name", probeConfig(server, func(c *peer.ProbeConfig) { c.Name = "" }), `peer: Name ""`},
		{"negative timeout", probeConfig(server, func(c *peer.ProbeConfig) { c.Timeout = -time.Second }), "peer: Timeout must be positive, got -1s"},
		{"zero timeout", probeConfig(server, func(c *peer.ProbeConfig) { c.Timeout = 0 }), "peer: Timeout must be positive, got 0s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := peer.NewProber(tt.cfg)
			if err == nil {
				p.Close()
			}
			if !strings.Contains(errText(err), tt.wantErr) {
				t.Errorf("NewProber: %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

// probeConfig is DefaultProbeConfig asking server, changed by change (if
// not nil).
func probeConfig(server netip.AddrPort, change func(*peer.ProbeConfig)) peer.ProbeConfig {
	cfg := peer.DefaultProbeConfig()
	cfg.Server = server
	if change != nil {
		change(&cfg)
	}
	return cfg
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
