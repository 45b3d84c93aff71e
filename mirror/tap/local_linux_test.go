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
			spec, err := newFilterSpec(tt.addrs, tt.port, tt.mark)
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
			// Without its first two instructions (load pkt_type; drop
			// unless outgoing): jumps are relative, the rest stands alone.
			withLoads := loadOrSkip(t, kprog[2:])
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
				if got := runFilter(t, viaVM, experimental, in, 0, 7); got != 0 {
					t.Errorf("%s, received on ifindex 7: eBPF returned %d, want 0", p.name, got)
				}
				switch {
				case p.pktType != packetOutgoing:
					continue // the test run cannot make a packet outgoing
				case len(p.data) == 0, p.ethertype() == etherTypeIPv6 && len(p.data) < ipv6Header:
					continue // the test run refuses these (EINVAL)
				}
				got := runFilter(t, withLoads, uint16(p.ethertype()), p.data, p.mark, 0)
				if pass := got > 0; pass != p.pass {
					t.Errorf("%s, kernel loads: passed %v, want %v", p.name, pass, p.pass)
				}
			}
		})
	}
}

// TestLocalProgram checks the translation: the longest filter the tap
// builds translates, and an instruction it does not know is an error
// rather than a filter that means something else.
func TestLocalProgram(t *testing.T) {
	spec, err := newFilterSpec(many(maxFilterAddrs), 53, 1)
	if err != nil {
		t.Fatal(err)
	}
	prog, err := spec.program(kernelLoads)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := localProgram(prog); err != nil {
		t.Fatalf("longest filter: %v", err)
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
