package cache

import (
	"bytes"
	"slices"
	"testing"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/wire"
)

// fuzzSeeds are responses of every shape the cache handles.
func fuzzSeeds(t testing.TB) [][]byte {
	soa := "cluster.local. 30 IN SOA ns.dns.cluster.local. h.cluster.local. 1 7200 1800 86400 30"
	do := reply(t, "signed.example.", dns.TypeA, 0, []string{"signed.example. 60 IN A 192.0.2.1"}, nil)
	do.SetEdns0(1232, true)
	cd := reply(t, "cd.example.", dns.TypeAAAA, 0, []string{"cd.example. 60 IN AAAA 2001:db8::1"}, nil)
	cd.CheckingDisabled = true
	mx := reply(t, "mail.example.", dns.TypeMX, 0, []string{"mail.example. 300 IN MX 10 mx.mail.example."}, []string{"mail.example. 300 IN NS ns.mail.example."})
	mx.Extra = []dns.RR{rr(t, "mx.mail.example. 300 IN A 192.0.2.25")}
	return [][]byte{
		pack(t, reply(t, "svc.ns.svc.cluster.local.", dns.TypeA, 0, []string{"svc.ns.svc.cluster.local. 30 IN A 10.0.0.1"}, nil)),
		pack(t, reply(t, "www.example.", dns.TypeA, 0, []string{"www.example. 300 IN CNAME web.example.", "web.example. 60 IN A 192.0.2.80"}, nil)),
		pack(t, reply(t, "nx.cluster.local.", dns.TypeA, dns.RcodeNameError, nil, []string{soa})),
		pack(t, reply(t, "svc.cluster.local.", dns.TypeAAAA, 0, nil, []string{soa})),
		pack(t, do), pack(t, cd), pack(t, mx),
	}
}

// FuzzInsert feeds arbitrary responses to Insert. Whatever it accepts must
// then serve as a well-formed answer to a query for the same question.
func FuzzInsert(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, resp []byte) {
		c, _ := newTestCache(t, nil)
		if err := c.Insert(resp); err != nil {
			if c.Len() != 0 {
				t.Fatalf("rejected insert left %d entries", c.Len())
			}
			return
		}
		var m dns.Msg
		if err := m.Unpack(resp); err != nil {
			t.Fatalf("accepted a response miekg/dns cannot unpack: %v", err)
		}
		q := new(dns.Msg)
		q.Id = 0xabcd
		q.Question = []dns.Question{m.Question[0]}
		q.CheckingDisabled = m.CheckingDisabled
		if opt := m.IsEdns0(); opt != nil {
			q.SetEdns0(4096, opt.Do())
		}
		raw, err := q.Pack()
		if err != nil {
			return // a question miekg/dns will not pack back (odd names)
		}
		var wq wire.Query
		if err := wire.ParseQuery(raw, &wq); err != nil {
			return
		}
		buf := make([]byte, 65535)
		n, st := c.Serve(buf, &wq, 65535, false)
		if st != Fresh || n == 0 {
			t.Fatalf("accepted response not served: status %s", st)
		}
		var a dns.Msg
		if err := a.Unpack(buf[:n]); err != nil {
			t.Fatalf("served answer does not unpack: %v", err)
		}
		if a.Id != 0xabcd || a.Rcode != m.Rcode || len(a.Answer) != len(m.Answer) || len(a.Ns) != len(m.Ns) {
			t.Fatalf("served answer differs: id %#x rcode %d/%d answers %d/%d ns %d/%d",
				a.Id, a.Rcode, m.Rcode, len(a.Answer), len(m.Answer), len(a.Ns), len(m.Ns))
		}
	})
}

// FuzzInsertMirror feeds arbitrary replies to InsertMirror: nothing may
// panic, the DO bit it files an accepted reply under must be exactly
// "has an RRSIG, NSEC or NSEC3 in answer or authority" as miekg/dns reads
// it, and the same reply again is either skipped as a repeat or stored
// again, never rejected otherwise, and never leaves the entry on
// probation.
func FuzzInsertMirror(f *testing.F) {
	signed := reply(f, "s.example.", dns.TypeA, 0, []string{
		"s.example. 60 IN A 192.0.2.1",
		"s.example. 60 IN RRSIG A 13 2 60 20261231000000 20261201000000 1 example. AAAA",
	}, nil)
	signed.SetEdns0(1232, true)
	f.Add(pack(f, signed))
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, resp []byte) {
		c, _ := newTestCache(t, nil)
		if err := c.InsertMirror(resp); err != nil {
			return
		}
		var m dns.Msg
		if err := m.Unpack(resp); err != nil {
			t.Fatalf("accepted a reply miekg/dns cannot unpack: %v", err)
		}
		want := false
		for _, rr := range append(append([]dns.RR{}, m.Answer...), m.Ns...) {
			switch rr.Header().Rrtype {
			case dns.TypeRRSIG, dns.TypeNSEC, dns.TypeNSEC3:
				want = true
			}
		}
		q := new(dns.Msg)
		q.Question = []dns.Question{m.Question[0]}
		q.CheckingDisabled = m.CheckingDisabled
		q.SetEdns0(4096, want)
		raw, err := q.Pack()
		if err != nil {
			return
		}
		var wq wire.Query
		if err := wire.ParseQuery(raw, &wq); err != nil {
			return
		}
		if st := c.Status(&wq); st != Fresh {
			t.Fatalf("accepted reply (DNSSEC records: %v) not fresh under DO=%v: %s", want, want, st)
		}
		if err := c.InsertMirror(resp); err != nil && err != errHaveFresh {
			t.Fatalf("the same reply again: %v", err)
		}
		if st := c.Stats(); st.Probation != 0 || st.Entries != 1 {
			t.Fatalf("after the same reply again: %d entries, %d on probation; want 1, 0", st.Entries, st.Probation)
		}
	})
}

// FuzzServe sends arbitrary queries to a populated cache. Nothing may
// panic; every answer must unpack, fit the limit and echo the client's ID
// and question bytes.
func FuzzServe(f *testing.F) {
	seeds := fuzzSeeds(f)
	for _, s := range seeds {
		var m dns.Msg
		if err := m.Unpack(s); err != nil {
			f.Fatal(err)
		}
		q := new(dns.Msg)
		q.Question = m.Question
		q.SetEdns0(512, false)
		f.Add(pack(f, q))
	}
	f.Add([]byte{0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1})
	c, _ := newTestCache(f, func(c *Config) { c.NSID = "dnsstandby" })
	for _, s := range seeds {
		if err := c.Insert(s); err != nil {
			f.Fatal(err)
		}
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var q wire.Query
		if err := wire.ParseQuery(raw, &q); err != nil {
			return
		}
		buf := make([]byte, 65535)
		limit := q.PayloadLimit()
		n, st := c.Serve(buf, &q, limit, true)
		if n == 0 {
			return
		}
		if st == Miss || n > limit {
			t.Fatalf("n=%d status %s limit %d", n, st, limit)
		}
		var a dns.Msg
		if err := a.Unpack(buf[:n]); err != nil {
			t.Fatalf("answer does not unpack: %v", err)
		}
		if a.Id != q.ID || !bytes.Equal(buf[wire.HeaderLen:wire.HeaderLen+len(q.QName)], q.QName) {
			t.Fatalf("answer does not echo id and question")
		}
	})
}

// FuzzServeTruncated feeds arbitrary responses and client sizes to the
// truncation walk: whatever Insert accepts, served to a client of that
// size, must fit, unpack, and hold exactly the records miekg/dns's
// Msg.Truncate (CoreDNS's cut) keeps, with TC set exactly when it sets it.
func FuzzServeTruncated(f *testing.F) {
	for _, m := range truncationCases(f) {
		for _, size := range []uint16{0, 512, 600, 1232, 4096} {
			f.Add(pack(f, m), size)
		}
	}
	for _, s := range fuzzSeeds(f) {
		f.Add(s, uint16(512))
	}
	f.Fuzz(func(t *testing.T, resp []byte, size uint16) {
		c, _ := newTestCache(t, nil)
		if c.Insert(resp) != nil {
			return
		}
		var stored dns.Msg
		if err := stored.Unpack(resp); err != nil {
			t.Fatalf("inserted response does not unpack: %v", err)
		}
		do := stored.IsEdns0() != nil && stored.IsEdns0().Do() // filed under DO: only a DO query finds it
		if do && size == 0 {
			size = 512
		}
		edns := -1 // size 0: a client without EDNS
		if size > 0 {
			edns = int(size)
		}
		q := query(t, stored.Question[0].Name, stored.Question[0].Qtype, edns, do)
		q.Question[0].Qclass = stored.Question[0].Qclass
		q.CheckingDisabled = stored.CheckingDisabled
		a, st := serve(t, c, q, 0, false) // fails the test if it does not fit or unpack
		if a == nil {
			t.Fatalf("status %s for an entry just inserted", st)
		}

		want := stored.Copy()
		want.Extra = slices.DeleteFunc(want.Extra, func(r dns.RR) bool { return r.Header().Rrtype == dns.TypeOPT })
		want.Truncated = false
		if size > 0 {
			opt := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
			want.Extra = append(want.Extra, opt)
		}
		want.Truncate(max(int(size), 512))
		if a.Truncated != want.Truncated || len(a.Answer) != len(want.Answer) ||
			len(a.Ns) != len(want.Ns) || len(a.Extra) != len(want.Extra) {
			t.Fatalf("TC=%v with %d/%d/%d records, Truncate: TC=%v with %d/%d/%d", a.Truncated,
				len(a.Answer), len(a.Ns), len(a.Extra), want.Truncated, len(want.Answer), len(want.Ns), len(want.Extra))
		}
	})
}
