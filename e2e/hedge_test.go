package e2e

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/status"
	"github.com/dnsstandby/dnsstandby/takeover"
)

// hedgeTimeout is the client's wait for a first answer in these tests: a
// query that needs longer counts as lost on its first try.
const hedgeTimeout = time.Second

// timedLoad sends queries for names to server from the node namespace,
// conc at a time, each from its own socket with a new ID, until d has
// passed, and returns each query's wait for its first answer, -1 for a
// query not answered within hedgeTimeout.
func (l *lab) timedLoad(server string, names []string, conc int, d time.Duration) []time.Duration {
	var (
		mu  sync.Mutex
		out []time.Duration
		wg  sync.WaitGroup
	)
	end := time.Now().Add(d)
	for w := range conc {
		wg.Go(func() {
			for i := w; time.Now().Before(end); i += conc {
				m := svcQuery(names[i%len(names)])
				start := time.Now()
				_, err := l.node.Exchange("udp", "", server, m, hedgeTimeout)
				took := time.Since(start)
				if err != nil {
					took = -1
				}
				mu.Lock()
				out = append(out, took)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return out
}

// summary is how many of lat were lost and the slowest answered one.
func summary(lat []time.Duration) (lost int, slowest time.Duration) {
	for _, d := range lat {
		if d < 0 {
			lost++
		}
		slowest = max(slowest, d)
	}
	return lost, slowest
}

// events reads dnsstandby's mode history.
func (l *lab) events(t *testing.T, s *standby) []takeover.Event {
	t.Helper()
	code, body, err := l.get(s, "/debug/events")
	if err != nil || code != 200 {
		t.Fatalf("/debug/events: %d %v", code, err)
	}
	var evs []takeover.Event
	if err := json.Unmarshal([]byte(body), &evs); err != nil {
		t.Fatalf("/debug/events: %v\n%s", err, body)
	}
	return evs
}

// TestHedgeHang: LocalDNS (real CoreDNS, bound) stops answering. Queries
// already sent to it are answered by dnsstandby's hedges from the
// mirrored cache, and the wire's silence holds LocalDNS's traffic within
// a fraction of a second: no query waits anywhere near a resolver's
// retry, none is lost. Without hedging the queries queued on LocalDNS's
// socket wait for their client's retry, and the hold comes only after
// three failed probes.
func TestHedgeHang(t *testing.T) {
	l := newLab(t)
	ref := l.startReference(t)
	admin := filepath.Join(t.TempDir(), "admin.sock")
	s := l.startStandby(t, "--steering", "adopt", "--mirror", "tap", "--admin-socket", admin)
	l.eventuallyMetric(t, s, 5*time.Second, "tap enabled", func() bool {
		return l.metric(t, s, "dnsstandby_mirror_tap_enabled") == 1
	}, "dnsstandby_mode", "dnsstandby_steer", "peer_sockets")

	var names []string
	for _, svc := range l.zones.Services[:20] {
		names = append(names, svc.FQDN)
	}
	before := l.mirrored(t, s)
	for _, name := range names {
		l.ask(t, "udp", standbyAddr, svcQuery(name))
	}
	l.eventuallyMetric(t, s, 5*time.Second, "the warm-up's replies mirrored", func() bool {
		return l.mirrored(t, s) >= before+float64(len(names))
	}, "dnsstandby_mirror")
	// Healthy: LocalDNS answers; dnsstandby hedges nothing.
	if lost, slowest := summary(l.timedLoad(standbyAddr, names, 4, time.Second)); lost > 0 {
		t.Fatalf("healthy: %d queries lost (slowest answer %s)", lost, slowest)
	}
	if n := l.metric(t, s, "dnsstandby_hedge_sent_total"); n != 0 {
		t.Errorf("healthy: %v hedges, want none", n)
	}

	must(t, ref.Signal(syscall.SIGSTOP))
	stopped := time.Now()
	t.Cleanup(func() { _ = ref.Signal(syscall.SIGCONT) })
	lat := l.timedLoad(standbyAddr, names, 8, 2*time.Second)
	lost, slowest := summary(lat)
	t.Logf("hung: %d queries, %d lost, slowest answer %s", len(lat), lost, slowest)
	if lost > 0 || slowest > 300*time.Millisecond {
		t.Errorf("hung: %d of %d queries lost, slowest answer %s; want none lost, none over 300ms", lost, len(lat), slowest)
	}
	if n := l.metric(t, s, "dnsstandby_hedge_sent_total"); n < 1 {
		t.Errorf("hung: %v hedges, want the queries queued on LocalDNS's socket hedged", n)
	}
	evs := l.events(t, s)
	i := slices.IndexFunc(evs, func(e takeover.Event) bool { return e.Reason == string(takeover.ReasonPeerSilent) })
	if i < 0 {
		t.Fatalf("no hold for a silent LocalDNS: events %+v", evs)
	}
	if took := evs[i].Start.Sub(stopped); evs[i].Mode != "hold" || took > 500*time.Millisecond {
		t.Errorf("held %s after the hang (event %+v), want hold within 500ms", took, evs[i])
	}

	var st status.Daemon
	if err := json.Unmarshal([]byte(nstest.Run(t, l.node, binary, "status", "--json", "--admin-socket", admin)), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Hedging) != 1 || st.Hedging[0].Listener != standbyAddr || st.Hedging[0].Hedges["cache"] < 1 || st.Hedging[0].Silent < 1 || st.Hedging[0].Tracking {
		t.Errorf("status hedging %+v: want one listener's, hedges from the cache, a fast hold, not tracking while held", st.Hedging)
	}
	if human := nstest.Run(t, l.node, binary, "status", "--admin-socket", admin); !strings.Contains(human, "hedging:   "+standbyAddr+" tracking=false") {
		t.Errorf("dnsstandby status:\n%s", human)
	}

	must(t, ref.Signal(syscall.SIGCONT))
	l.eventuallyMetric(t, s, 15*time.Second, "mirror again once LocalDNS answers", func() bool {
		return l.metric(t, s, "dnsstandby_mode", "mode", "mirror") == 1
	}, "dnsstandby_mode")
	if lost, slowest := summary(l.timedLoad(standbyAddr, names, 4, time.Second)); lost > 0 {
		t.Errorf("after the hang: %d queries lost (slowest answer %s)", lost, slowest)
	}
}

// TestHedgeErratic: LocalDNS is CoreDNS's own fault plugin, erratic,
// dropping one query in four. Its answers have TTL 0, which the mirror
// does not keep: a dropped query for a name dnsstandby has not resolved
// itself is a miss, hedged from the upstreams after the upstream deadline
// (150 ms at the least), and once resolved the name is hedged from the
// cache (held 5 s, the least TTL). None is lost, none waits for the
// client's retry, and a LocalDNS that answers three queries in four is
// never held.
func TestHedgeErratic(t *testing.T) {
	const zone = "lossy.test."
	// kube-dns answers every query (erratic drops one in two unless told).
	l := newLabWith(t, zone+":53 {\n    bind "+clusterIP+"\n    erratic {\n        drop 0\n    }\n}\n", nil)
	nstest.StartCoreDNS(t, l.node, nstest.CoreDNSConfig{
		Corefile: ".:53 {\n    bind 169.254.10.10 " + standbyIP + "\n    erratic {\n        drop 4\n    }\n}\n",
		Probe:    standbyAddr, // the readiness probe retries the query erratic drops
	})
	s := l.startStandby(t, "--steering", "adopt", "--mirror", "tap")
	l.eventuallyMetric(t, s, 5*time.Second, "hedger tracking", func() bool {
		return l.metric(t, s, "dnsstandby_hedge_tracking") == 1
	}, "dnsstandby_mode", "dnsstandby_steer", "dnsstandby_hedge")

	var names []string
	for i := range 50 {
		names = append(names, fmt.Sprintf("n%d.%s", i, zone))
	}
	lat := l.timedLoad(standbyAddr, names, 8, 3*time.Second)
	lost, slowest := summary(lat)
	hedged := l.metric(t, s, "dnsstandby_hedge_sent_total")
	t.Logf("%d queries, %d lost, slowest answer %s, %v hedged", len(lat), lost, slowest, hedged)
	if lost > 0 || slowest > 700*time.Millisecond {
		t.Errorf("%d of %d queries lost, slowest answer %s; want none lost, none over 700ms", lost, len(lat), slowest)
	}
	if share := hedged / float64(len(lat)); share < 0.15 || share > 0.35 {
		t.Errorf("%v of %d queries hedged (%.0f%%), want about a quarter", hedged, len(lat), 100*share)
	}
	if n := l.metric(t, s, "dnsstandby_hedge_sent_total", "source", "upstream"); n < 1 {
		t.Errorf("%v hedges from the upstreams, want the first query of each name", n)
	}
	if l.metric(t, s, "dnsstandby_mode", "mode", "mirror") != 1 || l.metric(t, s, "dnsstandby_localdns_silent_total") != 0 {
		_, body, _ := l.get(s, "/metrics")
		t.Errorf("a LocalDNS answering three queries in four was held:\n%s", grepLines(body, "dnsstandby_mode", "silent"))
	}
}
