package hedge

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/internal/testkit"
	"github.com/dnsstandby/dnsstandby/upstream"
)

// groupAnswerer resolves through a real upstream group, as the daemon's
// pipeline does, and records when each hedge is sent.
type groupAnswerer struct {
	g   *upstream.Group
	ctx context.Context
	wg  sync.WaitGroup

	mu   sync.Mutex
	sent []sentAt
}

type sentAt struct {
	at  time.Time
	msg *dns.Msg
}

func (a *groupAnswerer) Cached(dst, query []byte) (int, bool) { return 0, false }
func (a *groupAnswerer) Fresh(query []byte) bool              { return false }

func (a *groupAnswerer) Resolve(_ netip.AddrPort, query []byte, send func([]byte)) {
	req := new(dns.Msg)
	if req.Unpack(query) != nil {
		return
	}
	a.wg.Go(func() {
		ctx, cancel := context.WithTimeout(a.ctx, 5*time.Second)
		defer cancel()
		resp, err := a.g.Exchange(ctx, req)
		if err != nil {
			return
		}
		if b, err := resp.Pack(); err == nil {
			send(b)
		}
	})
}

func (a *groupAnswerer) Send(_ netip.AddrPort, reply []byte) error {
	m := new(dns.Msg)
	if err := m.Unpack(reply); err != nil {
		return err
	}
	a.mu.Lock()
	a.sent = append(a.sent, sentAt{time.Now(), m})
	a.mu.Unlock()
	return nil
}

// udpServer answers every query with ip after delay; silent when ip is "".
func udpServer(t *testing.T, ip string) netip.AddrPort {
	t.Helper()
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { pc.Close(); <-done })
	go func() {
		defer close(done)
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			q := new(dns.Msg)
			if ip == "" || q.Unpack(buf[:n]) != nil {
				continue
			}
			r := new(dns.Msg)
			r.SetReply(q)
			r.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: net.ParseIP(ip)}}
			if b, err := r.Pack(); err == nil {
				pc.WriteToUDPAddrPort(b, from)
			}
		}
	}()
	return pc.LocalAddr().(*net.UDPAddr).AddrPort()
}

// TestUpstreamStageBeatsHeldQuery is issue 25's case end to end inside
// the process: LocalDNS holds a miss (its first upstream server is silent,
// and CoreDNS waits 2 s on it); the hedger's upstream stage asks the same
// servers through an upstream group, whose speculative attempt reaches the
// second server, and the pod gets that answer within 300 ms, long before
// LocalDNS's. Without speculative attempts the group too waits out the
// silent server: nothing is sent within a second.
func TestUpstreamStageBeatsHeldQuery(t *testing.T) {
	for _, tt := range []struct {
		name string
		rate float64 // the group's SpeculativeRate; 0 turns them off
	}{
		{"speculative attempts", upstream.DefaultConfig().SpeculativeRate},
		{"without them: the hedge waits out the silent server", 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := upstream.DefaultConfig()
			cfg.Servers = []netip.AddrPort{udpServer(t, ""), udpServer(t, "192.0.2.7")}
			cfg.SpeculativeRate = tt.rate
			g, err := upstream.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			ans := &groupAnswerer{g: g, ctx: ctx}
			h, err := New(DefaultConfig(), ans)
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() { h.Run(ctx, nil); close(done) }()
			t.Cleanup(func() { cancel(); <-done; ans.wg.Wait(); g.Close() })

			start := time.Now()
			h.Query(start.UnixNano(), podA, query(7, "held.example."))
			// LocalDNS sends nothing: it is waiting on the silent server.
			sent := func() []sentAt {
				ans.mu.Lock()
				defer ans.mu.Unlock()
				return append([]sentAt(nil), ans.sent...)
			}
			if tt.rate == 0 {
				time.Sleep(time.Second)
				if s := sent(); len(s) != 0 {
					t.Fatalf("hedge sent after %v without speculative attempts, want none within 1 s", s[0].at.Sub(start))
				}
				return
			}
			testkit.Eventually(t, 5*time.Second, "the hedge", func() bool { return len(sent()) > 0 })
			s := sent()[0]
			took := s.at.Sub(start)
			t.Logf("hedge sent after %v", took)
			if s.msg.Id != 7 || len(s.msg.Answer) != 1 || s.msg.Answer[0].(*dns.A).A.String() != "192.0.2.7" {
				t.Fatalf("hedge %v, want the second server's answer to query 7", s.msg)
			}
			if took > 300*time.Millisecond {
				t.Errorf("hedge after %v, want within 300 ms (LocalDNS: 2 s)", took)
			}
		})
	}
}
