package tap

import (
	"fmt"

	"github.com/cilium/ebpf/asm"
	"golang.org/x/net/bpf"
)

// The classic filter passes every outgoing UDP datagram from LocalDNS's
// address and port, and on a Linux bridge (kubenet's cbr0, bridge-mode
// CNIs) that includes frames the bridge forwards from one pod to another:
// a pod can send a reply with LocalDNS's source address to its neighbour,
// and the tap would see it leave on the neighbour's port as PACKET_OUTGOING,
// like LocalDNS's own. (Across a routed veth the kernel drops such a
// packet, because its source address is local.)
//
// What tells the two apart is where the packet came from. A packet this
// host sends has never been received: its skb's ingress interface
// (skb->skb_iif, __sk_buff.ingress_ifindex) is 0. A forwarded frame was
// received on the sender's port, and keeps that port's ifindex through the
// bridge. Classic BPF has no load for it (SKF_AD_IFINDEX is the device the
// packet is on now), so the tap's filter is the classic program translated
// to eBPF with that test added before it passes a packet.
//
// Matching the sending socket itself (bpf_get_socket_cookie against
// LocalDNS's sockets) would be stronger, but it cannot be done here: a
// packet socket's filter runs on the clone dev_queue_xmit_nit makes for
// taps, and skb_clone leaves the clone's socket NULL, so the cookie is 0
// for every packet (measured on Linux 6.18: 0 for LocalDNS's replies on
// the bridge and on its port alike). "Sent by this host" is what is left:
// it shuts out every pod that is not in the node's network namespace.

// Offsets in struct __sk_buff (include/uapi/linux/bpf.h), stable ABI.
const (
	skbPktType        = 4
	skbMark           = 8
	skbProtocol       = 16
	skbIngressIfindex = 36
)

// Registers of the translated program. Classic BPF's accumulator is r0,
// where LD_ABS and LD_IND leave their result; X lives in a callee-saved
// register, since those loads clobber r1-r5; LD_ABS and LD_IND read the
// packet through r6, which must hold the context.
const (
	regA   = asm.R0
	regX   = asm.R7
	regCtx = asm.R6
	regTmp = asm.R8
)

// forwardedLabel is the exit of the translated program for a packet that
// matched but was not sent by this host.
const forwardedLabel = "forwarded"

// localProgram translates the classic filter prog (as filterSpec.program
// builds it with kernelLoads) into an eBPF socket filter that behaves the
// same, except that a reply it would pass is dropped unless this host
// sent it (ingress ifindex 0). A query it passes (returning snapQuery)
// passes as it is. It supports the instructions the tap's
// filter uses and fails on any other.
func localProgram(prog []bpf.Instruction) (asm.Instructions, error) {
	insns, err := translate(prog, func(val uint32) asm.Instructions {
		var ins asm.Instructions
		// A query's exit (snapQuery) passes received packets: every
		// query is received, on a pod's veth or on lo.
		if val != 0 && val != snapQuery {
			ins = append(ins,
				asm.LoadMem(regA, regCtx, skbIngressIfindex, asm.Word).WithSource(asm.Comment("A = ingress ifindex: 0 if this host sent it")),
				asm.JNE.Imm32(regA, 0, forwardedLabel).WithSource(asm.Comment("received first: forwarded, not ours")),
			)
		}
		return append(ins, asm.Mov.Imm32(regA, int32(val)), asm.Return())
	})
	if err != nil {
		return nil, err
	}
	return append(insns,
		asm.Mov.Imm32(regA, 0).WithSymbol(forwardedLabel).WithSource(asm.Comment("drop")),
		asm.Return(),
	), nil
}

// queryRingProgram translates prog (built for queries) into the ring
// mode's query filter: a query it would pass is taken once
// (queryOnceBlock), counted or copied into the ring, as the query mode
// map says (queryModeBlock), and dropped, as is everything else; the
// socket never queues a packet.
func queryRingProgram(prog []bpf.Instruction) (asm.Instructions, error) {
	insns, err := translate(prog, func(val uint32) asm.Instructions {
		if val == snapQuery {
			return asm.Instructions{asm.Ja.Label(queryOnceLabel)}
		}
		return asm.Instructions{asm.Mov.Imm32(regA, 0), asm.Return()}
	})
	if err != nil {
		return nil, err
	}
	insns = append(insns, queryOnceBlock(queryOnceLabel, queryModeLabel)...)
	insns = append(insns, queryModeBlock(queryModeLabel, recordLabel)...)
	return append(insns, recordBlock(recordLabel, recordQuery, 0, false)...), nil
}

// translate translates the classic filter prog instruction by
// instruction, each RET k as exit(k) says.
func translate(prog []bpf.Instruction, exit func(val uint32) asm.Instructions) (asm.Instructions, error) {
	label := func(i int) string { return fmt.Sprintf("c%d", i) }
	out := asm.Instructions{
		asm.Mov.Reg(regCtx, asm.R1).WithSource(asm.Comment("r6 = ctx, for LD_ABS/LD_IND")),
		asm.Mov.Imm32(regA, 0).WithSource(asm.Comment("A = 0")),
		asm.Mov.Imm32(regX, 0).WithSource(asm.Comment("X = 0")),
	}
	for i, in := range prog {
		var ins asm.Instructions
		switch in := in.(type) {
		case bpf.LoadExtension:
			off, ok := map[bpf.Extension]int16{bpf.ExtType: skbPktType, bpf.ExtMark: skbMark, bpf.ExtProto: skbProtocol}[in.Num]
			if !ok {
				return nil, fmt.Errorf("instruction %d: extension %v not translated", i, in.Num)
			}
			ins = append(ins, asm.LoadMem(regA, regCtx, off, asm.Word))
			if in.Num == bpf.ExtProto {
				// skb->protocol is big-endian; SKF_AD_PROTOCOL gives it in
				// host order.
				ins = append(ins, asm.HostTo(asm.BE, regA, asm.Half))
			}
		case bpf.LoadAbsolute:
			size, err := loadSize(in.Size)
			if err != nil {
				return nil, fmt.Errorf("instruction %d: %w", i, err)
			}
			ins = append(ins, asm.LoadAbs(int32(in.Off), size))
		case bpf.LoadIndirect:
			size, err := loadSize(in.Size)
			if err != nil {
				return nil, fmt.Errorf("instruction %d: %w", i, err)
			}
			ins = append(ins, asm.LoadInd(regA, regX, int32(in.Off), size))
		case bpf.LoadMemShift:
			// X = 4*(P[k]&0xf), leaving A as it was.
			ins = append(ins,
				asm.Mov.Reg(regTmp, regA),
				asm.LoadAbs(int32(in.Off), asm.Byte),
				asm.And.Imm32(regA, 0xf),
				asm.LSh.Imm32(regA, 2),
				asm.Mov.Reg(regX, regA),
				asm.Mov.Reg(regA, regTmp),
			)
		case bpf.ALUOpConstant:
			if in.Op != bpf.ALUOpAnd {
				return nil, fmt.Errorf("instruction %d: ALU op %v not translated", i, in.Op)
			}
			ins = append(ins, asm.And.Imm32(regA, int32(in.Val)))
		case bpf.JumpIf:
			op, ok := map[bpf.JumpTest]asm.JumpOp{bpf.JumpEqual: asm.JEq, bpf.JumpNotEqual: asm.JNE, bpf.JumpBitsSet: asm.JSet}[in.Cond]
			if !ok {
				return nil, fmt.Errorf("instruction %d: jump test %v not translated", i, in.Cond)
			}
			next := i + 1
			ins = append(ins, op.Imm32(regA, int32(in.Val), label(next+int(in.SkipTrue))))
			if in.SkipFalse != 0 {
				ins = append(ins, asm.Ja.Label(label(next+int(in.SkipFalse))))
			}
		case bpf.Jump:
			ins = append(ins, asm.Ja.Label(label(i+1+int(in.Skip))))
		case bpf.RetConstant:
			ins = append(ins, exit(in.Val)...)
		default:
			return nil, fmt.Errorf("instruction %d: %T not translated", i, in)
		}
		ins[0] = ins[0].WithSymbol(label(i))
		if ins[0].Source() == nil {
			ins[0] = ins[0].WithSource(asm.Comment(fmt.Sprint(in)))
		}
		out = append(out, ins...)
	}
	return out, nil
}

// loadSize is the eBPF size of a classic load of n bytes.
func loadSize(n int) (asm.Size, error) {
	switch n {
	case 1:
		return asm.Byte, nil
	case 2:
		return asm.Half, nil
	case 4:
		return asm.Word, nil
	}
	return 0, fmt.Errorf("load of %d bytes", n)
}
