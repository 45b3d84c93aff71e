package corefile

import (
	"errors"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestSelection checks which blocks serve the listen addresses: keys,
// ports, transports and bind.
func TestSelection(t *testing.T) {
	withInterfaces(t, map[string][]netip.Addr{
		"localdns": addrs("169.254.10.10", "169.254.10.11"),
		"eth0":     addrs("10.224.0.5", "fe80::1%eth0", "fd00::11"),
	})
	tests := []struct {
		name   string
		text   string
		listen []netip.AddrPort // default: the pod listener
		want   []string         // "zone:port@line", most specific first; nil: ErrNoServerBlock
		notes  []string
	}{
		{
			name: "bind matches",
			text: ".:53 {\n  bind 169.254.10.11\n}\n",
			want: []string{".:53@1"},
		},
		{
			name: "bind does not match",
			text: ".:53 {\n  bind 169.254.10.10\n}\n",
		},
		{
			name: "no bind listens everywhere",
			text: ".:53 {\n  whoami\n}\n",
			want: []string{".:53@1"},
		},
		{
			name: "key without port is 53",
			text: "cluster.local {\n}\n",
			want: []string{"cluster.local.:53@1"},
		},
		{
			name: "port mismatch",
			text: ".:1053 {\n  bind 169.254.10.11\n}\n",
		},
		{
			name:   "port other than 53",
			text:   ".:1053 {\n  bind 169.254.10.11\n}\n.:53 {\n  bind 169.254.10.11\n}\n",
			listen: addrPorts("169.254.10.11:1053"),
			want:   []string{".:1053@1"},
		},
		{
			name: "several keys in one block",
			text: "cluster.local in-addr.arpa:53 dns://ip6.arpa:53 {\n  bind 169.254.10.11\n}\n",
			want: []string{"cluster.local.:53@1", "in-addr.arpa.:53@1", "ip6.arpa.:53@1"},
		},
		{
			name: "keys on several lines with commas",
			text: "# comment\n\ncluster.local,\n  example.org {\n}\n",
			want: []string{"cluster.local.:53@3", "example.org.:53@3"},
		},
		{
			name: "keys with different ports keep the matching ones",
			text: ".:53 .:1053 {\n}\n",
			want: []string{".:53@1"},
		},
		{
			name: "upper case key",
			text: "Cluster.LOCAL.:53 {\n}\n",
			want: []string{"cluster.local.:53@1"},
		},
		{
			name: "classless reverse key",
			text: "10.0.0.0/23:53 {\n}\n",
			want: []string{"0.0.10.in-addr.arpa.:53@1", "1.0.10.in-addr.arpa.:53@1"},
		},
		{
			name:  "tls key is not plain DNS",
			text:  "tls://.:53 {\n}\ncluster.local {\n}\n",
			want:  []string{"cluster.local.:53@3"},
			notes: []string{`test.corefile:1: server block "tls://.:53" serves tls, not plain DNS; not used`},
		},
		{
			name: "tls key on its default port is not even considered",
			text: "tls://. {\n}\ncluster.local {\n}\n",
			want: []string{"cluster.local.:53@3"},
		},
		{
			name: "bind 0.0.0.0 covers IPv4",
			text: ".:53 {\n  bind 0.0.0.0\n}\n",
			want: []string{".:53@1"},
		},
		{
			name:   "bind 0.0.0.0 does not cover IPv6",
			text:   ".:53 {\n  bind 0.0.0.0\n}\n",
			listen: addrPorts("[fd00::11]:53"),
		},
		{
			name:   "bind :: covers both",
			text:   ".:53 {\n  bind ::\n}\n",
			listen: addrPorts("169.254.10.11:53", "[fd00::11]:53"),
			want:   []string{".:53@1"},
		},
		{
			name:   "IPv6 bind",
			text:   ".:53 {\n  bind fd00::11\n}\n",
			listen: addrPorts("[fd00::11]:53"),
			want:   []string{".:53@1"},
		},
		{
			name:   "IPv4-mapped listen address",
			text:   ".:53 {\n  bind 169.254.10.11\n}\n",
			listen: addrPorts("[::ffff:169.254.10.11]:53"),
			want:   []string{".:53@1"},
		},
		{
			name: "several bind lines add up",
			text: ".:53 {\n  bind 169.254.10.10\n  bind 169.254.10.11\n}\n",
			want: []string{".:53@1"},
		},
		{
			name: "bind except",
			text: ".:53 {\n  bind 169.254.10.10 169.254.10.11 {\n    except 169.254.10.11\n  }\n}\n",
		},
		{
			name: "bind by interface name",
			text: ".:53 {\n  bind localdns {\n    except 169.254.10.10\n  }\n}\n",
			want: []string{".:53@1"},
		},
		{
			name: "snippet and import of it",
			text: "(common) {\n  bind 169.254.10.11\n}\n.:53 {\n  import common\n}\n",
			want: []string{".:53@4"},
		},
		{
			name: "block without braces",
			text: "cluster.local:53\nbind 169.254.10.11\nwhoami\n",
			want: []string{"cluster.local.:53@1"},
		},
		{
			name: "a view lets two blocks share a zone",
			text: ".:53 {\n  view pods {\n    expr true\n  }\n}\n.:53 {\n}\n",
			want: []string{".:53@1", ".:53@6"},
		},
		{
			name: "block with brace on its own line",
			text: "cluster.local:53\n{\n  bind 169.254.10.11\n}\n.:53 {\n}\n",
			want: []string{"cluster.local.:53@1", ".:53@5"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			listen := tt.listen
			if listen == nil {
				listen = []netip.AddrPort{podListener}
			}
			s, err := Parse("test.corefile", strings.NewReader(tt.text), listen)
			if tt.want == nil {
				if !errors.Is(err, ErrNoServerBlock) {
					t.Fatalf("err = %v, zones %v; want ErrNoServerBlock", err, zoneNames(s))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, z := range s.Zones {
				got = append(got, z.Name+":"+strconv.Itoa(z.Port)+"@"+strconv.Itoa(z.Line))
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("zones = %q, want %q", got, tt.want)
			}
			var notes []string
			for _, n := range s.Notes {
				notes = append(notes, n.String())
			}
			if !slices.Equal(notes, tt.notes) {
				t.Errorf("notes = %q, want %q", notes, tt.notes)
			}
		})
	}
}

// TestServesAt checks that of two blocks for one zone, one bound to a
// wildcard and one to the listen address itself, the second gets the
// address's queries, as the kernel gives them to the exact socket.
func TestServesAt(t *testing.T) {
	s := parseText(t, ".:53 {\n  bind 0.0.0.0\n  forward . 10.0.0.1\n  loop\n}\n.:53 {\n  bind 169.254.10.11\n  forward . 10.0.0.2\n}\n", podListener, nodeListener)
	if z := s.ZoneForAddr(podListener, "x.example."); z == nil || z.Upstreams[0].Addr().String() != "10.0.0.2" {
		t.Errorf("pods' listener: %+v, want the block bound to it", z)
	}
	if z := s.ZoneForAddr(nodeListener, "x.example."); z == nil || z.Upstreams[0].Addr().String() != "10.0.0.1" {
		t.Errorf("node listener: %+v, want the wildcard block", z)
	}
}

func TestBindResolved(t *testing.T) {
	withInterfaces(t, map[string][]netip.Addr{
		"localdns": addrs("169.254.10.10", "169.254.10.11"),
		"eth0":     addrs("10.0.0.1"),
	})
	s := parseText(t, ".:53 {\n  bind localdns ::ffff:10.0.0.1\n}\n")
	if got, want := s.Zones[0].Bind, addrs("169.254.10.10", "169.254.10.11", "10.0.0.1"); !slices.Equal(got, want) {
		t.Errorf("Bind = %v, want %v", got, want)
	}
}

// TestServes checks Zone.Serves directly, zones included.
func TestServes(t *testing.T) {
	tests := []struct {
		bind []netip.Addr
		port int
		ap   string
		want bool
	}{
		{nil, 53, "169.254.10.11:53", true},
		{nil, 53, "169.254.10.11:54", false},
		{addrs("169.254.10.11"), 53, "169.254.10.11:53", true},
		{addrs("169.254.10.10"), 53, "169.254.10.11:53", false},
		{addrs("fe80::1%eth0"), 53, "[fe80::1]:53", true},
		{addrs("fe80::1"), 53, "[fe80::1%eth0]:53", true},
		{addrs("0.0.0.0"), 53, "[::1]:53", false},
		{addrs("::"), 53, "127.0.0.1:53", true},
	}
	for _, tt := range tests {
		z := Zone{Bind: tt.bind, Port: tt.port}
		if got := z.Serves(netip.MustParseAddrPort(tt.ap)); got != tt.want {
			t.Errorf("bind %v port %d: Serves(%s) = %v, want %v", tt.bind, tt.port, tt.ap, got, tt.want)
		}
	}
}

func TestNSID(t *testing.T) {
	withHostname(t, "aks-nodepool1-12345678-vmss000000")
	tests := []struct {
		text string
		want string
	}{
		{"nsid localdns-pod", "localdns-pod"},
		{"nsid two words", "two words"},
		{"nsid", "aks-nodepool1-12345678-vmss000000"},
		{"whoami", ""},
	}
	for _, tt := range tests {
		s := parseText(t, ".:53 {\n  "+tt.text+"\n}\n")
		if got := s.Zones[0].NSID; got != tt.want {
			t.Errorf("%q: NSID = %q, want %q", tt.text, got, tt.want)
		}
	}
}

func TestPluginsInOrder(t *testing.T) {
	s := parseText(t, ".:53 {\n  errors\n  hosts /etc/localdns/hosts {\n    fallthrough\n  }\n  forward . 10.0.0.10\n  log\n  log\n  rewrite name exact a.example. b.example.\n}\n")
	want := []string{"errors", "hosts", "forward", "log", "rewrite"}
	if got := s.Zones[0].Plugins; !slices.Equal(got, want) {
		t.Errorf("Plugins = %v, want %v", got, want)
	}
}

// TestUnservedBlocksChecked checks that a broken plugin in a block that
// does not serve the listen address refuses the Corefile all the same:
// CoreDNS refuses the whole file for it, so LocalDNS does not run it on
// any listener.
func TestUnservedBlocksChecked(t *testing.T) {
	_, err := Parse("test.corefile", strings.NewReader(".:53 {\n  bind 169.254.10.10\n  forward\n}\n.:53 {\n  bind 169.254.10.11\n}\n"), []netip.AddrPort{podListener})
	if want := `test.corefile:3: forward: wrong argument count or unexpected line ending after "forward"`; err == nil || err.Error() != want {
		t.Errorf("Parse: %v, want %s", err, want)
	}
}

func TestReverseZones(t *testing.T) {
	tests := []struct {
		prefix string
		want   []string
	}{
		{"10.0.0.0/8", []string{"10.in-addr.arpa."}},
		{"10.0.0.0/24", []string{"0.0.10.in-addr.arpa."}},
		{"10.1.2.3/24", []string{"2.1.10.in-addr.arpa."}},
		{"10.0.0.0/23", []string{"0.0.10.in-addr.arpa.", "1.0.10.in-addr.arpa."}},
		{"192.168.4.0/22", []string{"4.168.192.in-addr.arpa.", "5.168.192.in-addr.arpa.", "6.168.192.in-addr.arpa.", "7.168.192.in-addr.arpa."}},
		{"0.0.0.0/0", []string{"in-addr.arpa."}},
		{"10.0.0.1/32", []string{"1.0.0.10.in-addr.arpa."}},
		{"fd00::/16", []string{"0.0.d.f.ip6.arpa."}},
		{"fd00::/15", []string{"0.0.d.f.ip6.arpa.", "1.0.d.f.ip6.arpa."}},
		{"2001:db8::/33", []string{"0.8.b.d.0.1.0.0.2.ip6.arpa.", "1.8.b.d.0.1.0.0.2.ip6.arpa.", "2.8.b.d.0.1.0.0.2.ip6.arpa.", "3.8.b.d.0.1.0.0.2.ip6.arpa.", "4.8.b.d.0.1.0.0.2.ip6.arpa.", "5.8.b.d.0.1.0.0.2.ip6.arpa.", "6.8.b.d.0.1.0.0.2.ip6.arpa.", "7.8.b.d.0.1.0.0.2.ip6.arpa."}},
		{"::/0", []string{"ip6.arpa."}},
	}
	for _, tt := range tests {
		if got := reverseZones(netip.MustParsePrefix(tt.prefix)); !slices.Equal(got, tt.want) {
			t.Errorf("reverseZones(%s) = %q, want %q", tt.prefix, got, tt.want)
		}
	}
}
