package anchor

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestConfigDefaults(t *testing.T) {
	a11 := netip.MustParseAddr("169.254.10.11")
	v6 := netip.MustParseAddr("fd53::11")
	tests := []struct {
		name    string
		cfg     Config
		link    string
		kind    string
		addrs   []netip.Addr
		wantErr string
	}{
		{name: "defaults", cfg: Config{Addrs: []netip.Addr{a11}},
			link: "dnsstandby", kind: "dummy", addrs: []netip.Addr{a11}},
		{name: "bridge", cfg: Config{Link: "anchor0", Kind: "bridge", Addrs: []netip.Addr{a11, v6}},
			link: "anchor0", kind: "bridge", addrs: []netip.Addr{a11, v6}},
		{name: "mapped and duplicate", cfg: Config{Addrs: []netip.Addr{netip.MustParseAddr("::ffff:169.254.10.11"), a11}},
			link: "dnsstandby", kind: "dummy", addrs: []netip.Addr{a11}},
		{name: "zone dropped", cfg: Config{Addrs: []netip.Addr{netip.MustParseAddr("fe80::1%eth0")}},
			link: "dnsstandby", kind: "dummy", addrs: []netip.Addr{netip.MustParseAddr("fe80::1")}},
		{name: "no addresses", cfg: Config{}, wantErr: "no addresses"},
		{name: "zero address", cfg: Config{Addrs: []netip.Addr{{}}}, wantErr: "invalid"},
		{name: "unspecified", cfg: Config{Addrs: []netip.Addr{netip.IPv4Unspecified()}}, wantErr: "not a unicast"},
		{name: "multicast", cfg: Config{Addrs: []netip.Addr{netip.MustParseAddr("224.0.0.251")}}, wantErr: "not a unicast"},
		{name: "long name", cfg: Config{Link: "dnsstandby-anchor", Addrs: []netip.Addr{a11}}, wantErr: "IFNAMSIZ"},
		{name: "slash in name", cfg: Config{Link: "a/b", Addrs: []netip.Addr{a11}}, wantErr: "IFNAMSIZ"},
		{name: "bad kind", cfg: Config{Kind: "dum my", Addrs: []netip.Addr{a11}}, wantErr: "not a kernel link kind"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.cfg.withDefaults()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Link != tt.link || got.Kind != tt.kind || !slices.Equal(got.Addrs, tt.addrs) || got.Logger == nil {
				t.Errorf("got link %q kind %q addrs %v logger %v; want %q %q %v and a logger",
					got.Link, got.Kind, got.Addrs, got.Logger, tt.link, tt.kind, tt.addrs)
			}
		})
	}
}

func TestHostAddr(t *testing.T) {
	v4 := hostAddr(netip.MustParseAddr("169.254.10.11"))
	if v4.String() != "169.254.10.11/32" || v4.Flags != 0 {
		t.Errorf("v4 = %s flags %#x, want 169.254.10.11/32 flags 0", v4, v4.Flags)
	}
	v6 := hostAddr(netip.MustParseAddr("fd53::11"))
	if v6.String() != "fd53::11/128" || v6.Flags != 0x202 { // IFA_F_NODAD | IFA_F_NOPREFIXROUTE
		t.Errorf("v6 = %s flags %#x, want fd53::11/128 flags 0x202", v6, v6.Flags)
	}
}
