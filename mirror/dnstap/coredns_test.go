package dnstap

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/cache"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
	"github.com/dnsstandby/dnsstandby/wire"
)

// CoreDNS 1.13.1's dnstap writer (plugin/dnstap/io.go), which these tests
// measure: replies queue (10,000) into one goroutine that writes them
// through golang-framestream's 4 KiB buffered writer and flushes after 1 s
// without a reply. A failed write redials; a failed dial keeps the broken
// encoder (so the next reply redials again), but a dial whose handshake
// fails leaves no encoder, and then replies are dropped without redialing
// until a second passes with no reply at all.
const (
	// coreDNSFlush is CoreDNS's flushTimeout: replies reach us at the
	// latest this long after the last one, or when 4 KiB are buffered.
	coreDNSFlush = time.Second
	// lull is a pause in traffic long enough for CoreDNS's flush timer.
	lull = coreDNSFlush + 500*time.Millisecond
	// steadyInterval spaces the queries of a steady stream (500 qps): busy
	// enough that CoreDNS's timer never fires while it runs.
	steadyInterval = 2 * time.Millisecond
)

// TestCoreDNS runs a real CoreDNS 1.13.1 as LocalDNS (the AgentBaker-shaped
// Corefile, testkit.Corefile, in a namespace holding LocalDNS's addresses)
// with `dnstap unix://SOCK full` in its pods' block, mirrors its replies
// into a real cache, and measures what happens when the receiver restarts
// under CoreDNS's feet. The numbers are logged (go test -v) and the README
// quotes them.
//
// The waits here that are not testkit.Eventually are the measurement: how
// long CoreDNS, a separate process with its own 1 s flush timer, takes to
// do something, or whether it does it within a window at all; they poll
// with testkit.PollEvery, at a steady millisecond or five, so that the
// times stay as fine as they are reported. They run against the wall clock
// on purpose (testing/synctest cannot hold a real process or socket).
func TestCoreDNS(t *testing.T) {
	nstest.RequireRoot(t)
	bin := nstest.CoreDNSBinary(t)
	z := nstest.KubeDNSZones(nstest.ZoneOptions{Services: 200})
	var names []string // the cacheable questions: every service's A and SRV
	for _, s := range z.Services {
		names = append(names, s.FQDN, s.SRV)
	}

	cfg := testConfig(t)
	c := newCache(t)
	r := listen(t, cfg, c.Insert)
	ld := startLocalDNS(t, bin, z, cfg.Path)

	t.Run("every reply mirrored", func(t *testing.T) {
		testkit.Eventually(t, testTimeout, "CoreDNS to connect", func() bool { return r.Stats().Connections == 1 })
		// The readiness probes' replies, and the loop plugin's, come first.
		base := ld.sync(t, r, c)
		baseLen := c.Len()

		const rounds, workers = 5, 8
		var answered atomic.Uint64
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := w; i < rounds*len(names); i += workers {
					if ld.exchange(names[i%len(names)]) != nil {
						answered.Add(1)
					}
				}
			})
		}
		wg.Wait()
		n := answered.Load()
		if n != rounds*uint64(len(names)) {
			t.Logf("%d of %d queries answered", n, rounds*len(names))
		}
		// Anything more than n would be in by the sentinel's reply, which
		// sync waits for and which is counted here too.
		st := ld.sync(t, r, c)
		const sentinel = 1
		queries := st.Rejected[ReasonNotClientResponse] - base.Rejected[ReasonNotClientResponse]
		t.Logf("%d queries answered by CoreDNS, %d replies mirrored: %d accepted; rejected %v (CoreDNS taps each query too)",
			n, received(st)-received(base)-sentinel, st.Accepted-base.Accepted-sentinel, nonzero(st.Rejected))
		if st.Accepted-base.Accepted != n+sentinel || received(st)-received(base) != st.Accepted-base.Accepted {
			t.Errorf("accepted %d, %d other replies, of %d", st.Accepted-base.Accepted-sentinel, received(st)-received(base)-(st.Accepted-base.Accepted), n)
		}
		if queries != n+sentinel {
			t.Errorf("%d CLIENT_QUERY records for %d queries", queries-sentinel, n)
		}
		if want := baseLen + len(names) + sentinel; c.Len() != want {
			t.Errorf("cache holds %d entries, want %d", c.Len(), want)
		}
		// The cache answers as CoreDNS did.
		for _, name := range []string{names[0], names[1], names[len(names)-1]} {
			var got *dns.Msg
			want := ld.exchange(name)
			got = serveFromCache(t, c, want.Question[0])
			if got == nil || got.Rcode != want.Rcode || !sameRRs(got.Answer, want.Answer) {
				t.Errorf("%s: cache answers %v, CoreDNS %v", name, got, want)
			}
		}
	})
	if t.Failed() {
		return
	}
	if testing.Short() {
		t.Skip("-short: not measuring CoreDNS's reconnects")
	}

	// Each restart swaps the receiver; the cache stays.
	restart := func(t *testing.T, down time.Duration) (old Stats) {
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		old = r.Stats()
		time.Sleep(down)
		var err error
		if r, err = Listen(context.Background(), cfg, c.Insert); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return old
	}

	steadyRestart := func(t *testing.T, down time.Duration) (reconnect, string) {
		tr := startTraffic(ld, names)
		time.Sleep(200 * time.Millisecond) // the scenario: traffic flowing before the restart
		before, answered0 := r.Stats(), tr.answered.Load()
		old := restart(t, down)
		m := measureReconnect(r, tr, 2*time.Second)
		answered := tr.answered.Load() - answered0
		got := received(old) - received(before) + received(r.Stats())
		return m, m.report(answered, got)
	}
	t.Run("restart under steady traffic", func(t *testing.T) {
		m, report := steadyRestart(t, 0)
		t.Logf("receiver restarted at once under %s of steady traffic: %s", rate(steadyInterval), report)
		if !m.connected {
			t.Errorf("CoreDNS did not reconnect")
		}
	})
	t.Run("restart after a second down under steady traffic", func(t *testing.T) {
		m, report := steadyRestart(t, time.Second)
		t.Logf("receiver down 1 s (socket file gone) under %s of steady traffic: %s", rate(steadyInterval), report)
		if !m.connected {
			t.Errorf("CoreDNS did not reconnect")
		}
	})

	t.Run("restart under sparse traffic", func(t *testing.T) {
		const queries, spacing = 4, coreDNSFlush + 300*time.Millisecond
		time.Sleep(lull) // CoreDNS's buffer is empty
		restart(t, 0)
		start := time.Now()
		sent := 0
		for sent < queries && received(r.Stats()) == 0 {
			ld.exchange(names[sent])
			sent++
			_ = testkit.PollEvery(context.Background(), spacing, 5*time.Millisecond, func() (bool, error) {
				return received(r.Stats()) > 0, nil
			}) // not received within the spacing: the next query
		}
		st := r.Stats()
		if received(st) == 0 {
			t.Errorf("receiver restarted, then one query every %v: CoreDNS had not reconnected after %d queries (%v, %d connections)",
				spacing, queries, time.Since(start).Round(time.Millisecond), st.ConnectionsTotal)
			return
		}
		t.Logf("receiver restarted, then one query every %v: the first reply mirrored again came %v after the restart, after query %d; %d of %d replies lost",
			spacing, time.Since(start).Round(time.Millisecond), sent, sent-int(received(st)), sent)
	})

	t.Run("CoreDNS started before the receiver", func(t *testing.T) {
		cfg2 := testConfig(t)
		ld2 := startLocalDNS(t, bin, z, cfg2.Path) // nobody listens: its dial at start-up fails
		tr := startTraffic(ld2, names)
		time.Sleep(200 * time.Millisecond) // the scenario: traffic flowing before the receiver starts
		r2 := listen(t, cfg2, newCache(t).Insert)
		listenAt := time.Now()
		const window = 3 * time.Second
		underTraffic := testkit.PollEvery(context.Background(), window, 5*time.Millisecond, func() (bool, error) {
			return r2.Stats().ConnectionsTotal > 0, nil
		}) == nil
		tr.stop()
		lullAt := time.Now()
		if underTraffic {
			t.Logf("CoreDNS started first, then the receiver, under steady traffic: connected after %v", time.Since(listenAt).Round(time.Millisecond))
			return
		}
		testkit.Eventually(t, testTimeout, "CoreDNS to connect after the traffic stopped", func() bool { return r2.Stats().ConnectionsTotal > 0 })
		t.Logf("CoreDNS started first, then the receiver: NOT connected during %v of steady traffic (%d replies lost); connected %v after the traffic paused",
			window, tr.answered.Load(), time.Since(lullAt).Round(time.Millisecond))
		for _, name := range names[:10] {
			ld2.exchange(name)
		}
		testkit.Eventually(t, testTimeout, "replies after the connect", func() bool { return r2.Stats().Accepted == 10 })
	})
}

// localDNS is a CoreDNS run as LocalDNS in a namespace of its own: the
// AgentBaker-shaped Corefile with, in its pods' block, the dnstap line and
// cluster.local served from a zone file where AKS forwards to kube-dns.
type localDNS struct {
	ns    *nstest.Namespace
	addr  string // the pods' listener, "169.254.10.11:53"
	syncs int    // sentinel queries sent by sync
}

// startLocalDNS starts LocalDNS tapping to sock and returns once it
// answers; it is stopped, and its namespace removed, when the test ends.
func startLocalDNS(t *testing.T, bin string, z *nstest.Zones, sock string) *localDNS {
	t.Helper()
	ns := nstest.New(t, "localdns")
	if err := ns.AddLink("localdns", "", testkit.NodeListener+"/32", testkit.PodListener+"/32"); err != nil {
		t.Fatal(err)
	}
	l := &localDNS{ns: ns, addr: testkit.PodListener + ":53"}
	cf := testkit.Corefile{Extra: "dnstap unix://" + sock + " full\nfile db.cluster.local cluster.local"}
	nstest.StartCoreDNS(t, ns, nstest.CoreDNSConfig{
		Binary:   bin,
		Corefile: cf.String(),
		Files:    map[string]string{"db.cluster.local": z.Files["db.cluster.local"]},
		Probe:    l.addr,
	})
	return l
}

// exchange asks LocalDNS for name (SRV for _-names, else A) over UDP and
// returns the reply, or nil.
func (l *localDNS) exchange(name string) *dns.Msg {
	qtype := dns.TypeA
	if name[0] == '_' {
		qtype = dns.TypeSRV
	}
	q := new(dns.Msg)
	q.SetQuestion(name, qtype)
	r, err := l.ns.Exchange("udp", "", l.addr, q, 500*time.Millisecond)
	if err != nil {
		return nil
	}
	return r
}

// sync asks LocalDNS for a name never asked before (NXDOMAIN, cacheable)
// and waits until its reply is in c, then returns r's counters. CoreDNS
// writes its records in order on one connection, so every reply it sent
// before has been counted by then: the deterministic way to say "nothing
// more is coming" without waiting for it not to.
func (l *localDNS) sync(t *testing.T, r *Receiver, c *cache.Cache) Stats {
	t.Helper()
	l.syncs++
	name := fmt.Sprintf("sync-%d.cluster.local.", l.syncs)
	if m := l.exchange(name); m == nil || m.Rcode != dns.RcodeNameError {
		t.Fatalf("sentinel %s: %v, want NXDOMAIN", name, m)
	}
	q := dns.Question{Name: name, Qtype: dns.TypeA, Qclass: dns.ClassINET}
	testkit.Eventually(t, testTimeout, "the sentinel's reply in the cache", func() bool { return serveFromCache(t, c, q) != nil })
	return r.Stats()
}

// serveFromCache asks the cache for q as a client would.
func serveFromCache(t *testing.T, c *cache.Cache, q dns.Question) *dns.Msg {
	m := new(dns.Msg)
	m.Question = []dns.Question{q}
	m.RecursionDesired = true
	wq, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	var pq wire.Query
	if err := wire.ParseQuery(wq, &pq); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 65535)
	n, _ := c.Serve(buf, &pq, pq.PayloadLimit(), false)
	if n == 0 {
		return nil
	}
	r := new(dns.Msg)
	if err := r.Unpack(buf[:n]); err != nil {
		t.Fatal(err)
	}
	return r
}

// sameRRs compares record sets ignoring TTLs.
func sameRRs(a, b []dns.RR) bool {
	key := func(rrs []dns.RR) []string {
		var s []string
		for _, rr := range rrs {
			rr = dns.Copy(rr)
			rr.Header().Ttl = 0
			s = append(s, rr.String())
		}
		slices.Sort(s)
		return s
	}
	return slices.Equal(key(a), key(b))
}

// received counts the replies (CLIENT_RESPONSE records) a receiver got,
// whatever became of them. CoreDNS also taps every query (CLIENT_QUERY),
// which the receiver counts as not_client_response.
func received(st Stats) uint64 {
	return st.Accepted + st.RejectedTotal() - st.Rejected[ReasonNotClientResponse]
}

func nonzero(m map[string]uint64) map[string]uint64 {
	out := map[string]uint64{}
	for k, v := range m {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

func rate(interval time.Duration) string {
	return fmt.Sprintf("%.0f qps", float64(time.Second)/float64(interval))
}

// traffic is a steady stream of queries on one goroutine.
type traffic struct {
	answered atomic.Uint64
	cancel   context.CancelFunc
	done     chan struct{}
}

func startTraffic(l *localDNS, names []string) *traffic {
	ctx, cancel := context.WithCancel(context.Background())
	tr := &traffic{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(tr.done)
		tick := time.NewTicker(steadyInterval)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if l.exchange(names[i%len(names)]) != nil {
				tr.answered.Add(1)
			}
		}
	}()
	return tr
}

func (tr *traffic) stop() {
	tr.cancel()
	<-tr.done
}

// reconnect is what measureReconnect saw.
type reconnect struct {
	connected      bool
	connectAfter   time.Duration // from Listen to CoreDNS's connection
	firstAfter     time.Duration // from Listen to the first record
	sentToConnect  uint64        // replies CoreDNS answered between Listen and its connection
	underTraffic   bool          // connected while the traffic still ran
	afterLullStart time.Duration // when not under traffic: from the traffic's end to the connection
}

// measureReconnect watches a freshly started receiver while tr runs, for
// up to window, then stops tr, waits for CoreDNS's flush, and reports.
func measureReconnect(r *Receiver, tr *traffic, window time.Duration) reconnect {
	var m reconnect
	start, sent0 := time.Now(), tr.answered.Load()
	_ = testkit.PollEvery(context.Background(), window, time.Millisecond, func() (bool, error) {
		st := r.Stats()
		if !m.connected && st.ConnectionsTotal > 0 {
			m.connected, m.underTraffic = true, true
			m.connectAfter, m.sentToConnect = time.Since(start), tr.answered.Load()-sent0
		}
		if received(st) > 0 {
			m.firstAfter = time.Since(start)
			return true, nil
		}
		return false, nil
	}) // nothing within the window: what m says
	time.Sleep(100 * time.Millisecond) // some traffic on the new connection
	tr.stop()
	lullAt := time.Now()
	if !m.connected {
		connected := testkit.PollEvery(context.Background(), 2*lull, time.Millisecond, func() (bool, error) {
			return r.Stats().ConnectionsTotal > 0, nil
		}) == nil
		if connected {
			m.connected, m.afterLullStart = true, time.Since(lullAt)
		}
	}
	time.Sleep(lull) // CoreDNS flushes what it holds
	return m
}

// report sums up a restart: how long CoreDNS took, and how many of the
// replies it answered meanwhile no receiver got.
func (m reconnect) report(answered, got uint64) string {
	lost := int64(answered) - int64(got)
	switch {
	case !m.connected:
		return fmt.Sprintf("never reconnected; %d replies answered, %d mirrored", answered, got)
	case !m.underTraffic:
		return fmt.Sprintf("no connection while the traffic ran, connected %v after it paused; %d of %d replies lost",
			m.afterLullStart.Round(time.Millisecond), lost, answered)
	}
	return fmt.Sprintf("connected %v after Listen (%d replies answered meanwhile), first record %v after Listen; %d of %d replies lost around the restart",
		m.connectAfter.Round(time.Millisecond), m.sentToConnect, m.firstAfter.Round(time.Millisecond), lost, answered)
}
