package pipeline

import (
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/wire"
)

// FuzzQueryPath sends arbitrary messages through the whole query path —
// hot path, and the miss path when the hot path asks for it — as UDP and
// as TCP queries, against a cache holding a few answers. Nothing may
// panic, and every reply must unpack, carry the query's ID and fit the
// client's limit.
func FuzzQueryPath(f *testing.F) {
	for _, name := range []string{"a.example.", "A.ExAmPlE.", "nx.example.", "big.example."} {
		for _, edns := range []bool{false, true} {
			m := new(dns.Msg)
			m.SetQuestion(name, dns.TypeA)
			if edns {
				m.SetEdns0(1232, true)
				m.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_NSID{Code: dns.EDNS0NSID}}
			}
			b, _ := m.Pack()
			f.Add(b)
		}
	}
	f.Add([]byte{0, 1, 0x80, 0, 0, 1, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0, 1, 0x28, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 6, 0, 1})
	// Odd opcodes and question counts, in the order CoreDNS checks them:
	// UPDATE without a question, NOTIFY with one, STATUS with two, QUERY
	// with two, a header promising a question it does not have.
	f.Add([]byte{0, 1, 0x28, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0, 1, 0x20, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 'a', 0, 0, 1, 0, 1})
	f.Add([]byte{0, 1, 0x10, 0x10, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 1, 0, 1})
	f.Add([]byte{0, 1, 0x01, 0x90, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 1, 0, 1})
	f.Add([]byte{0, 1, 0x01, 0, 0, 1, 0, 0, 0, 0, 0, 0})

	up := newFake()
	up.set("a.example.", "a.example. 60 IN A 192.0.2.1")
	var big []string
	for i := range 50 {
		big = append(big, "big.example. 60 IN A 10.0.0."+string(rune('0'+i%10)))
	}
	up.set("big.example.", big...)
	p, _ := newPipelineF(f, up)
	w := p.NewWorker()
	f.Fuzz(func(t *testing.T, raw []byte) {
		var q wire.Query
		parseErr := wire.ParseQuery(raw, &q)
		check := func(reply []byte, udp bool) {
			var m dns.Msg
			if err := m.Unpack(reply); err != nil {
				// A FORMERR header for an unreadable question is all there is.
				if len(reply) == wire.HeaderLen {
					return
				}
				t.Fatalf("reply does not unpack: %v", err)
			}
			if m.Id != q.ID || !m.Response {
				t.Fatalf("reply id %#x qr %v for query id %#x", m.Id, m.Response, q.ID)
			}
			if udp && parseErr == nil && len(reply) > limitFor(&q, true) {
				t.Fatalf("reply of %d bytes over the limit %d", len(reply), limitFor(&q, true))
			}
		}
		for _, udp := range []bool{true, false} {
			buf := make([]byte, MaxUDPAnswer)
			n, act := w.Answer(buf, raw, udp)
			switch act {
			case Reply:
				check(buf[:n], udp)
			case Resolve:
				var wg sync.WaitGroup
				wg.Add(1)
				var once sync.Once
				p.Resolve(raw, netip.MustParseAddrPort("10.1.0.1:5353"), udp, func(b []byte) {
					once.Do(func() { check(b, udp); wg.Done() })
				})
				done := make(chan struct{})
				go func() { wg.Wait(); close(done) }()
				select {
				case <-done:
				case <-time.After(5 * time.Second):
					t.Fatal("miss never answered")
				}
			}
		}
	})
}
