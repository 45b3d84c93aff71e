package anchor

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestConfigValidated(t *testing.T) {
	a11 := netip.MustParseAddr("169.254.10.11")
	v6 := netip.MustParseAddr("fd53::11")
	with := func(change func(*Config)) Config {
		c := DefaultConfig()
		c.Addrs = []netip.Addr{a11}
		change(&c)
		return c
	}
	tests := []struct {
		name    string
		cfg     Config
		link    string
		kind    string
		addrs   []netip.Addr
		wantErr string
	}{
		{name: "defaults", cfg: with(func(*Config) {}),
			link: "dnsstandby", kind: "dummy", addrs: []netip.Addr{a11}},
		{name: "bridge", cfg: with(func(c *Config) { c.Link, c.Kind, c.Addrs = "anchor0", "bridge", []netip.Addr{a11, v6} }),
			link: "anchor0", kind: "bridge", addrs: []netip.Addr{a11, v6}},
		{name: "mapped and duplicate", cfg: with(func(c *Config) { c.Addrs = []netip.Addr{netip.MustParseAddr("::ffff:169.254.10.11"), a11} }),
			link: "dnsstandby", kind: "dummy", addrs: []netip.Addr{a11}},
		{name: "zone dropped", cfg: with(func(c *Config) { c.Addrs = []netip.Addr{netip.MustParseAddr("fe80::1%eth0")} }),
			link: "dnsstandby", kind: "dummy", addrs: []netip.Addr{netip.MustParseAddr("fe80::1")}},
		{name: "no addresses", cfg: DefaultConfig(), wantErr: "anchor: Addrs must hold at least one address"},
		{name: "zero address", cfg: with(func(c *Config) { c.Addrs = []netip.Addr{{}} }), wantErr: "anchor: Addrs: invalid"},
		{name: "unspecified", cfg: with(func(c *Config) { c.Addrs = []netip.Addr{netip.IPv4Unspecified()} }), wantErr: "not a unicast"},
		{name: "multicast", cfg: with(func(c *Config) { c.Addrs = []netip.Addr{netip.MustParseAddr("224.0.0.251")} }), wantErr: "not a unicast"},
		{name: "no name", cfg: with(func(c *Config) { c.Link = "" }), wantErr: `anchor: Link ""`},
		{name: "long name", cfg: with(func(c *Config) { c.Link = "dnsstandby-anchor" }), wantErr: "IFNAMSIZ"},
		{name: "slash in name", cfg: with(func(c *Config) { c.Link = "a/b" }), wantErr: "IFNAMSIZ"},
		{name: "no kind", cfg: with(func(c *Config) { c.Kind = "" }), wantErr: `anchor: Kind "": not a kernel link kind`},
		{name: "bad kind", cfg: with(func(c *Config) { c.Kind = "dum my" }), wantErr: "not a kernel link kind"},
		{name: "source toward", cfg: with(func(c *Config) {
			c.SourceToward = map[netip.Addr]netip.Addr{a11: netip.MustParseAddr("::ffff:10.0.0.10")}
		}),
			link: "dnsstandby", kind: "dummy", addrs: []netip.Addr{a11}},
		{name: "source for an address not held", cfg: with(func(c *Config) {
			c.SourceToward = map[netip.Addr]netip.Addr{netip.MustParseAddr("169.254.10.10"): netip.MustParseAddr("10.0.0.10")}
		}), wantErr: "anchor: SourceToward: 169.254.10.10 is not one of Addrs' IPv4 addresses"},
		{name: "source for IPv6", cfg: with(func(c *Config) {
			c.Addrs = []netip.Addr{a11, v6}
			c.SourceToward = map[netip.Addr]netip.Addr{v6: netip.MustParseAddr("10.0.0.10")}
		}), wantErr: "is not one of Addrs' IPv4 addresses"},
		{name: "source toward IPv6", cfg: with(func(c *Config) { c.SourceToward = map[netip.Addr]netip.Addr{a11: v6} }),
			wantErr: "anchor: SourceToward[169.254.10.11]: fd53::11 is not an IPv4 unicast address"},
		{name: "source toward nothing", cfg: with(func(c *Config) { c.SourceToward = map[netip.Addr]netip.Addr{a11: {}} }),
			wantErr: "is not an IPv4 unicast address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.cfg.validated()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for held, to := range got.SourceToward {
				if held.Is4In6() || to.Is4In6() {
					t.Errorf("SourceToward %s → %s: not unmapped", held, to)
				}
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
