package upstream

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

func TestNew(t *testing.T) {
	good := netip.MustParseAddrPort("10.0.0.10:53")
	tests := []struct {
		name    string
		mod     func(c *Config)
		wantErr string // "" for success
	}{
		{"one server, defaults", func(c *Config) { c.Servers = []netip.AddrPort{good} }, ""},
		{"ipv6", func(c *Config) { c.Servers = []netip.AddrPort{netip.MustParseAddrPort("[fd00::10]:53")} }, ""},
		{"MaxFails 0, MaxConcurrent set", func(c *Config) { c.Servers = []netip.AddrPort{good}; c.MaxFails = 0; c.MaxConcurrent = 1000 }, ""},
		{"no servers", func(c *Config) {}, "upstream: Servers is empty"},
		{"zero addrport", func(c *Config) { c.Servers = []netip.AddrPort{{}} }, "upstream: Servers[0]: invalid address"},
		{"unspecified v4", func(c *Config) { c.Servers = []netip.AddrPort{netip.MustParseAddrPort("0.0.0.0:53")} }, "unspecified"},
		{"unspecified v6", func(c *Config) { c.Servers = []netip.AddrPort{netip.MustParseAddrPort("[::]:53")} }, "unspecified"},
		{"unspecified 4in6", func(c *Config) { c.Servers = []netip.AddrPort{netip.MustParseAddrPort("[::ffff:0.0.0.0]:53")} }, "unspecified"},
		{"port 0", func(c *Config) { c.Servers = []netip.AddrPort{netip.MustParseAddrPort("10.0.0.10:0")} }, "port 0"},
		{"zone", func(c *Config) { c.Servers = []netip.AddrPort{netip.MustParseAddrPort("[fe80::1%eth0]:53")} }, "zoned"},
		{"duplicate", func(c *Config) { c.Servers = []netip.AddrPort{good, good} }, "upstream: Servers[1] 10.0.0.10:53: listed twice"},
		{"duplicate 4in6", func(c *Config) {
			c.Servers = []netip.AddrPort{good, netip.MustParseAddrPort("[::ffff:10.0.0.10]:53")}
		}, "listed twice"},
		{"zero timeout", func(c *Config) { c.Servers = []netip.AddrPort{good}; c.Timeout = 0 }, "upstream: Timeout must be positive, got 0s"},
		{"negative timeout", func(c *Config) { c.Servers = []netip.AddrPort{good}; c.Timeout = -1 }, "upstream: Timeout must be positive"},
		{"negative max fails", func(c *Config) { c.Servers = []netip.AddrPort{good}; c.MaxFails = -1 }, "upstream: MaxFails must not be negative, got -1"},
		{"zero health check", func(c *Config) { c.Servers = []netip.AddrPort{good}; c.HealthCheck = 0 }, "upstream: HealthCheck must be positive, got 0s"},
		{"zero expiry", func(c *Config) { c.Servers = []netip.AddrPort{good}; c.ExpireTCP = 0 }, "upstream: ExpireTCP must be positive, got 0s"},
		{"negative max concurrent", func(c *Config) { c.Servers = []netip.AddrPort{good}; c.MaxConcurrent = -1 }, "upstream: MaxConcurrent must not be negative, got -1"},
		{"round robin, fail fast, probe options", func(c *Config) {
			c.Servers = []netip.AddrPort{good}
			c.Policy, c.FailFast, c.HealthCheckDomain, c.HealthCheckNoRec = PolicyRoundRobin, true, "health.local.", true
		}, ""},
		{"random", func(c *Config) { c.Servers = []netip.AddrPort{good}; c.Policy = PolicyRandom }, ""},
		{"zero policy", func(c *Config) { c.Servers = []netip.AddrPort{good}; c.Policy = "" }, `upstream: Policy must be sequential, round_robin or random, got ""`},
		{"unknown policy", func(c *Config) { c.Servers = []netip.AddrPort{good}; c.Policy = "least_loaded" }, `upstream: Policy must be sequential, round_robin or random, got "least_loaded"`},
		{"empty probe domain", func(c *Config) { c.Servers = []netip.AddrPort{good}; c.HealthCheckDomain = "" }, `upstream: HealthCheckDomain must be a fully qualified domain name, got ""`},
		{"probe domain not fully qualified", func(c *Config) { c.Servers = []netip.AddrPort{good}; c.HealthCheckDomain = "health.local" }, `upstream: HealthCheckDomain must be a fully qualified domain name, got "health.local"`},
		{"probe domain invalid", func(c *Config) { c.Servers = []netip.AddrPort{good}; c.HealthCheckDomain = "health..local." }, "upstream: HealthCheckDomain must be a fully qualified domain name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tt.mod(&cfg)
			g, err := New(cfg)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("New: %v, want error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			defer g.Close()
			// Taken as given: nothing filled in or changed.
			c := g.cfg
			c.Logger = cfg.Logger
			if !reflect.DeepEqual(c, cfg) {
				t.Errorf("config changed by New:\n%+v\nwant\n%+v", c, cfg)
			}
		})
	}
}

// TestDefaultConfig holds DefaultConfig to CoreDNS forward's defaults.
func TestDefaultConfig(t *testing.T) {
	want := Config{
		Policy:            PolicySequential,       // dnsstandby's own (CoreDNS's is random)
		FailFast:          false,                  // failfast_all_unhealthy_upstreams absent
		Timeout:           2 * time.Second,        // plugin/pkg/proxy read timeout
		MaxFails:          2,                      // max_fails
		HealthCheck:       500 * time.Millisecond, // health_check
		HealthCheckDomain: ".",                    // health_check without domain
		HealthCheckNoRec:  false,                  // health_check without no_rec
		ExpireTCP:         10 * time.Second,       // expire
		MaxConcurrent:     0,                      // max_concurrent: none
		// dnsstandby's own: speculative attempts (CoreDNS has none).
		SpeculativeMult:   4,
		SpeculativeMin:    50 * time.Millisecond,
		SpeculativeMax:    250 * time.Millisecond,
		SpeculativeWindow: 10 * time.Second,
		SpeculativeShare:  0.01,
		SpeculativeRate:   500,
		SpeculativeBurst:  500,
	}
	if got := DefaultConfig(); !reflect.DeepEqual(got, want) {
		t.Errorf("DefaultConfig() = %+v, want %+v", got, want)
	}
}

// TestExchange is the plain case over each transport: the reply, of
// whatever rcode, comes back with the request's ID and question.
func TestExchange(t *testing.T) {
	tests := []struct {
		name     string
		forceTCP bool
		handler  tcpHandler
		rcode    int
		want     string
	}{
		{"udp noerror", false, answer("192.0.2.7"), dns.RcodeSuccess, "192.0.2.7"},
		{"udp nxdomain", false, rcodeReply(dns.RcodeNameError), dns.RcodeNameError, ""},
		{"udp servfail returned, not failed over", false, rcodeReply(dns.RcodeServerFailure), dns.RcodeServerFailure, ""},
		{"udp refused", false, rcodeReply(dns.RcodeRefused), dns.RcodeRefused, ""},
		{"tcp noerror", true, answer("192.0.2.8"), dns.RcodeSuccess, "192.0.2.8"},
		{"tcp servfail", true, rcodeReply(dns.RcodeServerFailure), dns.RcodeServerFailure, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newServer(t)
			s.setBoth(tt.handler)
			other := newServer(t)
			g, _ := newGroup(t, func(c *Config) { c.ForceTCP = tt.forceTCP }, s.addr, other.addr)
			r := mustAnswer(t, g, newReq("Svc.NS.svc.cluster.local.", dns.TypeA), tt.want)
			if r.Rcode != tt.rcode {
				t.Errorf("rcode %s, want %s", dns.RcodeToString[r.Rcode], dns.RcodeToString[tt.rcode])
			}
			st := stats(g, 0)
			proto, notProto := "udp", "tcp"
			if tt.forceTCP {
				proto, notProto = "tcp", "udp"
			}
			if st.Requests[proto] != 1 || st.Requests[notProto] != 0 || st.Replies != 1 || !st.Healthy {
				t.Errorf("stats %+v", st)
			}
			if n := other.udpQueries.Load() + other.tcpQueries.Load(); n != 0 {
				t.Errorf("second server got %d queries", n)
			}
		})
	}
}

// TestExchangeIPv6 runs the plain exchange against ::1.
func TestExchangeIPv6(t *testing.T) {
	if pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv6loopback}); err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	} else {
		pc.Close()
	}
	for _, forceTCP := range []bool{false, true} {
		s := newServerOn(t, net.IPv6loopback)
		g, _ := newGroup(t, func(c *Config) { c.ForceTCP = forceTCP }, s.addr)
		mustAnswer(t, g, newReq("v6.example.", dns.TypeA), "192.0.2.1")
		if st := stats(g, 0); st.Errors["mismatch"] != 0 || st.Replies != 1 {
			t.Errorf("forceTCP %v: stats %+v", forceTCP, st)
		}
	}
}

// TestRequestNotModified exchanges one request from several goroutines at
// once, over every path, while another reads it: under -race any write
// to it is caught, and afterwards it must equal a deep copy taken before.
func TestRequestNotModified(t *testing.T) {
	for _, path := range []string{"udp", "tc-then-tcp", "tcp"} {
		t.Run(path, func(t *testing.T) {
			s := newServer(t)
			if path == "tc-then-tcp" {
				s.setUDP(replyUDP(truncated))
			}
			g, _ := newGroup(t, func(c *Config) { c.ForceTCP = path == "tcp" }, s.addr)
			req := newReq("WwW.ExAmPlE.CoM.", dns.TypeA)
			req.Id = 0xbeef
			req.SetEdns0(1232, true)
			opt := req.IsEdns0()
			opt.Option = append(opt.Option, &dns.EDNS0_NSID{Code: dns.EDNS0NSID}, &dns.EDNS0_PADDING{Padding: make([]byte, 8)})
			before, packed := req.Copy(), mustPack(t, req)

			var wg sync.WaitGroup
			for range 4 {
				wg.Go(func() {
					for range 5 {
						r, err := exchange(t, g, req)
						if err != nil {
							t.Errorf("Exchange: %v", err)
							return
						}
						if r.Id != 0xbeef || r.Question[0].Name != "WwW.ExAmPlE.CoM." {
							t.Errorf("reply id %#x question %v", r.Id, r.Question)
						}
					}
				})
			}
			wg.Go(func() {
				for range 100 {
					_ = req.String()
				}
			})
			wg.Wait()
			// Copy turns nil sections into empty ones: compare copy to copy.
			if !reflect.DeepEqual(before, req.Copy()) || !bytes.Equal(packed, mustPack(t, req)) {
				t.Errorf("request modified:\n%v\nwant\n%v", req, before)
			}
		})
	}
}

func TestBadRequest(t *testing.T) {
	s := newServer(t)
	g, _ := newGroup(t, nil, s.addr)
	two := newReq("a.example.", dns.TypeA)
	two.Question = append(two.Question, two.Question[0])
	for _, req := range []*dns.Msg{new(dns.Msg), two} {
		if _, err := exchange(t, g, req); !errors.Is(err, ErrQuestionCount) {
			t.Errorf("Exchange with %d questions: %v, want ErrQuestionCount", len(req.Question), err)
		}
	}
	if n := s.udpQueries.Load(); n != 0 {
		t.Errorf("server got %d queries", n)
	}
}

// TestSequentialFailover: a failing first server passes the query to the
// next one in order, and servers after the one that answers are not asked.
func TestSequentialFailover(t *testing.T) {
	tests := []struct {
		name     string
		forceTCP bool
		first    func(t testing.TB) netip.AddrPort
		why      reason
	}{
		{"udp silent", false, silentServer, reasonTimeout},
		{"udp closed port", false, closedAddr, reasonRefused},
		{"tcp silent", true, silentServer, reasonTimeout},
		{"tcp closed port", true, closedAddr, reasonRefused},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			first := tt.first(t)
			second, third := newServer(t), newServer(t)
			second.setBoth(answer("192.0.2.2"))
			third.setBoth(answer("192.0.2.3"))
			g, _ := newGroup(t, func(c *Config) { c.ForceTCP = tt.forceTCP; c.MaxFails = 100 }, first, second.addr, third.addr)
			for range 3 {
				mustAnswer(t, g, newReq("svc.cluster.local.", dns.TypeA), "192.0.2.2")
			}
			if n := third.udpQueries.Load() + third.tcpQueries.Load(); n != 0 {
				t.Errorf("third server got %d queries", n)
			}
			st := stats(g, 0)
			if st.Errors[tt.why.String()] != 3 || st.Fails != 3 {
				t.Errorf("first server: errors %v fails %d, want 3 %s", st.Errors, st.Fails, tt.why)
			}
		})
	}
}

// silentServer returns a server that reads queries and never answers.
func silentServer(t testing.TB) netip.AddrPort {
	s := newServer(t)
	s.setBoth(silent)
	return s.addr
}

// TestAllFail: when no server answers, the error names every attempt.
func TestAllFail(t *testing.T) {
	a, b := closedAddr(t), silentServer(t)
	g, _ := newGroup(t, nil, a, b)
	_, err := exchange(t, g, newReq("x.example.", dns.TypeA))
	var e *Error
	if !errors.As(err, &e) || len(e.Failures) != 2 || e.Cause != nil {
		t.Fatalf("err %v, want *Error with two failures", err)
	}
	if !isFailure(err, reasonRefused) || !isFailure(err, reasonTimeout) {
		t.Errorf("err %v, want a refusal and a timeout", err)
	}
	if !strings.Contains(err.Error(), a.String()) || !strings.Contains(err.Error(), b.String()) {
		t.Errorf("error %q does not name both servers", err)
	}
}

// TestContext: the caller's context ends the exchange at once, and a
// server that was merely interrupted is not blamed for it.
func TestContext(t *testing.T) {
	tests := []struct {
		name     string
		forceTCP bool
		ctx      func() (context.Context, context.CancelFunc)
		want     error
	}{
		{"udp cancel", false, cancelAfter(50 * time.Millisecond), context.Canceled},
		{"udp deadline", false, deadlineIn(50 * time.Millisecond), context.DeadlineExceeded},
		{"udp already canceled", false, cancelAfter(0), context.Canceled},
		{"tcp cancel", true, cancelAfter(50 * time.Millisecond), context.Canceled},
		{"tcp deadline", true, deadlineIn(50 * time.Millisecond), context.DeadlineExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := silentServer(t), silentServer(t)
			g, _ := newGroup(t, func(c *Config) { c.ForceTCP = tt.forceTCP; c.Timeout = 10 * time.Second }, a, b)
			ctx, cancel := tt.ctx()
			defer cancel()
			start := time.Now()
			_, err := g.Exchange(ctx, newReq("slow.example.", dns.TypeA))
			if !errors.Is(err, tt.want) {
				t.Fatalf("err %v, want %v", err, tt.want)
			}
			if d := time.Since(start); d > time.Second {
				t.Errorf("Exchange took %s", d)
			}
			for i := range 2 {
				if st := stats(g, i); st.Fails != 0 || st.Errors["timeout"] != 0 || !st.Healthy {
					t.Errorf("server %d blamed: %+v", i, st)
				}
			}
		})
	}
}

func cancelAfter(d time.Duration) func() (context.Context, context.CancelFunc) {
	return func() (context.Context, context.CancelFunc) {
		ctx, cancel := context.WithCancel(context.Background())
		if d == 0 {
			cancel()
		} else {
			time.AfterFunc(d, cancel)
		}
		return ctx, cancel
	}
}

func deadlineIn(d time.Duration) func() (context.Context, context.CancelFunc) {
	return func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), d)
	}
}

// TestConcurrentExchanges runs many exchanges at once over UDP, TC+TCP
// and TCP; with -race it checks the pool and the counters. It is not about
// timing: the attempt timeout is generous, for a loaded two-core machine.
func TestConcurrentExchanges(t *testing.T) {
	s := newServer(t)
	tc := newServer(t)
	tc.setUDP(replyUDP(truncated))
	patient := func(c *Config) { c.Timeout = 2 * time.Second }
	udp, _ := newGroup(t, patient, s.addr)
	tcp, _ := newGroup(t, func(c *Config) { patient(c); c.ForceTCP = true }, s.addr)
	trunc, _ := newGroup(t, patient, tc.addr)
	var wg sync.WaitGroup
	for _, g := range []*Group{udp, tcp, trunc, udp, tcp, trunc} {
		wg.Go(func() {
			for range 30 {
				if _, err := exchange(t, g, newReq("c.example.", dns.TypeA)); err != nil {
					t.Errorf("Exchange: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := tcp.servers[0].pool.len(); n > maxIdleTCP {
		t.Errorf("%d idle connections, bound %d", n, maxIdleTCP)
	}
}
