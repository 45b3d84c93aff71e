package takeover

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/dnsstandby/dnsstandby/takeover/dnat"
	"github.com/dnsstandby/dnsstandby/takeover/peer"
	"github.com/dnsstandby/dnsstandby/takeover/steer"
)

// lines records the messages logged at or above Info, with their design
// attribute: what an operator sees of the fallback.
type lines struct {
	mu  sync.Mutex
	got []string
}

func (l *lines) Enabled(context.Context, slog.Level) bool { return true }
func (l *lines) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *lines) WithGroup(string) slog.Handler            { return l }
func (l *lines) Handle(_ context.Context, r slog.Record) error {
	if !strings.Contains(r.Message, "AKS LocalDNS fallback") {
		return nil
	}
	s := r.Level.String() + " " + r.Message
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "design" || a.Key == "pid" {
			s += " " + a.Key + "=" + a.Value.String()
		}
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, s)
	return nil
}

func (l *lines) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.got
	l.got = nil
	return out
}

// fallbackCoreDNS is the peer watch's State while AKS's fallback CoreDNS
// (pid 77, in localdns-fallback.service) holds the listen address, and
// LocalDNS is bound or not.
func fallbackCoreDNS(localdns bool, gen uint64) peer.State {
	st := localDNS(localdns, gen)
	st.FallbackPIDs = []int{77}
	st.Fallback = []peer.Socket{
		{Proto: peer.TCP, Addr: listenAddr, Inode: 9001, PID: 77, Comm: "coredns", Unit: peer.DefaultFallbackUnit},
		{Proto: peer.UDP, Addr: listenAddr, Inode: 9002, PID: 77, Comm: "coredns", Unit: peer.DefaultFallbackUnit},
	}
	return st
}

func fallbackMetric(design string) string {
	v := map[bool]string{true: "1", false: "0"}
	return `
# HELP dnsstandby_localdns_fallback 1 while AKS's LocalDNS fallback is seen, by design: coredns (a second CoreDNS in localdns-fallback.service on the listen address), nat (the listen addresses' queries DNATed away, the LOCALDNS-FALLBACK chain).
# TYPE dnsstandby_localdns_fallback gauge
dnsstandby_localdns_fallback{design="coredns"} ` + v[design == "coredns"] + `
dnsstandby_localdns_fallback{design="nat"} ` + v[design == "nat"] + `
`
}

// TestControllerFallbackCoreDNS: AKS's fallback CoreDNS on the listen
// address while LocalDNS is failed is reported, and changes nothing of
// what dnsstandby does at any steering level: takeover stays, no
// hold-down starts, nothing is probed or adopted, the steering keeps
// every query on our socket. Hand-back (the fallback stopped, LocalDNS
// bound) goes through the usual hold-down. One log line per transition.
func TestControllerFallbackCoreDNS(t *testing.T) {
	for _, level := range []steer.Level{steer.Adopt, steer.Own, steer.Off} {
		t.Run(level.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var logged lines
				var told []string
				r := newRig(t, false, level, func(c *Config) {
					c.Logger = slog.New(&logged)
					c.OnFallback = func(d string) { told = append(told, d) }
				})
				if err := testutil.CollectAndCompare(r.c, strings.NewReader(fallbackMetric("")), "dnsstandby_localdns_fallback"); err != nil {
					t.Error(err)
				}
				r.watch.updates <- fallbackCoreDNS(false, 0)
				r.do("wait:10s")
				st := r.c.Status()
				if st.Mode != "takeover" || st.LocalDNSFallback != FallbackCoreDNS || st.LocalDNSFallbackPID != 77 || st.Peer.Bound || len(st.Peer.Sockets) != 0 {
					t.Errorf("with the fallback: mode %s fallback %q pid %d peer %+v; want takeover, coredns, 77, LocalDNS not bound",
						st.Mode, st.LocalDNSFallback, st.LocalDNSFallbackPID, st.Peer)
				}
				if m, _, _ := r.steer.state(); level != steer.Off && m != steer.ToUs {
					t.Errorf("steering %v, want to-us: the fallback gets no query", m)
				}
				if n := r.prober.probes; n != 0 {
					t.Errorf("%d probes: the fallback must not be probed as LocalDNS", n)
				}
				if len(r.steer.peers) != 0 {
					t.Errorf("adopted %v: the fallback's sockets must not be adopted", r.steer.peers)
				}
				if err := testutil.CollectAndCompare(r.c, strings.NewReader(fallbackMetric("coredns")), "dnsstandby_localdns_fallback"); err != nil {
					t.Error(err)
				}
				if got, want := logged.take(), []string{"WARN AKS LocalDNS fallback seen design=coredns pid=77"}; !slices.Equal(got, want) {
					t.Errorf("log %q, want %q", got, want)
				}

				// Hand-back: ExecStartPre stops the fallback, LocalDNS binds.
				r.do("gone")
				r.prober.set(true)
				r.do("bound")
				st = r.c.Status()
				if st.Mode != "hold" || st.Reason != "peer-restarted" || st.LocalDNSFallback != "" {
					t.Errorf("after hand-back: %s/%s fallback %q, want hold/peer-restarted, none", st.Mode, st.Reason, st.LocalDNSFallback)
				}
				r.do(trust)
				if st = r.c.Status(); st.Mode != "mirror" {
					t.Errorf("LocalDNS back and trusted: mode %s, want mirror", st.Mode)
				}
				if got, want := logged.take(), []string{"INFO AKS LocalDNS fallback gone design=coredns"}; !slices.Equal(got, want) {
					t.Errorf("log %q, want %q", got, want)
				}
				if want := []string{FallbackCoreDNS, FallbackNone}; !slices.Equal(told, want) {
					t.Errorf("OnFallback %q, want %q", told, want)
				}
				if err := testutil.CollectAndCompare(r.c, strings.NewReader(fallbackMetric("")), "dnsstandby_localdns_fallback"); err != nil {
					t.Error(err)
				}
			})
		})
	}
}

// TestControllerFallbackNAT: queries the tap sees and our sockets do not
// receive while we should get them all, confirmed by a DNATed conntrack
// flow, report nat; our sockets receiving again clears it.
func TestControllerFallbackNAT(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logged lines
		var seen, received atomic.Uint64
		var flows atomic.Value
		flows.Store([]dnat.Flow{})
		r := newRig(t, false, steer.Adopt, func(c *Config) {
			c.Logger = slog.New(&logged)
			c.QueryCounts = func() dnat.Counts { return dnat.Counts{Seen: seen.Load(), Received: received.Load()} }
		})
		r.c.parts.flows = func() ([]dnat.Flow, error) { return flows.Load().([]dnat.Flow), nil }
		var cleared [][]netip.AddrPort
		r.c.parts.clearFlows = func(addrs []netip.AddrPort) (int, error) {
			cleared = append(cleared, addrs)
			return 2, nil
		}
		// traffic: n queries a second for d, of which ours reach our sockets.
		traffic := func(d time.Duration, n, ours uint64) {
			for range int(d / time.Second) {
				seen.Add(n)
				received.Add(ours)
				r.do("wait:1s")
			}
		}
		traffic(3*time.Second, 100, 100)
		if st := r.c.Status(); st.LocalDNSFallback != "" {
			t.Fatalf("served: fallback %q", st.LocalDNSFallback)
		}
		// Dropped, not DNATed (conntrack shows the flows answered by the
		// listener, or none): not nat.
		flows.Store([]dnat.Flow{{OrigDst: listenAddr, ReplySrc: listenAddr}})
		traffic(2*time.Second, 100, 0)
		if st := r.c.Status(); st.LocalDNSFallback != "" {
			t.Fatalf("dropped, not DNATed: fallback %q", st.LocalDNSFallback)
		}
		// DNATed: conntrack, not asked again for 10 suspect intervals
		// after it said no, confirms within them.
		flows.Store([]dnat.Flow{{OrigDst: listenAddr, ReplySrc: netip.MustParseAddrPort("10.244.0.5:53")}})
		traffic(10*time.Second, 100, 0)
		if st := r.c.Status(); st.LocalDNSFallback != FallbackNAT || st.Mode != "takeover" {
			t.Errorf("DNATed: fallback %q mode %s, want nat, takeover", st.LocalDNSFallback, st.Mode)
		}
		if err := testutil.CollectAndCompare(r.c, strings.NewReader(fallbackMetric("nat")), "dnsstandby_localdns_fallback"); err != nil {
			t.Error(err)
		}
		traffic(5*time.Second, 0, 0) // idle: stands
		// Served again, and no flow DNATed since: gone after 3 intervals
		// (the one DNATed before stays in conntrack).
		traffic(2*time.Second, 100, 100)
		if st := r.c.Status(); st.LocalDNSFallback != FallbackNAT {
			t.Errorf("served again for 2 s: fallback %q, want nat still", st.LocalDNSFallback)
		}
		traffic(1*time.Second, 100, 100)
		if st := r.c.Status(); st.LocalDNSFallback != "" {
			t.Errorf("served again for 3 s: fallback %q", st.LocalDNSFallback)
		}
		if got, want := logged.take(), []string{"WARN AKS LocalDNS fallback seen design=nat", "INFO AKS LocalDNS fallback gone design=nat",
			"INFO AKS LocalDNS fallback's conntrack entries of the listen addresses deleted"}; !slices.Equal(got, want) {
			t.Errorf("log %q, want %q", got, want)
		}
		// Its entries deleted once, when it went, on the listen addresses.
		if len(cleared) != 1 || !slices.Equal(cleared[0], []netip.AddrPort{listenAddr}) {
			t.Errorf("conntrack entries cleared %v, want once, of %v", cleared, listenAddr)
		}
	})
}

func TestOurShare(t *testing.T) {
	tests := []struct {
		name  string
		level steer.Level
		input []string
		want  float64
	}{
		{"takeover", steer.Adopt, nil, 1},
		{"takeover at off", steer.Off, nil, 1},
		{"hold at adopt", steer.Adopt, []string{"bound"}, 1},
		{"hold at own", steer.Own, []string{"bound"}, 1},
		{"hold at off: the hash", steer.Off, []string{"bound"}, 0.5},
		{"mirror at adopt: LocalDNS gets all", steer.Adopt, []string{"bound", trust}, 0},
		{"mirror at own: the hash", steer.Own, []string{"bound", trust}, 0.5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := newRig(t, false, tt.level)
				r.prober.set(true)
				for _, in := range tt.input {
					r.do(in)
				}
				if got := r.c.ourShare(); got != tt.want {
					t.Errorf("ourShare = %v, want %v (mode %s)", got, tt.want, r.c.Status().Mode)
				}
			})
		})
	}
}
