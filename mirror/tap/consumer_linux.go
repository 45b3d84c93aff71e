package tap

import (
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// consumer reads a BPF ring buffer's records in place, from its memory
// mapping, with no system call. cilium/ebpf's ringbuf.Reader asks epoll
// whether data is there before each drain: one system call per drain,
// and on its way out of it the Go runtime wakes its monitor thread
// (sysmon), which then polls every 20 µs for a while; on this project's
// virtual machines that was most of what a drain cost. The ring is read
// here as the kernel documents it (Documentation/bpf/ringbuf.rst): a
// consumer page holding the consumer position, which only the reader
// writes; a producer page holding the producer position; and the data,
// mapped twice in a row so that a record wrapping around the end reads
// as one slice. Each record is an 8-byte header (its length, with a busy
// and a discard bit) and its data, padded to 8 bytes.
type consumer struct {
	consPage, prodPage []byte // the mappings
	cons, prod         *uint64
	data               []byte // the data area, twice
	size               uint64 // a power of two
}

// Ring record header bits (include/uapi/linux/bpf.h).
const (
	ringBusyBit    = 1 << 31
	ringDiscardBit = 1 << 30
	ringHeaderSize = 8
)

func newConsumer(m *ebpf.Map) (*consumer, error) {
	size, ps := int(m.MaxEntries()), os.Getpagesize()
	cp, err := unix.Mmap(m.FD(), 0, ps, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map the ring's consumer page: %w", err)
	}
	pp, err := unix.Mmap(m.FD(), int64(ps), ps+2*size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		unix.Munmap(cp)
		return nil, fmt.Errorf("map the ring's data: %w", err)
	}
	return &consumer{
		consPage: cp, prodPage: pp,
		cons: (*uint64)(unsafe.Pointer(&cp[0])), prod: (*uint64)(unsafe.Pointer(&pp[0])),
		data: pp[ps:], size: uint64(size),
	}, nil
}

// pending reports whether records are waiting.
func (c *consumer) pending() bool { return atomic.LoadUint64(c.prod) != atomic.LoadUint64(c.cons) }

// each calls fn with every committed record, oldest first, and then gives
// their room back; it returns how many there were. It stops at a record
// still being written: the kernel wakes the reader once that one is
// committed (its position is then the consumer's). ahead, when not nil,
// is shown each record before fn gets the one before it: one record ahead.
// rec is valid only during the call.
func (c *consumer) each(fn, ahead func(rec []byte)) int {
	cons, prod := atomic.LoadUint64(c.cons), atomic.LoadUint64(c.prod)
	mask := c.size - 1
	n := 0
	var last []byte // the record read last, not yet shown to fn
	for cons < prod {
		// The length word is written last, by an atomic exchange: loaded
		// atomically, it orders the record's bytes before it.
		hdr := atomic.LoadUint32((*uint32)(unsafe.Pointer(&c.data[cons&mask])))
		if hdr&ringBusyBit != 0 {
			break
		}
		l := uint64(hdr &^ (ringBusyBit | ringDiscardBit))
		if l > c.size-ringHeaderSize {
			break // cannot be: the kernel reserves at most the ring's size
		}
		if hdr&ringDiscardBit == 0 {
			start := cons&mask + ringHeaderSize
			rec := c.data[start : start+l]
			if ahead != nil {
				ahead(rec)
			}
			if last != nil {
				fn(last)
			}
			last = rec
			n++
		}
		cons += (ringHeaderSize + l + 7) &^ 7
	}
	if last != nil {
		fn(last)
	}
	atomic.StoreUint64(c.cons, cons)
	return n
}

func (c *consumer) close() {
	unix.Munmap(c.prodPage)
	unix.Munmap(c.consPage)
}
