package upstream

import (
	"net"
	"net/netip"
	"testing"

	"github.com/miekg/dns"
)

// TestSpoofedRepliesIgnored: before the real reply, the server sends a
// datagram that must not be taken for it. The exchange must skip it,
// count it, and return the real reply (192.0.2.1); the bogus ones carry
// 192.0.2.66.
func TestSpoofedRepliesIgnored(t *testing.T) {
	bogus := func(q *dns.Msg) *dns.Msg { return answer("192.0.2.66")(q) }
	tests := []struct {
		name string
		send func(s *testServer, to netip.AddrPort, q *dns.Msg)
		why  reason // counter that must read 1
		none bool   // the kernel drops it: no counter moves
	}{
		{name: "wrong id", why: reasonMismatch, send: func(s *testServer, to netip.AddrPort, q *dns.Msg) {
			r := bogus(q)
			r.Id ^= 1
			s.sendUDP(to, r)
		}},
		{name: "other name", why: reasonMismatch, send: func(s *testServer, to netip.AddrPort, q *dns.Msg) {
			r := bogus(q)
			r.Question[0].Name = "evil.example."
			s.sendUDP(to, r)
		}},
		{name: "name in other case", why: reasonCase, send: func(s *testServer, to netip.AddrPort, q *dns.Msg) {
			r := bogus(q)
			r.Question[0].Name = swapCase(q.Question[0].Name) // not the case the query was sent in
			s.sendUDP(to, r)
		}},
		{name: "other type", why: reasonMismatch, send: func(s *testServer, to netip.AddrPort, q *dns.Msg) {
			r := bogus(q)
			r.Question[0].Qtype = dns.TypeAAAA
			s.sendUDP(to, r)
		}},
		{name: "other class", why: reasonMismatch, send: func(s *testServer, to netip.AddrPort, q *dns.Msg) {
			r := bogus(q)
			r.Question[0].Qclass = dns.ClassCHAOS
			s.sendUDP(to, r)
		}},
		{name: "no question", why: reasonMismatch, send: func(s *testServer, to netip.AddrPort, q *dns.Msg) {
			r := bogus(q)
			r.Question = nil
			s.sendUDP(to, r)
		}},
		{name: "two questions", why: reasonMismatch, send: func(s *testServer, to netip.AddrPort, q *dns.Msg) {
			r := bogus(q)
			r.Question = append(r.Question, r.Question[0])
			s.sendUDP(to, r)
		}},
		{name: "not a response", why: reasonMismatch, send: func(s *testServer, to netip.AddrPort, q *dns.Msg) {
			r := bogus(q)
			r.Response = false
			s.sendUDP(to, r)
		}},
		{name: "other opcode", why: reasonMismatch, send: func(s *testServer, to netip.AddrPort, q *dns.Msg) {
			r := bogus(q)
			r.Opcode = dns.OpcodeNotify
			s.sendUDP(to, r)
		}},
		{name: "runt", why: reasonMismatch, send: func(s *testServer, to netip.AddrPort, q *dns.Msg) {
			s.sendRawUDP(to, []byte{0x42})
		}},
		{name: "matching head, broken body", why: reasonMalformed, send: func(s *testServer, to netip.AddrPort, q *dns.Msg) {
			b := mustPack(t, bogus(q))
			b = b[:len(b)-3] // cut into the A record
			s.sendRawUDP(to, b)
		}},
		{name: "other source port", none: true, send: func(s *testServer, to netip.AddrPort, q *dns.Msg) {
			pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Errorf("listen: %v", err)
				return
			}
			defer pc.Close()
			pc.WriteToUDPAddrPort(mustPack(t, bogus(q)), to)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newServer(t)
			s.setUDP(func(s *testServer, from netip.AddrPort, q *dns.Msg) {
				tt.send(s, from, q)
				s.sendUDP(from, answer("192.0.2.1")(q))
			})
			g, _ := newGroup(t, nil, s.addr)
			mustAnswer(t, g, newReq("WwW.ExAmPlE.cOm.", dns.TypeA), "192.0.2.1")
			st := stats(g, 0)
			for r := range numReasons {
				want := uint64(0)
				if r == tt.why && !tt.none {
					want = 1
				}
				if got := st.Errors[r.String()]; got != want {
					t.Errorf("errors{%s} = %d, want %d", r, got, want)
				}
			}
		})
	}
}

// TestOnlySpoofedReplies: a server (or attacker) that sends only bogus
// replies gets the query nowhere: it times out, as silence would.
func TestOnlySpoofedReplies(t *testing.T) {
	s := newServer(t)
	s.setUDP(func(s *testServer, from netip.AddrPort, q *dns.Msg) {
		for id := range 20 {
			r := answer("192.0.2.66")(q)
			r.Id = q.Id + uint16(id) + 1
			s.sendUDP(from, r)
		}
	})
	g, _ := newGroup(t, nil, s.addr)
	_, err := exchange(t, g, newReq("www.example.", dns.TypeA))
	if !isFailure(err, reasonTimeout) {
		t.Fatalf("err %v, want a timeout", err)
	}
	if n := stats(g, 0).Errors["mismatch"]; n != 20 {
		t.Errorf("mismatch count %d, want 20", n)
	}
}

// TestRandomIDs: every attempt goes out with its own random ID, not the
// caller's.
func TestRandomIDs(t *testing.T) {
	s := newServer(t)
	ids := make(chan uint16, 64)
	s.setUDP(func(s *testServer, from netip.AddrPort, q *dns.Msg) {
		ids <- q.Id
		s.sendUDP(from, answer("192.0.2.1")(q))
	})
	g, _ := newGroup(t, nil, s.addr)
	seen := make(map[uint16]bool)
	for range 32 {
		mustAnswer(t, g, newReq("id.example.", dns.TypeA), "192.0.2.1")
		seen[<-ids] = true
	}
	// 32 draws from 65536 values collide with probability under 1%;
	// allow one collision, and the caller's ID 0x4242 at most by chance.
	if len(seen) < 31 {
		t.Errorf("only %d distinct IDs in 32 queries", len(seen))
	}
}

// TestSourcePorts: each query uses a fresh socket, so a fresh source port.
func TestSourcePorts(t *testing.T) {
	s := newServer(t)
	ports := make(chan uint16, 64)
	s.setUDP(func(s *testServer, from netip.AddrPort, q *dns.Msg) {
		ports <- from.Port()
		s.sendUDP(from, answer("192.0.2.1")(q))
	})
	g, _ := newGroup(t, nil, s.addr)
	seen := make(map[uint16]bool)
	for range 16 {
		mustAnswer(t, g, newReq("port.example.", dns.TypeA), "192.0.2.1")
		seen[<-ports] = true
	}
	if len(seen) < 8 {
		t.Errorf("only %d distinct source ports in 16 queries", len(seen))
	}
}
