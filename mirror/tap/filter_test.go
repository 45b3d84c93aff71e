package tap

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"testing"

	"golang.org/x/net/bpf"
)

// vmPacket prepends the pseudo-header vmLoads reads the kernel's metadata
// from.
func vmPacket(pktType, mark, proto uint32, pkt []byte) []byte {
	h := make([]byte, vmHeaderLen, vmHeaderLen+len(pkt))
	binary.BigEndian.PutUint32(h[vmTypeOff:], pktType)
	binary.BigEndian.PutUint32(h[vmMarkOff:], mark)
	binary.BigEndian.PutUint32(h[vmProtoOff:], proto)
	return append(h, pkt...)
}

func etherTypeOf(pkt []byte) uint32 {
	if len(pkt) > 0 && pkt[0]>>4 == 6 {
		return etherTypeIPv6
	}
	return etherTypeIPv4
}

// filterPacket is a packet the filter is shown, with the metadata the
// kernel keeps beside it, and whether the filter passes it.
type filterPacket struct {
	name          string
	pktType, mark uint32
	proto         uint32 // 0: from the version nibble
	data          []byte
	pass          bool
	query         bool // it passes as a query (snapQuery), not as a reply
}

// vmBytes is p as the VM program reads it: behind the pseudo-header.
func (p filterPacket) vmBytes() []byte { return vmPacket(p.pktType, p.mark, p.ethertype(), p.data) }

func (p filterPacket) ethertype() uint32 {
	if p.proto != 0 {
		return p.proto
	}
	return etherTypeOf(p.data)
}

// filterCase is a filter spec and packets to show it.
type filterCase struct {
	name    string
	addrs   []netip.Addr
	port    uint16
	mark    uint32
	pkts    []filterPacket
	queries bool // Config.Queries
}

// filterCases takes every branch of the filter, for the classic program
// in the VM (TestFilterVM) and its eBPF translation in the kernel
// (TestLocalProgramKernel).
func filterCases() []filterCase {
	payload := []byte("reply")
	from := func(a netip.Addr, port uint16) []byte { return reply(netip.AddrPortFrom(a, port), payload) }
	to := func(a netip.Addr, port uint16) []byte { return query(netip.AddrPortFrom(a, port), payload) }
	second := netip.MustParseAddr("169.254.20.11")
	second6 := netip.MustParseAddr("fd00:20::11")
	both := []netip.Addr{localDNS, second, localDNS6, second6}

	out := uint32(packetOutgoing)
	return []filterCase{
		{"ipv4 and ipv6, two of each", both, 53, 0, []filterPacket{
			{name: "v4 first address", pktType: out, data: from(localDNS, 53), pass: true},
			{name: "v4 second address", pktType: out, data: from(second, 53), pass: true},
			{name: "v6 first address", pktType: out, data: from(localDNS6, 53), pass: true},
			{name: "v6 second address", pktType: out, data: from(second6, 53), pass: true},
			{name: "v4 with options", pktType: out, data: mutate(from(localDNS, 53), func(p []byte) []byte {
				o := append([]byte(nil), p[:ipv4MinHeader]...)
				o[0] = 0x47
				o = append(o, make([]byte, 8)...)
				return append(o, p[ipv4MinHeader:]...)
			}), pass: true},
			{name: "the marked packets pass without ExcludeMark", pktType: out, mark: 7, data: from(localDNS, 53), pass: true},

			{name: "incoming copy on lo", pktType: packetHost, data: from(localDNS, 53)},
			{name: "incoming v6", pktType: packetHost, data: from(localDNS6, 53)},
			{name: "other host's", pktType: 3, data: from(localDNS, 53)},
			{name: "v4 other address", pktType: out, data: from(otherAddr, 53)},
			{name: "v6 other address", pktType: out, data: from(otherAddr6, 53)},
			{name: "v6 differs in the last word only", pktType: out, data: from(netip.MustParseAddr("fd00:10::12"), 53)},
			{name: "v6 differs in the first word only", pktType: out, data: from(netip.MustParseAddr("fd01:10::11"), 53)},
			{name: "v4 other port", pktType: out, data: from(localDNS, 5353)},
			{name: "v6 other port", pktType: out, data: from(localDNS6, 54)},
			{name: "query to LocalDNS (destination port 53)", pktType: out,
				data: udpPacket(netip.AddrPortFrom(podAddr, 53000), netip.AddrPortFrom(localDNS, 53), payload)},
			{name: "v4 TCP", pktType: out, data: mutate(from(localDNS, 53), func(p []byte) []byte { p[9] = 6; return p })},
			{name: "v4 more fragments", pktType: out, data: mutate(from(localDNS, 53), func(p []byte) []byte { p[6] |= 0x20; return p })},
			{name: "v4 later fragment", pktType: out, data: mutate(from(localDNS, 53), func(p []byte) []byte { p[7] = 1; return p })},
			{name: "v6 fragment header", pktType: out, data: withIPv6NextHeader(from(localDNS6, 53), 44)},
			{name: "v6 hop-by-hop", pktType: out, data: withIPv6NextHeader(from(localDNS6, 53), 0)},
			{name: "v6 TCP", pktType: out, data: mutate(from(localDNS6, 53), func(p []byte) []byte { p[6] = 6; return p })},
			{name: "ARP ethertype", pktType: out, proto: 0x0806, data: from(localDNS, 53)},
			{name: "v4 bytes under the v6 ethertype", pktType: out, proto: etherTypeIPv6, data: from(localDNS, 53)},
			{name: "v6 bytes under the v4 ethertype", pktType: out, proto: etherTypeIPv4, data: from(localDNS6, 53)},
			{name: "truncated before the port", pktType: out, data: from(localDNS, 53)[:ipv4MinHeader]},
			{name: "empty", pktType: out, data: nil},
		}, false},
		{"ipv4 only", []netip.Addr{localDNS}, 53, 0, []filterPacket{
			{name: "v4", pktType: out, data: from(localDNS, 53), pass: true},
			{name: "v6 from a v6 address", pktType: out, data: from(localDNS6, 53)},
			{name: "v6 carrying the v4 address mapped", pktType: out, data: from(netip.AddrFrom16(localDNS.As16()), 53)},
		}, false},
		{"ipv6 only, another port", []netip.Addr{localDNS6}, 5353, 0, []filterPacket{
			{name: "v6", pktType: out, data: from(localDNS6, 5353), pass: true},
			{name: "v6 port 53", pktType: out, data: from(localDNS6, 53)},
			{name: "v4", pktType: out, data: from(localDNS, 5353)},
		}, false},
		{"mapped address counts as ipv4", []netip.Addr{netip.AddrFrom16(localDNS.As16())}, 53, 0, []filterPacket{
			{name: "v4", pktType: out, data: from(localDNS, 53), pass: true},
		}, false},
		{"exclude mark", []netip.Addr{localDNS}, 53, 0x5d5, []filterPacket{
			{name: "unmarked", pktType: out, data: from(localDNS, 53), pass: true},
			{name: "other mark", pktType: out, mark: 0x5d4, data: from(localDNS, 53), pass: true},
			{name: "our mark", pktType: out, mark: 0x5d5, data: from(localDNS, 53)},
		}, false},
		{"without queries, no query passes", both, 53, 0, []filterPacket{
			{name: "v4 query", pktType: packetHost, data: to(localDNS, 53)},
			{name: "v6 query", pktType: packetHost, data: to(localDNS6, 53)},
			{name: "v4 reply", pktType: out, data: from(localDNS, 53), pass: true},
		}, false},
		{"queries, ipv4 and ipv6, two of each", both, 53, 0, queryPackets(both, payload), true},
		{"queries, ipv4 only", []netip.Addr{localDNS}, 53, 0, []filterPacket{
			{name: "v4 query", pktType: packetHost, data: to(localDNS, 53), pass: true, query: true},
			{name: "v4 reply", pktType: out, data: from(localDNS, 53), pass: true},
			{name: "v6 query to a v6 address", pktType: packetHost, data: to(localDNS6, 53)},
			{name: "v4 query to the second address", pktType: packetHost, data: to(second, 53)},
		}, true},
		{"queries, ipv6 only, another port", []netip.Addr{localDNS6}, 5353, 0, []filterPacket{
			{name: "v6 query", pktType: packetHost, data: to(localDNS6, 5353), pass: true, query: true},
			{name: "v6 query to port 53", pktType: packetHost, data: to(localDNS6, 53)},
			{name: "v6 reply", pktType: out, data: from(localDNS6, 5353), pass: true},
			{name: "v4 query", pktType: packetHost, data: to(localDNS, 5353)},
		}, true},
		{"queries, exclude mark", []netip.Addr{localDNS}, 53, 0x5d5, []filterPacket{
			{name: "unmarked query", pktType: packetHost, data: to(localDNS, 53), pass: true, query: true},
			{name: "query with another mark", pktType: packetHost, mark: 0x5d4, data: to(localDNS, 53), pass: true, query: true},
			{name: "our own query (a probe), marked", pktType: packetHost, mark: 0x5d5, data: to(localDNS, 53)},
			{name: "unmarked reply", pktType: out, data: from(localDNS, 53), pass: true},
			{name: "our marked reply", pktType: out, mark: 0x5d5, data: from(localDNS, 53)},
		}, true},
	}
}

// queryPackets are the query path's cases for a filter listening on addrs
// (localDNS, localDNS6 and two more) at port 53, with the reply path's
// main cases beside them: both paths in one program.
func queryPackets(addrs []netip.Addr, payload []byte) []filterPacket {
	out := uint32(packetOutgoing)
	to := func(a netip.Addr, port uint16) []byte { return query(netip.AddrPortFrom(a, port), payload) }
	var pkts []filterPacket
	for _, a := range addrs {
		pkts = append(pkts,
			filterPacket{name: "query to " + a.String(), pktType: packetHost, data: to(a, 53), pass: true, query: true},
			filterPacket{name: "reply from " + a.String(), pktType: out, data: reply(netip.AddrPortFrom(a, 53), payload), pass: true},
		)
	}
	return append(pkts, []filterPacket{
		{name: "v4 query with options", pktType: packetHost, data: mutate(to(localDNS, 53), func(p []byte) []byte {
			o := append([]byte(nil), p[:ipv4MinHeader]...)
			o[0] = 0x47
			o = append(o, make([]byte, 8)...)
			return append(o, p[ipv4MinHeader:]...)
		}), pass: true, query: true},
		{name: "query from a forged source (LocalDNS's own)", pktType: packetHost,
			data: udpPacket(netip.AddrPortFrom(localDNS, 53), netip.AddrPortFrom(localDNS, 53), payload), pass: true, query: true},
		{name: "the marked queries pass without ExcludeMark", pktType: packetHost, mark: 7, data: to(localDNS, 53), pass: true, query: true},

		{name: "outgoing copy of a query (lo, or a pod's query forwarded)", pktType: out, data: to(localDNS, 53)},
		{name: "outgoing copy of a v6 query", pktType: out, data: to(localDNS6, 53)},
		{name: "incoming copy of a reply (lo)", pktType: packetHost, data: reply(netip.AddrPortFrom(localDNS, 53), payload)},
		{name: "query for another host (bridge port, promiscuous)", pktType: 3, data: to(localDNS, 53)},
		{name: "broadcast query", pktType: 1, data: to(localDNS, 53)},
		{name: "v4 query to another address", pktType: packetHost, data: to(otherAddr, 53)},
		{name: "v6 query to another address", pktType: packetHost, data: to(otherAddr6, 53)},
		{name: "v6 query, address differs in the last word only", pktType: packetHost, data: to(netip.MustParseAddr("fd00:10::12"), 53)},
		{name: "v6 query, address differs in the first word only", pktType: packetHost, data: to(netip.MustParseAddr("fd01:10::11"), 53)},
		{name: "v4 query to another port", pktType: packetHost, data: to(localDNS, 5353)},
		{name: "v6 query to another port", pktType: packetHost, data: to(localDNS6, 54)},
		{name: "v4 query from port 53 to another port", pktType: packetHost,
			data: udpPacket(netip.AddrPortFrom(podAddr, 53), netip.AddrPortFrom(localDNS, 40000), payload)},
		{name: "v4 TCP query", pktType: packetHost, data: mutate(to(localDNS, 53), func(p []byte) []byte { p[9] = 6; return p })},
		{name: "v4 query, more fragments", pktType: packetHost, data: mutate(to(localDNS, 53), func(p []byte) []byte { p[6] |= 0x20; return p })},
		{name: "v4 query, later fragment", pktType: packetHost, data: mutate(to(localDNS, 53), func(p []byte) []byte { p[7] = 1; return p })},
		{name: "v6 query, fragment header", pktType: packetHost, data: withIPv6NextHeader(to(localDNS6, 53), 44)},
		{name: "v6 query, destination options", pktType: packetHost, data: withIPv6NextHeader(to(localDNS6, 53), 60)},
		{name: "v6 TCP query", pktType: packetHost, data: mutate(to(localDNS6, 53), func(p []byte) []byte { p[6] = 6; return p })},
		{name: "query, ARP ethertype", pktType: packetHost, proto: 0x0806, data: to(localDNS, 53)},
		{name: "v4 query under the v6 ethertype", pktType: packetHost, proto: etherTypeIPv6, data: to(localDNS, 53)},
		{name: "v6 query under the v4 ethertype", pktType: packetHost, proto: etherTypeIPv4, data: to(localDNS6, 53)},
		{name: "query truncated before the port", pktType: packetHost, data: to(localDNS, 53)[:ipv4MinHeader]},
		{name: "empty received packet", pktType: packetHost, data: nil},
	}...)
}

func TestFilterVM(t *testing.T) {
	for _, tt := range filterCases() {
		t.Run(tt.name, func(t *testing.T) {
			spec, err := newFilterSpec(tt.addrs, tt.port, tt.mark, tt.queries)
			if err != nil {
				t.Fatal(err)
			}
			prog, err := spec.program(vmLoads)
			if err != nil {
				t.Fatal(err)
			}
			vm, err := bpf.NewVM(prog)
			if err != nil {
				t.Fatalf("%v\n%s", err, spec.listing(vmLoads))
			}
			for _, p := range tt.pkts {
				in := p.vmBytes()
				n, err := vm.Run(in)
				if err != nil {
					t.Fatalf("%s: %v", p.name, err)
				}
				if pass := n > 0; pass != p.pass {
					t.Errorf("%s: passed %v, want %v\n%s", p.name, pass, p.pass, spec.listing(vmLoads))
				} else if pass && n < len(in) {
					t.Errorf("%s: keeps %d of %d bytes", p.name, n, len(in))
				} else if asQuery := n == snapQuery; pass && asQuery != p.query {
					t.Errorf("%s: passed as a query %v, want %v", p.name, asQuery, p.query)
				}
			}
		})
	}
}

// TestFilterKernelMatchesVM checks that the kernel's program is the VM's
// but for where it reads the metadata: an ancillary load where the VM reads
// its pseudo-header, every packet offset vmHeaderLen lower. So what the VM
// test shows holds for the kernel's program, given the kernel's ancillary
// loads mean what they say (the root test shows that).
func TestFilterKernelMatchesVM(t *testing.T) {
	for _, queries := range []bool{false, true} {
		t.Run(fmt.Sprintf("queries=%v", queries), func(t *testing.T) { testFilterKernelMatchesVM(t, queries) })
	}
}

func testFilterKernelMatchesVM(t *testing.T, queries bool) {
	spec, err := newFilterSpec([]netip.Addr{localDNS, localDNS6, otherAddr}, 53, 9, queries)
	if err != nil {
		t.Fatal(err)
	}
	kprog, err := spec.program(kernelLoads)
	if err != nil {
		t.Fatal(err)
	}
	vprog, err := spec.program(vmLoads)
	if err != nil {
		t.Fatal(err)
	}
	if len(kprog) != len(vprog) {
		t.Fatalf("kernel program %d instructions, VM program %d", len(kprog), len(vprog))
	}
	ext := map[bpf.Extension]uint32{bpf.ExtType: vmTypeOff, bpf.ExtMark: vmMarkOff, bpf.ExtProto: vmProtoOff}
	for i := range kprog {
		k, v := kprog[i], vprog[i]
		var want bpf.Instruction
		switch k := k.(type) {
		case bpf.LoadExtension:
			off, ok := ext[k.Num]
			if !ok {
				t.Fatalf("%d: extension %d has no VM counterpart", i, k.Num)
			}
			want = bpf.LoadAbsolute{Off: off, Size: 4}
		case bpf.LoadAbsolute:
			want = bpf.LoadAbsolute{Off: k.Off + vmHeaderLen, Size: k.Size}
		case bpf.LoadIndirect:
			want = bpf.LoadIndirect{Off: k.Off + vmHeaderLen, Size: k.Size}
		case bpf.LoadMemShift:
			want = bpf.LoadMemShift{Off: k.Off + vmHeaderLen}
		default:
			want = k
		}
		if v != want {
			t.Errorf("%d: kernel %v, VM %v, want VM %v", i, k, v, want)
		}
	}
	if _, err := bpf.Assemble(kprog); err != nil {
		t.Errorf("kernel program does not assemble: %v\n%s", err, spec.listing(kernelLoads))
	}
}

// TestFilterQueriesOff pins the program without Queries: instruction for
// instruction and comment for comment, what it was before the query path
// was added (testdata/filter_replies.golden).
func TestFilterQueriesOff(t *testing.T) {
	spec, err := newFilterSpec([]netip.Addr{localDNS, localDNS6, otherAddr}, 53, 9, false)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("testdata/filter_replies.golden")
	if err != nil {
		t.Fatal(err)
	}
	if got := spec.listing(kernelLoads); got != string(want) {
		t.Errorf("program without queries changed:\n%s\nwant:\n%s", got, want)
	}
	// With queries, the reply path is the same program up to its exits,
	// behind one more test of the packet type.
	spec.queries = true
	without, _ := newFilterSpec([]netip.Addr{localDNS, localDNS6, otherAddr}, 53, 9, false)
	off, err := without.program(kernelLoads)
	if err != nil {
		t.Fatal(err)
	}
	on, err := spec.program(kernelLoads)
	if err != nil {
		t.Fatal(err)
	}
	if len(on) <= len(off)+1 || on[0] != off[0] || on[1] != (bpf.JumpIf{Cond: bpf.JumpEqual, Val: packetHost, SkipTrue: uint8(len(off) - 1)}) {
		t.Fatalf("query test not first, or not jumping past the reply path:\n%s", spec.listing(kernelLoads))
	}
	for i := 1; i < len(off); i++ {
		if on[i+1] != off[i] {
			t.Errorf("reply path differs at %d: %v, want %v", i, on[i+1], off[i])
		}
	}
}

func TestFilterSpecLimits(t *testing.T) {
	// The most addresses allowed, all IPv6 (the longest program), assemble,
	// with the query path too.
	for _, queries := range []bool{false, true} {
		spec, err := newFilterSpec(many(maxFilterAddrs), 53, 1, queries)
		if err != nil {
			t.Fatal(err)
		}
		prog, err := spec.program(kernelLoads)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := bpf.Assemble(prog); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		name  string
		addrs []netip.Addr
		port  uint16
	}{
		{"no addresses", nil, 53},
		{"too many", many(maxFilterAddrs + 1), 53},
		{"port 0", []netip.Addr{localDNS}, 0},
		{"invalid address", []netip.Addr{{}}, 53},
		{"zone", []netip.Addr{netip.MustParseAddr("fe80::1%eth0")}, 53},
	} {
		if _, err := newFilterSpec(tt.addrs, tt.port, 0, false); err == nil {
			t.Errorf("%s: no error", tt.name)
		}
	}
}
