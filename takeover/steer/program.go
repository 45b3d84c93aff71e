package steer

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf/asm"
)

// The program's maps, named by the symbols its map loads reference. The
// loader binds them with asm.Instructions.AssociateMap.
const (
	// SockarrayMap is the group's BPF_MAP_TYPE_REUSEPORT_SOCKARRAY: slot 0
	// holds our socket, slots 1..MaxPeers LocalDNS's adopted sockets.
	SockarrayMap = "sockarray"
	// ConfigMap is the BPF_MAP_TYPE_ARRAY with one configValue at key 0.
	// Each group has its own (so that one group can hash in mirror while
	// the others steer to LocalDNS); the Steerer writes the same value to
	// all but the mode, which each group's level adapts.
	ConfigMap = "config"
	// LiveMap is the BPF_MAP_TYPE_ARRAY (memory-mapped where the kernel
	// allows it, 5.5+) with the group's read test at key 0: our read
	// loops' count of reads, and what the program notes of the packets it
	// gives our socket. It is apart from ConfigMap because both sides
	// write it: a config update rewrites the whole value, and would undo
	// the program's notes.
	LiveMap = "live"
)

// MaxPeers is how many LocalDNS sockets one group can adopt. CoreDNS opens
// one socket per listen address and protocol (the AKS Corefile has no
// multisocket plugin); eight leaves room for a reload's overlap and for
// multisocket while keeping the unrolled peer search short. It must be a
// power of two: the program picks its first peer slot as hash&(MaxPeers-1).
const MaxPeers = 8

// sockarraySize is the sockarray's MaxEntries: our slot plus the peers.
const sockarraySize = 1 + MaxPeers

// ourSlot is our socket's key in the sockarray.
const ourSlot = 0

// sk_reuseport return codes (include/uapi/linux/bpf.h, enum sk_action).
// The program only ever returns skPass: SK_DROP would drop the packet, and
// a broken steering program must never blackhole DNS.
const skPass = 1

// Offsets in struct sk_reuseport_md (include/uapi/linux/bpf.h, 4.19+).
// data and data_end are __bpf_md_ptr: 8 bytes each, on every architecture.
// data starts at the UDP or TCP header.
const (
	ctxData        = 0
	ctxDataEnd     = 8
	ctxEthProtocol = 20 // u32 holding skb->protocol: the EtherType in network order
	ctxHash        = 32 // u32: the kernel's hash of the packet's 4-tuple
)

// The config value's layout, in host byte order except the probe's
// fields, which are in network order as in the packet so that they compare
// with its bytes as they are. Every field is naturally aligned, so the
// program reads each with one load. A concurrent update may tear the
// probe's address from its port (several loads); the program then takes a
// probe for a query or the other way round for that one packet, as it
// would while SetProbe runs anyway.
const (
	cfgMode       = 0  // u32: a Mode
	cfgProbePort  = 4  // u16, network byte order (as in the UDP/TCP header); 0 = none
	cfgProbeProto = 6  // u16: EtherType of the probe's address, network byte order (as skb->protocol); 0 = none
	cfgHeartbeat  = 8  // u64: CLOCK_MONOTONIC ns of the last Heartbeat; 0 = never
	cfgStall      = 16 // u64: heartbeat age in ns beyond which we count as stalled
	cfgProbeAddr  = 24 // 16 bytes: the probe's source address as in the IP header (IPv4: the first 4)
	cfgUnread     = 40 // u64: how long in ns packets may wait on our socket unread before we count as stalled; 0 = no read test
	configSize    = 48
)

// The live value's layout: u64 words in host byte order, each written by
// one side only. reads is our read loops' (an atomic add per batch, in
// the memory-mapped value: no system call); the rest is the program's.
// seen and pending are written together, by whichever CPU runs the
// program: two CPUs writing at once both write a "now" of the same
// moment, so a torn pair only moves pending by the time between them.
const (
	liveReads    = 0  // u64: reads our loops counted (a batch, one); 0 = no reader counts: no read test
	liveSeen     = 8  // u64: reads as it was when the program last noted a packet given to us
	livePending  = 16 // u64: CLOCK_MONOTONIC ns of that packet: with no read since, it has waited that long
	liveBypassed = 24 // u64: packets not given to us because we were not reading (atomic add)
	liveMaxWait  = 32 // u64: the longest wait the program saw within the limit, in ns (a diagnostic; racy)
	liveSize     = 40
)

// EtherTypes, and where the source address is in each IP header.
const (
	ethPIPv4   = 0x0800
	ethPIPv6   = 0x86DD
	ipv4SrcOff = 12
	ipv6SrcOff = 8
)

// bpfHdrStartNet is BPF_HDR_START_NET: bpf_skb_load_bytes_relative's
// offsets count from the network (IP) header. The context's data starts
// at the UDP or TCP header, past the source address.
const bpfHdrStartNet = 1

// Stack slots below the frame pointer: the u32 map key that helpers take
// by pointer, the packet's source address as loaded (16 bytes), and the
// packet's time (8 bytes) for noting a packet given to us after the
// selection, whose helper call clobbers r0-r5.
const (
	keyOff = -4
	srcOff = -24
	nowOff = -32
)

// netOrder16 is v as a u16 load of its network-order bytes yields on this
// host: how the program sees skb->protocol.
func netOrder16(v uint16) int32 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return int32(binary.NativeEndian.Uint16(b[:]))
}

// Program returns the sk_reuseport program that steers one reuseport
// group. It is pure and deterministic: its map loads reference
// SockarrayMap, ConfigMap and LiveMap by name, to be bound with
// AssociateMap before loading.
//
// For each packet (UDP datagram, or TCP SYN) the program:
//
//  1. reads the config and the live value; without either it passes
//     (kernel hash);
//  2. counts us as fresh only if the heartbeat is set and no older than the
//     stall limit (read before bpf_ktime_get_ns, so age is never negative),
//     and, once our read loops count their reads and unless the unread
//     limit is 0, if no packet it gave our socket has waited longer than
//     the limit with no read of ours since (the read test: fast when
//     packets wait, silent when idle);
//  3. sends a packet from the probe's source address and port to a peer
//     (never to us): a pod may send from that port too, but not from that
//     address, one of the node's own, which the kernel refuses as the
//     source of a packet from outside;
//  4. in ToUs tries our slot (if fresh), then the peers;
//  5. in ToPeer tries the peers, then our slot (if fresh);
//  6. in Hash, or any unknown mode, selects nothing;
//  7. having given our socket a packet, notes its time if it is the first
//     since our last read; having kept one from us because we were not
//     reading, counts it.
//
// The peer search starts at slot 1+(hash&(MaxPeers-1)) and tries every peer
// slot once, so several LocalDNS sockets share the load and empty slots
// (closed sockets leave the map by themselves) are skipped. Every path ends
// at one exit returning SK_PASS: if nothing was selected the kernel falls
// back to its hash over the whole group.
//
// r9 says what our slot is worth: 0 not to be tried (never beaten, a stale
// heartbeat, a probe, or tried already), 1 fresh, 2 not reading (as 0, but
// a packet kept from us for it is counted).
func Program() asm.Instructions {
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1).WithSymbol("steer").WithSource(asm.Comment("r6 = ctx, kept across helper calls")),
		asm.StoreImm(asm.RFP, keyOff, 0, asm.Word).WithSource(asm.Comment("map key 0, for both lookups")),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, keyOff),
		asm.LoadMapPtr(asm.R1, 0).WithReference(ConfigMap),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "pass").WithSource(asm.Comment("no config: kernel hash")),
		asm.Mov.Reg(asm.R7, asm.R0).WithSource(asm.Comment("r7 = config")),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, keyOff),
		asm.LoadMapPtr(asm.R1, 0).WithReference(LiveMap),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "pass").WithSource(asm.Comment("no live value (an array's key 0 always has one): kernel hash")),
		asm.Mov.Reg(asm.R8, asm.R0).WithSource(asm.Comment("r8 = live")),

		// r9 = 1 if our heartbeat is fresh, else 0.
		asm.LoadMem(asm.R9, asm.R7, cfgHeartbeat, asm.DWord).WithSource(asm.Comment("r9 = heartbeat (read before now: age >= 0)")),
		asm.FnKtimeGetNs.Call().WithSource(asm.Comment("r0 = now, CLOCK_MONOTONIC")),
		asm.StoreMem(asm.RFP, nowOff, asm.R0, asm.DWord).WithSource(asm.Comment("now, kept for noting a packet given to us")),
		asm.JEq.Imm(asm.R9, 0, "probe").WithSource(asm.Comment("never beaten: stalled (r9 = 0)")),
		asm.Sub.Reg(asm.R0, asm.R9).WithSource(asm.Comment("r0 = heartbeat age")),
		asm.LoadMem(asm.R1, asm.R7, cfgStall, asm.DWord),
		asm.Mov.Imm(asm.R9, 0),
		asm.JSGT.Reg(asm.R0, asm.R1, "probe").WithSource(asm.Comment("older than the stall limit: stalled")),
		asm.Mov.Imm(asm.R9, 1).WithSource(asm.Comment("fresh")),

		// The read test: r9 = 2 if a packet given to us has waited longer
		// than the unread limit with no read of ours since.
		asm.LoadMem(asm.R3, asm.R7, cfgUnread, asm.DWord).WithSource(asm.Comment("r3 = the unread limit")),
		asm.JEq.Imm(asm.R3, 0, "probe").WithSource(asm.Comment("read test off (LocalDNS does not answer either)")),
		asm.LoadMem(asm.R1, asm.R8, liveReads, asm.DWord),
		asm.JEq.Imm(asm.R1, 0, "probe").WithSource(asm.Comment("no reader counts reads: no read test")),
		asm.LoadMem(asm.R2, asm.R8, liveSeen, asm.DWord),
		asm.JNE.Reg(asm.R1, asm.R2, "probe").WithSource(asm.Comment("read since the last packet noted: nothing waits on us for long")),
		asm.LoadMem(asm.R2, asm.R8, livePending, asm.DWord).WithSource(asm.Comment("set with seen: the noted packet's time")),
		asm.LoadMem(asm.R1, asm.RFP, nowOff, asm.DWord),
		asm.Sub.Reg(asm.R1, asm.R2).WithSource(asm.Comment("r1 = how long it has waited unread (another CPU's note may make it negative)")),
		asm.Mov.Imm(asm.R9, 2),
		asm.JSGT.Reg(asm.R1, asm.R3, "probe").WithSource(asm.Comment("waited too long: we are not reading")),
		asm.Mov.Imm(asm.R9, 1).WithSource(asm.Comment("reading: fresh")),
		asm.LoadMem(asm.R2, asm.R8, liveMaxWait, asm.DWord),
		asm.JSGE.Reg(asm.R2, asm.R1, "probe"),
		asm.StoreMem(asm.R8, liveMaxWait, asm.R1, asm.DWord).WithSource(asm.Comment("the longest wait within the limit so far")),

		// A packet from the probe's source port and address goes to a
		// peer, or is hashed.
		asm.LoadMem(asm.R1, asm.R7, cfgProbePort, asm.Half).WithSymbol("probe"),
		asm.JEq.Imm(asm.R1, 0, "dispatch").WithSource(asm.Comment("no probe port")),
		asm.LoadMem(asm.R2, asm.R6, ctxData, asm.DWord),
		asm.LoadMem(asm.R3, asm.R6, ctxDataEnd, asm.DWord),
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, 2),
		asm.JGT.Reg(asm.R4, asm.R3, "dispatch").WithSource(asm.Comment("source port not in the linear data")),
		asm.LoadMem(asm.R4, asm.R2, 0, asm.Half).WithSource(asm.Comment("UDP/TCP source port, network order")),
		asm.JNE.Reg(asm.R4, asm.R1, "dispatch"),
		asm.LoadMem(asm.R1, asm.R6, ctxEthProtocol, asm.Word),
		asm.LoadMem(asm.R2, asm.R7, cfgProbeProto, asm.Half),
		asm.JNE.Reg(asm.R1, asm.R2, "dispatch").WithSource(asm.Comment("another IP version than the probe's, or no probe address")),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, srcOff),
		asm.Mov.Imm(asm.R5, bpfHdrStartNet),
		asm.JEq.Imm(asm.R2, netOrder16(ethPIPv6), "probe6"),
		asm.Mov.Imm(asm.R2, ipv4SrcOff),
		asm.Mov.Imm(asm.R4, 4),
		asm.FnSkbLoadBytesRelative.Call().WithSource(asm.Comment("IPv4 source address onto the stack")),
		asm.JNE.Imm(asm.R0, 0, "dispatch"),
		asm.LoadMem(asm.R1, asm.RFP, srcOff, asm.Word),
		asm.LoadMem(asm.R2, asm.R7, cfgProbeAddr, asm.Word),
		asm.JNE.Reg(asm.R1, asm.R2, "dispatch").WithSource(asm.Comment("the probe's port, not its address: a query")),
		asm.Ja.Label("probed"),
		asm.Mov.Imm(asm.R2, ipv6SrcOff).WithSymbol("probe6"),
		asm.Mov.Imm(asm.R4, 16),
		asm.FnSkbLoadBytesRelative.Call().WithSource(asm.Comment("IPv6 source address onto the stack")),
		asm.JNE.Imm(asm.R0, 0, "dispatch"),
		asm.LoadMem(asm.R1, asm.RFP, srcOff, asm.DWord),
		asm.LoadMem(asm.R2, asm.R7, cfgProbeAddr, asm.DWord),
		asm.JNE.Reg(asm.R1, asm.R2, "dispatch"),
		asm.LoadMem(asm.R1, asm.RFP, srcOff+8, asm.DWord),
		asm.LoadMem(asm.R2, asm.R7, cfgProbeAddr+8, asm.DWord),
		asm.JNE.Reg(asm.R1, asm.R2, "dispatch").WithSource(asm.Comment("the probe's port, not its address: a query")),
		asm.Mov.Imm(asm.R9, 0).WithSymbol("probed").WithSource(asm.Comment("a probe never reaches us, and is not kept from us")),
		asm.Ja.Label("peers"),

		asm.LoadMem(asm.R1, asm.R7, cfgMode, asm.Word).WithSymbol("dispatch").WithSource(asm.Comment("r1 = mode")),
		asm.JEq.Imm(asm.R1, int32(ToPeer), "peers"),
		asm.JNE.Imm(asm.R1, int32(ToUs), "pass").WithSource(asm.Comment("Hash or unknown: kernel hash")),
		asm.JEq.Imm(asm.R9, 1, "us"),
		asm.JEq.Imm(asm.R9, 0, "peers").WithSource(asm.Comment("ToUs but stalled: peers only")),
		asm.Mov.Imm(asm.R1, 1).WithSource(asm.Comment("ToUs but not reading: count the packet kept from us")),
		asm.AddAtomic.Mem(asm.R8, asm.R1, asm.DWord, liveBypassed).WithSource(asm.Comment("live.bypassed += 1, atomically: CPUs run the program at once")),
		asm.Mov.Imm(asm.R9, 0),
		asm.Ja.Label("peers"),
	}
	insns = append(insns, selectSlot(asm.StoreImm(asm.RFP, keyOff, ourSlot, asm.Word).WithSymbol("us").WithSource(asm.Comment("ToUs: our slot first")))...)
	insns = append(insns,
		asm.JEq.Imm(asm.R0, 0, "noted"),
		asm.Mov.Imm(asm.R9, 0).WithSource(asm.Comment("our slot is empty: do not try it again")),
	)
	for i := range MaxPeers {
		first := asm.LoadMem(asm.R1, asm.R6, ctxHash, asm.Word).WithSource(asm.Comment(fmt.Sprintf("peer %d: key = 1 + ((hash + %d) & %d)", i, i, MaxPeers-1)))
		if i == 0 {
			first = first.WithSymbol("peers")
		}
		insns = append(insns, first)
		if i > 0 {
			insns = append(insns, asm.Add.Imm(asm.R1, int32(i)))
		}
		insns = append(insns,
			asm.And.Imm(asm.R1, MaxPeers-1),
			asm.Add.Imm(asm.R1, 1),
		)
		insns = append(insns, selectSlot(asm.StoreMem(asm.RFP, keyOff, asm.R1, asm.Word))...)
		insns = append(insns, asm.JEq.Imm(asm.R0, 0, "pass"))
	}
	insns = append(insns,
		asm.JEq.Imm(asm.R9, 0, "pass").WithSource(asm.Comment("no peer; stalled, probe, or tried already")),
		asm.JEq.Imm(asm.R9, 1, "last"),
		asm.Mov.Imm(asm.R1, 1).WithSource(asm.Comment("ToPeer, no peer, and we are not reading: count the packet kept from us")),
		asm.AddAtomic.Mem(asm.R8, asm.R1, asm.DWord, liveBypassed).WithSource(asm.Comment("live.bypassed += 1")),
		asm.Ja.Label("pass"),
	)
	insns = append(insns, selectSlot(asm.StoreImm(asm.RFP, keyOff, ourSlot, asm.Word).WithSymbol("last").WithSource(asm.Comment("ToPeer: our slot last")))...)
	insns = append(insns,
		asm.JNE.Imm(asm.R0, 0, "pass"),

		// Our socket got the packet: if it is the first since our last
		// read, note when; the read test measures from it.
		asm.LoadMem(asm.R1, asm.R8, liveReads, asm.DWord).WithSymbol("noted"),
		asm.JEq.Imm(asm.R1, 0, "pass").WithSource(asm.Comment("no reader counts reads: nothing to note")),
		asm.LoadMem(asm.R2, asm.R8, liveSeen, asm.DWord),
		asm.JEq.Reg(asm.R1, asm.R2, "pass").WithSource(asm.Comment("no read since a packet already noted: it waits longer")),
		asm.StoreMem(asm.R8, liveSeen, asm.R1, asm.DWord).WithSource(asm.Comment("seen = reads")),
		asm.LoadMem(asm.R1, asm.RFP, nowOff, asm.DWord),
		asm.StoreMem(asm.R8, livePending, asm.R1, asm.DWord).WithSource(asm.Comment("pending = now")),

		asm.Mov.Imm(asm.R0, skPass).WithSymbol("pass").WithSource(asm.Comment("the only exit: SK_PASS, selected socket or kernel hash")),
		asm.Return(),
	)
	return insns
}

// selectSlot stores the key with storeKey and calls
// bpf_sk_select_reuseport(ctx, sockarray, &key, 0); r0 == 0 on success.
func selectSlot(storeKey asm.Instruction) asm.Instructions {
	return asm.Instructions{
		storeKey,
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.LoadMapPtr(asm.R2, 0).WithReference(SockarrayMap),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, keyOff),
		asm.Mov.Imm(asm.R4, 0),
		asm.FnSkSelectReuseport.Call(),
	}
}

// configValue is the userspace side of the config map's one value.
type configValue struct {
	Mode      Mode
	ProbePort uint16     // host order here; encoded in network order
	ProbeAddr netip.Addr // unmapped; invalid: none, and no packet is a probe
	Heartbeat uint64     // CLOCK_MONOTONIC ns; 0 = never
	Stall     uint64     // ns
	Unread    uint64     // ns; 0 = no read test
}

// encode lays c out as the program reads it: host byte order, but the
// probe's port, EtherType and address in network order so they compare
// equal to the packet's bytes.
func (c configValue) encode() []byte {
	b := make([]byte, configSize)
	binary.NativeEndian.PutUint32(b[cfgMode:], uint32(c.Mode))
	binary.BigEndian.PutUint16(b[cfgProbePort:], c.ProbePort)
	switch a := c.ProbeAddr; {
	case a.Is4():
		binary.BigEndian.PutUint16(b[cfgProbeProto:], ethPIPv4)
		a4 := a.As4()
		copy(b[cfgProbeAddr:], a4[:])
	case a.Is6():
		binary.BigEndian.PutUint16(b[cfgProbeProto:], ethPIPv6)
		a16 := a.As16()
		copy(b[cfgProbeAddr:], a16[:])
	}
	binary.NativeEndian.PutUint64(b[cfgHeartbeat:], c.Heartbeat)
	binary.NativeEndian.PutUint64(b[cfgStall:], c.Stall)
	binary.NativeEndian.PutUint64(b[cfgUnread:], c.Unread)
	return b
}

// decodeConfig is encode's inverse.
func decodeConfig(b []byte) (configValue, error) {
	if len(b) != configSize {
		return configValue{}, fmt.Errorf("config value: %d bytes, want %d", len(b), configSize)
	}
	c := configValue{
		Mode:      Mode(binary.NativeEndian.Uint32(b[cfgMode:])),
		ProbePort: binary.BigEndian.Uint16(b[cfgProbePort:]),
		Heartbeat: binary.NativeEndian.Uint64(b[cfgHeartbeat:]),
		Stall:     binary.NativeEndian.Uint64(b[cfgStall:]),
		Unread:    binary.NativeEndian.Uint64(b[cfgUnread:]),
	}
	switch proto := binary.BigEndian.Uint16(b[cfgProbeProto:]); proto {
	case 0:
	case ethPIPv4:
		c.ProbeAddr = netip.AddrFrom4([4]byte(b[cfgProbeAddr : cfgProbeAddr+4]))
	case ethPIPv6:
		c.ProbeAddr = netip.AddrFrom16([16]byte(b[cfgProbeAddr : cfgProbeAddr+16]))
	default:
		return configValue{}, fmt.Errorf("config value: probe EtherType %#04x", proto)
	}
	return c, nil
}
