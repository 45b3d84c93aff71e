package responder

import (
	"encoding/binary"
	"net/netip"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mmsghdr is struct mmsghdr from recvmmsg(2).
type mmsghdr struct {
	hdr unix.Msghdr
	len uint32
	_   [4]byte
}

// sockaddrLen holds a sockaddr_in or sockaddr_in6.
const sockaddrLen = unix.SizeofSockaddrInet6

// batch is one read loop's datagram slots for recvmmsg and sendmmsg,
// allocated once, so that the loop receives and answers up to len(in)
// datagrams with one system call each way and without allocating.
// (golang.org/x/net's ReadBatch allocates an address per datagram.)
// A reply reuses the sockaddr its query arrived from.
type batch struct {
	rc syscall.RawConn

	in     []mmsghdr
	inIov  []unix.Iovec
	inBuf  [][]byte
	names  [][sockaddrLen]byte
	out    []mmsghdr
	outIov []unix.Iovec
	outBuf [][]byte

	// Results of the last system call; the callbacks below are method
	// values made once, so passing them to RawConn allocates nothing.
	n, sent, count int
	errno          syscall.Errno
	recvFn, sendFn func(fd uintptr) bool
}

func newBatch(rc syscall.RawConn, slots, inSize, outSize int) *batch {
	b := &batch{
		rc:     rc,
		in:     make([]mmsghdr, slots),
		inIov:  make([]unix.Iovec, slots),
		inBuf:  make([][]byte, slots),
		names:  make([][sockaddrLen]byte, slots),
		out:    make([]mmsghdr, slots),
		outIov: make([]unix.Iovec, slots),
		outBuf: make([][]byte, slots),
	}
	for i := range slots {
		b.inBuf[i] = make([]byte, inSize)
		b.outBuf[i] = make([]byte, outSize)
		b.inIov[i].Base = &b.inBuf[i][0]
		b.in[i].hdr.Iov = &b.inIov[i]
		b.in[i].hdr.SetIovlen(1)
		b.in[i].hdr.Name = &b.names[i][0]
		b.out[i].hdr.Iov = &b.outIov[i]
		b.out[i].hdr.SetIovlen(1)
	}
	b.recvFn = b.doRecv
	b.sendFn = b.doSend
	return b
}

// recv waits for datagrams and returns how many arrived (at least one).
func (b *batch) recv() (int, error) {
	for i := range b.in {
		b.in[i].hdr.Namelen = sockaddrLen
		b.in[i].hdr.Flags = 0
		b.in[i].len = 0
		b.inIov[i].SetLen(len(b.inBuf[i]))
	}
	b.n, b.errno = 0, 0
	if err := b.rc.Read(b.recvFn); err != nil {
		return 0, err
	}
	if b.errno != 0 {
		return 0, b.errno
	}
	return b.n, nil
}

func (b *batch) doRecv(fd uintptr) bool {
	r, _, e := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&b.in[0])), uintptr(len(b.in)), 0, 0, 0)
	runtime.KeepAlive(b)
	if e == unix.EAGAIN {
		return false // wait for the poller
	}
	b.n, b.errno = int(r), e
	return true
}

// datagram returns the i-th received datagram and whether the kernel cut
// it short (larger than the slot).
func (b *batch) datagram(i int) ([]byte, bool) {
	return b.inBuf[i][:b.in[i].len], b.in[i].hdr.Flags&unix.MSG_TRUNC != 0
}

// source decodes the i-th datagram's sender.
func (b *batch) source(i int) netip.AddrPort {
	return decodeSockaddr(b.names[i][:b.in[i].hdr.Namelen])
}

// queueReply makes out slot j send outBuf[j][:n] to the sender of in slot i.
func (b *batch) queueReply(j, i, n int) {
	b.outIov[j].Base = &b.outBuf[j][0]
	b.outIov[j].SetLen(n)
	b.out[j].hdr.Name = &b.names[i][0]
	b.out[j].hdr.Namelen = b.in[i].hdr.Namelen
}

// send transmits the first count queued replies. A reply the kernel
// refuses is skipped, and counted in the returned number of failures.
func (b *batch) send(count int) (failed int, err error) {
	b.sent, b.count = 0, count
	for b.sent < b.count {
		b.errno = 0
		if err := b.rc.Write(b.sendFn); err != nil {
			return failed + b.count - b.sent, err
		}
		if b.errno != 0 {
			b.sent++ // sendmmsg reports the first message's error: drop it
			failed++
		}
	}
	return failed, nil
}

func (b *batch) doSend(fd uintptr) bool {
	r, _, e := unix.Syscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&b.out[b.sent])), uintptr(b.count-b.sent), 0, 0, 0)
	runtime.KeepAlive(b)
	if e == unix.EAGAIN {
		return false
	}
	if e != 0 {
		b.errno = e
		return true
	}
	b.sent += int(r)
	return true
}

// decodeSockaddr reads a sockaddr_in or sockaddr_in6.
func decodeSockaddr(sa []byte) netip.AddrPort {
	if len(sa) < 2 {
		return netip.AddrPort{}
	}
	family := *(*uint16)(unsafe.Pointer(&sa[0])) // host byte order
	switch {
	case family == unix.AF_INET && len(sa) >= unix.SizeofSockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(sa[4:8])), binary.BigEndian.Uint16(sa[2:]))
	case family == unix.AF_INET6 && len(sa) >= unix.SizeofSockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte(sa[8:24])), binary.BigEndian.Uint16(sa[2:]))
	}
	return netip.AddrPort{}
}
