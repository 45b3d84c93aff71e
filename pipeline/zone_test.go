package pipeline

import (
	"testing"

	"github.com/miekg/dns"
)

func TestFetchZone(t *testing.T) {
	tests := []struct {
		name, zone, want string
	}{
		{"www.example.com.", ".", "example.com."},
		{"a.b.c.example.com.", ".", "example.com."},
		{"example.com.", ".", "example.com."},
		{"com.", ".", "com."},
		{".", ".", "."},
		{"a.b.example.co.uk.", ".", "example.co.uk."},
		{"co.uk.", ".", "co.uk."},
		{"rand-1234.slow.test.", ".", "slow.test."}, // test: not in the list, its last label is the suffix
		{"x.y.slow.test.", ".", "slow.test."},       // a random label at any depth
		{`x\.y.slow.test.`, ".", "slow.test."},      // a dot inside a label is no label boundary
		{`slow.x\.test.`, ".", `slow.x\.test.`},     // nor one in the suffix
		{"4.3.2.10.in-addr.arpa.", ".", "10.in-addr.arpa."},
		{"svc-0.default.svc.cluster.local.", "cluster.local.", "cluster.local."},
		{"svc-0.default.svc.cluster.local.", ".", "cluster.local."},
		{"a.b.corp.example.com.", "corp.example.com.", "corp.example.com."}, // the route's zone, longer
		{"a.b.internal.", "internal.", "b.internal."},                       // the registrable domain, longer
		{"bucket.s3.amazonaws.com.", ".", "bucket.s3.amazonaws.com."},       // a private suffix: each bucket its own
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name, zone := lowerWire(t, tt.name), lowerWire(t, tt.zone)
			got := fetchZone(name, len(zone))
			if want := lowerWire(t, tt.want); got != want {
				s, _, _ := dns.UnpackDomainName([]byte(got), 0)
				t.Errorf("fetchZone(%s) under %s = %s, want %s", tt.name, tt.zone, s, tt.want)
			}
		})
	}
}

// lowerWire is name in wire format, lower case.
func lowerWire(t *testing.T, name string) string {
	t.Helper()
	b := make([]byte, 256)
	n, err := dns.PackDomainName(dns.CanonicalName(name), b, 0, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	return string(b[:n])
}

// BenchmarkFetchZone is what finding a miss's fetch zone costs: a miss
// under the root route, where the public suffix list is read.
func BenchmarkFetchZone(b *testing.B) {
	b.ReportAllocs()
	wire := make([]byte, 256)
	n, _ := dns.PackDomainName("rand-0123456789.www.example.co.uk.", wire, 0, nil, false)
	name := string(wire[:n])
	for b.Loop() {
		if fetchZone(name, 1) == "" {
			b.Fatal("no zone")
		}
	}
}
