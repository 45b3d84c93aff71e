package tap

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// pendAge is how long a query waits in its slot before the sweep shows it
// to the observer: LocalDNS answers a cached name in about a millisecond,
// so what is still waiting then is a miss it forwards, or a query it
// dropped. The hedger's first deadline is 50 ms at the earliest.
const pendAge = 10 * time.Millisecond

// pendWake is the entry of pend past the slots whose first word the
// reader sets before it waits with no timeout: the ingress program that
// then holds a query swaps it back to 0 and, if it was 1, writes a
// recordWake record, whose arrival wakes the reader. A query held in a
// slot writes no record of its own, and a quiet node's reader would
// otherwise not wake for it.
const pendWake = pendSlots

// pendSlotMaps are the pending slots' two arrays and their mappings.
type pendSlotMaps struct {
	meta, data *ebpf.Map
	mem, dmem  []byte // the mappings: pendSlots+1 entries of pendMeta bytes; pendSlots of pendRoom
	buf        [pendRoom]byte
}

func newPendSlotMaps() (_ *pendSlotMaps, err error) {
	p := &pendSlotMaps{}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	if p.meta, err = ebpf.NewMap(&ebpf.MapSpec{
		Name: "dnsstandby_pend", Type: ebpf.Array, KeySize: 4, ValueSize: pendMeta,
		MaxEntries: pendSlots + 1, Flags: unix.BPF_F_MMAPABLE,
	}); err != nil {
		return nil, fmt.Errorf("create pending slots: %w", err)
	}
	if p.data, err = ebpf.NewMap(&ebpf.MapSpec{
		Name: "dnsstandby_pendq", Type: ebpf.Array, KeySize: 4, ValueSize: pendRoom,
		MaxEntries: pendSlots, Flags: unix.BPF_F_MMAPABLE,
	}); err != nil {
		return nil, fmt.Errorf("create pending queries: %w", err)
	}
	if p.mem, err = mapArray(p.meta, (pendSlots+1)*pendMeta); err != nil {
		return nil, err
	}
	if p.dmem, err = mapArray(p.data, pendSlots*pendRoom); err != nil {
		return nil, err
	}
	return p, nil
}

// mapArray maps an mmapable array's n bytes of values.
func mapArray(m *ebpf.Map, n int) ([]byte, error) {
	ps := os.Getpagesize()
	b, err := unix.Mmap(m.FD(), 0, (n+ps-1)/ps*ps, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map array %s: %w", m, err)
	}
	return b[:n], nil
}

func (p *pendSlotMaps) close() {
	for _, b := range [][]byte{p.mem, p.dmem} {
		if b != nil {
			unix.Munmap(b[:cap(b)])
		}
	}
	for _, m := range []*ebpf.Map{p.meta, p.data} {
		if m != nil {
			m.Close()
		}
	}
}

// word is the u32 at off in the mapping, for atomic use.
func (p *pendSlotMaps) word(off int) *uint32 { return (*uint32)(unsafe.Pointer(&p.mem[off])) }

// sweep hands fn each query that has waited in its slot since before
// oldest (CLOCK_MONOTONIC ns), taking it from the slot, and returns how
// many it took, how many wait still and when the first of those came (0
// if none). A slot the egress program frees meanwhile (its reply came)
// is left to it. pkt is valid during the call only.
func (p *pendSlotMaps) sweep(oldest int64, fn func(at int64, pkt []byte)) (took, waiting int, first int64) {
	for i := range pendSlots {
		off := i * pendMeta
		state := p.word(off + pendState)
		st := atomic.LoadUint32(state)
		if st&pendMask != pendWaiting {
			continue
		}
		// The program writes the slot before it publishes it as waiting
		// (an atomic exchange), and the load above orders these after it.
		at := int64(binary.NativeEndian.Uint64(p.mem[off+pendTime:]))
		if at > oldest {
			if waiting == 0 || at < first {
				first = at
			}
			waiting++
			continue
		}
		n := min(int(binary.NativeEndian.Uint32(p.mem[off+pendLen:])), pendRoom)
		copy(p.buf[:n], p.dmem[i*pendRoom:])
		// Taken only if it is still this generation's query, waiting.
		if !atomic.CompareAndSwapUint32(state, st, st&^pendMask) {
			continue
		}
		took++
		fn(at, p.buf[:n])
	}
	return took, waiting, first
}

// anyWaiting reports whether a query waits in a slot.
func (p *pendSlotMaps) anyWaiting() bool {
	for i := range pendSlots {
		if atomic.LoadUint32(p.word(i*pendMeta+pendState))&pendMask == pendWaiting {
			return true
		}
	}
	return false
}

// sleeping tells the ingress program, on, that the reader is about to
// wait with no timeout, and must be woken for a query it holds; off,
// that it is awake.
func (p *pendSlotMaps) sleeping(on bool) {
	var v uint32
	if on {
		v = 1
	}
	atomic.StoreUint32(p.word(pendWake*pendMeta), v)
}
