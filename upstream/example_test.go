package upstream_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/upstream"
)

// Example forwards one query to a kube-dns stand-in on the loopback.
func Example() {
	// The stand-in: a miekg/dns server answering every A query.
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	started := make(chan struct{})
	srv := &dns.Server{PacketConn: pc, NotifyStartedFunc: func() { close(started) },
		Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
			m := new(dns.Msg)
			m.SetReply(r)
			a, _ := dns.NewRR(r.Question[0].Name + " 30 IN A 10.0.0.1")
			m.Answer = append(m.Answer, a)
			w.WriteMsg(m)
		})}
	go srv.ActivateAndServe()
	defer srv.Shutdown()
	<-started

	cfg := upstream.DefaultConfig()
	cfg.Servers = []netip.AddrPort{pc.LocalAddr().(*net.UDPAddr).AddrPort()}
	g, err := upstream.New(cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer g.Close()

	req := new(dns.Msg)
	req.SetQuestion("Kubernetes.Default.svc.cluster.local.", dns.TypeA)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	resp, err := g.Exchange(ctx, req)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(dns.RcodeToString[resp.Rcode], resp.Id == req.Id, resp.Question[0].Name)
	fmt.Println(resp.Answer[0].(*dns.A).A)
	st := g.Stats()[0]
	fmt.Println(st.Healthy, st.Requests["udp"], st.Replies)
	// Output:
	// NOERROR true Kubernetes.Default.svc.cluster.local.
	// 10.0.0.1
	// true 1 1
}
