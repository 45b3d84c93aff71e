package e2e

import (
	be "encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// slowZone is a server block for kube-dns's CoreDNS: every name under
// slow.test is answered (192.0.2.53, by erratic) after 5 s, past
// dnsstandby's upstream timeout (2 s), as names under a zone whose servers
// do not answer are. Each miss there holds an upstream resolution for the
// whole timeout: what an attacker needs to take dnsstandby's capacity
// with few packets.
const slowZone = "slow.test.:53 {\n    bind " + clusterIP + "\n    erratic {\n        delay 1 5s\n    }\n}\n"

// slowQuery is a query for a name under slow.test no one asked before.
func slowQuery(tag string) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(fmt.Sprintf("%s-%x.slow.test.", tag, rand.Uint64()), dns.TypeA)
	return m
}

// tally counts the outcomes of legitimate queries during an attack.
type tally struct {
	mu                         sync.Mutex
	asked, answered, servfail  int
	truncatedRetried, failures int
	errs                       []string
}

// add records one query's outcome: answered is a reply that resolves the
// name (NOERROR with records, or NXDOMAIN), anything else a failure.
func (c *tally) add(r *dns.Msg, err error, retried bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asked++
	if retried {
		c.truncatedRetried++
	}
	switch {
	case err != nil:
		c.failures++
		if len(c.errs) < 3 {
			c.errs = append(c.errs, err.Error())
		}
	case r.Rcode == dns.RcodeServerFailure:
		c.servfail++
	case r.Rcode == dns.RcodeNameError || r.Rcode == dns.RcodeSuccess && len(r.Answer) > 0:
		c.answered++
	default:
		c.failures++
		if len(c.errs) < 3 {
			c.errs = append(c.errs, dns.RcodeToString[r.Rcode]+" without records")
		}
	}
}

func (c *tally) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := fmt.Sprintf("%d/%d answered, %d SERVFAIL, %d failed", c.answered, c.asked, c.servfail, c.failures)
	if c.truncatedRetried > 0 {
		s += fmt.Sprintf(", %d truncated and asked again over TCP", c.truncatedRetried)
	}
	if len(c.errs) > 0 {
		s += " (" + strings.Join(c.errs, "; ") + ")"
	}
	return s
}

func (c *tally) all() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.asked > 0 && c.answered == c.asked
}

// stub asks m as a pod's stub resolver does (glibc, musl from 1.2.4,
// Go's): over UDP from laddr, and again over TCP if the answer is
// truncated. It reports whether it asked again.
func (l *lab) stub(laddr string, m *dns.Msg) (*dns.Msg, bool, error) {
	r, err := l.node.Exchange("udp", laddr+":0", standbyAddr, m, timeout)
	if err != nil || !r.Truncated {
		return r, false, err
	}
	r, err = l.node.Exchange("tcp", laddr+":0", standbyAddr, m, timeout)
	return r, true, err
}

// legitNames are the names legitimate clients ask during an attack, each
// once, none asked before: a cluster service's A and SRV records, and
// names under example.com (NXDOMAIN), all answered by kube-dns at once.
func (l *lab) legitNames(n int) []*dns.Msg {
	var out []*dns.Msg
	for i := 0; len(out) < n; i++ {
		m := new(dns.Msg)
		switch svc := l.zones.Services[i%len(l.zones.Services)]; {
		case i < len(l.zones.Services):
			m.SetQuestion(svc.FQDN, dns.TypeA)
		case i < 2*len(l.zones.Services):
			m.SetQuestion(svc.SRV, dns.TypeSRV)
		default:
			m.SetQuestion(fmt.Sprintf("legit-%d.example.com.", i), dns.TypeA)
		}
		out = append(out, m)
	}
	return out
}

// attack runs fn on its own goroutines until the test stops it; stop
// returns once every one has returned.
type attack struct {
	done chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

func newAttack(t *testing.T) *attack {
	a := &attack{done: make(chan struct{})}
	t.Cleanup(a.stop)
	return a
}

func (a *attack) stopped() bool {
	select {
	case <-a.done:
		return true
	default:
		return false
	}
}

func (a *attack) stop() {
	a.once.Do(func() { close(a.done) })
	a.wg.Wait()
}

// udpFlood sends rate queries a second made by query from a socket bound
// to laddr, never reading the answers: as a forger does, whose answers go
// to the address it forged. dnsstandby cannot tell a datagram from another
// socket bound to that address from one with a forged source: both are
// from the address.
func (a *attack) udpFlood(t *testing.T, l *lab, laddr string, rate int, query func() *dns.Msg, sent *atomic.Int64) {
	conn, err := l.node.Dial("udp", laddr+":0", standbyAddr, timeout)
	must(t, err)
	a.wg.Go(func() {
		defer conn.Close()
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		for {
			select {
			case <-a.done:
				return
			case <-tick.C:
			}
			b, err := query().Pack()
			if err != nil {
				t.Errorf("pack: %v", err)
				return
			}
			if _, err := conn.Write(b); err == nil {
				sent.Add(1)
			}
		}
	})
}

// addrs adds n addresses prefix.1 to prefix.n to the node's localdns link
// and returns them: the pods an attack comes from.
func (l *lab) addrs(t *testing.T, prefix string, n int) []string {
	t.Helper()
	var out, cidrs []string
	for i := 1; i <= n; i++ {
		out = append(out, fmt.Sprintf("%s.%d", prefix, i))
		cidrs = append(cidrs, out[len(out)-1]+"/32")
	}
	must(t, l.node.AddAddr("localdns", cidrs...))
	return out
}

// TestTCPLockout: ten pods hold 100 TCP connections each (the default
// cap of 1,000), each connection with a query for a slow name in flight,
// asked again as soon as it is answered (SERVFAIL after the upstream
// timeout): one name for all of them (one upstream resolution, a thousand
// connections waiting on it), or a new name each time (a thousand
// resolutions, the global cap). Meanwhile a legitimate client from
// another address gets its answers over new TCP connections, and over
// UDP its misses are resolved.
//
// An attacker gains nothing by asking again at once after a fast answer
// (a refusal: its connection is idle either way), so its connections wait
// a second after one; that keeps the CPU the test takes from depending on
// how fast refusals come.
func TestTCPLockout(t *testing.T) {
	const (
		pods    = 10
		perPod  = 100
		legit   = 20 // queries over TCP, and as many over UDP
		holdFor = 20 * time.Second
	)
	for _, tt := range []struct {
		name string
		slow func(tag string) *dns.Msg
	}{
		{"one slow name", func(string) *dns.Msg { m := slowQuery("held"); m.Question[0].Name = "held.slow.test."; return m }},
		{"a new slow name each", slowQuery},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l := newLabWith(t, slowZone, nil)
			s := l.startStandby(t)
			a := newAttack(t)
			var conns, slowAnswers, fastAnswers atomic.Int64
			for p, addr := range l.addrs(t, "169.254.20", pods) {
				for c := range perPod {
					a.wg.Go(func() {
						for !a.stopped() {
							if conn, err := l.node.Dial("tcp", addr+":0", standbyAddr, timeout); err == nil {
								conns.Add(1)
								holdSlowQueries(a, conn, fmt.Sprintf("lock-%d-%d", p, c), tt.slow, &slowAnswers, &fastAnswers)
								conns.Add(-1)
								conn.Close()
							}
							// Closed or refused: connect again, after a pause
							// that keeps a thousand of these from spinning.
							select {
							case <-a.done:
							case <-time.After(100 * time.Millisecond):
							}
						}
					})
				}
			}
			l.eventuallyMetric(t, s, holdFor, "the attack holding every TCP connection", func() bool {
				return l.metric(t, s, "dnsstandby_tcp_connections") >= pods*perPod || conns.Load() >= pods*perPod
			}, "dnsstandby_tcp_connections", "dnsstandby_inflight")
			t.Logf("attack: %d connections open from the attackers' side; dnsstandby: %v TCP connections, %v upstream resolutions in flight",
				conns.Load(), l.metric(t, s, "dnsstandby_tcp_connections"), l.metric(t, s, "dnsstandby_inflight"))

			names := l.legitNames(2 * legit)
			var overTCP, overUDP tally
			for i := range legit {
				r, err := l.node.Exchange("tcp", asideIP+":0", standbyAddr, names[i], timeout)
				overTCP.add(r, err, false)
				r, err = l.node.Exchange("udp", asideIP+":0", standbyAddr, names[legit+i], timeout)
				overUDP.add(r, err, false)
				time.Sleep(100 * time.Millisecond) // a client's pace, not a wait for an event
			}
			t.Logf("during the attack (%d slow answers, %d fast ones to the attackers): legitimate client over new TCP connections: %v; its UDP misses: %v",
				slowAnswers.Load(), fastAnswers.Load(), &overTCP, &overUDP)
			t.Logf("dnsstandby: connections evicted: idle %v, busy %v, address %v; %v rejected; misses capped by scope: client %v, zone %v, global %v",
				l.metric(t, s, "dnsstandby_tcp_connections_evicted_total", "reason", "idle"), l.metric(t, s, "dnsstandby_tcp_connections_evicted_total", "reason", "busy"),
				l.metric(t, s, "dnsstandby_tcp_connections_evicted_total", "reason", "address"), l.metric(t, s, "dnsstandby_tcp_connections_rejected_total"),
				l.metric(t, s, "dnsstandby_upstream_capped_total", "scope", "client"), l.metric(t, s, "dnsstandby_upstream_capped_total", "scope", "zone"),
				l.metric(t, s, "dnsstandby_upstream_capped_total", "scope", "global"))
			if !overTCP.all() {
				t.Errorf("legitimate TCP client during the lockout attempt: %v", &overTCP)
			}
			if !overUDP.all() {
				t.Errorf("legitimate UDP misses during the lockout attempt: %v", &overUDP)
			}
		})
	}
}

// holdSlowQueries keeps one query for a slow name (from query) in flight on conn: it
// asks, reads the answer, and asks again, at once after a slow answer and
// a second after a fast one, until the attack stops or the connection
// closes.
func holdSlowQueries(a *attack, conn net.Conn, tag string, query func(string) *dns.Msg, slow, fast *atomic.Int64) {
	var frame []byte
	var l [2]byte
	for i := 0; !a.stopped(); i++ {
		b, err := query(fmt.Sprintf("%s-%d", tag, i)).Pack()
		if err != nil {
			return
		}
		frame = be.BigEndian.AppendUint16(frame[:0], uint16(len(b)))
		if _, err := conn.Write(append(frame, b...)); err != nil {
			return
		}
		start := time.Now()
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(conn, l[:]); err != nil {
			return
		}
		if _, err := io.CopyN(io.Discard, conn, int64(be.BigEndian.Uint16(l[:]))); err != nil {
			return
		}
		if time.Since(start) >= time.Second {
			slow.Add(1)
			continue
		}
		fast.Add(1)
		select {
		case <-a.done:
		case <-time.After(time.Second):
		}
	}
}

// TestForgedSourceFairness: a forger sends 200 queries a second for new
// names under a slow zone with a victim pod's address as the source. The
// victim's own queries for ordinary names (cluster services, each a miss)
// are answered, as its stub resolver asks them: over UDP, and over TCP if
// the answer is truncated.
func TestForgedSourceFairness(t *testing.T) {
	const (
		rate   = 200
		victim = 20
	)
	l := newLabWith(t, slowZone, nil)
	s := l.startStandby(t)
	victimAddr := l.addrs(t, "169.254.22", 1)[0]
	a := newAttack(t)
	var sent atomic.Int64
	a.udpFlood(t, l, victimAddr, rate, func() *dns.Msg { return slowQuery("forged") }, &sent)
	// The forged queries have filled what the victim's address may have
	// waiting.
	l.eventuallyMetric(t, s, 10*time.Second, "forged queries capped", func() bool {
		return l.metric(t, s, "dnsstandby_upstream_capped_total") > 0
	}, "dnsstandby_upstream_capped", "dnsstandby_inflight")

	var got tally
	for _, m := range l.legitNames(victim) {
		r, retried, err := l.stub(victimAddr, m)
		got.add(r, err, retried)
		time.Sleep(250 * time.Millisecond) // a client's pace
	}
	t.Logf("victim, while %d forged queries were sent as it: %v", sent.Load(), &got)
	t.Logf("dnsstandby: misses capped by scope: client %v, zone %v, global %v; %v in flight",
		l.metric(t, s, "dnsstandby_upstream_capped_total", "scope", "client"), l.metric(t, s, "dnsstandby_upstream_capped_total", "scope", "zone"),
		l.metric(t, s, "dnsstandby_upstream_capped_total", "scope", "global"), l.metric(t, s, "dnsstandby_inflight"))
	if !got.all() {
		t.Errorf("victim's queries: %v", &got)
	}
}

// TestRandomSubdomainFlood: 40 pods each send 20 queries a second for new
// names under one slow zone (800 a second, each waiting the upstream
// timeout). Misses for names in other zones from another address are
// answered.
func TestRandomSubdomainFlood(t *testing.T) {
	const (
		pods  = 40
		rate  = 20 // per pod
		legit = 40
	)
	l := newLabWith(t, slowZone, nil)
	s := l.startStandby(t)
	a := newAttack(t)
	var sent atomic.Int64
	for _, addr := range l.addrs(t, "169.254.21", pods) {
		a.udpFlood(t, l, addr, rate, func() *dns.Msg { return slowQuery("flood") }, &sent)
	}
	// The flood has had the upstream timeout to pile up.
	l.eventuallyMetric(t, s, 10*time.Second, "the flood holding upstream resolutions", func() bool {
		return l.metric(t, s, "dnsstandby_upstream_capped_total") > 0
	}, "dnsstandby_upstream_capped", "dnsstandby_inflight")
	var got tally
	for _, m := range l.legitNames(legit) {
		r, retried, err := l.stub(asideIP, m)
		got.add(r, err, retried)
		time.Sleep(100 * time.Millisecond) // a client's pace
	}
	t.Logf("legitimate misses during a flood of %d queries from %d addresses: %v", sent.Load(), pods, &got)
	t.Logf("dnsstandby: misses capped by scope: client %v, zone %v, global %v; %v in flight",
		l.metric(t, s, "dnsstandby_upstream_capped_total", "scope", "client"), l.metric(t, s, "dnsstandby_upstream_capped_total", "scope", "zone"),
		l.metric(t, s, "dnsstandby_upstream_capped_total", "scope", "global"), l.metric(t, s, "dnsstandby_inflight"))
	if !got.all() {
		t.Errorf("legitimate misses during the flood: %v", &got)
	}
}
