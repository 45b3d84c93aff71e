package pipeline

import (
	"net/netip"
	"runtime"
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

// BenchmarkWaitingQuery is what a query waiting on an upstream keeps: a
// query of 512 bytes (a question, an OPT padded to the bound) joins a
// flight the upstream holds. B-held/op is the heap still in use per
// waiting query once the garbage is collected; run it with a fixed count
// under the waiting caps (-benchtime 10000x).
func BenchmarkWaitingQuery(b *testing.B) {
	up := newFake()
	release := up.hold("held.example.")
	p, _ := newPipelineTB(b, up, func(c *Config) { c.MaxInflight = 1 << 20; c.MaxPerClient = 1 << 30 })
	m := new(dns.Msg)
	m.SetQuestion("held.example.", dns.TypeA)
	m.SetEdns0(1232, false)
	m.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_PADDING{Padding: make([]byte, 512-m.Len()-4)}}
	raw, err := m.Pack()
	if err != nil {
		b.Fatal(err)
	}
	from := netip.MustParseAddrPort("10.1.0.1:5353")
	answered := 0
	reply := func([]byte) { answered++ }
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	b.ReportAllocs()
	for b.Loop() {
		p.Resolve(append([]byte(nil), raw...), from, false, reply)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(b.N), "B-held/op")
	if answered != 0 {
		b.Fatalf("%d queries answered before the upstream: over a cap", answered)
	}
	close(release)
}
