package e2e

import (
	be "encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
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

// stalledReader is a TCP connection from ns to dnsstandby whose receive
// buffer is as small as the kernel allows and which never reads: every
// answer written to it fills the send buffer and then blocks.
func stalledReader(t *testing.T, ns *nstest.Namespace, laddr string) net.Conn {
	t.Helper()
	var conn net.Conn
	d := net.Dialer{
		Timeout:   timeout,
		LocalAddr: &net.TCPAddr{IP: net.ParseIP(laddr)},
		Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 1024)
			}); err != nil {
				return err
			}
			return serr
		},
	}
	must(t, ns.Do(func() error {
		var err error
		conn, err = d.Dial("tcp", standbyAddr)
		return err
	}))
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestHeadOfLineBlocking: eight TCP clients that never read their answers
// are waiting, with a healthy UDP client, on the same uncached name, whose
// answer (4,000 A records, about 64 KB) kube-dns sends after 600 ms. The
// UDP client's answer is not held up by the writes to the stalled
// connections: it comes within 1 s of its query.
func TestHeadOfLineBlocking(t *testing.T) {
	const (
		stalled = 8
		perConn = 8 // queries for the name on each stalled connection
		records = 4000
		slow    = 600 * time.Millisecond
	)
	var zone strings.Builder
	zone.WriteString("$ORIGIN big.test.\n$TTL 300\n@ IN SOA ns hostmaster 1 7200 1800 86400 300\n@ IN NS ns\nns IN A " + clusterIP + "\n")
	for i := range records {
		fmt.Fprintf(&zone, "huge IN A 10.%d.%d.%d\n", 100+i/65536, i/256%256, i%256)
	}
	l := newLabWith(t, "big.test.:53 {\n    bind "+clusterIP+"\n    file db.big\n}\n", map[string]string{"db.big": zone.String()})
	s := l.startStandby(t)
	// The stalled clients are pods: they reach dnsstandby over a veth (MTU
	// 1500), so its send buffers stay small as they do for real pods.
	must(t, l.kube.AddRoute(nstest.Route{Dst: standbyIP + "/32", Via: "10.200.0.1"}))

	const name = "huge.big.test."
	query := func(id uint16) []byte {
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeA)
		m.Id = id
		b, err := m.Pack()
		must(t, err)
		return b
	}
	must(t, l.kubeDNS.Freeze())
	frozen := true
	defer func() {
		if frozen {
			_ = l.kubeDNS.Signal(syscall.SIGCONT)
		}
	}()
	joined := l.metric(t, s, "dnsstandby_coalesced_total")
	for c := range stalled {
		conn := stalledReader(t, l.kube, []string{"10.200.0.2", clusterIP}[c%2])
		var frames []byte
		for i := range perConn {
			q := query(uint16(c*perConn + i))
			frames = be.BigEndian.AppendUint16(frames, uint16(len(q)))
			frames = append(frames, q...)
		}
		_, err := conn.Write(frames)
		must(t, err)
	}
	// Every stalled query has joined the first one's flight.
	l.eventuallyMetric(t, s, 5*time.Second, "stalled queries coalesced", func() bool {
		return l.metric(t, s, "dnsstandby_coalesced_total") >= joined+stalled*perConn-1
	}, "dnsstandby_coalesced", "dnsstandby_upstream_capped")

	// The healthy client asks last; kube-dns answers slow after that.
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	m.SetEdns0(1232, false)
	type result struct {
		r    *dns.Msg
		err  error
		took time.Duration
	}
	done := make(chan result, 1)
	go func() {
		start := time.Now()
		r, err := l.node.Exchange("udp", "", standbyAddr, m, 30*time.Second)
		done <- result{r, err, time.Since(start)}
	}()
	l.eventuallyMetric(t, s, 5*time.Second, "healthy query coalesced", func() bool {
		return l.metric(t, s, "dnsstandby_coalesced_total") >= joined+stalled*perConn
	}, "dnsstandby_coalesced")
	time.Sleep(slow) // kube-dns's slowness, not a wait for an event
	must(t, l.kubeDNS.Signal(syscall.SIGCONT))
	frozen = false
	res := <-done
	t.Logf("healthy UDP client answered in %s (kube-dns answered after %s): %v", res.took.Round(time.Millisecond), slow, res.err)
	switch {
	case res.err != nil:
		t.Fatalf("healthy UDP client: %v", res.err)
	case res.r.Rcode != dns.RcodeSuccess || len(res.r.Answer) == 0:
		t.Fatalf("healthy UDP client: %v", res.r)
	case res.took > time.Second:
		t.Errorf("healthy UDP client answered after %s, want within 1s", res.took.Round(time.Millisecond))
	}
}
