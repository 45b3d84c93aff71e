package dnat

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
)

var (
	pod     = netip.MustParseAddrPort("169.254.10.11:53")
	node    = netip.MustParseAddrPort("169.254.10.10:53")
	listen  = []netip.AddrPort{pod, node}
	kubeDNS = netip.MustParseAddrPort("10.244.1.7:53")
	client  = netip.MustParseAddrPort("10.244.0.9:40000")
)

// flow is a flow from client to dst answered from replySrc.
func flow(dst, replySrc netip.AddrPort) Flow {
	return Flow{OrigSrc: client, OrigDst: dst, ReplySrc: replySrc}
}

func TestDiverted(t *testing.T) {
	tests := []struct {
		name  string
		flows []Flow
		want  bool
	}{
		{"none", nil, false},
		{"answered by the listener", []Flow{flow(pod, pod)}, false},
		{"answered from another port of the listener", []Flow{flow(pod, netip.AddrPortFrom(pod.Addr(), 5353))}, false},
		{"pod listener DNATed to kube-dns", []Flow{flow(pod, pod), flow(pod, kubeDNS)}, true},
		{"node listener DNATed to the VNet's DNS", []Flow{flow(node, netip.MustParseAddrPort("168.63.129.16:53"))}, true},
		{"another service's DNAT", []Flow{flow(netip.MustParseAddrPort("10.0.0.10:53"), kubeDNS)}, false},
		{"the listener's address on another port", []Flow{flow(netip.AddrPortFrom(pod.Addr(), 54), kubeDNS)}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, got := Diverted(tt.flows, listen)
			if got != tt.want || got && f.ReplySrc == f.OrigDst {
				t.Errorf("Diverted = %v (%+v), want %v", got, f, tt.want)
			}
		})
	}
}

func TestJudge(t *testing.T) {
	c := DefaultConfig()
	tests := []struct {
		name           string
		seen, received uint64
		share          float64
		want           Verdict
	}{
		{"idle", 0, 0, 1, Unknown},
		{"too few to say", 9, 0, 1, Unknown},
		{"LocalDNS has them all (mirror at adopt)", 100, 0, 0, Unknown},
		{"takeover, all received", 100, 100, 1, Clear},
		{"takeover, host queries on top", 100, 180, 1, Clear},
		{"takeover, counted in the next interval", 100, 96, 1, Clear},
		{"takeover, none received", 100, 0, 1, Suspect},
		{"takeover, only new flows DNATed (1.5%)", 1000, 985, 1, Suspect},
		{"takeover, at the edge", 1000, 994, 1, Edge},
		{"takeover, long-lived sockets, a few new flows DNATed (0.8%)", 1250, 1240, 1, Edge},
		{"takeover, under half the bar missing", 1250, 1244, 1, Clear},
		{"busy takeover, a batch late", 20000, 19950, 1, Clear},
		{"busy takeover, 1% gone", 20000, 19800, 1, Suspect},
		{"hash beside LocalDNS, half received", 100, 48, 0.5, Clear},
		{"hash beside LocalDNS, none received", 100, 0, 0.5, Suspect},
		{"hash, unlucky", 40, 8, 0.5, Suspect},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := c.Judge(tt.seen, tt.received, tt.share); got != tt.want {
				t.Errorf("Judge(%d, %d, %v) = %v, want %v", tt.seen, tt.received, tt.share, got, tt.want)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
		ok   bool
	}{
		{"default", func(*Config) {}, true},
		{"MinSeen 0", func(c *Config) { c.MinSeen = 0 }, false},
		{"Ratio 0", func(c *Config) { c.Ratio = 0 }, false},
		{"Ratio 1", func(c *Config) { c.Ratio = 1 }, false},
		{"Confirm 0", func(c *Config) { c.Confirm = 0 }, false},
		{"Recheck 0", func(c *Config) { c.Recheck = 0 }, false},
	}
	for _, tt := range tests {
		c := DefaultConfig()
		tt.edit(&c)
		if _, err := New(c); (err == nil) != tt.ok {
			t.Errorf("%s: New error %v, want ok %v", tt.name, err, tt.ok)
		}
	}
}

// TestDetector runs sequences of intervals: each step adds seen and
// received to the totals, and conntrack answers flows or err.
func TestDetector(t *testing.T) {
	diverted := []Flow{flow(pod, kubeDNS)}
	plain := []Flow{flow(pod, pod)}
	// another is diverted plus a flow the DNAT made since.
	another := append(slices.Clone(diverted), Flow{OrigSrc: netip.MustParseAddrPort("10.244.0.9:40001"), OrigDst: pod, ReplySrc: kubeDNS})
	errNoModule := errors.New("nf_conntrack_netlink not loaded")
	type step struct {
		seen, received uint64
		share          float64
		flows          []Flow
		err            error
		changed, state bool
		confirmed      bool // conntrack was asked
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"takeover, served: never", []step{
			{seen: 50, received: 50, share: 1},
			{seen: 50, received: 50, share: 1},
		}},
		{"nat: suspect, conntrack confirms; gone after 3 clear intervals without a new DNATed flow", []step{
			{seen: 50, received: 50, share: 1},
			{seen: 50, received: 0, share: 1, flows: diverted, changed: true, state: true, confirmed: true},
			{seen: 50, received: 0, share: 1, state: true}, // not asked again
			{seen: 0, received: 0, share: 1, state: true},  // idle: stands
			{seen: 50, received: 0, share: 0, state: true}, // mirror at adopt: stands
			// hand-back: the old flow lingers in conntrack, no new one
			{seen: 50, received: 50, share: 1, flows: diverted, state: true, confirmed: true},
			{seen: 50, received: 50, share: 1, flows: diverted, state: true, confirmed: true},
			{seen: 50, received: 50, share: 1, flows: nil, changed: true, confirmed: true},
		}},
		{"diverted: a clear interval with a new DNATed flow starts the count again", []step{
			{},
			{seen: 50, received: 0, share: 1, flows: diverted, changed: true, state: true, confirmed: true},
			{seen: 50, received: 48, share: 1, flows: diverted, state: true, confirmed: true},
			{seen: 50, received: 48, share: 1, flows: diverted, state: true, confirmed: true},
			{seen: 50, received: 48, share: 1, flows: another, state: true, confirmed: true}, // a few new flows still DNATed
			{seen: 50, received: 48, share: 1, flows: another, state: true, confirmed: true},
			{seen: 50, received: 20, share: 1, state: true}, // suspect: starts again too
			{seen: 50, received: 48, share: 1, flows: another, state: true, confirmed: true},
			{seen: 50, received: 48, share: 1, flows: another, state: true, confirmed: true},
			{seen: 50, received: 48, share: 1, flows: another, changed: true, confirmed: true},
		}},
		{"diverted, no conntrack: 3 clear intervals in a row", []step{
			{},
			{seen: 50, received: 0, share: 1, flows: diverted, changed: true, state: true, confirmed: true},
			{seen: 50, received: 50, share: 1, err: errNoModule, state: true, confirmed: true},
			{seen: 50, received: 50, share: 1, err: errNoModule, state: true, confirmed: true},
			{seen: 50, received: 50, share: 1, err: errNoModule, changed: true, confirmed: true},
		}},
		{"dropped, not DNATed: conntrack says no, and is asked again 10 intervals later", append(append([]step{
			{},
			{seen: 50, received: 0, share: 1, flows: plain, confirmed: true}},
			slices.Repeat([]step{{seen: 50, received: 0, share: 1, flows: plain}}, 9)...),
			step{seen: 50, received: 0, share: 1, flows: diverted, confirmed: true, changed: true, state: true},
		)},
		{"a clear interval resets the wait", []step{
			{},
			{seen: 50, received: 0, share: 1, flows: plain, confirmed: true},
			{seen: 50, received: 50, share: 1},
			{seen: 50, received: 0, share: 1, flows: plain, confirmed: true},
		}},
		{"no conntrack: three suspects in a row stand for it", []step{
			{},
			{seen: 50, received: 0, share: 1, err: errNoModule, confirmed: true},
			{seen: 50, received: 50, share: 1},
			{seen: 50, received: 0, share: 1, err: errNoModule, confirmed: true},
			{seen: 50, received: 0, share: 1, err: errNoModule, confirmed: true},
			{seen: 50, received: 0, share: 1, err: errNoModule, confirmed: true, changed: true, state: true},
		}},
		{"at the edge: conntrack is listed and confirms", []step{
			{},
			{seen: 1250, received: 1240, share: 1, flows: diverted, confirmed: true, changed: true, state: true},
		}},
		{"at the edge, not DNATed: listed again 10 intervals later", append(append([]step{
			{},
			{seen: 1250, received: 1240, share: 1, flows: plain, confirmed: true}},
			slices.Repeat([]step{{seen: 1250, received: 1240, share: 1, flows: plain}}, 9)...),
			step{seen: 1250, received: 1240, share: 1, flows: plain, confirmed: true},
		)},
		{"no conntrack: edge intervals stand for nothing", append([]step{{}},
			slices.Repeat([]step{{seen: 1250, received: 1240, share: 1, err: errNoModule, confirmed: true}}, 5)...),
		},
		{"no conntrack: edge intervals neither add to suspects nor end them", []step{
			{},
			{seen: 50, received: 0, share: 1, err: errNoModule, confirmed: true},
			{seen: 1250, received: 1240, share: 1, err: errNoModule, confirmed: true},
			{seen: 50, received: 0, share: 1, err: errNoModule, confirmed: true},
			{seen: 1250, received: 1240, share: 1, err: errNoModule, confirmed: true},
			{seen: 50, received: 0, share: 1, err: errNoModule, confirmed: true, changed: true, state: true},
		}},
		{"the first totals are a baseline", []step{
			{seen: 5000, received: 0, share: 1},
			{seen: 50, received: 50, share: 1},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := New(DefaultConfig())
			if err != nil {
				t.Fatal(err)
			}
			var c Counts
			for i, s := range tt.steps {
				c.Seen += s.seen
				c.Received += s.received
				asked := false
				changed, by, err := d.Step(c, s.share, func() ([]Flow, error) { asked = true; return s.flows, s.err }, listen)
				if changed != s.changed || d.Diverted() != s.state || asked != s.confirmed {
					t.Fatalf("step %d: changed %v diverted %v asked %v, want %v %v %v", i, changed, d.Diverted(), asked, s.changed, s.state, s.confirmed)
				}
				if !errors.Is(err, s.err) && s.err != nil {
					t.Errorf("step %d: err %v, want %v", i, err, s.err)
				}
				if changed && s.state && s.flows != nil && by != s.flows[0] {
					t.Errorf("step %d: confirmed by %+v, want %+v", i, by, s.flows[0])
				}
			}
		})
	}
}
