package sockname

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestFromSockaddr(t *testing.T) {
	tests := []struct {
		name    string
		sa      unix.Sockaddr
		want    netip.AddrPort
		wantErr string
	}{
		{"ipv4", &unix.SockaddrInet4{Addr: [4]byte{169, 254, 10, 11}, Port: 53}, netip.MustParseAddrPort("169.254.10.11:53"), ""},
		{"ipv6", &unix.SockaddrInet6{Addr: netip.MustParseAddr("fd53::11").As16(), Port: 53}, netip.MustParseAddrPort("[fd53::11]:53"), ""},
		{"mapped stays mapped", &unix.SockaddrInet6{Addr: netip.MustParseAddr("::ffff:169.254.10.11").As16(), Port: 53}, netip.MustParseAddrPort("[::ffff:169.254.10.11]:53"), ""},
		{"unix", &unix.SockaddrUnix{Name: "/run/x"}, netip.AddrPort{}, "not an IPv4 or IPv6 socket"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := FromSockaddr(tt.sa)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("got %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

func TestOf(t *testing.T) {
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var got netip.AddrPort
	var gerr error
	if err := rc.Control(func(fd uintptr) { got, gerr = Of(int(fd)) }); err != nil {
		t.Fatal(err)
	}
	if want := c.LocalAddr().(*net.UDPAddr).AddrPort(); gerr != nil || got != want {
		t.Errorf("Of = %v, %v; want %v", got, gerr, want)
	}
}
