package daemon

import (
	"context"
	"testing"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/localanswer"
)

// answerer answers with rcode when answer is set, else passes on.
type answerer struct {
	answer bool
	rcode  int
}

func (a answerer) Answer(r localanswer.Request) (*dns.Msg, bool) {
	if !a.answer {
		return nil, false
	}
	m := new(dns.Msg)
	m.SetRcode(r.Msg, a.rcode)
	return m, true
}

// exchanger is an upstream group that answers REFUSED and counts.
type exchanger struct{ n *int }

func (e exchanger) Exchange(_ context.Context, req *dns.Msg) (*dns.Msg, error) {
	*e.n++
	m := new(dns.Msg)
	m.SetRcode(req, dns.RcodeRefused)
	return m, nil
}

// TestLocalFirst: the block's own answers first, in order; what they
// pass on goes upstream, or gets SERVFAIL in a block without one.
func TestLocalFirst(t *testing.T) {
	tests := []struct {
		name      string
		answerers []localanswer.Answerer
		upstream  bool
		want      int // rcode
		wantAsked int // upstream exchanges
	}{
		{"first answers", []localanswer.Answerer{answerer{true, dns.RcodeNameError}, answerer{true, dns.RcodeSuccess}}, true, dns.RcodeNameError, 0},
		{"second answers", []localanswer.Answerer{answerer{}, answerer{true, dns.RcodeSuccess}}, true, dns.RcodeSuccess, 0},
		{"all pass on, upstream", []localanswer.Answerer{answerer{}, answerer{}}, true, dns.RcodeRefused, 1},
		{"all pass on, no upstream", []localanswer.Answerer{answerer{}}, false, dns.RcodeServerFailure, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			asked := 0
			l := localFirst{answerers: tt.answerers}
			if tt.upstream {
				l.next = exchanger{&asked}
			}
			req := new(dns.Msg)
			req.SetQuestion("mcr.microsoft.com.", dns.TypeA)
			m, err := l.Exchange(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if m.Rcode != tt.want || asked != tt.wantAsked || m.Id != req.Id || m.Question[0] != req.Question[0] {
				t.Errorf("rcode %s, upstream asked %d times, id %d question %v; want %s, %d, the query's", dns.RcodeToString[m.Rcode], asked, m.Id, m.Question, dns.RcodeToString[tt.want], tt.wantAsked)
			}
		})
	}
}
