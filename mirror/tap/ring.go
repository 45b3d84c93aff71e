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
//     datagram as it is queued to one of LocalDNS's sockets, takes the
//     queries to its listen address and port. Nothing else on the node
//     pays for it. It holds each in a pending slot, where the egress
//     program matches its reply to it, rather than recording it (see
//     "Matching in the kernel", below).
//   - queries, while dnsstandby answers (the tap paused): a packet socket
//     bound to ETH_P_ALL with PACKET_IGNORE_OUTGOING, which the kernel
//     skips on the transmit path before it clones anything, and on the
//     receive path runs before any protocol handler. (One bound to
//     ETH_P_IP is handed each packet after IP's handler on recent kernels,
//     where packet sockets are on per-namespace lists, so ip_rcv finds the
//     packet shared and clones it: on Linux 6.18 every IP packet the node
//     received was cloned while dnsstandby answered.) Its filter is the
//     tap's own filter (localProgram) whose query exit drops the packet:
//     nothing is ever queued on the socket. It sees a pod's query before
//     netfilter, as the nat fallback's detection needs (a query DNATed
//     away reaches no socket), but its filter runs for every frame the
//     node receives. What the detection needs is a count, so the exit
//     takes each query once (queryOnceBlock) and only counts it
//     (countCounted) unless the query mode map asks for the query itself
//     (queryModeBlock): only then is it copied into the ring for the
//     observer, and only then does the reader wake for it.
//
// A record is a header and the packet from its IP header on, up to the
// record's size class: a reservation in a ring buffer must have a size
// the verifier knows, so the program picks the smallest of four classes
// that holds the packet, and the ring stays compact for small DNS packets.

// Record header layout, host byte order.
const (
	recTime = 0  // u64: bpf_ktime_get_ns (CLOCK_MONOTONIC) when the program ran
	recLen  = 8  // u32: the packet's whole length from its IP header (skb->len)
	recKind = 12 // u32: recordQuery or recordReply
	// recQueryTime, u64: a reply's query's recTime, where the programs
	// matched the two (see "Matching in the kernel"); 0 otherwise.
	recQueryTime = 16
	recHeader    = 24 // the packet's bytes follow
)

// Record kinds; the first two also the index of each kind's counters in
// the counts map.
const (
	recordQuery = 0
	recordReply = 1
	// recordWake carries no packet: it wakes the reader for a query held
	// in a pending slot (pendWake).
	recordWake = 2
)

// ringbufForceWakeup is BPF_RB_FORCE_WAKEUP, a flag of
// bpf_ringbuf_submit.
const ringbufForceWakeup = 2

// The counts map: a per-CPU array of u64, records written by kind, then
// records lost for want of room in the ring by kind, then queries held in
// a pending slot, queries dropped as retransmissions of one held, and
// queries the query socket's filter counted without recording them.
const (
	countRecorded = 0
	countLost     = 2
	countPended   = 4
	countRepeated = 5
	countCounted  = 6
	numCounts     = 7
)

// The query mode map: one u32, read by the query socket's filter for
// each query it takes. queryRecord, the map's initial zero, copies the
// query into the ring; queryCount only counts it.
const (
	queryRecord = 0
	queryCount  = 1
)

// recordClasses are the record sizes the programs reserve, smallest
// first. A packet longer than the last class's room is recorded cut to it,
// with its whole length in the header: the tap counts it as oversize, as
// it counts a packet longer than its read slot.
var recordClasses = [...]int32{256, 1024, 4096, slotSize}

// Map names the programs reference; the loader binds them with
// asm.Instructions.AssociateMap.
const (
	ringMapName      = "ring"   // BPF_MAP_TYPE_RINGBUF
	countsMapName    = "counts" // BPF_MAP_TYPE_PERCPU_ARRAY of numCounts u64
	pendMapName      = "pend"   // BPF_MAP_TYPE_ARRAY of pendSlots pendMeta slots, mmapable
	pendDataMapName  = "pendq"  // BPF_MAP_TYPE_ARRAY of pendSlots queries, mmapable
	queryModeMapName = "qmode"  // BPF_MAP_TYPE_ARRAY of one u32: queryRecord or queryCount
	queryOnceMapName = "qonce"  // BPF_MAP_TYPE_PERCPU_ARRAY of one queryOnceLen-byte entry
)

// Offsets in struct __sk_buff not named in local.go.
const skbLen = 0

// Stack slots of the record block and the cgroup programs.
const (
	stackCountKey  = -4   // u32 key of a counter
	stackSlot      = -8   // u32 key of a pending slot
	stackQueryTime = -16  // u64: recQueryTime of the record
	stackHeader    = -64  // the IP and UDP headers the programs check (48 bytes)
	stackDNS       = -80  // the DNS header and the question's first 4 bytes (16)
	stackKeyHi     = -88  // u64: the client's address, first half (0 for IPv4)
	stackKeyLo     = -96  // u64: second half (IPv4: the address)
	stackKeyPortID = -100 // u32: the client's port | the DNS ID << 16
	stackKeyQ4     = -104 // u32: the question's first 4 bytes
	stackKeyFam    = -108 // u32: 4 or 6
	stackState     = -120 // u64: the slot's state word as claimed
	// stackOnce: the query filter's queryOnceLen bytes of a query
	// (queryOnceBlock).
	stackOnce = -32
)

// Registers the record block uses. r6 holds the context throughout; r7
// and r9 survive helper calls.
const (
	regRec = asm.R7 // the reserved record
	regLen = asm.R9 // bytes to copy
)

// recordBlock copies the packet (r6 is the context) into a ring record of
// kind, counts it as recorded or lost (the ring had no room), and returns
// ret. It starts at label start. With matched, the record's query time is
// the program's stackQueryTime; else 0.
func recordBlock(start string, kind int32, ret int32, matched bool) asm.Instructions {
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
		out = append(out, reserveRecord(size, lost)...)
		out = append(out,
			asm.LoadMem(asm.R1, regCtx, skbLen, asm.Word),
			asm.StoreMem(regRec, recLen, asm.R1, asm.Word),
			asm.StoreImm(regRec, recKind, int64(kind), asm.Word),
		)
		if matched {
			out = append(out,
				asm.LoadMem(asm.R1, asm.RFP, stackQueryTime, asm.DWord),
				asm.StoreMem(regRec, recQueryTime, asm.R1, asm.DWord),
			)
		} else {
			out = append(out, asm.Mov.Imm(asm.R1, 0), asm.StoreMem(regRec, recQueryTime, asm.R1, asm.DWord))
		}
		out = append(out,
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
	bump := bumpCount(done)
	bump[0] = bump[0].WithSymbol(count)
	out = append(out, asm.StoreImm(asm.RFP, stackCountKey, int64(countLost+kind), asm.Word).WithSymbol(lost))
	out = append(out, bump...)
	out = append(out,
		asm.Mov.Imm(asm.R0, ret).WithSymbol(done),
		asm.Return(),
	)
	return out
}

// reserveRecord reserves a ring record of size bytes and stamps its time
// (regRec points at it), or goes to full if the ring has no room.
func reserveRecord(size int32, full string) asm.Instructions {
	return asm.Instructions{
		asm.LoadMapPtr(asm.R1, 0).WithReference(ringMapName),
		asm.Mov.Imm(asm.R2, size),
		asm.Mov.Imm(asm.R3, 0),
		asm.FnRingbufReserve.Call(),
		asm.JEq.Imm(asm.R0, 0, full),
		asm.Mov.Reg(regRec, asm.R0),
		asm.FnKtimeGetNs.Call(),
		asm.StoreMem(regRec, recTime, asm.R0, asm.DWord),
	}
}

// recordLabel starts the record block of the query program,
// queryModeLabel its query mode block and queryOnceLabel its block that
// takes each query once.
const (
	recordLabel    = "record"
	queryModeLabel = "query_mode"
	queryOnceLabel = "query_once"
)

// queryOnceLen is how much of a query queryOnceBlock compares: 8 bytes
// of the IP header that hold the source address (IPv4: the source and
// destination addresses; IPv6: the source address's second half), the
// UDP header (ports, length, checksum) and the DNS header's first 8
// bytes (ID, flags, question and answer counts).
const queryOnceLen = 24

// queryOnceBlock (the query socket's filter, for a query it takes) makes
// the filter take each query once. Bound to ETH_P_ALL, the socket sees a
// frame a pod sends through a Linux bridge twice where the bridge has
// the port's MAC address (a bridge without one of its own takes its
// lowest port's): on the port, addressed to this host, and again on the
// bridge. The bridge hands it up in the same softirq on the same CPU, so
// the block keeps the last query's queryOnceLen bytes per CPU and drops
// the same bytes again at once, counted as a repeat (countRepeated). A
// client's identical retry that comes next on that CPU is one too, as
// the tap's duplicate check in user space took it. Anything unreadable
// goes on to next.
func queryOnceBlock(start, next string) asm.Instructions {
	v4, load, store, repeated := start+"_v4", start+"_load", start+"_store", start+"_repeated"
	const (
		regOff  = asm.R8 // the UDP header's offset (regTmp: the translation is done with it)
		regAddr = asm.R9 // the source address's bytes' offset
	)
	ins := asm.Instructions{
		asm.LoadAbs(0, asm.Byte).WithSymbol(start).WithSource(asm.Comment("A = version, IHL")),
		asm.Mov.Reg(asm.R1, asm.R0),
		asm.RSh.Imm(asm.R1, 4),
		asm.JEq.Imm(asm.R1, 4, v4),
		asm.Mov.Imm(regOff, ipv6Header),
		asm.Mov.Imm(regAddr, 16),
		asm.Ja.Label(load),
		asm.Mov.Reg(regOff, asm.R0).WithSymbol(v4),
		asm.And.Imm(regOff, 0x0f),
		asm.LSh.Imm(regOff, 2),
		asm.Mov.Imm(regAddr, 12),
		asm.Mov.Reg(asm.R1, regCtx).WithSymbol(load).WithSource(asm.Comment("8 bytes of the addresses")),
		asm.Mov.Reg(asm.R2, regAddr),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, stackOnce),
		asm.Mov.Imm(asm.R4, 8),
		asm.FnSkbLoadBytes.Call(),
		asm.JNE.Imm(asm.R0, 0, next),
		asm.Mov.Reg(asm.R1, regCtx).WithSource(asm.Comment("the UDP header and the DNS header's first 8 bytes")),
		asm.Mov.Reg(asm.R2, regOff),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, stackOnce+8),
		asm.Mov.Imm(asm.R4, queryOnceLen-8),
		asm.FnSkbLoadBytes.Call(),
		asm.JNE.Imm(asm.R0, 0, next),
		asm.StoreImm(asm.RFP, stackCountKey, 0, asm.Word),
	}
	ins = append(ins, lookup(queryOnceMapName, stackCountKey, next)...)
	for off := int16(0); off < queryOnceLen; off += 8 {
		ins = append(ins,
			asm.LoadMem(asm.R1, asm.R0, off, asm.DWord),
			asm.LoadMem(asm.R2, asm.RFP, stackOnce+off, asm.DWord),
			asm.JNE.Reg(asm.R1, asm.R2, store),
		)
	}
	ins = append(ins, asm.Ja.Label(repeated))
	for off := int16(0); off < queryOnceLen; off += 8 {
		in := asm.LoadMem(asm.R1, asm.RFP, stackOnce+off, asm.DWord)
		if off == 0 {
			in = in.WithSymbol(store).WithSource(asm.Comment("a new query: remember it"))
		}
		ins = append(ins, in, asm.StoreMem(asm.R0, off, asm.R1, asm.DWord))
	}
	ins = append(ins, asm.Ja.Label(next))
	ins = append(ins, countBlock(repeated, countRepeated, repeated+"_drop")...)
	return append(ins, asm.Mov.Imm(asm.R0, 0).WithSymbol(repeated+"_drop"), asm.Return())
}

// queryModeBlock (the query socket's filter, for a query it takes) goes
// to record unless the query mode map says queryCount; then it counts
// the query as countCounted and drops it, leaving the ring and its
// reader alone.
func queryModeBlock(start, record string) asm.Instructions {
	counted := start + "_counted"
	ins := asm.Instructions{asm.StoreImm(asm.RFP, stackCountKey, 0, asm.Word).WithSymbol(start)}
	ins = append(ins, lookup(queryModeMapName, stackCountKey, record)...)
	ins = append(ins,
		asm.LoadMem(asm.R1, asm.R0, 0, asm.Word),
		asm.JNE.Imm(asm.R1, queryCount, record),
	)
	ins = append(ins, countBlock(counted+"_count", countCounted, counted)...)
	return append(ins, asm.Mov.Imm(asm.R0, 0).WithSymbol(counted), asm.Return())
}

// cgroupProgram is a cgroup skb program on LocalDNS's cgroup that records
// LocalDNS's traffic of one kind: attached at egress, the replies its
// sockets send (kind recordReply: an IPv4 or IPv6 UDP datagram from one
// of spec's addresses and its port); at ingress, the queries its sockets
// receive (kind recordQuery: to one of those addresses and the port).
// Either must not be a fragment nor carry IPv6 extension headers (IPv4
// options are read past, as the query socket's filter does). With
// netns not 0 it takes only packets of that network namespace (its
// cookie, SO_NETNS_COOKIE): a cgroup's processes may use several, and a
// LocalDNS of another namespace on the same address is not this one. It
// lets every packet pass: a broken tap must never cost LocalDNS a query
// or a reply.
//
// With match (and spec's queries), the two match queries with replies in
// the kernel: see pendBlock and matchBlock.
func cgroupProgram(spec filterSpec, netns uint64, kind int32, match bool) asm.Instructions {
	const (
		out   = "out"
		v4    = "v4"
		v6    = "v6"
		store = "store"
		ipv6  = ipv6Header
	)
	rec := "record"
	// Where the address and port to test are: the source's in a reply,
	// the destination's in a query.
	addr4, port4, addr6, port6 := int16(12), int16(ipv4MinHeader), int16(8), int16(ipv6)
	if kind == recordQuery {
		addr4, port4, addr6, port6 = 16, ipv4MinHeader+2, 24, ipv6+2
	}
	match = match && spec.queries
	ins := asm.Instructions{
		// The kernel wants line info from the first instruction on if any
		// instruction has a comment.
		asm.Mov.Reg(regCtx, asm.R1).WithSource(asm.Comment("r6 = ctx")),
	}
	if match {
		// (No 64-bit store of an immediate: cilium/ebpf's asm makes none.)
		ins = append(ins, asm.Mov.Imm(asm.R1, 0), asm.StoreMem(asm.RFP, stackQueryTime, asm.R1, asm.DWord))
		// The headers' room zeroed: keyBlock tests the family again, and
		// the verifier, which does not know it is the same, walks the
		// IPv6 branch after an IPv4 header too. Without CAP_PERFMON (the
		// unit's and the DaemonSet's capabilities) it refuses that read
		// of stack no path wrote.
		for off := int16(0); off < ipv6Header+udpHeader; off += 8 {
			ins = append(ins, asm.StoreMem(asm.RFP, stackHeader+off, asm.R1, asm.DWord))
		}
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
		asm.Mov.Imm(regUDP, ipv4MinHeader),
		asm.JEq.Imm(asm.R2, 0x45, v4+"_udp"),
		asm.Mov.Reg(asm.R3, asm.R2),
		asm.RSh.Imm(asm.R3, 4),
		asm.JNE.Imm(asm.R3, 4, out),
		asm.And.Imm(asm.R2, 0x0f),
		asm.JLT.Imm(asm.R2, ipv4MinHeader/4, out),
		asm.LSh.Imm(asm.R2, 2),
		asm.Mov.Reg(regUDP, asm.R2),
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
		asm.Mov.Imm(regUDP, ipv6),
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
	if match {
		// The address matched: key the packet, then hold the query in a
		// pending slot or match the reply to one, and record what is left.
		ins = append(ins, keyBlock(rec, store, kind)...)
		if kind == recordQuery {
			ins = append(ins, pendBlock(store, out)...)
		} else {
			ins = append(ins, matchBlock(store)...)
		}
		rec = store
	}
	ins = append(ins, recordBlock(rec, kind, 1, match)...)
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

// Matching in the kernel. Standing by, the ingress program holds each
// query in a pending slot instead of recording it, and the egress program
// matches each reply to its slot, frees it and puts the query's time in
// the reply's record: a query LocalDNS answers is then never read on its
// own, and the reply needs no matching in user space. The tap sweeps the
// slots for queries still waiting after pendAge and shows them to the
// observer as it shows recorded ones. A query whose slot another waiting
// query holds, or too long for one, is recorded as before; so is a reply
// that matches no waiting slot.
//
// The slots are two mmapable arrays of pendSlots entries, indexed by a
// hash of the client's address and port and the DNS ID: pend, the state
// and key (pendMeta bytes each, one cache line), which the sweep reads,
// and pendq, the query from its IP header on. A slot's state word is
// generation << 2 | state. Only a compare-and-swap from waiting frees a
// slot, so exactly one of the egress program (the reply) and the sweep
// (the query is overdue) gets each query; the generation, which each
// claim advances, keeps the sweep from freeing a slot that was answered
// and claimed again while it copied the query.
const (
	pendSlots = 1 << pendBits
	pendBits  = 10
	pendRoom  = 256 // bytes of a query a slot holds, from its IP header

	// pend's slot layout.
	pendState  = 0  // u32: generation << 2 | pendFree, pendWriting or pendWaiting
	pendPortID = 4  // u32: stackKeyPortID
	pendQ4     = 8  // u32: stackKeyQ4
	pendLen    = 12 // u32: the query's length (skb->len)
	pendTime   = 16 // u64: bpf_ktime_get_ns when it arrived
	pendHi     = 24 // u64: stackKeyHi
	pendLo     = 32 // u64: stackKeyLo
	pendFam    = 40 // u32: stackKeyFam
	pendMeta   = 64

	pendFree    = 0
	pendWriting = 1
	pendWaiting = 2
	pendMask    = 3

	// pendMul spreads the key's bits to the top ones, which index the slot
	// (Fibonacci hashing): 0x9e3779b97f4a7c15 as an int64.
	pendMul = -0x61c8864680b583eb
)

// Registers of the matching blocks. regUDP holds the UDP header's offset
// in the packet from the family checks on; regSlot the pend slot.
const (
	regUDP  = asm.R8
	regSlot = asm.R7
	regOld  = asm.R8 // the slot's state word as read, once regUDP is done with
)

// pendIndex is the slot of a client's key: the programs' hash, for the
// tests.
func pendIndex(hi, lo uint64, portID uint32) uint32 {
	return uint32(((hi ^ lo ^ uint64(portID)) * 0x9e3779b97f4a7c15) >> (64 - pendBits))
}

// keyBlock loads the DNS ID and the question's first 4 bytes (a reply
// echoes the question) and puts the key of the packet's client (a
// query's source, a reply's destination) and its slot on the stack. A
// packet too short for them goes to fallback; else it goes on past the
// block.
func keyBlock(start, fallback string, kind int32) asm.Instructions {
	h := func(off int16) int16 { return stackHeader + off }
	addr4, port4, addr6, port6 := int16(16), int16(ipv4MinHeader+2), int16(24), int16(ipv6Header+2)
	if kind == recordQuery {
		addr4, port4, addr6, port6 = 12, ipv4MinHeader, 8, ipv6Header
	}
	v6, port := start+"_v6", start+"_port"
	return asm.Instructions{
		asm.Mov.Reg(asm.R1, regCtx).WithSymbol(start),
		asm.Mov.Reg(asm.R2, regUDP),
		asm.Add.Imm(asm.R2, udpHeader),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, stackDNS),
		asm.Mov.Imm(asm.R4, 16),
		asm.FnSkbLoadBytes.Call().WithSource(asm.Comment("the DNS header and the question's first 4 bytes")),
		asm.JNE.Imm(asm.R0, 0, fallback),
		asm.LoadMem(asm.R1, regCtx, skbProtocol, asm.Word),
		asm.JNE.Imm(asm.R1, int32(netOrder16(etherTypeIPv4)), v6),
		asm.LoadMem(asm.R2, asm.RFP, h(addr4), asm.Word),
		asm.Mov.Imm(asm.R1, 0),
		asm.StoreMem(asm.RFP, stackKeyHi, asm.R1, asm.DWord),
		asm.StoreMem(asm.RFP, stackKeyLo, asm.R2, asm.DWord),
		asm.StoreImm(asm.RFP, stackKeyFam, 4, asm.Word),
		asm.LoadMem(asm.R3, asm.RFP, h(port4), asm.Half),
		asm.Ja.Label(port),
		asm.LoadMem(asm.R2, asm.RFP, h(addr6), asm.DWord).WithSymbol(v6),
		asm.LoadMem(asm.R4, asm.RFP, h(addr6+8), asm.DWord),
		asm.StoreMem(asm.RFP, stackKeyHi, asm.R2, asm.DWord),
		asm.StoreMem(asm.RFP, stackKeyLo, asm.R4, asm.DWord),
		asm.StoreImm(asm.RFP, stackKeyFam, 6, asm.Word),
		asm.LoadMem(asm.R3, asm.RFP, h(port6), asm.Half),
		asm.LoadMem(asm.R2, asm.RFP, stackDNS, asm.Half).WithSymbol(port).WithSource(asm.Comment("the DNS ID")),
		asm.LSh.Imm(asm.R2, 16),
		asm.Or.Reg(asm.R3, asm.R2),
		asm.StoreMem(asm.RFP, stackKeyPortID, asm.R3, asm.Word),
		asm.LoadMem(asm.R2, asm.RFP, stackDNS+12, asm.Word),
		asm.StoreMem(asm.RFP, stackKeyQ4, asm.R2, asm.Word),
		asm.LoadMem(asm.R1, asm.RFP, stackKeyHi, asm.DWord).WithSource(asm.Comment("slot = pendIndex(hi, lo, portID)")),
		asm.LoadMem(asm.R2, asm.RFP, stackKeyLo, asm.DWord),
		asm.Xor.Reg(asm.R1, asm.R2),
		asm.Xor.Reg(asm.R1, asm.R3),
		asm.LoadImm(asm.R2, pendMul, asm.DWord),
		asm.Mul.Reg(asm.R1, asm.R2),
		asm.RSh.Imm(asm.R1, 64-pendBits),
		asm.StoreMem(asm.RFP, stackSlot, asm.R1, asm.Word),
	}
}

// lookupSlot points r0 at the stackSlot entry of map name, or goes to
// fallback.
func lookupSlot(name, fallback string) asm.Instructions { return lookup(name, stackSlot, fallback) }

// lookup points r0 at the entry of map name whose u32 key is in the stack
// slot at key, or goes to missing.
func lookup(name string, key int32, missing string) asm.Instructions {
	return asm.Instructions{
		asm.LoadMapPtr(asm.R1, 0).WithReference(name),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, key),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, missing),
	}
}

// readSlot points regSlot at the packet's pend slot (stackSlot), and puts
// its state word in r1 and the state in r2; it goes to fallback where the
// map has no such slot.
func readSlot(fallback string) asm.Instructions {
	return append(lookupSlot(pendMapName, fallback),
		asm.Mov.Reg(regSlot, asm.R0),
		asm.LoadMem(asm.R1, regSlot, pendState, asm.Word),
		asm.Mov.Reg(asm.R2, asm.R1),
		asm.And.Imm(asm.R2, pendMask),
	)
}

// keyFields are the key's fields: where a slot holds each, and where
// keyBlock put it on the stack.
var keyFields = [...]struct {
	slot, stack int16
	size        asm.Size
}{
	{pendPortID, stackKeyPortID, asm.Word},
	{pendQ4, stackKeyQ4, asm.Word},
	{pendLo, stackKeyLo, asm.DWord},
	{pendHi, stackKeyHi, asm.DWord},
	{pendFam, stackKeyFam, asm.Word},
}

// sameKey goes to differ unless regSlot's slot holds the stack's key.
func sameKey(differ string) asm.Instructions {
	var out asm.Instructions
	for _, f := range keyFields {
		out = append(out,
			asm.LoadMem(asm.R2, regSlot, f.slot, f.size),
			asm.LoadMem(asm.R3, asm.RFP, f.stack, f.size),
			asm.JNE.Reg(asm.R2, asm.R3, differ),
		)
	}
	return out
}

// atomicMem is op.Mem(dst, src, size, off) with the operation in the
// instruction's immediate, where the kernel reads it: cilium/ebpf v0.22
// moves it there only after it has encoded the immediate, and so emits
// every atomic operation as an add.
func atomicMem(op asm.AtomicOp, dst, src asm.Register, size asm.Size, off int16) asm.Instruction {
	ins := op.Mem(dst, src, size, off)
	ins.Constant = int64(op >> 8)
	return ins
}

// countBlock adds one to counter key and goes to then.
func countBlock(start string, key int32, then string) asm.Instructions {
	out := asm.Instructions{asm.StoreImm(asm.RFP, stackCountKey, int64(key), asm.Word).WithSymbol(start)}
	out = append(out, bumpCount(then)...)
	return append(out, asm.Ja.Label(then))
}

// bumpCount adds one to the counter whose key is at stackCountKey, and
// goes on past the block (to missing where the map has no such key).
func bumpCount(missing string) asm.Instructions {
	return append(lookup(countsMapName, stackCountKey, missing),
		// Per CPU: a plain add, no atomic, no shared cache line.
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
		asm.Add.Imm(asm.R1, 1),
		asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),
	)
}

// pendBlock (the ingress program, after keyBlock) holds the query in its
// slot if the slot is free, and goes to out; the same query again while
// it waits (a client's retransmission: the hedger keeps the first
// arrival) is counted and goes to out too. Any other query goes to
// fallback, to be recorded.
func pendBlock(fallback, out string) asm.Instructions {
	const busy, release, pended = "pend_busy", "pend_release", "pend_count"
	ins := asm.Instructions{
		asm.LoadMem(regLen, regCtx, skbLen, asm.Word).WithSource(asm.Comment("a query a slot can hold")),
		asm.JLT.Imm(regLen, 1, fallback),
		asm.JGT.Imm(regLen, pendRoom, fallback),
	}
	ins = append(ins, readSlot(fallback)...)
	ins = append(ins,
		asm.JEq.Imm(asm.R2, pendWaiting, busy),
		asm.JEq.Imm(asm.R2, pendWriting, fallback),
		asm.Mov.Reg(regOld, asm.R1).WithSource(asm.Comment("free: claim it, one generation on")),
		asm.And.Imm(asm.R1, ^pendMask),
		asm.Add.Imm(asm.R1, pendMask+1),
		asm.Or.Imm(asm.R1, pendWriting),
		asm.StoreMem(asm.RFP, stackState, asm.R1, asm.DWord),
		asm.Mov.Reg(asm.R0, regOld),
		atomicMem(asm.CmpXchg, regSlot, asm.R1, asm.Word, pendState),
		asm.JNE.Reg(asm.R0, regOld, fallback),
	)
	for _, f := range keyFields {
		ins = append(ins,
			asm.LoadMem(asm.R1, asm.RFP, f.stack, f.size),
			asm.StoreMem(regSlot, f.slot, asm.R1, f.size),
		)
	}
	ins = append(ins,
		asm.StoreMem(regSlot, pendLen, regLen, asm.Word),
		asm.FnKtimeGetNs.Call(),
		asm.StoreMem(regSlot, pendTime, asm.R0, asm.DWord),
	)
	ins = append(ins, lookupSlot(pendDataMapName, release)...)
	ins = append(ins,
		asm.Mov.Reg(asm.R1, regCtx),
		asm.Mov.Imm(asm.R2, 0),
		asm.Mov.Reg(asm.R3, asm.R0),
		asm.Mov.Reg(asm.R4, regLen),
		asm.FnSkbLoadBytes.Call(),
		asm.JNE.Imm(asm.R0, 0, release),
		asm.LoadMem(asm.R1, asm.RFP, stackState, asm.DWord).WithSource(asm.Comment("written: publish it as waiting")),
		asm.Add.Imm(asm.R1, pendWaiting-pendWriting),
		atomicMem(asm.Xchg, regSlot, asm.R1, asm.Word, pendState),
		// A reader about to sleep with no timeout (pendWake) is woken
		// by a record: this query wrote none.
		asm.StoreImm(asm.RFP, stackSlot, pendWake, asm.Word),
	)
	ins = append(ins, lookupSlot(pendMapName, pended)...)
	ins = append(ins,
		asm.LoadMem(asm.R1, asm.R0, 0, asm.Word),
		asm.JEq.Imm(asm.R1, 0, pended),
		asm.Mov.Imm(asm.R1, 0),
		atomicMem(asm.Xchg, asm.R0, asm.R1, asm.Word, 0),
		asm.JEq.Imm(asm.R1, 0, pended),
	)
	ins = append(ins, reserveRecord(recHeader, pended)...)
	ins = append(ins,
		asm.StoreImm(regRec, recLen, 0, asm.Word),
		asm.StoreImm(regRec, recKind, recordWake, asm.Word),
		asm.Mov.Imm(asm.R1, 0),
		asm.StoreMem(regRec, recQueryTime, asm.R1, asm.DWord),
		asm.Mov.Reg(asm.R1, regRec),
		asm.Mov.Imm(asm.R2, ringbufForceWakeup),
		asm.FnRingbufSubmit.Call(),
		asm.Ja.Label(pended),
		asm.LoadMem(asm.R1, asm.RFP, stackState, asm.DWord).WithSymbol(release),
		asm.And.Imm(asm.R1, ^pendMask),
		atomicMem(asm.Xchg, regSlot, asm.R1, asm.Word, pendState),
		asm.Ja.Label(fallback),
	)
	dup := sameKey(fallback)
	dup[0] = dup[0].WithSymbol(busy)
	ins = append(ins, dup...)
	ins = append(ins, countBlock(busy+"_count", countRepeated, out)...)
	ins = append(ins, countBlock(pended, countPended, out)...)
	return ins
}

// matchBlock (the egress program, after keyBlock) frees the slot of the
// reply's query, if it waits there, and puts the query's time where the
// record block takes it; it goes on to fallback, the record block, either
// way.
func matchBlock(fallback string) asm.Instructions {
	ins := readSlot(fallback)
	ins = append(ins,
		asm.JNE.Imm(asm.R2, pendWaiting, fallback),
		asm.Mov.Reg(regOld, asm.R1),
		asm.LoadMem(asm.R4, regSlot, pendTime, asm.DWord),
	)
	ins = append(ins, sameKey(fallback)...)
	ins = append(ins,
		asm.Mov.Reg(asm.R1, regOld).WithSource(asm.Comment("waiting, the reply's: free it")),
		asm.And.Imm(asm.R1, ^pendMask),
		asm.Mov.Reg(asm.R0, regOld),
		atomicMem(asm.CmpXchg, regSlot, asm.R1, asm.Word, pendState),
		asm.JNE.Reg(asm.R0, regOld, fallback),
		asm.StoreMem(asm.RFP, stackQueryTime, asm.R4, asm.DWord),
	)
	return ins
}
