package e2e

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// TestAnswersMatchCoreDNS asks dnsstandby (on 169.254.10.12) and LocalDNS
// (CoreDNS with AgentBaker's Corefile, on .11) the same questions, first (a miss, forwarded to kube-dns) and again (from
// their caches): same rcode, same records, dnsstandby's TTLs never larger,
// the client's 0x20 case kept, and each names itself by NSID.
func TestAnswersMatchCoreDNS(t *testing.T) {
	l := newLab(t)
	l.startReference(t)
	l.startStandbyOn(t, asideAddr)

	type query struct {
		name  string
		qtype uint16
		do    bool
	}
	var queries []query
	for _, c := range l.zones.Cases {
		if c.Rcode == dns.RcodeRefused {
			continue // names in no zone: kube-dns refuses, nothing to compare
		}
		queries = append(queries, query{name: mixCase(c.Name), qtype: c.Type})
	}
	queries = append(queries, query{name: l.zones.Services[3].FQDN, qtype: dns.TypeA, do: true})

	for _, pass := range []string{"miss", "cached"} {
		for _, q := range queries {
			m := new(dns.Msg)
			m.SetQuestion(q.name, q.qtype)
			m.SetEdns0(4096, q.do)
			m.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_NSID{Code: dns.EDNS0NSID}}
			ref := l.ask(t, "udp", standbyAddr, m)
			got := l.ask(t, "udp", asideAddr, m)
			if err := sameAnswer(got, ref); err != nil {
				t.Errorf("%s %s %s: %v", pass, q.name, dns.TypeToString[q.qtype], err)
			}
			if got.Question[0].Name != q.name {
				t.Errorf("%s %s: question came back as %q", pass, q.name, got.Question[0].Name)
			}
			if c, ok := l.zones.Case(q.name, q.qtype); ok {
				if err := c.Check(got); err != nil {
					t.Errorf("%s: %v", pass, err)
				}
			}
			if n := nsid(got); n != "dnsstandby" {
				t.Errorf("%s %s: NSID %q, want dnsstandby", pass, q.name, n)
			}
			if n := nsid(ref); n != "localdns-pod" {
				t.Errorf("%s %s: reference NSID %q", pass, q.name, n)
			}
			if got.IsEdns0().Do() != q.do {
				t.Errorf("%s %s: DO %v in answer, %v in query", pass, q.name, got.IsEdns0().Do(), q.do)
			}
		}
	}

	t.Run("large answer: TC over UDP, whole over TCP", func(t *testing.T) {
		m := new(dns.Msg)
		m.SetQuestion(nstest.LargeName, dns.TypeA) // no EDNS: 512 bytes
		// Both fill a truncated reply with the whole records that fit and
		// set TC (clients that ignore TC use what they got); clients that
		// honour it retry over TCP.
		// How many fit depends on name compression, and miekg/dns
		// compresses case-sensitively: an entry first learned through a
		// mixed-case query (earlier in this test) packs its first owner
		// name whole, one record fewer. So: the same records, give or
		// take the last.
		udpRef, udpGot := l.ask(t, "udp", standbyAddr, m), l.ask(t, "udp", asideAddr, m)
		if !udpRef.Truncated || !udpGot.Truncated || len(udpGot.Answer) == 0 {
			t.Errorf("over UDP: CoreDNS TC=%v, dnsstandby TC=%v with %d records", udpRef.Truncated, udpGot.Truncated, len(udpGot.Answer))
		}
		fewer, more := rrKeys(udpGot.Answer), rrKeys(udpRef.Answer)
		if len(fewer) > len(more) {
			fewer, more = more, fewer
		}
		for k := range fewer {
			if _, ok := more[k]; !ok {
				t.Errorf("over UDP: %s is in one reply and not the other (dnsstandby %d records, CoreDNS %d)", k, len(udpGot.Answer), len(udpRef.Answer))
			}
		}
		if d := len(udpGot.Answer) - len(udpRef.Answer); d < -1 || d > 1 {
			t.Errorf("over UDP: dnsstandby sends %d records, CoreDNS %d", len(udpGot.Answer), len(udpRef.Answer))
		}
		got, ref := l.ask(t, "tcp", asideAddr, m), l.ask(t, "tcp", standbyAddr, m)
		if len(got.Answer) != nstest.LargeCount || got.Truncated {
			t.Errorf("over TCP: TC=%v with %d records", got.Truncated, len(got.Answer))
		}
		if err := sameAnswer(got, ref); err != nil {
			t.Errorf("over TCP: %v", err)
		}
	})

	t.Run("dig", func(t *testing.T) {
		for _, c := range l.zones.Cases {
			if c.Large || c.Rcode == dns.RcodeRefused {
				continue
			}
			rcode, answer := nstest.Dig(t, l.node, "@"+asideIP, c.Name, dns.TypeToString[c.Type])
			if err := c.CheckRRs(rcode, answer); err != nil {
				t.Errorf("dig: %v", err)
			}
		}
	})

	t.Run("kdig", func(t *testing.T) {
		svc := l.zones.Services[0]
		out := nstest.Run(t, l.node, "kdig", "@"+asideIP, "+nsid", "+tcp", svc.FQDN, "A")
		if !strings.Contains(out, `"dnsstandby"`) || !strings.Contains(out, svc.IP.String()) || !strings.Contains(out, "NOERROR") {
			t.Errorf("kdig over TCP:\n%s", out)
		}
	})
}

// sameAnswer compares got (dnsstandby) with ref (CoreDNS): rcode, TC, and
// every section's records as sets ignoring TTL, with got's TTLs no larger.
func sameAnswer(got, ref *dns.Msg) error {
	if got.Rcode != ref.Rcode || got.Truncated != ref.Truncated {
		return fmt.Errorf("rcode %s TC %v, CoreDNS %s TC %v", dns.RcodeToString[got.Rcode], got.Truncated, dns.RcodeToString[ref.Rcode], ref.Truncated)
	}
	for _, sec := range []struct {
		name     string
		got, ref []dns.RR
	}{{"answer", got.Answer, ref.Answer}, {"authority", got.Ns, ref.Ns}} {
		g, r := rrKeys(sec.got), rrKeys(sec.ref)
		if !slices.Equal(slices.Sorted(maps.Keys(g)), slices.Sorted(maps.Keys(r))) {
			return fmt.Errorf("%s differs:\n dnsstandby %v\n CoreDNS    %v", sec.name, sec.got, sec.ref)
		}
		for k, ttl := range g {
			if ttl > r[k] {
				return fmt.Errorf("%s: TTL %d larger than CoreDNS's %d for %s", sec.name, ttl, r[k], k)
			}
		}
	}
	return nil
}

// rrKeys maps each record, TTL cleared and owner lower-cased, to its TTL.
func rrKeys(rrs []dns.RR) map[string]uint32 {
	out := make(map[string]uint32, len(rrs))
	for _, rr := range rrs {
		c := dns.Copy(rr)
		ttl := c.Header().Ttl
		c.Header().Ttl = 0
		c.Header().Name = strings.ToLower(c.Header().Name)
		out[c.String()] = ttl
	}
	return out
}

func nsid(m *dns.Msg) string {
	if opt := m.IsEdns0(); opt != nil {
		for _, o := range opt.Option {
			if n, ok := o.(*dns.EDNS0_NSID); ok {
				b := make([]byte, len(n.Nsid)/2)
				fmt.Sscanf(n.Nsid, "%x", &b)
				return string(b)
			}
		}
	}
	return ""
}

// mixCase returns name with every other letter upper-cased (0x20 style).
func mixCase(name string) string {
	b := []byte(name)
	for i := range b {
		if i%2 == 0 && b[i] >= 'a' && b[i] <= 'z' {
			b[i] -= 'a' - 'A'
		}
	}
	return string(b)
}

// TestUpstreamUnreachable: with kube-dns hung (SIGSTOP: it takes queries
// and never answers) and then gone (its link down), cached names are
// answered stale with TTL 30 within the verify budget, and uncached names
// get SERVFAIL within the upstream timeout.
func TestUpstreamUnreachable(t *testing.T) {
	l := newLab(t)
	// Entries expire after 1 s so the test need not wait for real TTLs.
	l.startStandby(t, "--cache-max-ttl", "1s", "--cache-max-neg-ttl", "1s", "--cache-min-ttl", "0s",
		"--stale-budget", "500ms", "--upstream-timeout", "1500ms")
	cached := l.zones.Services[:5]
	// sentinel is cached last, so every name is stale once it is; it is
	// asked for no more than that.
	sentinel := l.zones.Services[5]
	for _, svc := range append(slices.Clip(cached), sentinel) {
		r := l.ask(t, "udp", standbyAddr, svcQuery(svc.FQDN))
		if len(r.Answer) != 1 {
			t.Fatalf("warm-up %s: %v", svc.FQDN, r)
		}
	}
	// Hung before any entry expires, so that no question below refreshes
	// one.
	must(t, l.kubeDNS.Freeze())
	testkit.Eventually(t, 5*time.Second, "the last name cached answered stale (TTL 30)", func() bool {
		r := l.ask(t, "udp", standbyAddr, svcQuery(sentinel.FQDN))
		return len(r.Answer) == 1 && r.Answer[0].Header().Ttl == 30
	})

	check := func(t *testing.T, phase string) {
		for _, svc := range cached {
			start := time.Now()
			r := l.ask(t, "udp", standbyAddr, svcQuery(svc.FQDN))
			took := time.Since(start)
			if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || r.Answer[0].Header().Ttl != 30 {
				t.Errorf("%s: cached %s: %v", phase, svc.FQDN, r)
			}
			if took > 900*time.Millisecond {
				t.Errorf("%s: stale answer for %s took %s, budget 500ms", phase, svc.FQDN, took)
			}
		}
		for i := range 3 {
			name := l.zones.Services[30+i].FQDN
			if phase == "link down" {
				name = l.zones.Services[40+i].FQDN
			}
			start := time.Now()
			r := l.ask(t, "udp", standbyAddr, svcQuery(name))
			took := time.Since(start)
			if r.Rcode != dns.RcodeServerFailure {
				t.Errorf("%s: uncached %s: rcode %s, want SERVFAIL", phase, name, dns.RcodeToString[r.Rcode])
			}
			if took > 1900*time.Millisecond {
				t.Errorf("%s: SERVFAIL for %s took %s, upstream timeout 1.5s", phase, name, took)
			}
		}
	}

	t.Run("kube-dns hung", func(t *testing.T) { check(t, "hung") })
	must(t, l.kubeDNS.Signal(syscall.SIGCONT))
	nstest.Run(t, l.node, "ip", "link", "set", "to-kubedns", "down")
	t.Run("link down", func(t *testing.T) { check(t, "link down") })
}

func svcQuery(name string) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	return m
}

// TestSharesSocketWithCoreDNS: a CoreDNS bound to 169.254.10.11:53 (as
// LocalDNS is, with SO_REUSEPORT) and dnsstandby on the same address form
// one reuseport group, and the kernel gives both a share of the queries.
func TestSharesSocketWithCoreDNS(t *testing.T) {
	l := newLab(t)
	l.startReference(t) // LocalDNS, on .11 itself
	l.startStandby(t, "--steering", "off")
	who := l.askMany(t, 300)
	if who["localdns-pod"] < 50 || who["dnsstandby"] < 50 || who["localdns-pod"]+who["dnsstandby"] != 300 {
		t.Fatalf("answers by NSID %v, want both members of the group answering", who)
	}
	t.Logf("300 queries answered by %v", who)
}

// TestSteeringAdopt: with full steering a healthy LocalDNS (real CoreDNS
// on .11) answers everything; when it is killed dnsstandby answers
// everything, with nothing lost.
func TestSteeringAdopt(t *testing.T) {
	l := newLab(t)
	ref := l.startReference(t)
	s := l.startStandby(t, "--steering", "adopt")
	if got := l.metric(t, s, "dnsstandby_steer_level", "level", "adopt"); got != 1 {
		_, body, _ := l.get(s, "/metrics")
		t.Fatalf("steering level adopt not in force:\n%s", grepLines(body, "dnsstandby_steer"))
	}
	if who := l.askMany(t, 300); who["localdns-pod"] != 300 {
		t.Fatalf("healthy LocalDNS: answers by NSID %v, want all 300 from localdns-pod", who)
	}
	// The probes reach LocalDNS (the program routes their port to it) and
	// their round trip is recorded.
	l.eventuallyMetric(t, s, 3*time.Second, "an answered probe of LocalDNS recorded", func() bool {
		return l.metric(t, s, "dnsstandby_peer_probe_duration_seconds_count") >= 1
	}, "dnsstandby_peer_probe")
	const since = "dnsstandby_mode_entered_timestamp_seconds"
	mirrorSince := l.metric(t, s, since)
	killed := time.Now()
	must(t, ref.Stop())
	if who := l.askMany(t, 300); who["dnsstandby"] != 300 {
		t.Fatalf("LocalDNS killed: answers by NSID %v, want all 300 from dnsstandby", who)
	}
	if got := l.metric(t, s, "dnsstandby_mode", "mode", "takeover"); got != 1 {
		t.Fatalf("mode is not takeover after LocalDNS died")
	}
	// The takeover began after the kill (the namespaces share this clock).
	takeoverSince := l.metric(t, s, since)
	if k := float64(killed.UnixNano()) / 1e9; mirrorSince <= 0 || mirrorSince > k || takeoverSince < k || takeoverSince > float64(time.Now().UnixNano())/1e9 {
		t.Errorf("%s: %f in mirror, %f in takeover; LocalDNS killed at %f", since, mirrorSince, takeoverSince, k)
	}
}

// askMany sends n queries from fresh source ports and counts the answers
// by NSID; every query must be answered.
func (l *lab) askMany(t *testing.T, n int) map[string]int {
	t.Helper()
	who := map[string]int{}
	for i := range n {
		m := new(dns.Msg)
		m.SetQuestion(l.zones.Services[i%20].FQDN, dns.TypeA)
		m.SetEdns0(1232, false)
		m.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_NSID{Code: dns.EDNS0NSID}}
		r := l.ask(t, "udp", standbyAddr, m) // a new source port each time
		if len(r.Answer) != 1 {
			t.Fatalf("query %d: %v", i, r)
		}
		who[nsid(r)]++
	}
	return who
}

// TestBadInput sends 200,000 random and mutated datagrams and holds 1,000
// idle TCP connections open; afterwards dnsstandby is alive, its memory
// bounded, and valid queries over UDP and TCP are still answered.
func TestBadInput(t *testing.T) {
	l := newLab(t)
	s := l.startStandby(t, "--cache-max-bytes", "16MiB")
	valid := make([][]byte, 0, 50)
	for _, svc := range l.zones.Services {
		m := svcQuery(svc.FQDN)
		m.SetEdns0(1232, true)
		b, err := m.Pack()
		must(t, err)
		valid = append(valid, b)
		l.ask(t, "udp", standbyAddr, m) // cached: mutations of these hit the hot path
	}
	rssBefore := rss(t, s.Pid())

	var idle []net.Conn
	t.Cleanup(func() {
		for _, c := range idle {
			c.Close()
		}
	})
	for range 1000 {
		c, err := l.node.Dial("tcp", "", standbyAddr, timeout)
		if err != nil {
			t.Fatalf("idle connection %d: %v", len(idle), err)
		}
		idle = append(idle, c)
	}

	const datagrams = 200_000
	// Sockets are made in the node namespace (Dial), then written from
	// four goroutines.
	var wg sync.WaitGroup
	for w := range 4 {
		conn, err := l.node.Dial("udp", "", standbyAddr, timeout)
		must(t, err)
		defer conn.Close()
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 42))
			buf := make([]byte, 0, 1500)
			for i := range datagrams / 4 {
				buf = garbage(r, buf[:0], valid[r.IntN(len(valid))])
				_, _ = conn.Write(buf)
				if i%200 == 0 {
					time.Sleep(time.Millisecond) // at most ~100k/s in all
				}
			}
		})
	}
	wg.Wait()
	l.eventuallyMetric(t, s, 5*time.Second, "FORMERR/NOTIMP/REFUSED for the garbage", func() bool {
		return l.metric(t, s, "dnsstandby_queries_total", "source", "error") >= 1000
	}, "dnsstandby_queries")

	select {
	case <-s.Done():
		t.Fatalf("dnsstandby died: %v\n%s", s.Err(), s.Output())
	default:
	}
	rssAfter := rss(t, s.Pid())
	t.Logf("RSS %d MiB before, %d MiB after; dropped %v short, %v responses; FORMERR/NOTIMP/REFUSED %v",
		rssBefore>>20, rssAfter>>20, l.metric(t, s, "dnsstandby_queries_dropped_total", "reason", "short"),
		l.metric(t, s, "dnsstandby_queries_dropped_total", "reason", "response"), l.metric(t, s, "dnsstandby_queries_total", "source", "error"))
	if rssAfter > 200<<20 {
		t.Errorf("RSS %d MiB after the bad input, want under 200 MiB", rssAfter>>20)
	}
	for _, network := range []string{"udp", "tcp"} {
		for _, svc := range l.zones.Services[:10] {
			r := l.ask(t, network, standbyAddr, svcQuery(svc.FQDN))
			if len(r.Answer) != 1 {
				t.Errorf("%s %s after bad input: %v", network, svc.FQDN, r)
			}
		}
	}
	if code, body, err := l.get(s, "/healthz"); err != nil || code != 200 {
		t.Errorf("/healthz %d %q %v", code, body, err)
	}
}

// garbage appends one bad datagram: random bytes, or a valid query with a
// few bytes flipped, cut short, or extended.
func garbage(r *rand.Rand, buf, valid []byte) []byte {
	switch r.IntN(4) {
	case 0:
		n := r.IntN(600)
		for range n {
			buf = append(buf, byte(r.Uint32()))
		}
	case 1:
		buf = append(buf, valid[:r.IntN(len(valid))]...)
	case 2:
		buf = append(buf, valid...)
		for range 1 + r.IntN(4) {
			buf[r.IntN(len(buf))] ^= byte(1 + r.IntN(255))
		}
	default:
		buf = append(buf, valid...)
		for range r.IntN(100) {
			buf = append(buf, byte(r.Uint32()))
		}
	}
	return buf
}

// memory reads a field of /proc/PID/status counted in kB — "VmRSS", or
// "VmHWM", the peak RSS — in bytes.
func memory(pid int, field string) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no %s for pid %d", field, pid)
}

// rss is a process's resident set size in bytes.
func rss(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := memory(pid, "VmRSS")
	must(t, err)
	return b
}

// TestSIGTERMFinishesInflight: a query waiting on kube-dns when SIGTERM
// arrives is still answered, and dnsstandby exits cleanly within its
// shutdown bound.
func TestSIGTERMFinishesInflight(t *testing.T) {
	l := newLab(t)
	s := l.startStandby(t, "--shutdown-timeout", "3s")
	must(t, l.kubeDNS.Freeze()) // the query will wait upstream
	answered := make(chan *dns.Msg, 1)
	go func() {
		r, err := l.node.Exchange("udp", "", standbyAddr, svcQuery(l.zones.Services[7].FQDN), 5*time.Second)
		if err != nil {
			t.Errorf("in-flight query: %v", err)
		}
		answered <- r
	}()
	l.eventuallyMetric(t, s, 5*time.Second, "the query waiting upstream", func() bool {
		return l.metric(t, s, "dnsstandby_inflight") >= 1
	}, "dnsstandby_inflight")
	start := time.Now()
	must(t, s.Signal(syscall.SIGTERM))
	testkit.Eventually(t, 2*time.Second, "dnsstandby shutting down", func() bool {
		return strings.Contains(s.Output(), `msg="shutting down"`)
	})
	must(t, l.kubeDNS.Signal(syscall.SIGCONT)) // kube-dns answers now

	select {
	case r := <-answered:
		if r == nil || len(r.Answer) != 1 {
			t.Fatalf("in-flight query answered %v", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("in-flight query not answered")
	}
	select {
	case <-s.Done():
		if err := s.Err(); err != nil {
			t.Fatalf("dnsstandby exit: %v\n%s", err, s.Output())
		}
		if took := time.Since(start); took > 3500*time.Millisecond {
			t.Fatalf("exit took %s, bound 3s", took)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("dnsstandby did not exit after SIGTERM")
	}
	if !strings.Contains(s.Output(), "msg=stopped") {
		t.Errorf("no stop line in its log:\n%s", s.Output())
	}
	// Both groups' steering programs came off cleanly: each socket was
	// still a member when its group was detached.
	if strings.Contains(s.Output(), "takeover stop") {
		t.Errorf("the steering program was not detached cleanly:\n%s", s.Output())
	}
}

// TestMirrorFeed: with full steering LocalDNS answers everything, and
// the packet tap copies its answers into dnsstandby's cache; with LocalDNS
// and kube-dns both gone, dnsstandby answers those names from the cache.
func TestMirrorFeed(t *testing.T) {
	l := newLab(t)
	ref := l.startReference(t)
	s := l.startStandby(t, "--steering", "adopt", "--mirror", "tap")
	l.eventuallyMetric(t, s, 5*time.Second, "tap enabled", func() bool {
		return l.metric(t, s, "dnsstandby_mirror_tap_enabled") == 1
	}, "dnsstandby_mode", "dnsstandby_steer", "mirror", "peer_sockets")
	// Half the names are asked with EDNS and NSID but no DO: CoreDNS 1.13.1
	// sets DO in those replies anyway, which must not hide them from the
	// same DO=0 queries later.
	names := l.zones.Services[:40]
	ednsQuery := func(i int, name string) *dns.Msg {
		m := svcQuery(name)
		if i%2 == 1 {
			m.SetEdns0(1232, false)
			m.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_NSID{Code: dns.EDNS0NSID}}
		}
		return m
	}
	for i, svc := range names {
		if r := l.ask(t, "udp", standbyAddr, ednsQuery(i, svc.FQDN)); len(r.Answer) != 1 {
			t.Fatalf("%s: %v", svc.FQDN, r)
		}
	}
	l.eventuallyMetric(t, s, 5*time.Second, fmt.Sprintf("the cache holding the %d names LocalDNS answered", len(names)), func() bool {
		return l.metric(t, s, "dnsstandby_cache_entries") >= float64(len(names))
	}, "mirror", "dnsstandby_cache_entries")
	if got := l.metric(t, s, "dnsstandby_queries_total", "source", "upstream"); got != 0 {
		t.Fatalf("dnsstandby answered %v queries itself: steering is not full", got)
	}
	// Double fault: kube-dns unreachable, LocalDNS gone.
	nstest.Run(t, l.node, "ip", "link", "set", "to-kubedns", "down")
	must(t, ref.Stop())
	for i, svc := range names {
		r := l.ask(t, "udp", standbyAddr, ednsQuery(i, svc.FQDN))
		if len(r.Answer) != 1 || r.Rcode != dns.RcodeSuccess {
			t.Errorf("%s from the mirrored cache: %v", svc.FQDN, r)
		}
	}
}
