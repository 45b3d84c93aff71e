package e2e

import (
	be "encoding/binary"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// ampName is a question name of 250 bytes in wire format under
// example.com, unique by i: the target that every compression pointer of
// a padded query expands to.
func ampName(tag string, i int) string {
	prefix := fmt.Sprintf("%s-%d.", tag, i)
	label := strings.Repeat("a", 63) + "."
	name := prefix
	for len(name)+len(label)+len("example.com.") < 250 {
		name += label
	}
	return name + "example.com."
}

// paddedQuery is a query for name whose answer section holds one HIP
// record of about size bytes: a public key of filler and then
// rendezvous-server names that are each a 2-byte compression pointer to
// the question. miekg/dns unpacks every pointer into a string of the whole
// name (about 250 bytes), so the parsed query is some 40 times the size of
// the bytes sent. Its header passes miekg/dns's default accept function
// (one answer record), which is how LocalDNS's CoreDNS takes it over TCP.
func paddedQuery(t testing.TB, name string, size int) []byte {
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	b, err := m.Pack()
	if err != nil { // called from the attackers' goroutines: no Fatal
		t.Errorf("pack %s: %v", name, err)
		return nil
	}
	be.BigEndian.PutUint16(b[6:], 1) // ANCOUNT
	rdlen := size - len(b) - 12
	pointers := rdlen / 4 // half the rdata as pointers, half as key
	pk := rdlen - 4 - 1 - 2*pointers
	b = append(b, 0xc0, 12)
	b = be.BigEndian.AppendUint16(b, dns.TypeHIP)
	b = be.BigEndian.AppendUint16(b, dns.ClassINET)
	b = be.BigEndian.AppendUint32(b, 0)
	b = be.BigEndian.AppendUint16(b, uint16(rdlen))
	b = append(b, 1, 2) // HIT length, algorithm
	b = be.BigEndian.AppendUint16(b, uint16(pk))
	b = append(b, 0xaa) // HIT
	b = append(b, make([]byte, pk)...)
	for range pointers {
		b = append(b, 0xc0, 12)
	}
	return b
}

// TestMemoryAmplification: while kube-dns hangs (every miss waits the
// whole upstream timeout), attackers on the node send padded queries —
// 64 KB ones over many TCP connections from two addresses, 4 KB datagrams
// from a third — and queries padded with EDNS padding up to the TCP
// bound. dnsstandby's peak RSS (VmHWM) stays under 128 MiB, and it still
// answers a cached name at once, over UDP and TCP.
//
// Every padded query is refused before it is parsed into a message: over
// UDP as CoreDNS refuses it (FORMERR: it reads 512 bytes of a datagram),
// over TCP by closing the connection (a query is never that long). The
// queries that pass — one question and an OPT, up to 512 bytes — wait
// with what their answer needs and no more.
func TestMemoryAmplification(t *testing.T) {
	const (
		attack   = 8 * time.Second
		limit    = 128 << 20
		tcpSize  = 65535
		udpSize  = 4000
		tcpConns = 12 // per address
		perConn  = 10 // queries written before reading the answers
	)
	l := newLab(t)
	s := l.startStandby(t)
	cached := svcQuery(l.zones.Services[0].FQDN)
	l.ask(t, "udp", standbyAddr, cached)
	must(t, l.kubeDNS.Freeze())
	start := rss(t, s.Pid())

	// The attackers stop well above the limit, so that the machine the
	// test runs on is never at risk: the test fails either way.
	const safety = 1 << 30
	stop := make(chan struct{})
	var stopOnce sync.Once
	halt := func() { stopOnce.Do(func() { close(stop) }) }
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			b, err := memory(s.Pid(), "VmRSS")
			return err != nil || b > safety
		}
	}
	var sent, closed atomic.Int64

	var wg sync.WaitGroup
	// TCP: many connections, each writing perConn queries of 64 KB and
	// then reading what comes back, until the server answers or closes.
	for a, laddr := range []string{"10.200.0.1", "169.254.10.10"} {
		for c := range tcpConns {
			wg.Go(func() {
				for round := 0; !stopped(); round++ {
					conn, err := l.node.Dial("tcp", laddr+":0", standbyAddr, timeout)
					if err != nil {
						continue
					}
					var frame []byte
					for i := range perConn {
						q := paddedQuery(t, ampName(fmt.Sprintf("t%d-%d-%d", a, c, round), i), tcpSize-2)
						frame = be.BigEndian.AppendUint16(frame[:0], uint16(len(q)))
						frame = append(frame, q...)
						if _, err := conn.Write(frame); err != nil {
							closed.Add(1)
							break
						}
						sent.Add(1)
					}
					_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
					_, _ = io.Copy(io.Discard, conn)
					conn.Close()
				}
			})
		}
	}
	// UDP: datagrams of 4 KB, 100 distinct names a burst.
	udp, err := l.node.Dial("udp", "169.254.10.12:0", standbyAddr, timeout)
	must(t, err)
	defer udp.Close()
	wg.Go(func() {
		for round := 0; !stopped(); round++ {
			for i := range 100 {
				_, _ = udp.Write(paddedQuery(t, ampName(fmt.Sprintf("u-%d", round), i), udpSize))
				sent.Add(1)
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
	// Within the bounds: one question and an OPT padded to 512 bytes,
	// over TCP, many names, from a fourth address.
	wg.Go(func() {
		for round := 0; !stopped(); round++ {
			conn, err := l.node.Dial("tcp", "169.254.10.11:0", standbyAddr, timeout)
			if err != nil {
				continue
			}
			var frame []byte
			for i := range 32 {
				m := new(dns.Msg)
				m.SetQuestion(ampName(fmt.Sprintf("p-%d", round), i), dns.TypeA)
				m.SetEdns0(1232, false)
				m.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_PADDING{Padding: make([]byte, 512-m.Len()-4)}}
				q, err := m.Pack()
				if err != nil {
					t.Errorf("pack: %v", err)
					return
				}
				frame = be.BigEndian.AppendUint16(frame[:0], uint16(len(q)))
				if _, err := conn.Write(append(frame, q...)); err != nil {
					break
				}
				sent.Add(1)
			}
			_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
			_, _ = io.Copy(io.Discard, conn)
			conn.Close()
		}
	})

	// Meanwhile a cached name is answered at once over UDP and TCP.
	deadline := time.After(attack)
	for wait := true; wait; {
		select {
		case <-deadline:
			wait = false
		case <-time.After(500 * time.Millisecond):
			for _, network := range []string{"udp", "tcp"} {
				r, err := l.node.Exchange(network, "", standbyAddr, cached, time.Second)
				if err != nil || len(r.Answer) != 1 {
					t.Errorf("%s: cached name during the attack: %v %v", network, r, err)
				}
			}
		}
	}
	halt()
	wg.Wait()

	select {
	case <-s.Done():
		t.Fatalf("dnsstandby died: %v", s.Err())
	default:
	}
	peak, err := memory(s.Pid(), "VmHWM")
	must(t, err)
	t.Logf("RSS %d MiB before the attack, peak %d MiB (VmHWM); %d padded queries sent, %d TCP writes failed on a closed connection",
		start>>20, peak>>20, sent.Load(), closed.Load())
	if peak >= limit {
		t.Errorf("peak RSS %d MiB under the attack, want under %d MiB", peak>>20, limit>>20)
	}
}
