package dnstap_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"

	tap "github.com/dnstap/golang-dnstap"
	fs "github.com/farsightsec/golang-framestream"
	"github.com/miekg/dns"
	"google.golang.org/protobuf/proto"

	"github.com/dnsstandby/dnsstandby/cache"
	"github.com/dnsstandby/dnsstandby/mirror/dnstap"
)

// Mirror a CLIENT_RESPONSE into a cache, sent as CoreDNS sends it.
func ExampleListen() {
	dir, _ := os.MkdirTemp("", "dnstap-example")
	defer os.RemoveAll(dir)
	c, _ := cache.New(cache.DefaultConfig())
	cfg := dnstap.DefaultConfig()
	cfg.Path = filepath.Join(dir, "dnstap.sock")
	r, err := dnstap.Listen(context.Background(), cfg, c.Insert)
	if err != nil {
		fmt.Println(err)
		return
	}

	// The sender's side: what `dnstap unix://PATH full` does for a reply.
	conn, _ := net.Dial("unix", r.Addr())
	w, _ := fs.NewWriter(conn, &fs.WriterOptions{
		ContentTypes: [][]byte{[]byte(dnstap.ContentType)}, Bidirectional: true})
	q := new(dns.Msg)
	q.SetQuestion("www.example.com.", dns.TypeA)
	resp := new(dns.Msg)
	resp.SetReply(q)
	a, _ := dns.NewRR("www.example.com. 300 IN A 192.0.2.10")
	resp.Answer = append(resp.Answer, a)
	wire, _ := resp.Pack()
	dt, mt := tap.Dnstap_MESSAGE, tap.Message_CLIENT_RESPONSE
	frame, _ := proto.Marshal(&tap.Dnstap{Type: &dt, Message: &tap.Message{Type: &mt, ResponseMessage: wire}})
	w.WriteFrame(frame)
	w.Close() // STOP, then wait for FINISH: the frame has been handled
	conn.Close()

	r.Close()
	st := r.Stats()
	fmt.Println("accepted:", st.Accepted, "cached:", c.Len())
	// Output: accepted: 1 cached: 1
}
