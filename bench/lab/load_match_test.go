package lab

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// loadTestOffline is a Load without sockets, for the bookkeeping alone:
// its sends fail (counted as send errors, as a refused send is), and the
// test plays the replies and the clock through handleReply and expire.
func loadTestOffline(t *testing.T, names []LoadName) *Load {
	t.Helper()
	l := &Load{
		cfg:     LoadConfig{QPS: 1000, Timeout: time.Second, Sockets: 2, Names: names},
		fds:     []int{-1, -1},
		epfd:    -1,
		pending: map[uint32]int32{},
		rng:     rand.New(rand.NewPCG(1, 2)),
		nsids:   map[string]string{},
		sbuf:    make([]byte, 0, 512),
		res:     LoadResult{BadRcodes: map[int]int{}},
		start:   time.Now(),
	}
	for _, n := range names {
		tmpl, err := newLoadTemplate(n)
		if err != nil {
			t.Fatal(err)
		}
		l.tmpl = append(l.tmpl, tmpl)
	}
	return l
}

// testAdvance moves the load's clock on by d (its start back): the timers
// it sets from then on are set from the later time.
func (l *Load) testAdvance(d time.Duration) time.Duration {
	l.start = l.start.Add(-d)
	return l.since()
}

// reply plays a reply to try of query q received at, for name's question
// (the try's own when name < 0), with the try's ID xor idXor.
func (l *Load) testReply(t *testing.T, q int32, try uint8, name int, rcode int, idXor uint16, at time.Duration) {
	t.Helper()
	qq := l.query(q)
	if name < 0 {
		name = int(qq.rec.Name)
	}
	m := new(dns.Msg)
	m.SetQuestion(l.cfg.Names[name].FQDN, l.cfg.Names[name].Type)
	m.Id = qq.id[try] ^ idXor
	m.Response, m.Rcode = true, rcode
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	l.handleReply(int(qq.sock[try]), b, qq.sent[try]+at)
}

// TestLoadReplyMatching: every reply is checked against its try's ID and
// question, also after the try was answered; the counts say which was
// which, and the query's outcome is the first acceptable reply's.
func TestLoadReplyMatching(t *testing.T) {
	names := []LoadName{{FQDN: "a.lab.test.", Type: dns.TypeA}, {FQDN: "b.lab.test.", Type: dns.TypeA}}
	const ms = time.Millisecond
	ok, fail := dns.RcodeSuccess, dns.RcodeServerFailure
	tests := []struct {
		name  string
		play  func(t *testing.T, l *Load)
		want  LoadOutcome
		count [4]int // late, duplicates, mismatched, SERVFAIL replies
	}{
		{"one answer", func(t *testing.T, l *Load) {
			l.testReply(t, 0, 0, -1, ok, 0, 5*ms)
		}, LoadFirstTry, [4]int{}},
		{"answered twice: one duplicate", func(t *testing.T, l *Load) {
			l.testReply(t, 0, 0, -1, ok, 0, 5*ms)
			l.testReply(t, 0, 0, -1, ok, 0, 40*ms)
		}, LoadFirstTry, [4]int{0, 1, 0, 0}},
		{"answered three times", func(t *testing.T, l *Load) {
			for i := range 3 {
				l.testReply(t, 0, 0, -1, ok, 0, time.Duration(i+1)*ms)
			}
		}, LoadFirstTry, [4]int{0, 2, 0, 0}},
		{"a duplicate after the try's deadline is still a duplicate", func(t *testing.T, l *Load) {
			l.testReply(t, 0, 0, -1, ok, 0, 5*ms)
			l.testReply(t, 0, 0, -1, ok, 0, 1500*ms)
		}, LoadFirstTry, [4]int{0, 1, 0, 0}},
		{"another question with the try's ID is mismatched and settles nothing", func(t *testing.T, l *Load) {
			l.testReply(t, 0, 0, 1, ok, 0, 5*ms)
			l.testReply(t, 0, 0, -1, ok, 0, 6*ms)
		}, LoadFirstTry, [4]int{0, 0, 1, 0}},
		{"another question after the answer is mismatched, not a duplicate", func(t *testing.T, l *Load) {
			l.testReply(t, 0, 0, -1, ok, 0, 5*ms)
			l.testReply(t, 0, 0, 1, ok, 0, 6*ms)
		}, LoadFirstTry, [4]int{0, 0, 1, 0}},
		{"an ID never sent is mismatched", func(t *testing.T, l *Load) {
			l.testReply(t, 0, 0, -1, ok, 0x8000, 5*ms)
			l.testReply(t, 0, 0, -1, ok, 0, 6*ms)
		}, LoadFirstTry, [4]int{0, 0, 1, 0}},
		{"a SERVFAIL, then the first try answered again: duplicate; the retry answers", func(t *testing.T, l *Load) {
			l.testReply(t, 0, 0, -1, fail, 0, 5*ms)
			l.testReply(t, 0, 0, -1, ok, 0, 6*ms)
			l.testReply(t, 0, 1, -1, ok, 0, 2*ms)
		}, LoadAfterRetry, [4]int{0, 1, 0, 1}},
		{"late, then late again: one late, one duplicate", func(t *testing.T, l *Load) {
			l.expire(l.testAdvance(1001 * ms)) // first try times out, retry sent
			l.testReply(t, 0, 0, -1, ok, 0, 1100*ms)
			l.testReply(t, 0, 0, -1, ok, 0, 1200*ms)
			l.testReply(t, 0, 1, -1, ok, 0, 3*ms)
		}, LoadAfterRetry, [4]int{1, 1, 0, 0}},
		{"a duplicate seconds later is still a duplicate", func(t *testing.T, l *Load) {
			l.testReply(t, 0, 0, -1, ok, 0, 5*ms)
			l.expire(l.testAdvance(loadForget - time.Second))
			l.testReply(t, 0, 0, -1, ok, 0, loadForget)
		}, LoadFirstTry, [4]int{0, 1, 0, 0}},
		{"after the forget timer the ID is unknown: mismatched", func(t *testing.T, l *Load) {
			l.testReply(t, 0, 0, -1, ok, 0, 5*ms)
			l.expire(l.testAdvance(loadForget + time.Second))
			l.testReply(t, 0, 0, -1, ok, 0, loadForget+2*time.Second)
		}, LoadFirstTry, [4]int{0, 0, 1, 0}},
		{"both tries time out", func(t *testing.T, l *Load) {
			l.expire(l.testAdvance(1001 * ms))
			l.expire(l.testAdvance(1001 * ms))
		}, LoadUnanswered, [4]int{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := loadTestOffline(t, names)
			l.sendNew()
			tc.play(t, l)
			rec := l.query(0).rec
			got := [4]int{l.res.Late, l.res.Duplicates, l.res.Mismatched, l.res.BadRcodes[fail]}
			if rec.Outcome != tc.want || got != tc.count {
				t.Errorf("outcome %v, late/duplicates/mismatched/SERVFAIL %v; want %v, %v", rec.Outcome, got, tc.want, tc.count)
			}
			// Bounded: once every timer has fired, no key is left.
			l.expire(l.testAdvance(2 * loadForget))
			if len(l.pending) != 0 || l.timers.len() != 0 || l.forgets.len() != 0 || l.open != 0 {
				t.Errorf("after every timer: %d keys pending, %d timers and %d forgets left, %d queries open; want none",
					len(l.pending), l.timers.len(), l.forgets.len(), l.open)
			}
		})
	}
}
