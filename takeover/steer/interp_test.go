package steer

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
)

// This file runs the program's kernel encoding through a small eBPF
// interpreter that models the sk_reuseport context, the config and live
// maps and the sockarray, so every decision the program makes, and every
// note it leaves in the live value, is checked against the specification
// without a kernel.

// kind tags what a register or memory word points to.
type kind int

const (
	scalar kind = iota
	ctxPtr
	stackPtr
	cfgPtr    // the config map's value
	livePtr   // the live map's value
	pktPtr    // packet data (UDP/TCP header first)
	pktEnd    // data_end
	mapConfig // a map pointer (LDDW of the config map's fd)
	mapLive
	mapSocks
)

type reg struct {
	k   kind
	off int64 // pointer offset, or the scalar's value (as int64 bits)
}

// machine is one packet's run.
type machine struct {
	cfg      []byte // nil: no config value
	live     []byte // nil: no live value
	pkt      []byte // from the UDP/TCP header
	net      []byte // the IP header, before pkt
	ethProto uint16 // skb->protocol, in network order
	hash     uint32
	now      uint64
	filled   [sockarraySize]bool
	stack    [512]byte
	selected int // last slot bpf_sk_select_reuseport accepted; -1 none
	calls    []int
}

func (m *machine) load(r reg, off int64, size int) (reg, error) {
	at := r.off + off
	switch r.k {
	case ctxPtr:
		switch {
		case at == ctxData && size == 8:
			return reg{k: pktPtr}, nil
		case at == ctxDataEnd && size == 8:
			return reg{k: pktEnd, off: int64(len(m.pkt))}, nil
		case at == ctxHash && size == 4:
			return reg{off: int64(m.hash)}, nil
		case at == ctxEthProtocol && size == 4:
			// The kernel loads the __be16 as it is in memory.
			var b [2]byte
			binary.BigEndian.PutUint16(b[:], m.ethProto)
			return reg{off: int64(binary.NativeEndian.Uint16(b[:]))}, nil
		}
		return reg{}, fmt.Errorf("ctx load of %d bytes at %d", size, at)
	case cfgPtr:
		return scalarFrom(m.cfg, at, size)
	case livePtr:
		return scalarFrom(m.live, at, size)
	case pktPtr:
		return scalarFrom(m.pkt, at, size)
	case stackPtr:
		return scalarFrom(m.stack[:], 512+at, size)
	}
	return reg{}, fmt.Errorf("load through %v", r.k)
}

func scalarFrom(b []byte, at int64, size int) (reg, error) {
	if at < 0 || at+int64(size) > int64(len(b)) {
		return reg{}, fmt.Errorf("load of %d bytes at %d outside %d", size, at, len(b))
	}
	switch size {
	case 2:
		return reg{off: int64(binary.NativeEndian.Uint16(b[at:]))}, nil
	case 4:
		return reg{off: int64(binary.NativeEndian.Uint32(b[at:]))}, nil
	case 8:
		return reg{off: int64(binary.NativeEndian.Uint64(b[at:]))}, nil
	}
	return reg{}, fmt.Errorf("load size %d", size)
}

// store writes v: words to the stack (map keys), double words to the
// stack (the packet's time) and the live value (its notes).
func (m *machine) store(r reg, off int64, size int, v uint64) error {
	var b []byte
	at := r.off + off
	switch {
	case r.k == stackPtr && (size == 4 || size == 8):
		b, at = m.stack[:], 512+at
	case r.k == livePtr && size == 8:
		b = m.live
	default:
		return fmt.Errorf("store of %d bytes through %v at %d", size, r.k, at)
	}
	if at < 0 || at+int64(size) > int64(len(b)) {
		return fmt.Errorf("store of %d bytes through %v at %d outside %d", size, r.k, r.off+off, len(b))
	}
	if size == 4 {
		binary.NativeEndian.PutUint32(b[at:], uint32(v))
	} else {
		binary.NativeEndian.PutUint64(b[at:], v)
	}
	return nil
}

var sizes = map[uint8]int{0x00: 4, 0x08: 2, 0x10: 1, 0x18: 8}

// run interprets code and returns r0 at exit.
func (m *machine) run(code []byte) (uint64, error) {
	var r [11]reg
	r[1] = reg{k: ctxPtr}
	r[10] = reg{k: stackPtr}
	m.selected = -1
	n := len(code) / 8
	for pc, steps := 0, 0; ; pc, steps = pc+1, steps+1 {
		if pc < 0 || pc >= n || steps > 10000 {
			return 0, fmt.Errorf("pc %d out of the program", pc)
		}
		b := code[pc*8:]
		op := b[0]
		dst, src := b[1]&0xf, b[1]>>4
		off := int64(int16(binary.LittleEndian.Uint16(b[2:])))
		imm := int64(int32(binary.LittleEndian.Uint32(b[4:])))
		class := op & 7
		switch class {
		case 0x07: // ALU64
			v := reg{off: imm}
			if op&0x08 != 0 {
				v = r[src]
			}
			d := r[dst]
			switch op & 0xf0 {
			case 0xb0: // mov
				d = v
			case 0x00: // add
				if v.k != scalar {
					return 0, fmt.Errorf("pc %d: add of a pointer", pc)
				}
				d.off += v.off
			case 0x10: // sub
				if d.k != scalar || v.k != scalar {
					return 0, fmt.Errorf("pc %d: sub with a pointer", pc)
				}
				d.off -= v.off
			case 0x50: // and
				if d.k != scalar {
					return 0, fmt.Errorf("pc %d: and of a pointer", pc)
				}
				d.off &= v.off
			default:
				return 0, fmt.Errorf("pc %d: ALU op %#x", pc, op)
			}
			r[dst] = d
		case 0x01: // LDX
			v, err := m.load(r[src], off, sizes[op&0x18])
			if err != nil {
				return 0, fmt.Errorf("pc %d: %w", pc, err)
			}
			r[dst] = v
		case 0x03: // STX
			if op&0xe0 == 0xc0 { // atomic
				if imm != 0 || r[src].k != scalar || r[dst].k != livePtr || op&0x18 != 0x18 {
					return 0, fmt.Errorf("pc %d: atomic op %#x imm %#x through %v", pc, op, imm, r[dst].k)
				}
				old, err := m.load(r[dst], off, 8)
				if err != nil {
					return 0, fmt.Errorf("pc %d: %w", pc, err)
				}
				if err := m.store(r[dst], off, 8, uint64(old.off+r[src].off)); err != nil {
					return 0, fmt.Errorf("pc %d: %w", pc, err)
				}
				continue
			}
			fallthrough
		case 0x02: // ST
			if op&0xe0 != 0x60 {
				return 0, fmt.Errorf("pc %d: store mode %#x", pc, op&0xe0)
			}
			v := uint64(imm)
			if class == 0x03 {
				if r[src].k != scalar {
					return 0, fmt.Errorf("pc %d: stores a pointer", pc)
				}
				v = uint64(r[src].off)
			}
			if err := m.store(r[dst], off, sizes[op&0x18], v); err != nil {
				return 0, fmt.Errorf("pc %d: %w", pc, err)
			}
		case 0x00: // LDDW
			if op != 0x18 || src != 1 {
				return 0, fmt.Errorf("pc %d: LD op %#x src %d", pc, op, src)
			}
			switch imm {
			case fakeConfigFD:
				r[dst] = reg{k: mapConfig}
			case fakeLiveFD:
				r[dst] = reg{k: mapLive}
			case fakeSockarrayFD:
				r[dst] = reg{k: mapSocks}
			default:
				return 0, fmt.Errorf("pc %d: map fd %d", pc, imm)
			}
			pc++
		case 0x05: // JMP
			jop := op & 0xf0
			if jop == 0x90 { // exit
				if r[0].k != scalar {
					return 0, fmt.Errorf("pc %d: exit with a pointer", pc)
				}
				return uint64(r[0].off), nil
			}
			if jop == 0x80 { // call
				if err := m.call(pc, imm, &r); err != nil {
					return 0, err
				}
				continue
			}
			a, v := r[dst], reg{off: imm}
			if op&0x08 != 0 {
				v = r[src]
			}
			var take bool
			switch {
			case jop == 0x00:
				take = true
			case jop == 0x20 && a.k == pktPtr && v.k == pktEnd: // data+n > data_end
				take = a.off > v.off
			case a.k != scalar || v.k != scalar:
				// A null check of a map lookup's result.
				if (a.k == cfgPtr || a.k == livePtr) && v.k == scalar && v.off == 0 && (jop == 0x10 || jop == 0x50) {
					take = jop == 0x50
					break
				}
				return 0, fmt.Errorf("pc %d: compares %v with %v", pc, a.k, v.k)
			case jop == 0x10:
				take = a.off == v.off
			case jop == 0x50:
				take = a.off != v.off
			case jop == 0x20:
				take = uint64(a.off) > uint64(v.off)
			case jop == 0x60:
				take = a.off > v.off
			case jop == 0x70:
				take = a.off >= v.off
			default:
				return 0, fmt.Errorf("pc %d: jump op %#x", pc, op)
			}
			if take {
				pc += int(off)
			}
		default:
			return 0, fmt.Errorf("pc %d: class %#x", pc, class)
		}
	}
}

const enoent = -2

func (m *machine) call(pc int, fn int64, r *[11]reg) error {
	ret := reg{}
	switch fn {
	case 1: // map_lookup_elem(map, &key)
		if (r[1].k != mapConfig && r[1].k != mapLive) || r[2].k != stackPtr {
			return fmt.Errorf("pc %d: map_lookup_elem(%v, %v)", pc, r[1].k, r[2].k)
		}
		key, err := m.load(r[2], 0, 4)
		if err != nil {
			return err
		}
		switch {
		case key.off != 0:
		case r[1].k == mapConfig && m.cfg != nil:
			ret = reg{k: cfgPtr}
		case r[1].k == mapLive && m.live != nil:
			ret = reg{k: livePtr}
		}
	case 5: // ktime_get_ns
		ret = reg{off: int64(m.now)}
	case 68: // skb_load_bytes_relative(ctx, offset, to, len, start_header)
		if r[1].k != ctxPtr || r[2].k != scalar || r[3].k != stackPtr || r[4].k != scalar || r[5].k != scalar || r[5].off != bpfHdrStartNet {
			return fmt.Errorf("pc %d: skb_load_bytes_relative(%v, %v, %v, %v, %v)", pc, r[1].k, r[2], r[3].k, r[4], r[5])
		}
		off, n, to := r[2].off, r[4].off, 512+r[3].off
		if n <= 0 || to < 0 || to+n > 512 {
			return fmt.Errorf("pc %d: skb_load_bytes_relative of %d bytes to stack %d", pc, n, r[3].off)
		}
		dst := m.stack[to : to+n]
		if off < 0 || off+n > int64(len(m.net)) {
			clear(dst)          // as the kernel does on failure
			ret = reg{off: -14} // -EFAULT
			break
		}
		copy(dst, m.net[off:off+n])
	case 82: // sk_select_reuseport(ctx, sockarray, &key, flags)
		if r[1].k != ctxPtr || r[2].k != mapSocks || r[3].k != stackPtr || r[4].k != scalar || r[4].off != 0 {
			return fmt.Errorf("pc %d: sk_select_reuseport(%v, %v, %v, %v)", pc, r[1].k, r[2].k, r[3].k, r[4])
		}
		key, err := m.load(r[3], 0, 4)
		if err != nil {
			return err
		}
		m.calls = append(m.calls, int(key.off))
		if key.off >= 0 && key.off < sockarraySize && m.filled[key.off] {
			m.selected = int(key.off)
		} else {
			ret = reg{off: enoent}
		}
	default:
		return fmt.Errorf("pc %d: helper %d", pc, fn)
	}
	r[0] = ret
	for i := 1; i <= 5; i++ {
		r[i] = reg{k: scalar, off: 0x5a5a} // clobbered
	}
	return nil
}

// ipHeader returns an IP header (v4 or v6 as src is) with source address
// src, and its EtherType.
func ipHeader(src netip.Addr) ([]byte, uint16) {
	if src.Is4() {
		h := make([]byte, 20)
		h[0] = 0x45
		a := src.As4()
		copy(h[ipv4SrcOff:], a[:])
		copy(h[16:], []byte{169, 254, 10, 11})
		return h, ethPIPv4
	}
	h := make([]byte, 40)
	h[0] = 0x60
	a := src.As16()
	copy(h[ipv6SrcOff:], a[:])
	h[39] = 1
	return h, ethPIPv6
}

// wantSlot is the specification: the slot the program must select, or -1
// for none (the kernel's hash), and whether the packet counts as kept from
// us because we were not reading (bypassed). fresh is the heartbeat's
// verdict, reading the read test's.
func wantSlot(mode Mode, fresh, reading, probe bool, filled [sockarraySize]bool, hash uint32) (slot int, bypassed bool) {
	peer := func() int {
		for i := range uint32(MaxPeers) {
			if k := 1 + (hash+i)&(MaxPeers-1); filled[k] {
				return int(k)
			}
		}
		return -1
	}
	if probe {
		return peer(), false
	}
	// Kept from us for not reading: the packets whose turn ours was.
	notReading := fresh && !reading
	switch mode {
	case ToUs:
		if fresh && reading && filled[0] {
			return 0, false
		}
		return peer(), notReading
	case ToPeer:
		if p := peer(); p >= 0 {
			return p, false
		}
		if fresh && reading && filled[0] {
			return 0, false
		}
		return -1, notReading
	}
	return -1, false
}

// liveState is the live value before a packet, and what the read test
// must make of it.
type liveState struct {
	name                   string
	off                    bool // the read test is off (an unread limit of 0)
	reads, seen            uint64
	pending                uint64 // CLOCK_MONOTONIC ns
	reading                bool   // the read test passes
	wait                   int64  // how long packets have waited unread, when the test measures it (reads == seen != 0)
	measured               bool
	initialMax, initialByp uint64
}

func TestProgramDecisions(t *testing.T) {
	_, code := encoded(t)
	const (
		now    = 100e9
		stall  = 2e9
		unread = 150e6
		probe  = 5353
	)
	heartbeats := []struct {
		name  string
		hb    uint64
		fresh bool
	}{
		{"never", 0, false},
		{"fresh", now - 1e9, true},
		{"at-limit", now - stall, true},
		{"stale", now - stall - 1, false},
		{"future", now + 5, true}, // another CPU's clock a hair ahead
	}
	lives := []liveState{
		{name: "no-reader", reads: 0, seen: 0, pending: 0, reading: true},
		{name: "no-reader-stale-notes", reads: 0, seen: 0, pending: now - 10e9, reading: true, initialByp: 3},
		{name: "read-since", reads: 7, seen: 6, pending: now - 10e9, reading: true, initialMax: 5e6},
		{name: "first-read", reads: 1, seen: 0, pending: 0, reading: true},
		{name: "waiting", reads: 7, seen: 7, pending: now - 10e6, reading: true, wait: 10e6, measured: true, initialMax: 5e6},
		{name: "waiting-less-than-max", reads: 7, seen: 7, pending: now - 1e6, reading: true, wait: 1e6, measured: true, initialMax: 5e6},
		{name: "at-limit", reads: 7, seen: 7, pending: now - unread, reading: true, wait: unread, measured: true},
		{name: "unread", reads: 7, seen: 7, pending: now - unread - 1, reading: false, wait: unread + 1, measured: true, initialByp: 41},
		{name: "future", reads: 7, seen: 7, pending: now + 5, reading: true, wait: -5, measured: true},
		{name: "off-unread", off: true, reads: 7, seen: 7, pending: now - unread - 1, reading: true, initialByp: 41},
		{name: "off-read-since", off: true, reads: 7, seen: 6, pending: now - 10e9, reading: true},
	}
	slotSets := [][]int{{}, {0}, {1}, {0, 1}, {0, 3, 6}, {2, 8}, {0, 1, 2, 3, 4, 5, 6, 7, 8}}
	prober4, prober6 := netip.MustParseAddr("10.224.0.4"), netip.MustParseAddr("fd00::4")
	probers := []struct {
		name string
		port uint16
		addr netip.Addr
	}{
		{"none", 0, netip.Addr{}},
		{"v4", probe, prober4},
		{"v6", probe, prober6},
		{"port-without-address", probe, netip.Addr{}},
	}
	probePort := []byte{probe >> 8, probe & 0xff, 0, 53, 0, 20, 0, 0}
	packets := []struct {
		name string
		pkt  []byte
		src  netip.Addr // in the IP header
		cut  int        // bytes of the IP header missing from the linear data
	}{
		{"other-port", []byte{0xc3, 0x50, 0, 53, 0, 20, 0, 0}, prober4, 0},
		{"probe-port-from-prober-v4", probePort, prober4, 0},
		{"probe-port-from-pod-v4", probePort, netip.MustParseAddr("10.244.1.7"), 0},
		{"probe-port-from-prober-v6", probePort, prober6, 0},
		{"probe-port-from-pod-v6", probePort, netip.MustParseAddr("fd00::4:0:0:0:4"), 0},
		{"probe-port-from-prober-v6, source address cut", probePort, prober6, 20},
		{"short", []byte{probe >> 8}, prober4, 0},
	}
	runs := 0
	for _, mode := range []Mode{Hash, ToPeer, ToUs, 7} {
		for _, hb := range heartbeats {
			for _, lv := range lives {
				for _, pr := range probers {
					for _, p := range packets {
						netHdr, proto := ipHeader(p.src)
						netHdr = netHdr[:len(netHdr)-p.cut]
						isProbe := len(p.pkt) >= 2 && pr.port != 0 && binary.BigEndian.Uint16(p.pkt) == pr.port &&
							pr.addr.IsValid() && p.src == pr.addr && p.cut == 0
						for _, set := range slotSets {
							for hash := range uint32(2 * MaxPeers) {
								limit := uint64(unread)
								if lv.off {
									limit = 0
								}
								m := &machine{
									cfg:      configValue{Mode: mode, ProbePort: pr.port, ProbeAddr: pr.addr, Heartbeat: hb.hb, Stall: stall, Unread: limit}.encode(),
									live:     make([]byte, liveSize),
									pkt:      p.pkt,
									net:      netHdr,
									ethProto: proto,
									hash:     hash * 0x9e3779b1 >> 3, // spread over the low bits too
									now:      now,
								}
								binary.NativeEndian.PutUint64(m.live[liveReads:], lv.reads)
								binary.NativeEndian.PutUint64(m.live[liveSeen:], lv.seen)
								binary.NativeEndian.PutUint64(m.live[livePending:], lv.pending)
								binary.NativeEndian.PutUint64(m.live[liveBypassed:], lv.initialByp)
								binary.NativeEndian.PutUint64(m.live[liveMaxWait:], lv.initialMax)
								for _, s := range set {
									m.filled[s] = true
								}
								ret, err := m.run(code)
								name := fmt.Sprintf("mode=%v hb=%s live=%s prober=%s pkt=%s slots=%v hash=%#x", mode, hb.name, lv.name, pr.name, p.name, set, m.hash)
								if err != nil {
									t.Fatalf("%s: %v", name, err)
								}
								if ret != skPass {
									t.Fatalf("%s: returned %d, want SK_PASS", name, ret)
								}
								want, bypassed := wantSlot(mode, hb.fresh, lv.reading, isProbe, m.filled, m.hash)
								if m.selected != want {
									t.Fatalf("%s: selected %d, want %d (tried %v)", name, m.selected, want, m.calls)
								}
								if len(m.calls) > MaxPeers+1 {
									t.Fatalf("%s: %d selections tried, want at most %d", name, len(m.calls), MaxPeers+1)
								}
								checkLive(t, name, m.live, lv, hb.fresh, bypassed, want == ourSlot, now, unread)
								runs++
							}
						}
					}
				}
			}
		}
	}
	t.Logf("%d packets decided as specified", runs)

	// Without a config value, or a live value, the program passes
	// without selecting.
	for _, m := range []*machine{
		{live: make([]byte, liveSize)},
		{cfg: configValue{Mode: ToUs, Heartbeat: 1, Stall: stall, Unread: unread}.encode()},
	} {
		m.pkt, m.filled = packets[0].pkt, [sockarraySize]bool{true, true}
		m.net, m.ethProto = ipHeader(prober4)
		if ret, err := m.run(code); err != nil || ret != skPass || m.selected != -1 {
			t.Fatalf("config %v, live %v: ret %d err %v selected %d; want SK_PASS, no selection", m.cfg != nil, m.live != nil, ret, err, m.selected)
		}
	}
}

// checkLive checks what the program left in the live value: our loops'
// count untouched; a packet given to us noted if it is the first since
// a read; a packet kept from us for not reading counted; the longest
// wait within the limit kept.
func checkLive(t *testing.T, name string, live []byte, before liveState, fresh, bypassed, ours bool, now, unread uint64) {
	t.Helper()
	u64 := func(off int) uint64 { return binary.NativeEndian.Uint64(live[off:]) }
	if got := u64(liveReads); got != before.reads {
		t.Fatalf("%s: reads %d, want %d: the program must not write our loops' count", name, got, before.reads)
	}
	wantSeen, wantPending := before.seen, before.pending
	if ours && before.reads != 0 && before.reads != before.seen {
		wantSeen, wantPending = before.reads, now
	}
	if u64(liveSeen) != wantSeen || u64(livePending) != wantPending {
		t.Fatalf("%s: seen %d pending %d, want %d and %d", name, u64(liveSeen), u64(livePending), wantSeen, wantPending)
	}
	wantByp := before.initialByp
	if bypassed {
		wantByp++
	}
	if got := u64(liveBypassed); got != wantByp {
		t.Fatalf("%s: bypassed %d, want %d", name, got, wantByp)
	}
	wantMax := before.initialMax
	if fresh && before.measured && before.wait <= int64(unread) && before.wait > int64(wantMax) {
		wantMax = uint64(before.wait)
	}
	if got := u64(liveMaxWait); got != wantMax {
		t.Fatalf("%s: max wait %d, want %d", name, got, wantMax)
	}
}
