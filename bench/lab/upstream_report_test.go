package lab

import (
	"reflect"
	"testing"
)

func TestUpstreamCountsSince(t *testing.T) {
	n := func(v int) *int { return &v }
	for _, c := range []struct {
		name       string
		end, fault *UpstreamCounts
		want       *UpstreamCounts
	}{
		{"all read", &UpstreamCounts{n(1500), n(40), n(3), n(35)}, &UpstreamCounts{n(1000), n(30), n(1), n(28)}, &UpstreamCounts{n(500), n(10), n(2), n(7)}},
		// LocalDNS alone's node: no dnsstandby counters at either end.
		{"no dnsstandby", &UpstreamCounts{KubeDNSQueries: n(900)}, &UpstreamCounts{KubeDNSQueries: n(850)}, &UpstreamCounts{KubeDNSQueries: n(50)}},
		// Not read at the fault: not counted, rather than counted over the whole run.
		{"unread at the fault", &UpstreamCounts{n(1500), n(40), n(3), n(35)}, &UpstreamCounts{KubeDNSQueries: n(1000)}, &UpstreamCounts{KubeDNSQueries: n(500)}},
		{"no counts at the fault", &UpstreamCounts{n(1500), n(40), n(3), n(35)}, nil, nil},
	} {
		if got := c.end.Since(c.fault); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: Since = %+v, want %+v", c.name, got, c.want)
		}
	}
}
