package hedge

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"
)

// simQuery is one client query in a simulated run.
type simQuery struct {
	at     int64 // arrival
	client netip.AddrPort
	msg    []byte
	reply  int64 // LocalDNS's reply time, 0 for none
	first  int64 // when the client got its first answer, 0 for never
	miss   bool
	hedged bool
}

type simEvent struct {
	at    int64
	reply bool
	i     int
}

// simulate runs qps queries a second for dur through a Hedger, with
// LocalDNS answering as localdns says (its reply latency, or false for no
// reply), the tap delivering everything in 5 ms batches, hedges echoed
// back through the tap, and upstreams answering in 20 ms.
func simulate(t *testing.T, qps int, dur time.Duration, missShare float64,
	localdns func(r *rand.Rand, at int64, miss bool) (time.Duration, bool)) ([]simQuery, *harness, []int64) {
	t.Helper()
	return simulateWith(t, DefaultConfig(), 20*time.Millisecond, qps, dur, missShare, localdns)
}

// simulateWith is simulate with the Hedger's cfg and the upstreams'
// answer time up given.
func simulateWith(t *testing.T, cfg Config, up time.Duration, qps int, dur time.Duration, missShare float64,
	localdns func(r *rand.Rand, at int64, miss bool) (time.Duration, bool)) ([]simQuery, *harness, []int64) {
	t.Helper()
	r := rand.New(rand.NewPCG(1, 2))
	ans := newFakeAnswerer()
	var silentAt []int64
	x := newHarness(t, cfg, ans)
	x.onSilent = func(int, time.Time) { silentAt = append(silentAt, x.now) }
	n := int(dur.Seconds() * float64(qps))
	qs := make([]simQuery, n)
	evs := make([]simEvent, 0, 2*n)
	byClient := map[netip.AddrPort]int{}
	for i := range qs {
		q := &qs[i]
		q.at = t0 + int64(i)*int64(time.Second)/int64(qps)
		q.client = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(i >> 16), 1}), uint16(1024+i%60000))
		q.miss = r.Float64() < missShare
		name := fmt.Sprintf("hit%d.example.", i%500)
		if q.miss {
			name = fmt.Sprintf("miss%d.example.", i)
		} else {
			ans.names[name] = true
		}
		q.msg = query(uint16(i), name)
		byClient[q.client] = i
		evs = append(evs, simEvent{q.at, false, i})
		if lat, ok := localdns(r, q.at, q.miss); ok {
			q.reply = q.at + int64(lat)
			evs = append(evs, simEvent{q.reply, true, i})
		}
	}
	slices.SortStableFunc(evs, func(a, b simEvent) int { return int(a.at - b.at) })

	type pending struct {
		at   int64
		send func([]byte)
		msg  []byte
	}
	var upstream []pending
	end := t0 + int64(dur) + int64(3*time.Second)
	next := 0
	for x.now < end {
		x.now += 5 * ms
		// The tap: everything up to now, a batch up to 5 ms late.
		for ; next < len(evs) && evs[next].at <= x.now; next++ {
			e := evs[next]
			q := &qs[e.i]
			if !e.reply {
				x.h.Query(q.at, q.client, q.msg)
				continue
			}
			if q.first == 0 || q.reply < q.first {
				q.first = q.reply
			}
			if x.h.Reply(q.reply, q.client, answer(q.msg, "10.0.0.1")) {
				t.Fatal("LocalDNS's reply taken as own")
			}
		}
		// Our hedges went out at the last tick: the tap sees them now.
		for _, s := range ans.sent {
			i := byClient[s.client]
			if binary.BigEndian.Uint16(s.msg) != uint16(i) {
				t.Fatal("hedge for the wrong query")
			}
			if !x.h.Reply(x.now-ms, s.client, s.msg) {
				t.Fatal("own hedge not recognised")
			}
		}
		ans.sent = ans.sent[:0]
		for len(upstream) > 0 && upstream[0].at <= x.now {
			upstream[0].send(upstream[0].msg)
			upstream = upstream[1:]
		}
		for _, rc := range ans.resolves {
			upstream = append(upstream, pending{x.now + int64(up), rc.send, answer(rc.query, "10.0.0.2")})
		}
		ans.resolves = ans.resolves[:0]

		before := len(ans.sent)
		x.h.tick(x.now, x.onSilent)
		for _, s := range ans.sent[before:] {
			q := &qs[byClient[s.client]]
			q.hedged = true
			if q.first == 0 || x.now < q.first {
				q.first = x.now
			}
		}
		// Upstream hedges are sent from the send callback above, at now.
		for _, s := range ans.sent[:before] {
			q := &qs[byClient[s.client]]
			q.hedged = true
			if q.first == 0 || x.now < q.first {
				q.first = x.now
			}
		}
	}
	x.check()
	return qs, x, silentAt
}

func latencies(qs []simQuery) (p99, max time.Duration, unanswered int) {
	var l []int64
	for _, q := range qs {
		if q.first == 0 {
			unanswered++
			continue
		}
		l = append(l, q.first-q.at)
	}
	slices.Sort(l)
	return time.Duration(l[len(l)*99/100]), time.Duration(l[len(l)-1]), unanswered
}

// healthyLatency is LocalDNS on a busy node: hits in about a millisecond
// with a tail to 10 ms, misses forwarded in 10 to 60 ms.
func healthyLatency(r *rand.Rand, miss bool) time.Duration {
	if miss {
		return time.Duration(10+r.IntN(50)) * time.Millisecond
	}
	if r.IntN(100) == 0 {
		return time.Duration(5000+r.IntN(5000)) * time.Microsecond
	}
	return time.Duration(300+r.IntN(1700)) * time.Microsecond
}

// The acceptance numbers, on a simulated 1000 queries/s with 5% misses.
func TestScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("simulation")
	}
	t.Run("healthy: at most 0.1% hedged", func(t *testing.T) {
		qs, x, silent := simulate(t, 1000, 20*time.Second, 0.05, func(r *rand.Rand, _ int64, miss bool) (time.Duration, bool) {
			return healthyLatency(r, miss), true
		})
		hedged := 0
		for _, q := range qs {
			if q.hedged {
				hedged++
			}
		}
		c, u := x.h.Deadlines()
		t.Logf("hedged %d of %d; deadlines %v %v", hedged, len(qs), c, u)
		if hedged*1000 > len(qs) || len(silent) != 0 {
			t.Fatalf("hedged %d of %d, fast holds %d", hedged, len(qs), len(silent))
		}
	})
	t.Run("10% dropped: p99 at most 200 ms", func(t *testing.T) {
		qs, x, silent := simulate(t, 1000, 20*time.Second, 0.05, func(r *rand.Rand, _ int64, miss bool) (time.Duration, bool) {
			return healthyLatency(r, miss), r.IntN(10) != 0
		})
		p99, max, un := latencies(qs)
		t.Logf("p99 %v max %v unanswered %d; stats %+v", p99, max, un, x.h.Stats())
		if p99 > 200*time.Millisecond || un != 0 || len(silent) != 0 {
			t.Fatalf("p99 %v, unanswered %d, fast holds %d", p99, un, len(silent))
		}
	})
	t.Run("SIGSTOP: no gap over 250 ms, fast hold within 250 ms", func(t *testing.T) {
		stop := t0 + int64(10*time.Second)
		qs, _, silent := simulate(t, 1000, 20*time.Second, 0.05, func(r *rand.Rand, at int64, miss bool) (time.Duration, bool) {
			lat := healthyLatency(r, miss)
			return lat, at+int64(lat) < stop
		})
		// The longest a hit waits (misses wait for the upstream deadline).
		var worst int64
		for _, q := range qs {
			if !q.miss && (q.first == 0 || q.first-q.at > worst) {
				if q.first == 0 {
					t.Fatalf("hit at %v never answered", time.Duration(q.at-t0))
				}
				worst = q.first - q.at
			}
		}
		if len(silent) == 0 {
			t.Fatal("no fast hold")
		}
		t.Logf("worst hit %v; fast hold at %v after the stop", time.Duration(worst), time.Duration(silent[0]-stop))
		if worst > int64(250*time.Millisecond) || len(silent) != 1 || silent[0]-stop > int64(250*time.Millisecond) {
			t.Fatalf("worst %v, fast holds %v", time.Duration(worst), silent)
		}
	})
}

// TestSilentUpstream is issue 25's case on the simulated node: from 10 s
// on, the first upstream server silently drops, so LocalDNS answers
// every miss after its forward's 2 s read timeout, from the second
// server; hits stay fast. dnsstandby's own exchange reaches the second
// server at its speculative deadline (upstream package: 50 ms at the
// least) instead of 2 s later, so its upstream answers come in 20 ms +
// 50 ms. The misses must be answered with a p99 of at most 300 ms and none
// slower than 600 ms, which the upstream deadline's bounds decide: the
// old 300–500 ms could not. A healthy node with a slow internet (2% of
// misses take 200 to 400 ms) pays for the shorter wait in upstream
// hedges of misses: logged, and held under 2% of the misses.
func TestSilentUpstream(t *testing.T) {
	if testing.Short() {
		t.Skip("simulation")
	}
	fault := t0 + int64(10*time.Second)
	held := func(r *rand.Rand, at int64, miss bool) (time.Duration, bool) {
		if miss && at >= fault {
			return 2*time.Second + time.Duration(r.IntN(5))*time.Millisecond, true
		}
		return healthyLatency(r, miss), true
	}
	slowNet := func(r *rand.Rand, _ int64, miss bool) (time.Duration, bool) {
		if miss && r.IntN(50) == 0 {
			return time.Duration(200+r.IntN(200)) * time.Millisecond, true
		}
		return healthyLatency(r, miss), true
	}
	old := DefaultConfig()
	old.UpstreamMin, old.UpstreamMax = 300*time.Millisecond, 500*time.Millisecond
	for _, tt := range []struct {
		name string
		cfg  Config
		pass bool
	}{{"before (300-500 ms)", old, false}, {"defaults", DefaultConfig(), true}} {
		t.Run(tt.name, func(t *testing.T) {
			qs, _, _ := simulateWith(t, tt.cfg, 70*time.Millisecond, 1000, 20*time.Second, 0.05, held)
			var l []int64
			for _, q := range qs {
				if q.miss && q.at >= fault && q.first != 0 {
					l = append(l, q.first-q.at)
				}
			}
			slices.Sort(l)
			p99, worst := time.Duration(l[len(l)*99/100]), time.Duration(l[len(l)-1])
			qs, _, _ = simulateWith(t, tt.cfg, 20*time.Millisecond, 1000, 20*time.Second, 0.05, slowNet)
			misses, hedged := 0, 0
			for _, q := range qs {
				if q.miss {
					misses++
					if q.hedged {
						hedged++
					}
				}
			}
			t.Logf("silent upstream: misses p99 %v, slowest %v; healthy, slow internet: %d of %d misses hedged from the upstreams (%.2f%%)",
				p99, worst, hedged, misses, 100*float64(hedged)/float64(misses))
			ok := p99 <= 300*time.Millisecond && worst <= 600*time.Millisecond
			if ok != tt.pass {
				t.Errorf("target (p99 ≤ 300 ms, none over 600 ms) met: %v, want %v", ok, tt.pass)
			}
			if tt.pass && hedged*50 > misses {
				t.Errorf("healthy: %d of %d misses hedged, over 2%%", hedged, misses)
			}
		})
	}
}
