package check

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/dnsstandby/dnsstandby/takeover/peer"
)

var dotEleven = netip.MustParseAddr("169.254.10.11")

func TestAddressResult(t *testing.T) {
	tests := []struct {
		name      string
		addr      netip.Addr
		f         addrFacts
		want      Status
		wantFound string
	}{
		{"on both links", dotEleven, addrFacts{Links: map[netip.Addr][]string{dotEleven: {"localdns", "dnsstandby"}}}, Pass, "local on localdns, dnsstandby"},
		{"anchor only", dotEleven, addrFacts{Links: map[netip.Addr][]string{dotEleven: {"dnsstandby"}}}, Pass, "dnsstandby"},
		{"nowhere", dotEleven, addrFacts{Links: map[netip.Addr][]string{netip.MustParseAddr("10.0.0.4"): {"eth0"}}}, Fail, "on no link"},
		{"wildcard", netip.IPv4Unspecified(), addrFacts{Links: map[netip.Addr][]string{}}, Pass, "wildcard"},
		{"netlink error", dotEleven, addrFacts{Err: errors.New("operation not permitted")}, Warn, "cannot list"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := addressResult(tt.addr, tt.f)
			if r.Status != tt.want {
				t.Fatalf("%s, want %s: %s", r.Status, tt.want, r.Found)
			}
			checkRow(t, r, tt.wantFound, "")
		})
	}
}

func TestGroupResult(t *testing.T) {
	ap := netip.AddrPortFrom(dotEleven, 53)
	sock := func(proto peer.Proto, comm string, pid int, uid uint32) peer.Socket {
		return peer.Socket{Proto: proto, Addr: ap, Inode: uint64(pid)*10 + uint64(len(comm)), UID: uid, PID: pid, Comm: comm}
	}
	coredns := sock(peer.UDP, "coredns", 812, 0)
	standby := sock(peer.UDP, "dnsstandby", 640, 0)
	tests := []struct {
		name      string
		g         groupFacts
		daemonPID int
		want      Status
		wantFound string
		wantFix   string
	}{
		{"both, one UID", groupFacts{Addr: ap,
			UDP: []peer.Socket{coredns, standby, standby},
			TCP: []peer.Socket{sock(peer.TCP, "coredns", 812, 0), sock(peer.TCP, "dnsstandby", 640, 0)}},
			640, Pass, "udp: coredns[812] uid 0, dnsstandby[640] uid 0 ×2; tcp: coredns[812] uid 0, dnsstandby[640] uid 0", ""},
		// The daemon's PID tells its sockets even under another name.
		{"daemon by pid", groupFacts{Addr: ap, UDP: []peer.Socket{coredns, sock(peer.UDP, "standby", 640, 0)}}, 640, Pass, "standby[640]", ""},
		{"UIDs differ", groupFacts{Addr: ap, UDP: []peer.Socket{coredns, sock(peer.UDP, "dnsstandby", 640, 1000)}}, 640, Fail, "different UIDs", "UID 0"},
		{"UIDs differ on tcp", groupFacts{Addr: ap, UDP: []peer.Socket{coredns, standby},
			TCP: []peer.Socket{sock(peer.TCP, "coredns", 812, 0), sock(peer.TCP, "dnsstandby", 640, 101)}}, 0, Fail, "different UIDs", "UID 0"},
		{"localdns down", groupFacts{Addr: ap, UDP: []peer.Socket{standby}}, 640, Warn, "LocalDNS has no UDP socket", "localdns.service"},
		{"standby not running", groupFacts{Addr: ap, UDP: []peer.Socket{coredns}}, 0, Warn, "dnsstandby has no UDP socket", "systemctl start dnsstandby"},
		{"nobody", groupFacts{Addr: ap}, 0, Fail, "udp: none; tcp: none", "systemctl start"},
		{"owners not visible", groupFacts{Addr: ap, UDP: []peer.Socket{{Proto: peer.UDP, Addr: ap, Inode: 7, UID: 0}}}, 0, Warn, "owner not visible", "as root"},
		{"sock_diag error", groupFacts{Addr: ap, UDPErr: errors.New("no such file or directory (load module udp_diag)")}, 0, Warn, "udp_diag", "udp_diag"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := groupResult(tt.g, tt.daemonPID)
			if r.Name != "reuseport-group 169.254.10.11:53" || r.Status != tt.want {
				t.Fatalf("%s %s, want %s: %s (fix: %s)", r.Name, r.Status, tt.want, r.Found, r.Fix)
			}
			checkRow(t, r, tt.wantFound, tt.wantFix)
		})
	}
}

func TestStandbyPIDs(t *testing.T) {
	g := []groupFacts{{
		UDP: []peer.Socket{{Comm: "coredns", PID: 9}, {Comm: "dnsstandby", PID: 7}},
		TCP: []peer.Socket{{Comm: "dnsstandby", PID: 7}, {Comm: "dnsstandby", PID: 3}},
	}}
	if got := joinInts(standbyPIDs(g)); got != "3,7" {
		t.Fatalf("standbyPIDs = %s, want 3,7", got)
	}
}
