package tap

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// htons turns a 16-bit value into network byte order, as the protocol
// fields of AF_PACKET's socket(2) and sockaddr_ll want it.
func htons(v uint16) uint16 { return v<<8 | v>>8 }

// openSocket returns a non-blocking cooked AF_PACKET socket of the calling
// thread's network namespace with a filter for prog attached. It is
// created with protocol 0, which hooks it to no traffic, and bound to
// every protocol (ETH_P_ALL, the only hook that sees outgoing packets)
// only once the filter is in place, so not one unfiltered packet is ever
// queued. The filter is locked (SO_LOCK_FILTER).
//
// The filter is prog translated to eBPF with the test that the packet was
// sent by this host (see localProgram), loaded with load; if the kernel
// refuses it, prog itself as classic BPF, and refused says why.
//
// The descriptor is not handed to Go's poller for good (os.NewFile,
// net.FilePacketConn): the poller registers it edge-triggered with epoll,
// and every packet that arrives would then wake the runtime's netpoll
// thread, even while the reader is not waiting. Only a duplicate is, for
// each wait (see waiter).
func openSocket(prog []bpf.Instruction, rcvbuf int, load localLoader) (fd int, refused, err error) {
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return -1, nil, fmt.Errorf("assemble filter: %w", err)
	}
	fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
			return -1, nil, fmt.Errorf("packet socket: %w (needs CAP_NET_RAW in the network namespace)", err)
		}
		return -1, nil, fmt.Errorf("packet socket: %w", err)
	}
	fail := func(err error) (int, error, error) {
		unix.Close(fd)
		return -1, nil, err
	}
	refused = attachLocal(fd, prog, load)
	if refused != nil {
		filter := make([]unix.SockFilter, len(raw))
		for i, r := range raw {
			filter[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
		}
		fprog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
		if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &fprog); err != nil {
			return fail(fmt.Errorf("attach filter: %w", err))
		}
		runtime.KeepAlive(filter)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_LOCK_FILTER, 1); err != nil {
		return fail(fmt.Errorf("lock filter: %w", err))
	}
	if err := stampPackets(fd, true); err != nil {
		return fail(err)
	}
	if rcvbuf > 0 {
		// Past net.core.rmem_max when privileged; a smaller buffer only
		// means drops sooner under a burst (counted), so failing is no error.
		if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcvbuf) != nil {
			_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, rcvbuf)
		}
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL)}); err != nil {
		return fail(fmt.Errorf("bind packet socket: %w", err))
	}
	return fd, refused, nil
}

// stampPackets asks for the kernel's receive time of each packet
// (software, CLOCK_REALTIME) as a control message, or stops asking: when
// a query arrived and when its reply left, not when the tap got round to
// reading them (up to a batch pause later). The clone a packet socket gets
// of an outgoing packet is stamped as it is handed to the tap
// (dev_queue_xmit_nit). While any socket asks, the kernel stamps every
// packet the machine receives (netstamp_needed).
func stampPackets(fd int, on bool) error {
	v := 0
	if on {
		v = 1
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, v); err != nil {
		return fmt.Errorf("set SO_TIMESTAMPNS to %d: %w", v, err)
	}
	return nil
}

// localLoader loads a translated filter into the kernel.
type localLoader func(asm.Instructions) (*ebpf.Program, error)

// loadLocal is the localLoader of a running tap: a BPF_PROG_TYPE_SOCKET_FILTER
// program. Loading one needs CAP_BPF (or CAP_SYS_ADMIN), or unprivileged BPF.
func loadLocal(insns asm.Instructions) (*ebpf.Program, error) {
	// Before 5.11 BPF memory counts against RLIMIT_MEMLOCK; from 5.11 on
	// (memcg accounting) this does nothing. Failing it is not fatal: the
	// load says whether memory was short.
	_ = rlimit.RemoveMemlock()
	return ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "dnsstandby_tap",
		Type:         ebpf.SocketFilter,
		Instructions: insns,
		License:      "Dual MIT/GPL",
	})
}

// attachLocal attaches the eBPF translation of prog to fd, and says why
// not if it cannot. The socket holds the program: its descriptor is
// closed here.
func attachLocal(fd int, prog []bpf.Instruction, load localLoader) error {
	insns, err := localProgram(prog)
	if err != nil {
		return fmt.Errorf("translate filter: %w", err)
	}
	p, err := load(insns)
	if err != nil {
		return fmt.Errorf("load eBPF filter: %w", err)
	}
	defer p.Close()
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ATTACH_BPF, p.FD()); err != nil {
		return fmt.Errorf("attach eBPF filter: %w", err)
	}
	return nil
}

// kernelStats reads and resets the socket's PACKET_STATISTICS: packets
// that passed the filter and were offered to the queue, and of those the
// ones dropped because the receive buffer was full.
func kernelStats(fd int) (packets, drops uint32, err error) {
	st, err := unix.GetsockoptTpacketStats(fd, unix.SOL_PACKET, unix.PACKET_STATISTICS)
	if err != nil {
		return 0, 0, err
	}
	return st.Packets, st.Drops, nil
}

// waiter blocks the reader until the socket has packets or the tap is
// asked to stop, in Go's netpoller, with the socket registered only for
// the wait: a duplicate of its descriptor is, and is closed after.
// Registered for good, the socket would wake the runtime's netpoll thread
// for every packet that arrives (edge-triggered), also while the reader
// sleeps out its batch pause. Waiting in a blocking ppoll instead costs no
// such wake-up, but a goroutine blocked in a system call has the runtime's
// monitor thread (sysmon) take its P back and then check every 20 µs for
// a while: at 10 queries a second that was half of a near-idle
// dnsstandby's CPU (bench/README.md, "Where the watching cost goes").
type waiter struct {
	fd   int
	mu   sync.Mutex
	cur  *os.File // the registered duplicate while waiting, else nil
	quit bool     // stop was called: no wait starts, the current one ends
}

func newWaiter(sock int) *waiter { return &waiter{fd: sock} }

// forPackets waits until the socket is readable or stop is called, and
// reports whether it was stopped.
func (w *waiter) forPackets() (stopped bool, err error) {
	w.mu.Lock()
	if w.quit {
		w.mu.Unlock()
		return true, nil
	}
	dup, err := unix.FcntlInt(uintptr(w.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		w.mu.Unlock()
		return false, fmt.Errorf("duplicate the socket to wait on it: %w", err)
	}
	// Non-blocking (the flag belongs to the open socket, which the
	// duplicate shares), so os.NewFile registers it with the poller.
	f := os.NewFile(uintptr(dup), "packet tap")
	w.cur = f
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.cur = nil
		w.mu.Unlock()
		f.Close()
	}()
	rc, err := f.SyscallConn()
	if err != nil {
		return false, fmt.Errorf("wait on the socket: %w", err)
	}
	var pollErr error
	err = rc.Read(func(fd uintptr) bool {
		// Readable already? Packets may have come before the duplicate
		// was registered; past this, the poller reports new ones.
		p := [1]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(p[:], 0)
		switch {
		case err == unix.EINTR:
			return false
		case err != nil:
			pollErr = err
			return true
		}
		return n > 0
	})
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("wait on the socket: %w", err)
	}
	return false, pollErr
}

// stop ends the current wait, if any, and every later one at once.
func (w *waiter) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.quit = true
	if w.cur != nil {
		_ = w.cur.SetReadDeadline(time.Unix(1, 0)) // in the past: the wait ends now
	}
}

// mmsghdr is struct mmsghdr from recvmmsg(2).
type mmsghdr struct {
	hdr unix.Msghdr
	len uint32
	_   [4]byte
}

// sizeofTimespec is the timespec SCM_TIMESTAMPNS carries (the
// architecture's old layout, which SO_TIMESTAMPNS asks for).
const sizeofTimespec = int(unsafe.Sizeof(unix.Timespec{}))

// ctlSize is each slot's room for control messages: the one asked for,
// SCM_TIMESTAMPNS (a timespec), and as much again.
var ctlSize = 2 * unix.CmsgSpace(sizeofTimespec)

// batch is the reader's datagram slots for recvmmsg, allocated once, so
// that one system call takes up to len(hdrs) packets and nothing is
// allocated per packet. Each slot has its sockaddr_ll, which says whether
// the packet was received (PACKET_HOST: a query) or sent (a reply), and
// its control buffer, which holds the kernel's receive time.
type batch struct {
	hdrs  []mmsghdr
	iovs  []unix.Iovec
	bufs  [][]byte
	names []unix.RawSockaddrLinklayer
	ctls  []byte // ctlSize bytes a slot
}

func newBatch(slots, size int) *batch {
	b := &batch{
		hdrs:  make([]mmsghdr, slots),
		iovs:  make([]unix.Iovec, slots),
		bufs:  make([][]byte, slots),
		names: make([]unix.RawSockaddrLinklayer, slots),
		// Word-aligned (a byte slice this large is), and ctlSize keeps
		// every slot's buffer aligned for its cmsghdr.
		ctls: make([]byte, slots*ctlSize),
	}
	// One backing array: the slots sit next to each other in memory.
	mem := make([]byte, slots*size)
	for i := range slots {
		b.bufs[i] = mem[i*size : (i+1)*size : (i+1)*size]
		b.iovs[i].Base = &b.bufs[i][0]
		h := &b.hdrs[i].hdr
		h.Iov = &b.iovs[i]
		h.SetIovlen(1)
		h.Name = (*byte)(unsafe.Pointer(&b.names[i]))
		h.Control = &b.ctls[i*ctlSize]
	}
	return b
}

// recv takes the packets queued on fd, up to len(hdrs), without waiting:
// 0 and no error when there are none.
func (b *batch) recv(fd int) (int, error) {
	for i := range b.hdrs {
		h := &b.hdrs[i].hdr
		h.Flags = 0
		h.Namelen = unix.SizeofSockaddrLinklayer
		h.SetControllen(ctlSize)
		b.hdrs[i].len = 0
		b.iovs[i].SetLen(len(b.bufs[i]))
	}
	r, _, e := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&b.hdrs[0])), uintptr(len(b.hdrs)), unix.MSG_DONTWAIT, 0, 0)
	runtime.KeepAlive(b)
	switch e {
	case 0:
		return int(r), nil
	case unix.EAGAIN, unix.EINTR:
		return 0, nil
	}
	return 0, e
}

// packet returns the i-th received packet and what the socket said of it:
// its kernel receive time (now if it has none), whether it was received
// for this host (a query) and whether it was longer than its slot.
func (b *batch) packet(i int, now int64) ([]byte, arrival) {
	h := &b.hdrs[i].hdr
	a := arrival{
		at:    now,
		query: h.Namelen >= unix.SizeofSockaddrLinklayer && b.names[i].Pkttype == packetHost,
		trunc: h.Flags&unix.MSG_TRUNC != 0,
	}
	ctl := b.ctls[i*ctlSize : (i+1)*ctlSize]
	if at, ok := rxTime(ctl[:min(int(h.Controllen), len(ctl))]); ok {
		a.at = at
	}
	return b.bufs[i][:b.hdrs[i].len], a
}

// rxTime finds SCM_TIMESTAMPNS among the control messages in ctl and
// returns it in unix nanoseconds. It reads the headers in place, as
// unix.ParseSocketControlMessage would but without allocating.
func rxTime(ctl []byte) (int64, bool) {
	for len(ctl) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&ctl[0]))
		n := int(h.Len)
		if n < unix.CmsgLen(0) || n > len(ctl) {
			return 0, false
		}
		if h.Level == unix.SOL_SOCKET && h.Type == unix.SCM_TIMESTAMPNS && n >= unix.CmsgLen(sizeofTimespec) {
			ts := (*unix.Timespec)(unsafe.Pointer(&ctl[unix.CmsgLen(0)]))
			if at := ts.Nano(); at > 0 {
				return at, true
			}
			return 0, false
		}
		next := unix.CmsgSpace(n - unix.CmsgLen(0))
		if next >= len(ctl) {
			break
		}
		ctl = ctl[next:]
	}
	return 0, false
}
