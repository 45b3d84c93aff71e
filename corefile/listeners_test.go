package corefile

import (
	"net/netip"
	"testing"
)

func TestCovers(t *testing.T) {
	ap := netip.MustParseAddrPort
	tests := []struct {
		listen []netip.AddrPort
		at     netip.AddrPort
		want   bool
	}{
		{[]netip.AddrPort{ap("169.254.10.11:53")}, ap("169.254.10.11:53"), true},
		{[]netip.AddrPort{ap("169.254.10.11:53")}, ap("169.254.10.10:53"), false},
		{[]netip.AddrPort{ap("169.254.10.11:53")}, ap("169.254.10.11:5353"), false},
		{[]netip.AddrPort{ap("0.0.0.0:53")}, ap("169.254.10.10:53"), true},
		{[]netip.AddrPort{ap("0.0.0.0:53")}, ap("[fd00::10]:53"), false},
		{[]netip.AddrPort{ap("[::]:53")}, ap("169.254.10.10:53"), true},
		{nil, ap("169.254.10.10:53"), false},
	}
	for _, tt := range tests {
		if got := Covers(tt.listen, tt.at); got != tt.want {
			t.Errorf("Covers(%v, %v) = %v, want %v", tt.listen, tt.at, got, tt.want)
		}
	}
}
