package handover

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/coreos/go-systemd/v22/activation"
	"golang.org/x/sys/unix"
)

// CacheName is the FDNAME of the memfd holding the caches.
const CacheName = "cache"

// SocketName is the FDNAME a listen socket is stored under: its protocol,
// address, port and index ("udp-169.254.10.11-53-0"). systemd refuses
// names with ':', so an IPv6 address's colons become '_'. The name only
// serves to remove a socket from the store: sockets are matched by what
// they are, never by name.
func SocketName(ap netip.AddrPort, udp bool, i int) string {
	addr := strings.ReplaceAll(ap.Addr().String(), ":", "_")
	return fmt.Sprintf("%s-%s-%d-%d", proto(udp), addr, ap.Port(), i)
}

func proto(udp bool) string {
	if udp {
		return "udp"
	}
	return "tcp"
}

// Inherited is what a process found in systemd's store at start: sockets
// not yet taken and the cache file, if any. Its methods are for the
// start-up goroutine only.
type Inherited struct {
	log   *slog.Logger
	socks []*os.File // not taken yet; Name() is the FDNAME
	cache *os.File
	taken int
	other []string // names of files neither a socket nor the cache, closed
}

// FromEnv takes the files systemd passed (LISTEN_PID, LISTEN_FDS,
// LISTEN_FDNAMES) and unsets those variables. With none it returns an
// empty Inherited: every Take then returns nil. A nil logger discards.
func FromEnv(log *slog.Logger) *Inherited {
	return FromFiles(activation.Files(true), log)
}

// FromFiles sorts files by name: CacheName is the cache, every socket
// a candidate listen socket; anything else is closed.
func FromFiles(files []*os.File, log *slog.Logger) *Inherited {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	in := &Inherited{log: log.With("component", "handover")}
	for _, f := range files {
		switch {
		case f.Name() == CacheName && in.cache == nil:
			in.cache = f
		case isSocket(int(f.Fd())):
			in.socks = append(in.socks, f)
		default:
			in.other = append(in.other, f.Name())
			in.log.Warn("handover: inherited file closed: neither a socket nor the cache", "name", f.Name())
			f.Close()
		}
	}
	return in
}

func isSocket(fd int) bool {
	var st unix.Stat_t
	return unix.Fstat(fd, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFSOCK
}

// Sockets is how many inherited sockets are not taken yet.
func (in *Inherited) Sockets() int { return len(in.socks) }

// Taken is how many sockets Take handed out.
func (in *Inherited) Taken() int { return in.taken }

// TakeUDP returns an inherited UDP socket that fits ap (see Fits), or nil
// when none does: the caller then binds a new one.
func (in *Inherited) TakeUDP(ap netip.AddrPort) *net.UDPConn {
	f := in.take(ap, true)
	if f == nil {
		return nil
	}
	defer f.Close()
	pc, err := net.FilePacketConn(f)
	if err != nil {
		in.log.Warn("handover: inherited socket not usable: binding a new one", "name", f.Name(), slog.Any("err", err))
		return nil
	}
	conn, ok := pc.(*net.UDPConn)
	if !ok {
		pc.Close()
		return nil
	}
	in.taken++
	return conn
}

// TakeTCP returns an inherited TCP listener that fits ap, or nil.
func (in *Inherited) TakeTCP(ap netip.AddrPort) *net.TCPListener {
	f := in.take(ap, false)
	if f == nil {
		return nil
	}
	defer f.Close()
	l, err := net.FileListener(f)
	if err != nil {
		in.log.Warn("handover: inherited socket not usable: binding a new one", "name", f.Name(), slog.Any("err", err))
		return nil
	}
	ln, ok := l.(*net.TCPListener)
	if !ok {
		l.Close()
		return nil
	}
	in.taken++
	return ln
}

// take removes and returns the first socket that fits ap.
func (in *Inherited) take(ap netip.AddrPort, udp bool) *os.File {
	for i, f := range in.socks {
		if Fits(int(f.Fd()), ap, udp) == nil {
			in.socks = append(in.socks[:i], in.socks[i+1:]...)
			return f
		}
	}
	return nil
}

// Rest closes the sockets nobody took and returns their names, which the
// caller removes from the store: a socket left there stays bound in its
// reuseport group with no one reading it. Each refusal is logged with
// its reason.
func (in *Inherited) Rest(want []netip.AddrPort) []string {
	var names []string
	for _, f := range in.socks {
		in.log.Info("handover: inherited socket not needed: closed and removed from the store", "name", f.Name(), "why", why(int(f.Fd()), want))
		names = append(names, f.Name())
		f.Close()
	}
	in.socks = nil
	return append(names, in.other...)
}

// why says why a socket fits none of the addresses.
func why(fd int, want []netip.AddrPort) string {
	var errs []error
	for _, ap := range want {
		for _, udp := range []bool{true, false} {
			if err := Fits(fd, ap, udp); err != nil {
				errs = append(errs, fmt.Errorf("%s %s: %w", proto(udp), ap, err))
			} else {
				return fmt.Sprintf("%s %s: socket beyond those the listener needs", proto(udp), ap)
			}
		}
	}
	if len(errs) == 0 {
		return "no listen address"
	}
	return errors.Join(errs...).Error()
}

// Cache returns the inherited cache file, or nil, and forgets it: the
// caller owns it.
func (in *Inherited) Cache() *os.File {
	f := in.cache
	in.cache = nil
	return f
}

// Fits says whether the socket fd can serve the listen address ap as a
// UDP socket (udp) or a TCP listener: the address family of ap, the type,
// plain UDP or TCP (not MPTCP: the steering program's sockarray takes
// neither), bound to ap exactly, SO_REUSEPORT set (else LocalDNS could not
// share the address), and a TCP socket listening. nil if it fits.
func Fits(fd int, ap netip.AddrPort, udp bool) error {
	domain, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil {
		return fmt.Errorf("SO_DOMAIN: %w", err)
	}
	wantDomain := unix.AF_INET6
	if ap.Addr().Is4() {
		wantDomain = unix.AF_INET
	}
	if domain != wantDomain {
		return fmt.Errorf("address family %d, want %d", domain, wantDomain)
	}
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return fmt.Errorf("SO_TYPE: %w", err)
	}
	wantType, wantProto := unix.SOCK_STREAM, unix.IPPROTO_TCP
	if udp {
		wantType, wantProto = unix.SOCK_DGRAM, unix.IPPROTO_UDP
	}
	if typ != wantType {
		return fmt.Errorf("socket type %d, want %d (%s)", typ, wantType, proto(udp))
	}
	p, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL)
	if err != nil {
		return fmt.Errorf("SO_PROTOCOL: %w", err)
	}
	if p != wantProto {
		return fmt.Errorf("protocol %d, want %d (%s)", p, wantProto, proto(udp))
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return fmt.Errorf("getsockname: %w", err)
	}
	var local netip.AddrPort
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		local = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
	case *unix.SockaddrInet6:
		local = netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), uint16(sa.Port))
	}
	if local != ap {
		return fmt.Errorf("bound to %s, want %s", local, ap)
	}
	rp, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT)
	if err != nil {
		return fmt.Errorf("SO_REUSEPORT: %w", err)
	}
	if rp == 0 {
		return errors.New("SO_REUSEPORT not set")
	}
	if !udp {
		acc, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
		if err != nil {
			return fmt.Errorf("SO_ACCEPTCONN: %w", err)
		}
		if acc == 0 {
			return errors.New("not listening")
		}
	}
	return nil
}
