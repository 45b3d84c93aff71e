package tap

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf/asm"
)

// The ring: how the tap watches LocalDNS without a packet socket on the
// transmit path. While an ETH_P_ALL packet socket is open, the kernel
// clones every packet sent on every device of the namespace for it
// (dev_queue_xmit_nit), before any filter runs, and each packet passed
// costs a copy into the socket and out of it (recvmmsg). In ring mode eBPF
// programs copy what the tap needs into one BPF ring buffer instead, where
// a program already runs for each packet:
//
//   - replies: a cgroup skb egress program on LocalDNS's cgroup sees each
//     datagram LocalDNS's own sockets send, once, before fragmentation,
//     and copies the replies from its listen address and port. A frame a
//     bridge forwards from a pod never passes there, so no pod can forge
//     what it records.
//   - queries, standing by (the tap inserting: LocalDNS gets every
//     query): the same program at the cgroup's ingress, which sees each
//     datagram as it is queued to one of LocalDNS's sockets, copies the
//     queries to its listen address and port. Nothing else on the node
//     pays for it.
//   - queries, while dnsstandby answers (the tap paused): a packet socket
//     bound to ETH_P_IP (or ETH_P_IPV6) sees only received packets, not
//     sent ones, and so clones nothing on the transmit path. Its filter is
//     the tap's own filter (localProgram) whose query exit copies the
//     packet into the ring and then drops it: nothing is ever queued on
//     the socket. It sees a pod's query before netfilter, as the nat
//     fallback's detection needs (a query DNATed away reaches no socket),
//     but its filter runs for every IP packet the node receives.
//
// A record is a header and the packet from its IP header on, up to the
// record's size class: a reservation in a ring buffer must have a size
// the verifier knows, so the program picks the smallest of four classes
// that holds the packet, and the ring stays compact for small DNS packets.

// Record header layout, host byte order.
const (
	recTime   = 0  // u64: bpf_ktime_get_ns (CLOCK_MONOTONIC) when the program ran
	recLen    = 8  // u32: the packet's whole length from its IP header (skb->len)
	recKind   = 12 // u32: recordQuery or recordReply
	recHeader = 16 // the packet's bytes follow
)

// Record kinds; also the index of each kind's counters in the counts map.
const (
	recordQuery = 0
	recordReply = 1
)

// The counts map: a per-CPU array of u64, records written by kind, then
// records lost for want of room in the ring by kind.
const (
	countRecorded = 0
	countLost     = 2
	numCounts     = 4
)

// recordClasses are the record sizes the programs reserve, smallest
// first. A packet longer than the last class's room is recorded cut to it,
// with its whole length in the header: the tap counts it as oversize, as
// it counts a packet longer than its read slot.
var recordClasses = [...]int32{256, 1024, 4096, slotSize}

// Map names the programs reference; the loader binds them with
// asm.Instructions.AssociateMap.
const (
	ringMapName   = "ring"   // BPF_MAP_TYPE_RINGBUF
	countsMapName = "counts" // BPF_MAP_TYPE_PERCPU_ARRAY of numCounts u64
)

// Offsets in struct __sk_buff not named in local.go.
const skbLen = 0

// Stack slots of the record block and the egress program.
const (
	stackCountKey = -4  // u32 key of a counter
	stackHeader   = -64 // the IP and UDP headers the egress program checks (48 bytes)
)

// Registers the record block uses. r6 holds the context throughout; r7
// and r9 survive helper calls.
const (
	regRec = asm.R7 // the reserved record
	regLen = asm.R9 // bytes to copy
)

// recordBlock copies the packet (r6 is the context) into a ring record of
// kind, counts it as recorded or lost (the ring had no room), and returns
// ret. It starts at label start.
func recordBlock(start string, kind int32, ret int32) asm.Instructions {
	lost := start + "_lost"
	count := start + "_count"
	done := start + "_done"
	out := asm.Instructions{
		asm.LoadMem(regLen, regCtx, skbLen, asm.Word).WithSymbol(start).WithSource(asm.Comment("len = skb->len")),
		asm.JLT.Imm(regLen, 1, done),
	}
	for i, size := range recordClasses {
		class := fmt.Sprintf("%s_class%d", start, i)
		next := fmt.Sprintf("%s_class%d", start, i+1)
		room := size - recHeader
		var head asm.Instructions
		if i < len(recordClasses)-1 {
			head = asm.Instructions{asm.JGT.Imm(regLen, room, next)}
		} else {
			// The last class takes the rest, cut to its room.
			head = asm.Instructions{
				asm.JLE.Imm(regLen, room, class+"_fits"),
				asm.Mov.Imm(regLen, room),
				asm.Mov.Imm(asm.R0, 0).WithSymbol(class + "_fits"),
			}
		}
		head[0] = head[0].WithSymbol(class)
		out = append(out, head...)
		out = append(out,
			asm.LoadMapPtr(asm.R1, 0).WithReference(ringMapName),
			asm.Mov.Imm(asm.R2, size),
			asm.Mov.Imm(asm.R3, 0),
			asm.FnRingbufReserve.Call(),
			asm.JEq.Imm(asm.R0, 0, lost),
			asm.Mov.Reg(regRec, asm.R0),
			asm.FnKtimeGetNs.Call(),
			asm.StoreMem(regRec, recTime, asm.R0, asm.DWord),
			asm.LoadMem(asm.R1, regCtx, skbLen, asm.Word),
			asm.StoreMem(regRec, recLen, asm.R1, asm.Word),
			asm.StoreImm(regRec, recKind, int64(kind), asm.Word),
			asm.Mov.Reg(asm.R1, regCtx),
			asm.Mov.Imm(asm.R2, 0),
			asm.Mov.Reg(asm.R3, regRec),
			asm.Add.Imm(asm.R3, recHeader),
			asm.Mov.Reg(asm.R4, regLen),
			asm.FnSkbLoadBytes.Call(),
			asm.Mov.Reg(asm.R1, regRec),
			asm.Mov.Imm(asm.R2, 0),
			asm.JNE.Imm(asm.R0, 0, class+"_discard"),
			asm.FnRingbufSubmit.Call(),
			asm.StoreImm(asm.RFP, stackCountKey, int64(countRecorded+kind), asm.Word),
			asm.Ja.Label(count),
			asm.FnRingbufDiscard.Call().WithSymbol(class+"_discard"),
			asm.Ja.Label(lost),
		)
	}
	out = append(out,
		asm.StoreImm(asm.RFP, stackCountKey, int64(countLost+kind), asm.Word).WithSymbol(lost),
		asm.LoadMapPtr(asm.R1, 0).WithReference(countsMapName).WithSymbol(count),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, stackCountKey),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, done),
		// Per CPU: a plain add, no atomic, no shared cache line.
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
		asm.Add.Imm(asm.R1, 1),
		asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),
		asm.Mov.Imm(asm.R0, ret).WithSymbol(done),
		asm.Return(),
	)
	return out
}

// recordLabel starts the record block of the query program.
const recordLabel = "record"

// cgroupProgram is a cgroup skb program on LocalDNS's cgroup that records
// LocalDNS's traffic of one kind: attached at egress, the replies its
// sockets send (kind recordReply: an IPv4 or IPv6 UDP datagram from one
// of spec's addresses and its port); at ingress, the queries its sockets
// receive (kind recordQuery: to one of those addresses and the port).
// Either must not be a fragment nor carry IPv6 extension headers (IPv4
// options are read past, as the query sockets' filter does). With
// netns not 0 it takes only packets of that network namespace (its
// cookie, SO_NETNS_COOKIE): a cgroup's processes may use several, and a
// LocalDNS of another namespace on the same address is not this one. It
// lets every packet pass: a broken tap must never cost LocalDNS a query
// or a reply.
func cgroupProgram(spec filterSpec, netns uint64, kind int32) asm.Instructions {
	const (
		out  = "out"
		v4   = "v4"
		v6   = "v6"
		rec  = "record"
		ipv6 = ipv6Header
	)
	// Where the address and port to test are: the source's in a reply,
	// the destination's in a query.
	addr4, port4, addr6, port6 := int16(12), int16(ipv4MinHeader), int16(8), int16(ipv6)
	if kind == recordQuery {
		addr4, port4, addr6, port6 = 16, ipv4MinHeader+2, 24, ipv6+2
	}
	ins := asm.Instructions{
		// The kernel wants line info from the first instruction on if any
		// instruction has a comment.
		asm.Mov.Reg(regCtx, asm.R1).WithSource(asm.Comment("r6 = ctx")),
	}
	if netns != 0 {
		ins = append(ins,
			asm.Mov.Reg(asm.R1, regCtx),
			asm.FnGetNetnsCookie.Call(),
			asm.LoadImm(asm.R2, int64(netns), asm.DWord),
			asm.JNE.Reg(asm.R0, asm.R2, out),
		)
	}
	if spec.excludeMark != 0 {
		ins = append(ins,
			asm.LoadMem(asm.R3, regCtx, skbMark, asm.Word),
			asm.JEq.Imm(asm.R3, int32(spec.excludeMark), out),
		)
	}
	ins = append(ins,
		asm.LoadMem(asm.R2, regCtx, skbProtocol, asm.Word).WithSource(asm.Comment("skb->protocol, network order")),
		asm.JEq.Imm(asm.R2, int32(netOrder16(etherTypeIPv4)), v4),
		asm.JEq.Imm(asm.R2, int32(netOrder16(etherTypeIPv6)), v6),
		asm.Ja.Label(out),
	)
	loadHeaders := func(label string, n int32) asm.Instructions {
		return asm.Instructions{
			asm.Mov.Reg(asm.R1, regCtx).WithSymbol(label),
			asm.Mov.Imm(asm.R2, 0),
			asm.Mov.Reg(asm.R3, asm.RFP),
			asm.Add.Imm(asm.R3, stackHeader),
			asm.Mov.Imm(asm.R4, n),
			asm.FnSkbLoadBytes.Call(),
			asm.JNE.Imm(asm.R0, 0, out),
		}
	}
	h := func(off int16) int16 { return stackHeader + off }
	// IPv4: version 4, UDP, no fragment bits, then the port and the
	// address. A header with options (longer than 20 bytes) has its UDP
	// header loaded again from where it is.
	ins = append(ins, loadHeaders(v4, ipv4MinHeader+udpHeader)...)
	ins = append(ins,
		asm.LoadMem(asm.R2, asm.RFP, h(0), asm.Byte),
		asm.JEq.Imm(asm.R2, 0x45, v4+"_udp"),
		asm.Mov.Reg(asm.R3, asm.R2),
		asm.RSh.Imm(asm.R3, 4),
		asm.JNE.Imm(asm.R3, 4, out),
		asm.And.Imm(asm.R2, 0x0f),
		asm.JLT.Imm(asm.R2, ipv4MinHeader/4, out),
		asm.LSh.Imm(asm.R2, 2),
		asm.Mov.Reg(asm.R1, regCtx),
		asm.Mov.Imm(asm.R4, udpHeader),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, int32(h(ipv4MinHeader))),
		asm.FnSkbLoadBytes.Call().WithSource(asm.Comment("the UDP header after the options")),
		asm.JNE.Imm(asm.R0, 0, out),
		asm.LoadMem(asm.R2, asm.RFP, h(9), asm.Byte).WithSymbol(v4+"_udp"),
		asm.JNE.Imm(asm.R2, protoUDP, out),
		asm.LoadMem(asm.R2, asm.RFP, h(6), asm.Half),
		asm.JSet.Imm(asm.R2, int32(netOrder16(ipv4FragMask)), out),
		asm.LoadMem(asm.R2, asm.RFP, h(port4), asm.Half),
		asm.JNE.Imm(asm.R2, int32(netOrder16(spec.port)), out),
		asm.LoadMem(asm.R2, asm.RFP, h(addr4), asm.Word),
	)
	for _, a := range spec.v4 {
		b := a.As4()
		ins = append(ins, asm.JEq.Imm(asm.R2, int32(binary.NativeEndian.Uint32(b[:])), rec))
	}
	ins = append(ins, asm.Ja.Label(out))
	// IPv6: UDP as the next header (no extension headers), the port, then
	// the address as two 64-bit halves.
	ins = append(ins, loadHeaders(v6, ipv6+udpHeader)...)
	ins = append(ins,
		asm.LoadMem(asm.R2, asm.RFP, h(6), asm.Byte),
		asm.JNE.Imm(asm.R2, protoUDP, out),
		asm.LoadMem(asm.R2, asm.RFP, h(port6), asm.Half),
		asm.JNE.Imm(asm.R2, int32(netOrder16(spec.port)), out),
		asm.LoadMem(asm.R2, asm.RFP, h(addr6), asm.DWord),
		asm.LoadMem(asm.R3, asm.RFP, h(addr6+8), asm.DWord),
	)
	for i, a := range spec.v6 {
		next := fmt.Sprintf("v6_addr%d", i+1)
		hi, lo := addrHalves(a)
		ins = append(ins,
			asm.LoadImm(asm.R4, hi, asm.DWord),
			asm.JNE.Reg(asm.R2, asm.R4, next),
			asm.LoadImm(asm.R4, lo, asm.DWord),
			asm.JEq.Reg(asm.R3, asm.R4, rec),
			asm.Mov.Imm(asm.R0, 0).WithSymbol(next),
		)
	}
	ins = append(ins, asm.Ja.Label(out))
	ins = append(ins, recordBlock(rec, kind, 1)...)
	ins = append(ins,
		asm.Mov.Imm(asm.R0, 1).WithSymbol(out),
		asm.Return(),
	)
	return ins
}

// netOrder16 is v as a u16 load of its network-order bytes yields on this
// host: how a program sees a port or an EtherType.
func netOrder16(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}

// addrHalves is an IPv6 address as two u64 loads of its bytes yield.
func addrHalves(a netip.Addr) (hi, lo int64) {
	b := a.As16()
	return int64(binary.NativeEndian.Uint64(b[:8])), int64(binary.NativeEndian.Uint64(b[8:]))
}
