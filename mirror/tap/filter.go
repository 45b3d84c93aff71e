package tap

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"golang.org/x/net/bpf"
)

// The kernel's values the filter compares with.
const (
	packetHost     = 0      // PACKET_HOST, skb->pkt_type of a packet addressed to this host
	packetOutgoing = 4      // PACKET_OUTGOING, skb->pkt_type of a packet this host sends
	etherTypeIPv4  = 0x0800 // ETH_P_IP
	etherTypeIPv6  = 0x86dd // ETH_P_IPV6
	protoUDP       = 17
	// ipv4FragMask covers the IPv4 header's MF flag and fragment offset:
	// any bit set means the datagram is a fragment, and only the first
	// fragment would even hold the UDP header.
	ipv4FragMask = 0x3fff
)

// snapLen is what the filter returns for a packet it passes: the most of
// it the kernel may queue. It is larger than any IP packet (an IPv6 packet
// without jumbo payload is at most 40+65535 bytes), so nothing is cut in
// the kernel; a packet larger than the read slot shows as MSG_TRUNC.
const snapLen = 1 << 18

// snapQuery is what the filter returns for a query it passes. It differs
// from snapLen only so that the eBPF translation (localProgram) can tell
// the two exits apart: the "sent by this host" test belongs on the
// reply's, never on the query's (a query is always received). Both are
// larger than any IP packet.
const snapQuery = snapLen - 1

// maxFilterAddrs bounds Config.Addrs: a jump in classic BPF skips at most
// 255 instructions, and an IPv6 address costs eight. LocalDNS listens on
// two addresses.
const maxFilterAddrs = 16

// filterSpec is what the filter matches.
type filterSpec struct {
	v4, v6      []netip.Addr // source addresses taken, by family
	port        uint16       // source port taken
	excludeMark uint32       // skb mark of packets to leave out; 0 = none
	// queries: also pass datagrams this host receives (PACKET_HOST) for
	// one of the addresses and port: the queries LocalDNS is asked.
	queries bool
}

// newFilterSpec checks the addresses and port a Config gives; its errors
// name the Config fields, and Start puts the package's name before them.
func newFilterSpec(addrs []netip.Addr, port uint16, excludeMark uint32, queries bool) (filterSpec, error) {
	s := filterSpec{port: port, excludeMark: excludeMark, queries: queries}
	if len(addrs) == 0 {
		return s, errors.New("Addrs is empty")
	}
	if len(addrs) > maxFilterAddrs {
		return s, fmt.Errorf("Addrs has %d addresses, at most %d", len(addrs), maxFilterAddrs)
	}
	if port == 0 {
		return s, errors.New("Port must not be 0")
	}
	for _, a := range addrs {
		a = a.Unmap()
		switch {
		case !a.IsValid():
			return s, errors.New("Addrs holds an invalid address")
		case a.Zone() != "":
			return s, fmt.Errorf("Addrs: %s: zones are not supported", a)
		case a.Is4():
			s.v4 = append(s.v4, a)
		default:
			s.v6 = append(s.v6, a)
		}
	}
	return s, nil
}

// matches says whether ap is one of the listen addresses and port: a
// reply's source or a query's destination (the user-space check behind
// the kernel's).
func (s *filterSpec) matches(ap netip.AddrPort) bool {
	if ap.Port() != s.port {
		return false
	}
	addrs := s.v6
	if ap.Addr().Is4() {
		addrs = s.v4
	}
	for _, a := range addrs {
		if a == ap.Addr() {
			return true
		}
	}
	return false
}

// The filter reads three values the kernel keeps beside the packet data:
// the packet type, the skb mark and the link-layer protocol. In the kernel
// they are ancillary loads (SKF_AD_PKTTYPE, SKF_AD_MARK, SKF_AD_PROTOCOL).
// golang.org/x/net/bpf's VM has none of them, so for tests the same program
// is built with them read from a pseudo-header of vmHeaderLen bytes in
// front of the packet, every packet offset moved by that much: the VM then
// runs every branch the kernel runs.
const (
	vmTypeOff   = 0 // uint32: pkt_type
	vmMarkOff   = 4 // uint32: mark
	vmProtoOff  = 8 // uint32: protocol (ethertype)
	vmHeaderLen = 12
)

// loads says where the program finds the packet's metadata and data.
type loads struct {
	pktType, mark, proto bpf.Instruction
	off                  uint32 // where the IP header starts
}

var kernelLoads = loads{
	pktType: bpf.LoadExtension{Num: bpf.ExtType},
	mark:    bpf.LoadExtension{Num: bpf.ExtMark},
	proto:   bpf.LoadExtension{Num: bpf.ExtProto},
}

var vmLoads = loads{
	pktType: bpf.LoadAbsolute{Off: vmTypeOff, Size: 4},
	mark:    bpf.LoadAbsolute{Off: vmMarkOff, Size: 4},
	proto:   bpf.LoadAbsolute{Off: vmProtoOff, Size: 4},
	off:     vmHeaderLen,
}

// program returns the classic BPF filter for s; it is a pure function of
// its arguments. It passes a packet (returning snapLen) only if it is
// outgoing, not marked with s.excludeMark, IPv4 or IPv6 (by ethertype and
// by version nibble), carries UDP directly (no IPv6 extension header), is
// not an IPv4 fragment, and comes from one of s's addresses and s.port.
// With s.queries it also passes (returning snapQuery) a packet received
// for this host (PACKET_HOST) that passes the same tests on its
// destination address and port instead. Everything else returns 0: the
// kernel drops it before queueing.
func (s *filterSpec) program(l loads) ([]bpf.Instruction, error) {
	a, err := s.assemble(l)
	if err != nil {
		return nil, err
	}
	return a.ins, nil
}

// listing returns the program for l with one instruction a line, its
// index, labels and comment: for test failures and debugging.
func (s *filterSpec) listing(l loads) string {
	a, err := s.assemble(l)
	if err != nil {
		return err.Error()
	}
	at := map[int][]string{}
	for name, i := range a.labels {
		at[i] = append(at[i], name)
	}
	var b strings.Builder
	for i, in := range a.ins {
		for _, name := range slices.Sorted(slices.Values(at[i])) {
			fmt.Fprintf(&b, "%s:\n", name)
		}
		fmt.Fprintf(&b, "%3d  %-40v // %s\n", i, in, a.comments[i])
	}
	return b.String()
}

func (s *filterSpec) assemble(l loads) (*classicAsm, error) {
	a := new(classicAsm)
	a.op(l.pktType, "A = pkt_type")
	if s.queries {
		a.jump(bpf.JumpEqual, packetHost, "query", "", "received for this host: a query (on lo, the incoming copy)")
	}
	a.jump(bpf.JumpNotEqual, packetOutgoing, "drop", "", "only what this host sends: on lo each packet also comes back in")
	s.direction(a, l, replyDir)
	a.label("accept")
	a.op(bpf.RetConstant{Val: snapLen}, "pass")
	a.label("drop")
	a.op(bpf.RetConstant{Val: 0}, "drop")
	if s.queries {
		// The query path has its own exits: a jump back is impossible,
		// and one over the whole reply path to a shared exit could be
		// longer than the 255 instructions a classic jump skips.
		a.label("query")
		s.direction(a, l, queryDir)
		a.label("qaccept")
		a.op(bpf.RetConstant{Val: snapQuery}, "pass a query")
		a.label("qdrop")
		a.op(bpf.RetConstant{Val: 0}, "drop")
	}
	if err := a.resolve(); err != nil {
		return nil, err
	}
	return a, nil
}

// dir is one path through the filter: replies (matched on their source)
// or queries (matched on their destination). Its labels are prefixed so
// that both paths can sit in one program; the reply path's are the
// program's labels as they were before queries.
type dir struct {
	prefix  string // of the path's labels
	end     string // "source" or "destination": which address and port are matched
	addr4   uint32 // offset of that IPv4 address
	addr6   uint32 // offset of that IPv6 address
	portOff uint32 // offset of that port in the UDP header
}

var (
	replyDir = dir{prefix: "", end: "source", addr4: 12, addr6: 8, portOff: 0}
	queryDir = dir{prefix: "q", end: "destination", addr4: 16, addr6: 24, portOff: 2}
)

// direction appends d's path: mark, ethertype, IP and UDP tests, ending in
// a jump to d's accept or drop label.
func (s *filterSpec) direction(a *classicAsm, l loads, d dir) {
	o := l.off
	lb := func(name string) string { return d.prefix + name }
	if s.excludeMark != 0 {
		a.op(l.mark, "A = skb mark")
		comment := "our own replies, marked with SO_MARK"
		if d == queryDir {
			comment = "our own queries to LocalDNS (probes), marked with SO_MARK"
		}
		a.jump(bpf.JumpEqual, s.excludeMark, lb("drop"), "", comment)
	}
	a.op(l.proto, "A = ethertype")
	if len(s.v4) > 0 {
		a.jump(bpf.JumpEqual, etherTypeIPv4, lb("ipv4"), "", "IPv4")
	}
	if len(s.v6) > 0 {
		a.jump(bpf.JumpEqual, etherTypeIPv6, lb("ipv6"), "", "IPv6")
	}
	a.jumpTo(lb("drop"), "neither")

	if len(s.v4) > 0 {
		a.label(lb("ipv4"))
		a.op(bpf.LoadAbsolute{Off: o + 0, Size: 1}, "A = version, IHL")
		a.op(bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: 0xf0}, "A = version << 4")
		a.jump(bpf.JumpNotEqual, 0x40, lb("drop"), "", "version 4")
		a.op(bpf.LoadAbsolute{Off: o + 9, Size: 1}, "A = protocol")
		a.jump(bpf.JumpNotEqual, protoUDP, lb("drop"), "", "UDP")
		a.op(bpf.LoadAbsolute{Off: o + 6, Size: 2}, "A = flags, fragment offset")
		a.jump(bpf.JumpBitsSet, ipv4FragMask, lb("drop"), "", "not a fragment")
		a.op(bpf.LoadAbsolute{Off: o + d.addr4, Size: 4}, "A = "+d.end+" address")
		for _, addr := range s.v4 {
			b := addr.As4()
			a.jump(bpf.JumpEqual, be32(b[:]), lb("ipv4port"), "", addr.String())
		}
		a.jumpTo(lb("drop"), "no address matched")
		a.label(lb("ipv4port"))
		a.op(bpf.LoadMemShift{Off: o + 0}, "X = IHL*4")
		a.op(bpf.LoadIndirect{Off: o + d.portOff, Size: 2}, "A = UDP "+d.end+" port")
		a.jump(bpf.JumpEqual, uint32(s.port), lb("accept"), lb("drop"), d.end+" port")
	}

	if len(s.v6) > 0 {
		a.label(lb("ipv6"))
		a.op(bpf.LoadAbsolute{Off: o + 0, Size: 1}, "A = version, traffic class")
		a.op(bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: 0xf0}, "A = version << 4")
		a.jump(bpf.JumpNotEqual, 0x60, lb("drop"), "", "version 6")
		a.op(bpf.LoadAbsolute{Off: o + 6, Size: 1}, "A = next header")
		a.jump(bpf.JumpNotEqual, protoUDP, lb("drop"), "", "UDP right after the fixed header")
		for i, addr := range s.v6 {
			b := addr.As16()
			next := lb(fmt.Sprintf("ipv6addr%d", i+1))
			for w := range 4 {
				a.op(bpf.LoadAbsolute{Off: o + d.addr6 + 4*uint32(w), Size: 4}, fmt.Sprintf("A = %s address word %d", d.end, w))
				if w < 3 {
					a.jump(bpf.JumpNotEqual, be32(b[4*w:]), next, "", addr.String())
				} else {
					a.jump(bpf.JumpEqual, be32(b[4*w:]), lb("ipv6port"), next, addr.String())
				}
			}
			a.label(next)
		}
		a.jumpTo(lb("drop"), "no address matched")
		a.label(lb("ipv6port"))
		a.op(bpf.LoadAbsolute{Off: o + 40 + d.portOff, Size: 2}, "A = UDP "+d.end+" port")
		a.jump(bpf.JumpEqual, uint32(s.port), lb("accept"), lb("drop"), d.end+" port")
	}
}

func be32(b []byte) uint32 {
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// classicAsm collects instructions whose jumps name labels, and resolves them
// into the relative skips classic BPF uses.
type classicAsm struct {
	ins      []bpf.Instruction
	comments []string // one per instruction
	jumps    []pendingJump
	labels   map[string]int
}

// pendingJump is a jump at ins[at] whose targets are labels ("" = the next
// instruction).
type pendingJump struct {
	at              int
	cond            bpf.JumpTest
	val             uint32
	ifTrue, ifFalse string
	always          bool // an unconditional jump to ifTrue
}

// op appends an instruction; comment says what it does (listing shows it).
func (a *classicAsm) op(in bpf.Instruction, comment string) {
	a.ins = append(a.ins, in)
	a.comments = append(a.comments, comment)
}

// jump appends "if A cond val goto ifTrue else goto ifFalse".
func (a *classicAsm) jump(cond bpf.JumpTest, val uint32, ifTrue, ifFalse, comment string) {
	a.jumps = append(a.jumps, pendingJump{at: len(a.ins), cond: cond, val: val, ifTrue: ifTrue, ifFalse: ifFalse})
	a.op(nil, comment)
}

// jumpTo appends "goto label".
func (a *classicAsm) jumpTo(label, comment string) {
	a.jumps = append(a.jumps, pendingJump{at: len(a.ins), ifTrue: label, always: true})
	a.op(nil, comment)
}

func (a *classicAsm) label(name string) {
	if a.labels == nil {
		a.labels = map[string]int{}
	}
	a.labels[name] = len(a.ins)
}

func (a *classicAsm) resolve() error {
	skip := func(j pendingJump, label string) (uint32, error) {
		if label == "" {
			return 0, nil
		}
		to, ok := a.labels[label]
		if !ok {
			return 0, fmt.Errorf("bpf: undefined label %q", label)
		}
		if to <= j.at {
			return 0, fmt.Errorf("bpf: backward jump to %q", label)
		}
		return uint32(to - j.at - 1), nil
	}
	for _, j := range a.jumps {
		t, err := skip(j, j.ifTrue)
		if err != nil {
			return err
		}
		if j.always {
			a.ins[j.at] = bpf.Jump{Skip: t}
			continue
		}
		f, err := skip(j, j.ifFalse)
		if err != nil {
			return err
		}
		if t > 255 || f > 255 {
			return fmt.Errorf("bpf: jump at %d too long (%d, %d)", j.at, t, f)
		}
		a.ins[j.at] = bpf.JumpIf{Cond: j.cond, Val: j.val, SkipTrue: uint8(t), SkipFalse: uint8(f)}
	}
	return nil
}
