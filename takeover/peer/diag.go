package peer

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// sock_diag (inet_diag) message layout, from linux/inet_diag.h.
const (
	sizeofInetDiagSockID = 48                            // struct inet_diag_sockid
	sizeofInetDiagReqV2  = 8 + sizeofInetDiagSockID      // struct inet_diag_req_v2
	sizeofInetDiagMsg    = 4 + sizeofInetDiagSockID + 20 // struct inet_diag_msg

	// Socket states (linux/tcp_states.h) as inet_diag reports them. A bound,
	// unconnected UDP socket is TCP_CLOSE; a TCP listener is TCP_LISTEN.
	tcpClose  = 7
	tcpListen = 10
)

// diagTimeout bounds one sock_diag dump: the kernel answers a filtered dump
// in microseconds, so a dump this slow means something is wrong, and the
// watcher must not hang on it.
const diagTimeout = 5 * time.Second

// diagConn is a NETLINK_SOCK_DIAG socket. Netlink sockets act on the network
// namespace they were created in, whatever thread uses them later, so a
// Watcher made inside a namespace keeps watching that namespace.
type diagConn struct {
	fd  int    // good until close
	buf []byte // reply buffer; a diagConn serves one goroutine at a time
	seq uint32
}

// openDiag opens a sock_diag socket in the calling thread's network
// namespace.
func openDiag() (*diagConn, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return nil, fmt.Errorf("open sock_diag socket: %w", err)
	}
	tv := unix.NsecToTimeval(diagTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("sock_diag socket: SO_RCVTIMEO: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind sock_diag socket: %w", err)
	}
	return &diagConn{fd: fd, buf: make([]byte, 32<<10)}, nil
}

func (d *diagConn) close() error { return unix.Close(d.fd) }

// diagSocket is one inet_diag_msg, reduced to what we use.
type diagSocket struct {
	addr  netip.AddrPort // local address
	peer  netip.AddrPort // remote address; port 0 when unconnected
	state uint8
	uid   uint32
	inode uint64
}

// diagRequest is the inet_diag_req_v2 asking for the sockets of one family
// and protocol in the given states with local port port. The kernel filters
// a dump by state and by local port (udp_dump, inet_diag_dump_icsk), so the
// reply holds LocalDNS's few sockets, not every socket on the node.
func diagRequest(seq uint32, family uint8, proto Proto, port uint16) []byte {
	b := make([]byte, unix.NLMSG_HDRLEN+sizeofInetDiagReqV2)
	ne := binary.NativeEndian
	ne.PutUint32(b[0:], uint32(len(b)))
	ne.PutUint16(b[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(b[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	ne.PutUint32(b[8:], seq)
	r := b[unix.NLMSG_HDRLEN:]
	r[0] = family
	states := uint32(1) << tcpClose
	r[1] = unix.IPPROTO_UDP
	if proto == TCP {
		r[1] = unix.IPPROTO_TCP
		states = 1 << tcpListen
	}
	ne.PutUint32(r[4:], states)
	binary.BigEndian.PutUint16(r[8:], port) // idiag_sport, network order
	return b
}

// parseDiagMsg decodes one inet_diag_msg.
func parseDiagMsg(b []byte) (diagSocket, error) {
	if len(b) < sizeofInetDiagMsg {
		return diagSocket{}, fmt.Errorf("inet_diag_msg of %d bytes, want %d", len(b), sizeofInetDiagMsg)
	}
	family := b[0]
	id := b[4 : 4+sizeofInetDiagSockID]
	sport := binary.BigEndian.Uint16(id[0:])
	dport := binary.BigEndian.Uint16(id[2:])
	var src, dst netip.Addr
	switch family {
	case unix.AF_INET:
		src = netip.AddrFrom4([4]byte(id[4:8]))
		dst = netip.AddrFrom4([4]byte(id[20:24]))
	case unix.AF_INET6:
		src = netip.AddrFrom16([16]byte(id[4:20]))
		dst = netip.AddrFrom16([16]byte(id[20:36]))
	default:
		return diagSocket{}, fmt.Errorf("inet_diag_msg of address family %d", family)
	}
	tail := b[4+sizeofInetDiagSockID:]
	ne := binary.NativeEndian
	return diagSocket{
		addr:  netip.AddrPortFrom(src, sport),
		peer:  netip.AddrPortFrom(dst, dport),
		state: b[1],
		uid:   ne.Uint32(tail[12:]),
		inode: uint64(ne.Uint32(tail[16:])),
	}, nil
}

// errDumpInterrupted means the socket tables changed during a dump; the
// caller retries.
var errDumpInterrupted = errors.New("sock_diag dump interrupted")

// dumpAttempts bounds retries of an interrupted dump. An interrupted dump
// needs sockets being created while it runs; three in a row do not happen
// on a quiet port.
const dumpAttempts = 3

// dump returns the sockets of one family and protocol bound to port. Sockets
// bound to other addresses on the port are included; the caller filters.
func (d *diagConn) dump(family uint8, proto Proto, port uint16) ([]diagSocket, error) {
	var err error
	for range dumpAttempts {
		var socks []diagSocket
		socks, err = d.dumpOnce(family, proto, port)
		if !errors.Is(err, errDumpInterrupted) {
			return socks, err
		}
	}
	return nil, err
}

func (d *diagConn) dumpOnce(family uint8, proto Proto, port uint16) ([]diagSocket, error) {
	d.seq++
	seq := d.seq
	if err := unix.Sendto(d.fd, diagRequest(seq, family, proto, port), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("send sock_diag request: %w", err)
	}
	var (
		socks       []diagSocket
		interrupted bool
		buf         = d.buf
	)
	for {
		n, _, err := unix.Recvfrom(d.fd, buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read sock_diag reply: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return nil, fmt.Errorf("parse sock_diag reply: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Seq != seq {
				continue // a late reply to an earlier, abandoned dump
			}
			if m.Header.Flags&unix.NLM_F_DUMP_INTR != 0 {
				interrupted = true
			}
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				if interrupted {
					return nil, errDumpInterrupted
				}
				return socks, nil
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if errno := int32(binary.NativeEndian.Uint32(m.Data)); errno != 0 {
						return nil, fmt.Errorf("sock_diag: %w", unix.Errno(-errno))
					}
				}
				return socks, nil
			case unix.SOCK_DIAG_BY_FAMILY:
				s, err := parseDiagMsg(m.Data)
				if err != nil {
					return nil, fmt.Errorf("parse sock_diag reply: %w", err)
				}
				socks = append(socks, s)
			}
		}
	}
}

// family returns the address family of addr (an IPv4-mapped IPv6 address
// counts as IPv4, as the kernel binds it).
func family(addr netip.Addr) uint8 {
	if addr.Unmap().Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// bound returns the sockets of proto bound to exactly one of addrs (an
// unconnected UDP socket, or a TCP listener), leaving out those exclude
// reports as ours. Owners are not filled in. The kernel filters a dump by
// port, not address, so one dump per family and port serves every address
// on it (169.254.10.10 and .11 both).
func (d *diagConn) bound(addrs []netip.AddrPort, proto Proto, exclude func(uint64) bool) ([]Socket, error) {
	type dumpKey struct {
		family uint8
		port   uint16
	}
	dumps := map[dumpKey][]diagSocket{}
	var out []Socket
	for _, addr := range addrs {
		addr = netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port())
		k := dumpKey{family(addr.Addr()), addr.Port()}
		socks, ok := dumps[k]
		if !ok {
			var err error
			if socks, err = d.dump(k.family, proto, k.port); err != nil {
				if errors.Is(err, unix.ENOENT) {
					// sock_diag answers ENOENT for a protocol without a handler.
					err = fmt.Errorf("%w (the kernel has no sock_diag handler for %s: load module %s_diag)", err, proto, proto)
				}
				return nil, fmt.Errorf("list %s sockets on %s: %w", proto, addr, err)
			}
			dumps[k] = socks
		}
		for _, s := range socks {
			if s.addr != addr || s.peer.Port() != 0 {
				continue
			}
			if exclude != nil && exclude(s.inode) {
				continue
			}
			out = append(out, Socket{Proto: proto, Addr: addr, Inode: s.inode, UID: s.uid})
		}
	}
	slices.SortFunc(out, func(a, b Socket) int { return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Inode, b.Inode)) })
	return out, nil
}

// FindSockets lists the sockets of proto bound to addr (unconnected UDP
// sockets, or TCP listeners) that are not ours — exclude reports our own
// sockets' inodes (see SocketInode) and may be nil — with the process that
// holds each, found through /proc/*/fd. It sees the network namespace of
// the calling thread. A socket whose holder is not visible (another PID
// namespace, or no permission to read /proc/PID/fd) has PID 0.
func FindSockets(addr netip.AddrPort, proto Proto, exclude func(inode uint64) bool) ([]Socket, error) {
	if proto != UDP && proto != TCP {
		return nil, fmt.Errorf("find sockets on %s: protocol %q, want %q or %q", addr, proto, UDP, TCP)
	}
	d, err := openDiag()
	if err != nil {
		return nil, fmt.Errorf("find sockets on %s: %w", addr, err)
	}
	defer d.close()
	socks, err := d.bound([]netip.AddrPort{addr}, proto, exclude)
	if err != nil {
		return nil, fmt.Errorf("find sockets: %w", err)
	}
	if err := fillOwners(procRoot, socks, nil); err != nil {
		return nil, fmt.Errorf("find sockets on %s: %w", addr, err)
	}
	return socks, nil
}
