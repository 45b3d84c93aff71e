package testkit

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/dnsstandby/dnsstandby/corefile"
)

// TestCorefileParses holds the fixture to what dnsstandby's own Corefile
// reader makes of it: the zones each listener serves and their forwards.
func TestCorefileParses(t *testing.T) {
	tests := []struct {
		name      string
		cf        Corefile
		listen    string
		wantZones []string
		wantUp    string // the root zone's first upstream, "" for none
		wantConc  int
	}{
		{"pod listener", Corefile{KubeDNS: "10.0.0.10", VnetDNS: "168.63.129.16"}, PodListener + ":53", []string{"health-check.localdns.local.", "."}, "10.0.0.10:53", 1000},
		{"node listener", Corefile{KubeDNS: "10.0.0.10", VnetDNS: "168.63.129.16", MaxConcurrent: 2000}, NodeListener + ":53", []string{"health-check.localdns.local.", "."}, "168.63.129.16:53", 2000},
		{"no node block", Corefile{KubeDNS: "10.0.0.10"}, NodeListener + ":53", []string{"health-check.localdns.local."}, "", 0},
		{"no forward", Corefile{Extra: "template ANY ANY {\n rcode NXDOMAIN\n}"}, PodListener + ":53", []string{"health-check.localdns.local.", "."}, "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			text := tt.cf.String()
			s, err := corefile.Parse("fixture", strings.NewReader(text), []netip.AddrPort{netip.MustParseAddrPort(tt.listen)})
			if err != nil {
				t.Fatalf("parse: %v\n%s", err, text)
			}
			var zones []string
			var up string
			var conc int
			for _, z := range s.Zones {
				zones = append(zones, z.Name)
				if z.Name == "." && len(z.Upstreams) > 0 {
					up, conc = z.Upstreams[0].String(), z.MaxConcurrent
				}
			}
			if strings.Join(zones, " ") != strings.Join(tt.wantZones, " ") || up != tt.wantUp || conc != tt.wantConc {
				t.Errorf("zones %v upstream %q max_concurrent %d; want %v %q %d\n%s", zones, up, conc, tt.wantZones, tt.wantUp, tt.wantConc, text)
			}
		})
	}
}

func TestEventually(t *testing.T) {
	n := 0
	Eventually(t, time.Second, "third call", func() bool { n++; return n == 3 })
	if n != 3 {
		t.Errorf("cond called %d times, want 3", n)
	}
}

func TestPoll(t *testing.T) {
	boom := errors.New("boom")
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name   string
		ctx    context.Context
		within time.Duration
		cond   func(n int) (bool, error)
		want   error
		calls  int // at least
	}{
		{"done at the third call", context.Background(), time.Second, func(n int) (bool, error) { return n == 3, nil }, nil, 3},
		{"cond's error", context.Background(), time.Second, func(n int) (bool, error) { return false, boom }, boom, 1},
		{"never done", context.Background(), 20 * time.Millisecond, func(int) (bool, error) { return false, nil }, ErrNotWithin, 2},
		{"ctx ended", canceled, time.Second, func(int) (bool, error) { return false, nil }, context.Canceled, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for name, p := range map[string]func(context.Context, time.Duration, func() (bool, error)) error{
				"Poll": Poll,
				"PollEvery": func(ctx context.Context, within time.Duration, cond func() (bool, error)) error {
					return PollEvery(ctx, within, time.Millisecond, cond)
				},
			} {
				n := 0
				err := p(tt.ctx, tt.within, func() (bool, error) { n++; return tt.cond(n) })
				if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
					t.Errorf("%s: %v, want %v", name, err, tt.want)
				}
				if n < tt.calls {
					t.Errorf("%s: cond called %d times, want at least %d", name, n, tt.calls)
				}
			}
		})
	}
}
