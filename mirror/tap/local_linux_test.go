package tap

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// skBuff is struct __sk_buff as BPF_PROG_TEST_RUN takes it for a socket
// filter: the kernel copies mark and ingress_ifindex (among a few others)
// into the skb it runs the program on.
type skBuff [192 / 4]uint32

// runFilter runs prog in the kernel (BPF_PROG_TEST_RUN) on pkt behind an
// Ethernet header of the given ethertype (the test run sets skb->protocol
// from it and starts the program's data after it), with the skb mark and
// ingress ifindex given, and returns what the filter returned.
func runFilter(t *testing.T, prog *ebpf.Program, ethertype uint16, pkt []byte, mark, ingress uint32) uint32 {
	t.Helper()
	frame := make([]byte, 14, 14+len(pkt))
	binary.BigEndian.PutUint16(frame[12:], ethertype)
	frame = append(frame, pkt...)
	var ctx skBuff
	ctx[skbMark/4] = mark
	ctx[skbIngressIfindex/4] = ingress
	ret, err := prog.Run(&ebpf.RunOptions{Data: frame, Context: ctx})
	if err != nil {
		t.Fatalf("BPF_PROG_TEST_RUN on %d bytes, ethertype %#x: %v", len(pkt), ethertype, err)
	}
	return ret
}

// loadOrSkip loads the translation of prog, skipping the test where this
// process may not load BPF programs.
func loadOrSkip(t *testing.T, prog []bpf.Instruction) *ebpf.Program {
	t.Helper()
	insns, err := localProgram(prog)
	if err != nil {
		t.Fatal(err)
	}
	p, err := loadLocal(insns)
	if errors.Is(err, unix.EPERM) || errors.Is(err, ebpf.ErrNotSupported) {
		t.Skipf("cannot load a socket filter here: %v", err)
	}
	if err != nil {
		t.Fatalf("%v\n%v", err, insns)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// TestLocalProgramKernel runs the eBPF translation of the filter in the
// kernel on every packet TestFilterVM shows the classic program, and
// checks that it returns what the VM did for a packet the host sent
// (ingress ifindex 0) and drops every one that was received first. The VM
// program reads its metadata from the pseudo-header, so this covers every
// branch; the kernel program's own metadata loads (mark and protocol; the
// test run cannot make a packet PACKET_OUTGOING) are checked on the
// program less its direction test.
func TestLocalProgramKernel(t *testing.T) {
	for _, tt := range filterCases() {
		t.Run(tt.name, func(t *testing.T) {
			spec, err := newFilterSpec(tt.addrs, tt.port, tt.mark, tt.queries)
			if err != nil {
				t.Fatal(err)
			}
			vprog, err := spec.program(vmLoads)
			if err != nil {
				t.Fatal(err)
			}
			vm, err := bpf.NewVM(vprog)
			if err != nil {
				t.Fatal(err)
			}
			viaVM := loadOrSkip(t, vprog)
			kprog, err := spec.program(kernelLoads)
			if err != nil {
				t.Fatal(err)
			}
			// Without its packet-type tests (load pkt_type; with queries,
			// to the query path if PACKET_HOST; drop unless outgoing): jumps
			// are relative, the reply path stands alone.
			// With queries, the query path follows the reply path's exits
			// and is cut off (the verifier refuses unreachable code).
			replyPath := kprog[2:]
			if tt.queries {
				off := spec
				off.queries = false
				offProg, err := off.program(kernelLoads)
				if err != nil {
					t.Fatal(err)
				}
				replyPath = kprog[3 : len(offProg)+1]
			}
			withLoads := loadOrSkip(t, replyPath)
			// The whole program: the test run makes its packet PACKET_HOST
			// (eth_type_trans on lo, whose address the frame's zero
			// destination is), so it takes the query path.
			whole := loadOrSkip(t, kprog)
			for _, p := range tt.pkts {
				in := p.vmBytes()
				want, err := vm.Run(in)
				if err != nil {
					t.Fatalf("%s: VM: %v", p.name, err)
				}
				const experimental = 0x88b5 // IEEE 802 local experimental: no header parsed
				if got := runFilter(t, viaVM, experimental, in, 0, 0); got != uint32(want) {
					t.Errorf("%s, sent by the host: eBPF returned %d, classic %d", p.name, got, want)
				}
				// A reply received first was forwarded: dropped. A query is
				// always received, and passes as the classic filter says.
				wantRecv := uint32(0)
				if p.query {
					wantRecv = uint32(want)
				}
				if got := runFilter(t, viaVM, experimental, in, 0, 7); got != wantRecv {
					t.Errorf("%s, received on ifindex 7: eBPF returned %d, want %d", p.name, got, wantRecv)
				}
				if len(p.data) == 0 || p.ethertype() == etherTypeIPv6 && len(p.data) < ipv6Header {
					continue // the test run refuses these (EINVAL)
				}
				switch p.pktType {
				case packetOutgoing:
					got := runFilter(t, withLoads, uint16(p.ethertype()), p.data, p.mark, 0)
					if pass := got > 0; pass != p.pass {
						t.Errorf("%s, kernel loads: passed %v, want %v", p.name, pass, p.pass)
					}
				case packetHost:
					got := runFilter(t, whole, uint16(p.ethertype()), p.data, p.mark, 7)
					if pass := got > 0; pass != p.pass || pass && (got == snapQuery) != p.query {
						t.Errorf("%s, kernel loads, received: returned %d, want pass %v (as a query %v)", p.name, got, p.pass, p.query)
					}
				}
			}
		})
	}
}

// TestLocalProgram checks the translation: the longest filter the tap
// builds translates, and an instruction it does not know is an error
// rather than a filter that means something else.
func TestLocalProgram(t *testing.T) {
	for _, queries := range []bool{false, true} {
		spec, err := newFilterSpec(many(maxFilterAddrs), 53, 1, queries)
		if err != nil {
			t.Fatal(err)
		}
		prog, err := spec.program(kernelLoads)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := localProgram(prog); err != nil {
			t.Fatalf("longest filter, queries %v: %v", queries, err)
		}
	}
	for _, tt := range []struct {
		name string
		prog []bpf.Instruction
		want string
	}{
		{"scratch memory", []bpf.Instruction{bpf.LoadScratch{N: 0}, bpf.RetA{}}, "bpf.LoadScratch"},
		{"other extension", []bpf.Instruction{bpf.LoadExtension{Num: bpf.ExtCPUID}, bpf.RetA{}}, "extension"},
		{"other ALU op", []bpf.Instruction{bpf.ALUOpConstant{Op: bpf.ALUOpAdd, Val: 1}, bpf.RetA{}}, "ALU op"},
		{"other jump test", []bpf.Instruction{bpf.JumpIf{Cond: bpf.JumpGreaterThan, Val: 1}, bpf.RetA{}}, "jump test"},
		{"eight-byte load", []bpf.Instruction{bpf.LoadAbsolute{Off: 0, Size: 8}, bpf.RetA{}}, "8 bytes"},
	} {
		if _, err := localProgram(tt.prog); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error about %q", tt.name, err, tt.want)
		}
	}
}
