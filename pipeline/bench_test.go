package pipeline

import (
	"net/netip"
	"testing"

	"github.com/miekg/dns"
)

// BenchmarkAnswerHit is the pipeline's share of the hot path: a UDP query
// with EDNS for a cached name, parsed, looked up and answered into the
// read loop's buffer by Worker.Answer. It must not allocate.
func BenchmarkAnswerHit(b *testing.B) {
	const name = "kubernetes.default.svc.cluster.local."
	up := newFake()
	up.set(name, name+" 30 IN A 10.0.0.1")
	p, _ := newPipelineTB(b, up, nil)
	w := p.NewWorker()
	m := new(dns.Msg)
	m.SetQuestion("KuBeRnEtEs.default.svc.cluster.local.", dns.TypeA)
	m.SetEdns0(1232, false)
	raw, err := m.Pack()
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	p.Resolve(append([]byte(nil), raw...), netip.MustParseAddrPort("10.1.0.1:5353"), true, func([]byte) { close(done) })
	<-done
	buf := make([]byte, MaxUDPAnswer)
	b.ReportAllocs()
	for b.Loop() {
		if n, act := w.Answer(buf, raw, true); act != Reply || n == 0 {
			b.Fatalf("action %d, want a cached reply", act)
		}
	}
}
