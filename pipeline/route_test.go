package pipeline

import (
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// TestSetRoutes: new routes take effect for the next query; a bad set is
// refused and the routes in force stay.
func TestSetRoutes(t *testing.T) {
	before, after := newFake(), newFake()
	before.set("www.example.", "www.example. 30 IN A 192.0.2.1")
	after.set("new.example.", "new.example. 30 IN A 192.0.2.2")
	p, _ := newPipeline(t, nil, func(c *Config) { c.Routes = []Route{{Zone: ".", Upstream: before}} })
	w := p.NewWorker()
	wait(t, ask(t, w, q(t, "www.example.", dns.TypeA, false), "10.1.0.1"))

	if err := p.SetRoutes([]Route{{Zone: ".", Upstream: after}, {Zone: ".", Upstream: before}}); err == nil || !strings.Contains(err.Error(), "routed twice") {
		t.Fatalf("SetRoutes with a zone twice: %v", err)
	}
	if err := p.SetRoutes([]Route{{Zone: "Example.", Upstream: after}}); err != nil {
		t.Fatal(err)
	}
	a := wait(t, ask(t, w, q(t, "new.example.", dns.TypeA, false), "10.1.0.1"))
	if len(a.Answer) != 1 || after.count("new.example.") != 1 || before.count("new.example.") != 0 {
		t.Fatalf("after SetRoutes: answer %v, new upstream asked %d times, old %d", a.Answer, after.count("new.example."), before.count("new.example."))
	}
	// Outside the new routes' zones: no route.
	if a := wait(t, ask(t, w, q(t, "www.other.", dns.TypeA, false), "10.1.0.1")); a.Rcode != dns.RcodeRefused {
		t.Fatalf("a name no route covers: rcode %s, want REFUSED", dns.RcodeToString[a.Rcode])
	}
}
