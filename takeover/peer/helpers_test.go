package peer_test

import (
	"encoding/hex"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/internal/testkit"
	"golang.org/x/sys/unix"
)

// reply builds the replies a fake server sends for query q (none: it stays
// silent). Helpers below cover the common cases.
type reply func(q *dns.Msg) [][]byte

// withNSID answers q (NOERROR, one A record) with the given NSID when q
// asks for one; nsid "" sends no NSID option.
func withNSID(nsid string) reply {
	return withRcode(nsid, dns.RcodeSuccess)
}

func withRcode(nsid string, rcode int) reply {
	return func(q *dns.Msg) [][]byte { return [][]byte{pack(answer(q, nsid, rcode))} }
}

func answer(q *dns.Msg, nsid string, rcode int) *dns.Msg {
	r := new(dns.Msg)
	r.SetRcode(q, rcode)
	if rcode == dns.RcodeSuccess {
		r.Answer = append(r.Answer, &dns.A{
			Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5},
			A:   net.IPv4(192, 0, 2, 1),
		})
	}
	if opt := q.IsEdns0(); opt != nil {
		ropt := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
		ropt.SetUDPSize(1232)
		asked := false
		for _, o := range opt.Option {
			if _, ok := o.(*dns.EDNS0_NSID); ok {
				asked = true
			}
		}
		if asked && nsid != "" {
			ropt.Option = append(ropt.Option, &dns.EDNS0_NSID{Code: dns.EDNS0NSID, Nsid: hex.EncodeToString([]byte(nsid))})
		}
		r.Extra = append(r.Extra, ropt)
	}
	return r
}

func pack(m *dns.Msg) []byte {
	b, err := m.Pack()
	if err != nil {
		panic(err)
	}
	return b
}

// serveFake answers every query on conn with what reply gives, until conn
// is closed (at the end of the test). It records the queries it got.
type fakeServer struct {
	conn *net.UDPConn

	mu      sync.Mutex // guards following
	queries []*dns.Msg
}

func serveFake(t testing.TB, conn *net.UDPConn, r reply) *fakeServer {
	t.Helper()
	f := &fakeServer{conn: conn}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			n, from, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			q := new(dns.Msg)
			if q.Unpack(buf[:n]) != nil || len(q.Question) != 1 {
				continue
			}
			f.mu.Lock()
			f.queries = append(f.queries, q)
			f.mu.Unlock()
			for _, b := range r(q) {
				conn.WriteToUDPAddrPort(b, from)
			}
		}
	}()
	t.Cleanup(func() {
		conn.Close()
		<-done
	})
	return f
}

func (f *fakeServer) got() []*dns.Msg {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*dns.Msg(nil), f.queries...)
}

// reusePortControl sets SO_REUSEPORT, as dnsstandby's responder and CoreDNS
// do, so that the socket joins the address's reuseport group.
func reusePortControl(network, address string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	}); err != nil {
		return err
	}
	return serr
}

// peerGoroutines lists the goroutines running this package's code (its
// Watcher and Process goroutines), to check that Close stopped them all.
func peerGoroutines() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "takeover/peer.(*Watcher).run") || strings.Contains(g, "takeover/peer.(*Process).wait") {
			out = append(out, g)
		}
	}
	return out
}

// waitNoPeerGoroutines fails the test if goroutines of the package are
// still running a second after every Watcher and Process was closed.
func waitNoPeerGoroutines(t testing.TB) {
	t.Helper()
	var g []string
	defer func() {
		if len(g) > 0 {
			t.Logf("goroutines of package peer still running:\n%s", strings.Join(g, "\n\n"))
		}
	}()
	testkit.Eventually(t, time.Second, "no goroutines of package peer", func() bool {
		g = peerGoroutines()
		return len(g) == 0
	})
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func netipMust(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
