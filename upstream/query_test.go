package upstream

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/miekg/dns"
)

// testQuery packs a query for name/qtype as an attempt would send it, ID
// 0x1234, the name in random case (caps) or in the caller's.
func testQuery(t testing.TB, name string, qtype uint16, caps bool) *query {
	t.Helper()
	req := newReq(name, qtype)
	req.SetEdns0(1232, false)
	q, err := newQuery(req)
	if err != nil {
		t.Fatalf("newQuery: %v", err)
	}
	q.prepare(0x1234, caps)
	return q
}

// sentName is the question name of q as last sent.
func sentName(t testing.TB, q *query) string {
	t.Helper()
	var m dns.Msg
	if err := m.Unpack(q.msg); err != nil {
		t.Fatal(err)
	}
	return m.Question[0].Name
}

// replyTo builds the wire reply to q as sent, then lets mod change it.
func replyTo(t testing.TB, q *query, mod func(m *dns.Msg)) []byte {
	t.Helper()
	var sent dns.Msg
	if err := sent.Unpack(q.msg); err != nil {
		t.Fatal(err)
	}
	m := answer("192.0.2.1")(&sent)
	if mod != nil {
		mod(m)
	}
	return mustPack(t, m)
}

func TestAccept(t *testing.T) {
	q := testQuery(t, "Api.Example.COM.", dns.TypeA, true)
	sent := sentName(t, q)
	tests := []struct {
		name  string
		reply func() []byte
		ok    bool
		why   reason
	}{
		{"match", func() []byte { return replyTo(t, q, nil) }, true, 0},
		{"answer owner in another case", func() []byte {
			return replyTo(t, q, func(m *dns.Msg) { m.Answer[0].Header().Name = "api.example.com." })
		}, true, 0},
		{"rcode servfail", func() []byte {
			return replyTo(t, q, func(m *dns.Msg) { m.Rcode = dns.RcodeServerFailure; m.Answer = nil })
		}, true, 0},
		{"wrong id", func() []byte { return replyTo(t, q, func(m *dns.Msg) { m.Id++ }) }, false, reasonMismatch},
		{"caller's id", func() []byte { return replyTo(t, q, func(m *dns.Msg) { m.Id = 0x4242 }) }, false, reasonMismatch},
		{"query, not reply", func() []byte { return replyTo(t, q, func(m *dns.Msg) { m.Response = false }) }, false, reasonMismatch},
		{"name in another case", func() []byte {
			return replyTo(t, q, func(m *dns.Msg) { m.Question[0].Name = swapCase(sent) })
		}, false, reasonCase},
		{"one letter in another case", func() []byte {
			return replyTo(t, q, func(m *dns.Msg) { m.Question[0].Name = swapCase(sent[:1]) + sent[1:] })
		}, false, reasonCase},
		{"caller's name, not the case sent", func() []byte {
			return replyTo(t, q, func(m *dns.Msg) {
				if sent != "Api.Example.COM." { // the same once in 2^13 draws
					m.Question[0].Name = "Api.Example.COM."
				}
			})
		}, sent == "Api.Example.COM.", reasonCase},
		{"other letters of the same case", func() []byte {
			return replyTo(t, q, func(m *dns.Msg) { m.Question[0].Name = "Api.Example.CON." })
		}, false, reasonMismatch},
		{"longer name", func() []byte {
			return replyTo(t, q, func(m *dns.Msg) { m.Question[0].Name = "x.Api.Example.COM." })
		}, false, reasonMismatch},
		{"type", func() []byte {
			return replyTo(t, q, func(m *dns.Msg) { m.Question[0].Qtype = dns.TypeAAAA })
		}, false, reasonMismatch},
		{"class", func() []byte {
			return replyTo(t, q, func(m *dns.Msg) { m.Question[0].Qclass = dns.ClassANY })
		}, false, reasonMismatch},
		{"header only", func() []byte { return replyTo(t, q, nil)[:12] }, false, reasonMismatch},
		{"empty", func() []byte { return nil }, false, reasonMismatch},
		{"question cut", func() []byte { return replyTo(t, q, nil)[:20] }, false, reasonMismatch},
		{"qdcount 0 with question bytes", func() []byte {
			b := replyTo(t, q, nil)
			binary.BigEndian.PutUint16(b[4:], 0)
			return b
		}, false, reasonMismatch},
		{"answer cut", func() []byte {
			b := replyTo(t, q, nil)
			return b[:len(b)-2]
		}, false, reasonMalformed},
		{"truncated with lying counts", func() []byte {
			b := replyTo(t, q, func(m *dns.Msg) { m.Truncated = true })
			binary.BigEndian.PutUint16(b[6:], 9) // nine answers announced
			return b
		}, true, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, why, ok := q.accept(tt.reply())
			if ok != tt.ok || (!ok && why != tt.why) {
				t.Fatalf("accept = %v, %s; want %v, %s", ok, why, tt.ok, tt.why)
			}
			if !ok {
				return
			}
			if m.Id != q.req.Id || len(m.Question) != 1 || m.Question[0] != q.req.Question[0] {
				t.Errorf("reply not re-labelled for the caller: id %#x question %v", m.Id, m.Question)
			}
			for _, rr := range m.Answer {
				if rr.Header().Name != q.req.Question[0].Name {
					t.Errorf("answer owner %q, want the caller's case %q", rr.Header().Name, q.req.Question[0].Name)
				}
			}
		})
	}
}

// TestAcceptAnyCase: after an attempt in the caller's case (a server that
// does not keep case), the reply's name is taken in any case, but still
// has to be the same name.
func TestAcceptAnyCase(t *testing.T) {
	q := testQuery(t, "Api.Example.COM.", dns.TypeA, false)
	if got := sentName(t, q); got != "Api.Example.COM." {
		t.Fatalf("sent %q, want the caller's case", got)
	}
	tests := []struct {
		name  string
		qname string
		ok    bool
	}{
		{"as sent", "Api.Example.COM.", true},
		{"lower-cased", "api.example.com.", true},
		{"upper-cased", "API.EXAMPLE.COM.", true},
		{"other name", "Api.Example.CON.", false},
		{"longer name", "x.Api.Example.COM.", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := replyTo(t, q, func(m *dns.Msg) { m.Question[0].Name = tt.qname; m.Answer[0].Header().Name = tt.qname })
			m, why, ok := q.accept(b)
			if ok != tt.ok || (!ok && why != reasonMismatch) {
				t.Fatalf("accept = %v, %s; want %v", ok, why, tt.ok)
			}
			if ok && (m.Question[0] != q.req.Question[0] || m.Answer[0].Header().Name != "Api.Example.COM.") {
				t.Errorf("reply not in the caller's case: question %v answer %v", m.Question, m.Answer)
			}
		})
	}
}

// TestPrepareRandomizesCase: each attempt sends the name in a case of its
// own: only the letters change, every case is drawn, and the caller's
// request is untouched.
func TestPrepareRandomizesCase(t *testing.T) {
	const name = "a-1.Svc.cluster.local."
	q := testQuery(t, name, dns.TypeA, true)
	seen := map[string]bool{}
	for range 200 {
		q.prepare(0x1234, true)
		got := sentName(t, q)
		if !foldEqual(got, name) {
			t.Fatalf("sent %q: not %q in another case", got, name)
		}
		seen[got] = true
	}
	// 16 letters: 2^16 cases; 200 draws give nearly 200 different ones.
	if len(seen) < 150 {
		t.Errorf("%d distinct cases in 200 attempts", len(seen))
	}
	if q.req.Question[0].Name != name {
		t.Errorf("request's name changed to %q", q.req.Question[0].Name)
	}
	q.prepare(0x1234, false)
	if got := sentName(t, q); got != name {
		t.Errorf("without 0x20 sent %q, want the caller's %q", got, name)
	}
}

// TestNewQuery: the packed query is the request, its question bytes are
// where match looks, and an attempt's ID does not reach the request.
func TestNewQuery(t *testing.T) {
	req := newReq("Mixed.Case.example.", dns.TypeSRV)
	req.SetEdns0(4096, true)
	req.Compress = true
	q, err := newQuery(req)
	if err != nil {
		t.Fatal(err)
	}
	q.prepare(0x9999, false)
	if req.Id != 0x4242 {
		t.Errorf("request ID changed to %#x", req.Id)
	}
	var back dns.Msg
	if err := back.Unpack(q.msg); err != nil {
		t.Fatal(err)
	}
	if back.Id != 0x9999 || back.Question[0] != req.Question[0] || back.IsEdns0() == nil || !back.IsEdns0().Do() {
		t.Errorf("packed query differs: %v", &back)
	}
	wantQ := append([]byte("\x05Mixed\x04Case\x07example\x00"), 0, byte(dns.TypeSRV), 0, 1)
	if !bytes.Equal(q.question, wantQ) {
		t.Errorf("question bytes %q, want %q", q.question, wantQ)
	}
	if n := binary.BigEndian.Uint16(q.framed); int(n) != len(q.msg) {
		t.Errorf("frame length %d, message %d", n, len(q.msg))
	}
}

// FuzzAccept feeds arbitrary bytes to the reply check. Nothing may panic,
// and whatever is accepted must really answer the query: same ID and
// question byte for byte (the random case too), QR set, one question; the
// message handed back carries the caller's ID and question.
func FuzzAccept(f *testing.F) {
	q := testQuery(f, "WwW.Example.ORG.", dns.TypeA, true)
	f.Add(replyTo(f, q, nil))
	f.Add(replyTo(f, q, func(m *dns.Msg) { m.Question[0].Name = swapCase(m.Question[0].Name) }))
	f.Add(replyTo(f, q, func(m *dns.Msg) { m.Truncated = true; m.Answer = nil }))
	f.Add(replyTo(f, q, func(m *dns.Msg) { m.Rcode = dns.RcodeNameError }))
	f.Add(replyTo(f, q, func(m *dns.Msg) { m.Question[0].Name = "www.example.org." }))
	f.Add(replyTo(f, q, func(m *dns.Msg) { m.SetEdns0(1232, true) }))
	f.Add([]byte{0x12, 0x34, 0x80, 0, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		in := bytes.Clone(b)
		m, why, ok := q.accept(b)
		if !bytes.Equal(in, b) {
			t.Fatal("accept modified its input")
		}
		if !ok {
			if m != nil || (why != reasonMismatch && why != reasonMalformed && why != reasonCase) {
				t.Fatalf("rejected with message %v, reason %s", m, why)
			}
			return
		}
		if len(b) < 12+len(q.question) ||
			binary.BigEndian.Uint16(b) != 0x1234 ||
			b[2]&0x80 == 0 ||
			binary.BigEndian.Uint16(b[4:]) != 1 ||
			!bytes.Equal(b[12:12+len(q.question)], q.question) {
			t.Fatalf("accepted a reply that does not answer the query: %x", b)
		}
		if m.Id != q.req.Id || len(m.Question) != 1 || m.Question[0] != q.req.Question[0] {
			t.Fatalf("accepted reply not re-labelled: id %#x question %v", m.Id, m.Question)
		}
		var full dns.Msg
		if err := full.Unpack(b); err != nil && !m.Truncated {
			t.Fatalf("accepted a reply that does not unpack and is not truncated: %v", err)
		}
	})
}
