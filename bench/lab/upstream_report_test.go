package lab

import (
	"reflect"
	"testing"
)

func TestUpstreamCountsSince(t *testing.T) {
	n := func(v int) *int { return &v }
	// all is counts with every field read.
	all := func(kube, req, spec, toKube, localDNS int) *UpstreamCounts {
		return &UpstreamCounts{KubeDNSQueries: n(kube), StandbyRequests: n(req), StandbySpeculative: n(spec),
			StandbyToKubeDNS: n(toKube), LocalDNSToKubeDNS: n(localDNS)}
	}
	for _, c := range []struct {
		name       string
		end, fault *UpstreamCounts
		want       *UpstreamCounts
	}{
		{"all read", all(1500, 40, 3, 35, 1400), all(1000, 30, 1, 28, 950), all(500, 10, 2, 7, 450)},
		// LocalDNS alone's node: no dnsstandby counters at either end.
		{"no dnsstandby", &UpstreamCounts{KubeDNSQueries: n(900), LocalDNSToKubeDNS: n(880)}, &UpstreamCounts{KubeDNSQueries: n(850), LocalDNSToKubeDNS: n(830)},
			&UpstreamCounts{KubeDNSQueries: n(50), LocalDNSToKubeDNS: n(50)}},
		// Not read at the fault: not counted, rather than counted over the whole run.
		{"unread at the fault", all(1500, 40, 3, 35, 1400), &UpstreamCounts{KubeDNSQueries: n(1000)}, &UpstreamCounts{KubeDNSQueries: n(500)}},
		{"no counts at the fault", all(1500, 40, 3, 35, 1400), nil, nil},
	} {
		if got := c.end.Since(c.fault); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: Since = %+v, want %+v", c.name, got, c.want)
		}
	}
}
