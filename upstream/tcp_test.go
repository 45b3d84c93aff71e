package upstream

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// truncated replies with TC=1 and no records, as a server does when the
// answer does not fit.
func truncated(q *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(q)
	m.Truncated = true
	return m
}

// TestTruncatedRetriesTCP: TC=1 over UDP sends the query again over TCP to
// the same server; if that fails, the next server is asked, and only when
// no server gives a full answer is the truncated reply returned.
func TestTruncatedRetriesTCP(t *testing.T) {
	tests := []struct {
		name      string
		firstTCP  tcpHandler // the first server's TCP; its UDP truncates
		second    bool       // a second, working server is configured
		want      string     // the A record expected, "" for the truncated reply
		wantTCPOK bool
	}{
		{"tcp answers", answer("192.0.2.1"), false, "192.0.2.1", true},
		{"tcp silent, next server", silent, true, "192.0.2.2", false},
		{"tcp silent, no other server", silent, false, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newServer(t)
			s.setUDP(replyUDP(truncated))
			s.setTCP(tt.firstTCP)
			servers := []*testServer{s}
			if tt.second {
				s2 := newServer(t)
				s2.setBoth(answer("192.0.2.2"))
				servers = append(servers, s2)
			}
			var addrs []netip.AddrPort
			for _, x := range servers {
				addrs = append(addrs, x.addr)
			}
			g, _ := newGroup(t, nil, addrs...)
			r := mustAnswer(t, g, newReq("big.example.", dns.TypeTXT), tt.want)
			if tt.want == "" && (!r.Truncated || len(r.Answer) != 0) {
				t.Errorf("want the truncated reply, got %v", r)
			}
			if tt.want != "" && r.Truncated {
				t.Errorf("got a truncated reply")
			}
			st := stats(g, 0)
			if st.Requests["udp"] != 1 || st.Requests["tcp"] != 1 || s.tcpQueries.Load() != 1 {
				t.Errorf("first server: requests %v, tcp queries seen %d", st.Requests, s.tcpQueries.Load())
			}
			// The server answered over UDP: a TCP problem alone does not
			// count against it.
			if st.Fails != 0 || !st.Healthy {
				t.Errorf("first server blamed: %+v", st)
			}
			if ok := st.Replies == 1; ok != tt.wantTCPOK {
				t.Errorf("replies timed %d", st.Replies)
			}
		})
	}
}

// TestTCPReuse: sequential TCP queries share one connection.
func TestTCPReuse(t *testing.T) {
	s := newServer(t)
	g, _ := newGroup(t, func(c *Config) { c.ForceTCP = true }, s.addr)
	for range 5 {
		mustAnswer(t, g, newReq("reuse.example.", dns.TypeA), "192.0.2.1")
	}
	if a, q := s.accepts.Load(), s.tcpQueries.Load(); a != 1 || q != 5 {
		t.Errorf("%d connections for %d queries, want 1 for 5", a, q)
	}
	if n := g.servers[0].pool.len(); n != 1 {
		t.Errorf("%d idle connections, want 1", n)
	}
}

// TestTCPExpiry: an idle connection is closed after ExpireTCP, and the
// next query dials a new one.
func TestTCPExpiry(t *testing.T) {
	s := newServer(t)
	g, _ := newGroup(t, func(c *Config) { c.ForceTCP = true; c.ExpireTCP = 40 * time.Millisecond }, s.addr)
	mustAnswer(t, g, newReq("a.example.", dns.TypeA), "192.0.2.1")
	testkit.Eventually(t, 3*time.Second, "the janitor to close the idle connection", func() bool {
		return g.servers[0].pool.len() == 0
	})
	testkit.Eventually(t, 3*time.Second, "the server to see the close", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.conns) == 0
	})
	mustAnswer(t, g, newReq("b.example.", dns.TypeA), "192.0.2.1")
	if a := s.accepts.Load(); a != 2 {
		t.Errorf("%d connections, want 2", a)
	}
	if n := stats(g, 0).Errors["tcp_closed"]; n != 0 {
		t.Errorf("tcp_closed %d: an expired connection was used", n)
	}
}

// TestBrokenPooledConn: a pooled connection the server closed or reset is
// retried once on a fresh one, without blaming the server.
func TestBrokenPooledConn(t *testing.T) {
	tests := []struct {
		name string
		mode tcpMode
	}{
		{"closed by server", tcpCloseAfterOne},
		{"reset by server", tcpResetOnSecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newServer(t)
			s.tcpMode = tt.mode
			g, _ := newGroup(t, func(c *Config) { c.ForceTCP = true; c.MaxFails = 1 }, s.addr)
			mustAnswer(t, g, newReq("one.example.", dns.TypeA), "192.0.2.1")
			if tt.mode == tcpCloseAfterOne {
				testkit.Eventually(t, 3*time.Second, "the server to close", func() bool {
					s.mu.Lock()
					defer s.mu.Unlock()
					return len(s.conns) == 0
				})
			}
			mustAnswer(t, g, newReq("two.example.", dns.TypeA), "192.0.2.1")
			st := stats(g, 0)
			if a := s.accepts.Load(); a != 2 {
				t.Errorf("%d connections, want 2", a)
			}
			if st.Errors["tcp_closed"] != 1 || st.Fails != 0 || !st.Healthy || st.Requests["tcp"] != 3 {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

// TestTCPPoolBound: concurrent TCP queries may open many connections, but
// only maxIdleTCP stay open afterwards.
func TestTCPPoolBound(t *testing.T) {
	p := new(pool)
	now := time.Now()
	var conns []net.Conn
	for range maxIdleTCP + 3 {
		a, b := net.Pipe()
		defer b.Close()
		conns = append(conns, a)
		p.put(a, now)
	}
	if n := p.len(); n != maxIdleTCP {
		t.Fatalf("%d idle, want %d", n, maxIdleTCP)
	}
	// Connections over the bound were closed at once.
	if _, err := conns[maxIdleTCP].Write([]byte{0}); err == nil {
		t.Errorf("connection over the bound still open")
	}
}

func TestPool(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	const expire = 10 * time.Second
	tests := []struct {
		name     string
		used     []time.Duration // put times after t0, oldest first
		op       func(p *pool) net.Conn
		wantGot  int // index of the conn returned, -1 for none
		wantLeft int
	}{
		{"get newest", []time.Duration{0, time.Second, 2 * time.Second},
			func(p *pool) net.Conn { return p.get(t0.Add(3*time.Second), expire) }, 2, 2},
		{"get expired empties", []time.Duration{0, time.Second},
			func(p *pool) net.Conn { return p.get(t0.Add(12*time.Second), expire) }, -1, 0},
		{"get from empty", nil,
			func(p *pool) net.Conn { return p.get(t0, expire) }, -1, 0},
		{"expire oldest", []time.Duration{0, 4 * time.Second, 9 * time.Second},
			func(p *pool) net.Conn { p.expire(t0.Add(14*time.Second), expire); return nil }, -1, 1},
		{"expire none", []time.Duration{5 * time.Second},
			func(p *pool) net.Conn { p.expire(t0.Add(14*time.Second), expire); return nil }, -1, 1},
		{"flush", []time.Duration{0, time.Second},
			func(p *pool) net.Conn { p.flush(); return nil }, -1, 0},
		{"closed pool closes on put", nil,
			func(p *pool) net.Conn {
				p.close()
				a, b := net.Pipe()
				defer b.Close()
				p.put(a, t0)
				return nil
			}, -1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := new(pool)
			var conns []net.Conn
			for _, d := range tt.used {
				a, b := net.Pipe()
				t.Cleanup(func() { a.Close(); b.Close() })
				conns = append(conns, a)
				p.put(a, t0.Add(d))
			}
			got := tt.op(p)
			switch {
			case tt.wantGot < 0 && got != nil:
				t.Errorf("got a connection, want none")
			case tt.wantGot >= 0 && got != conns[tt.wantGot]:
				t.Errorf("got the wrong connection")
			}
			if n := p.len(); n != tt.wantLeft {
				t.Errorf("%d left, want %d", n, tt.wantLeft)
			}
		})
	}
}
