package lab

import (
	"fmt"
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

// queryName is the name query q asked: its mix entry's FQDN, or for a
// fresh entry the name under it that q alone asked.
func (l *Load) queryName(q int32) string {
	n := l.cfg.Names[l.query(q).rec.Name]
	if !n.Fresh {
		return n.FQDN
	}
	label := make([]byte, LoadFreshLabelLen)
	l.freshLabel(label, q)
	return string(label) + "." + n.FQDN
}

// reply plays a reply to try of query q received at, for name's question
// (the try's own when name < 0), with the try's ID xor idXor.
func (l *Load) testReply(t *testing.T, q int32, try uint8, name int, rcode int, idXor uint16, at time.Duration) {
	t.Helper()
	qq := l.query(q)
	qname := l.queryName(q)
	if name < 0 {
		name = int(qq.rec.Name)
	} else {
		qname = l.cfg.Names[name].FQDN
	}
	m := new(dns.Msg)
	m.SetQuestion(qname, l.cfg.Names[name].Type)
	m.Id = qq.id[try] ^ idXor
	m.Response, m.Rcode = true, rcode
	if rcode == dns.RcodeSuccess {
		m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: qname, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: []byte{192, 0, 2, 1}})
	}
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

// sentName is the name the query last sent (l.sbuf) asked.
func (l *Load) sentName(t *testing.T) string {
	t.Helper()
	m := new(dns.Msg)
	if err := m.Unpack(l.sbuf); err != nil || len(m.Question) != 1 {
		t.Fatalf("the query sent does not unpack: %v", err)
	}
	return m.Question[0].Name
}

// TestLoadFreshNames: a fresh entry asks a name of its own in every query,
// the same in the retry, distinct between loads; a reply must carry its
// query's own name to count.
func TestLoadFreshNames(t *testing.T) {
	names := []LoadName{{FQDN: "fresh.lab.test.", Type: dns.TypeA, Fresh: true}, {FQDN: "a.lab.test.", Type: dns.TypeA}}
	l := loadTestOffline(t, names)
	l.nonce = 0x0102abcd
	var sent []string
	for range 4 {
		l.sendNew()
		sent = append(sent, l.sentName(t))
	}
	if sent[1] != "a.lab.test." || sent[3] != "a.lab.test." {
		t.Errorf("the plain entry asked %q and %q", sent[1], sent[3])
	}
	for _, q := range []int32{0, 2} {
		n := sent[q]
		if want := fmt.Sprintf("0102abcd%08x.fresh.lab.test.", q); n != want {
			t.Errorf("query %d asked %q, want %q", q, n, want)
		}
		if got := l.queryName(q); got != n {
			t.Errorf("queryName(%d) = %q, the query asked %q", q, got, n)
		}
	}

	// Query 2's name on query 0's ID: mismatched, settles nothing.
	m := new(dns.Msg)
	m.SetQuestion(sent[2], dns.TypeA)
	m.Id, m.Response = l.query(0).id[0], true
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	l.handleReply(int(l.query(0).sock[0]), b, l.query(0).sent[0]+time.Millisecond)
	if l.res.Mismatched != 1 || l.query(0).done {
		t.Errorf("another fresh name's reply: mismatched %d, query settled %v; want 1, false", l.res.Mismatched, l.query(0).done)
	}
	l.testReply(t, 0, 0, -1, dns.RcodeSuccess, 0, 2*time.Millisecond)
	if rec := l.query(0).rec; rec.Outcome != LoadFirstTry {
		t.Errorf("its own name's reply: %v, want %v", rec.Outcome, LoadFirstTry)
	}
	// A NOERROR without an answer record for a fresh name was made up on
	// the way: it fails the try, and the retry goes out.
	l.sendNew() // query 4, fresh
	m = new(dns.Msg)
	m.SetQuestion(l.sentName(t), dns.TypeA)
	m.Id, m.Response = l.query(4).id[0], true
	if b, err = m.Pack(); err != nil {
		t.Fatal(err)
	}
	l.handleReply(int(l.query(4).sock[0]), b, l.query(4).sent[0]+time.Millisecond)
	if qq := l.query(4); l.res.Empty != 1 || qq.try != 1 || qq.done || qq.rec.BadReplies != 1 || len(l.res.BadRcodes) != 0 {
		t.Errorf("an empty answer to a fresh name: empty %d, try %d, done %v, bad replies %d, bad rcodes %v; want 1, 1, false, 1, none",
			l.res.Empty, qq.try, qq.done, qq.rec.BadReplies, l.res.BadRcodes)
	}
	if got := l.sentName(t); got != sent[0][:8]+"00000004.fresh.lab.test." {
		t.Errorf("query 4's retry asked %q", got)
	}
	l.testReply(t, 4, 1, -1, dns.RcodeSuccess, 0, time.Millisecond)

	// Query 2 times out (the others answered): the retry asks the same
	// name, and its reply counts.
	l.testReply(t, 1, 0, -1, dns.RcodeSuccess, 0, time.Millisecond)
	l.testReply(t, 3, 0, -1, dns.RcodeSuccess, 0, time.Millisecond)
	l.expire(l.testAdvance(1001 * time.Millisecond))
	if got := l.sentName(t); got != sent[2] {
		t.Errorf("query 2's retry asked %q, its first try %q", got, sent[2])
	}
	l.testReply(t, 2, 1, -1, dns.RcodeSuccess, 0, 3*time.Millisecond)
	if rec := l.query(2).rec; rec.Outcome != LoadAfterRetry {
		t.Errorf("query 2: %v, want %v", rec.Outcome, LoadAfterRetry)
	}

	// Another load (another nonce) asks other names for the same queries.
	other := loadTestOffline(t, names)
	other.nonce = l.nonce + 1
	other.sendNew()
	if got := other.sentName(t); got == sent[0] {
		t.Errorf("two loads asked the same fresh name %q", got)
	}
}
