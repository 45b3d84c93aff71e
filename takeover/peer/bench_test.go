package peer

import (
	"net/netip"
	"testing"
)

// BenchmarkRescan is what a Watcher spends per rescan of one address while
// LocalDNS keeps its sockets: a UDP and a TCP sock_diag dump filtered by
// the kernel to one port (no /proc scan: the owners are known).
func BenchmarkRescan(b *testing.B) {
	d, err := openDiag()
	if err != nil {
		b.Skip(err)
	}
	defer d.close()
	addr := netip.MustParseAddrPort("127.0.0.1:53")
	for b.Loop() {
		for _, proto := range []Proto{UDP, TCP} {
			if _, err := d.bound([]netip.AddrPort{addr}, proto, nil); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkOwnerScan is the worst case of finding a socket's holder: every
// process's fds read, none holds it (a LocalDNS that just restarted is
// found on the way, usually sooner).
func BenchmarkOwnerScan(b *testing.B) {
	for b.Loop() {
		socks := []Socket{{Inode: 1<<64 - 1}}
		if err := fillOwners(procRoot, socks, nil); err != nil {
			b.Fatal(err)
		}
	}
}
