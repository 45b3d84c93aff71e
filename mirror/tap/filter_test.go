package tap

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"golang.org/x/net/bpf"
)

const packetHost = 0 // PACKET_HOST: a packet this host receives

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
	name  string
	addrs []netip.Addr
	port  uint16
	mark  uint32
	pkts  []filterPacket
}

// filterCases takes every branch of the filter, for the classic program
// in the VM (TestFilterVM) and its eBPF translation in the kernel
// (TestLocalProgramKernel).
func filterCases() []filterCase {
	payload := []byte("reply")
	from := func(a netip.Addr, port uint16) []byte { return reply(netip.AddrPortFrom(a, port), payload) }
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
		}},
		{"ipv4 only", []netip.Addr{localDNS}, 53, 0, []filterPacket{
			{name: "v4", pktType: out, data: from(localDNS, 53), pass: true},
			{name: "v6 from a v6 address", pktType: out, data: from(localDNS6, 53)},
			{name: "v6 carrying the v4 address mapped", pktType: out, data: from(netip.AddrFrom16(localDNS.As16()), 53)},
		}},
		{"ipv6 only, another port", []netip.Addr{localDNS6}, 5353, 0, []filterPacket{
			{name: "v6", pktType: out, data: from(localDNS6, 5353), pass: true},
			{name: "v6 port 53", pktType: out, data: from(localDNS6, 53)},
			{name: "v4", pktType: out, data: from(localDNS, 5353)},
		}},
		{"mapped address counts as ipv4", []netip.Addr{netip.AddrFrom16(localDNS.As16())}, 53, 0, []filterPacket{
			{name: "v4", pktType: out, data: from(localDNS, 53), pass: true},
		}},
		{"exclude mark", []netip.Addr{localDNS}, 53, 0x5d5, []filterPacket{
			{name: "unmarked", pktType: out, data: from(localDNS, 53), pass: true},
			{name: "other mark", pktType: out, mark: 0x5d4, data: from(localDNS, 53), pass: true},
			{name: "our mark", pktType: out, mark: 0x5d5, data: from(localDNS, 53)},
		}},
	}
}

func TestFilterVM(t *testing.T) {
	for _, tt := range filterCases() {
		t.Run(tt.name, func(t *testing.T) {
			spec, err := newFilterSpec(tt.addrs, tt.port, tt.mark)
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
	spec, err := newFilterSpec([]netip.Addr{localDNS, localDNS6, otherAddr}, 53, 9)
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

func TestFilterSpecLimits(t *testing.T) {
	// The most addresses allowed, all IPv6 (the longest program), assemble.
	spec, err := newFilterSpec(many(maxFilterAddrs), 53, 1)
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
		if _, err := newFilterSpec(tt.addrs, tt.port, 0); err == nil {
			t.Errorf("%s: no error", tt.name)
		}
	}
}
