package steer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/dnsstandby/dnsstandby/takeover/internal/sockname"
)

// group is one reuseport group we steer: our socket and its program.
type group struct {
	name   string
	udp    bool
	prog   *ebpf.Program // attached to the group through our socket
	socks  *ebpf.Map     // the group's REUSEPORT_SOCKARRAY
	config *ebpf.Map     // the group's config (ARRAY, one configValue)
	live   *ebpf.Map     // the group's read test (ARRAY, one live value; memory-mapped if mmapErr is nil)

	// mmapErr says why live is not memory-mapped (a kernel before 5.5):
	// then Reads refuses, and the read test stays off.
	mmapErr error
	// view is live's value mapped into our memory, from the first Reads
	// on; reads points into it.
	view  unsafe.Pointer
	reads *atomic.Uint64

	our       syscall.RawConn // our socket; Close detaches through it
	ourAddr   netip.AddrPort  // its address: every adopted socket must have it
	ourCookie uint64          // its SO_COOKIE, to refuse adopting it as a peer

	// unadoptable is set when LocalDNS's socket could not be adopted
	// (MPTCP) and cleared only by a successful Adopt (not by ClearPeers,
	// which the caller runs whenever LocalDNS's sockets change): the group
	// then steers at level Own, so mirror (ToPeer) hashes rather than
	// taking LocalDNS's share.
	unadoptable bool
}

// level is the level g steers at, given the Steerer's.
func (g *group) level(l Level) Level {
	if l == Adopt && g.unadoptable {
		return Own
	}
	return l
}

// loadGroup creates a group's maps and loads Program against them.
func loadGroup(name string, udp bool) (*group, error) {
	g := &group{name: name, udp: udp}
	var err error
	g.config, err = ebpf.NewMap(&ebpf.MapSpec{
		Name:       configName,
		Type:       ebpf.Array,
		KeySize:    4,
		ValueSize:  configSize,
		MaxEntries: 1,
	})
	if err != nil {
		return nil, fmt.Errorf("create steering config map: %w", err)
	}
	g.live, g.mmapErr, err = newLiveMap()
	if err != nil {
		g.closeObjects()
		return nil, err
	}
	g.socks, err = ebpf.NewMap(&ebpf.MapSpec{
		Name:      sockarrayName,
		Type:      ebpf.ReusePortSockArray,
		KeySize:   4,
		ValueSize: 8, // a u64 fd on update; the socket's cookie on lookup
		// (a lookup from userspace needs an 8-byte value)
		MaxEntries: sockarraySize,
	})
	if err != nil {
		g.closeObjects()
		return nil, fmt.Errorf("create REUSEPORT_SOCKARRAY: %w", err)
	}
	insns := Program()
	if err := errors.Join(insns.AssociateMap(SockarrayMap, g.socks), insns.AssociateMap(ConfigMap, g.config),
		insns.AssociateMap(LiveMap, g.live)); err != nil {
		g.closeObjects()
		return nil, err
	}
	g.prog, err = ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         programName,
		Type:         ebpf.SkReuseport,
		Instructions: insns,
		License:      "Dual MIT/GPL",
	})
	if err != nil {
		g.closeObjects()
		return nil, fmt.Errorf("load steering program: %w", err)
	}
	return g, nil
}

// newLiveMap creates a group's live map, memory-mapped where the kernel
// allows it (BPF_F_MMAPABLE, 5.5+); before, a plain one and why not.
func newLiveMap() (m *ebpf.Map, mmapErr, err error) {
	spec := &ebpf.MapSpec{
		Name:       liveName,
		Type:       ebpf.Array,
		KeySize:    4,
		ValueSize:  liveSize,
		MaxEntries: 1,
		Flags:      unix.BPF_F_MMAPABLE,
	}
	if m, err = ebpf.NewMap(spec); err == nil {
		return m, nil, nil
	}
	mmapErr = fmt.Errorf("memory-mapped BPF array (Linux 5.5+): %w", err)
	spec.Flags = 0
	if m, err = ebpf.NewMap(spec); err != nil {
		return nil, nil, fmt.Errorf("create steering live map: %w", err)
	}
	return m, mmapErr, nil
}

// mapReads maps the live value into our memory, once, and points
// g.reads at its read counter.
func (g *group) mapReads() error {
	if g.reads != nil {
		return nil
	}
	if g.mmapErr != nil {
		return g.mmapErr
	}
	p, err := unix.MmapPtr(g.live.FD(), 0, nil, uintptr(os.Getpagesize()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("mmap the steering live map: %w", err)
	}
	g.view = p
	g.reads = (*atomic.Uint64)(unsafe.Add(p, liveReads))
	return nil
}

// releaseView puts anonymous memory in place of the live value's mapping,
// in one mmap (MAP_FIXED replaces a mapping atomically): read loops may
// still hold the counter and add to it after the group ends, which must
// never fault, and the map must be freed with its last descriptor, which
// a mapping of it would keep. The page stays in our address space: one
// per read-counted group, for the life of the process.
func (g *group) releaseView() error {
	if g.view == nil {
		return nil
	}
	if _, err := unix.MmapPtr(-1, 0, g.view, uintptr(os.Getpagesize()), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED); err != nil {
		// The mapping stays, and with it the map's memory: safe, and
		// freed at exit.
		return fmt.Errorf("release the steering live map's mapping: %w", err)
	}
	g.view = nil
	return nil
}

// liveValue reads the program's notes: packets kept from us, and the
// longest wait it saw within the limit.
func (g *group) liveValue() (bypassed uint64, maxWait time.Duration, err error) {
	b := make([]byte, liveSize)
	if err := g.live.Lookup(uint32(0), b); err != nil {
		return 0, 0, fmt.Errorf("read the steering live map: %w", err)
	}
	return binary.NativeEndian.Uint64(b[liveBypassed:]), time.Duration(binary.NativeEndian.Uint64(b[liveMaxWait:])), nil
}

// closeObjects closes g's program and maps (what of them exists).
func (g *group) closeObjects() error {
	var errs []error
	if g.prog != nil {
		errs = append(errs, g.prog.Close())
	}
	if g.live != nil {
		errs = append(errs, g.releaseView(), g.live.Close())
	}
	if g.socks != nil {
		errs = append(errs, g.socks.Close())
	}
	if g.config != nil {
		errs = append(errs, g.config.Close())
	}
	return errors.Join(errs...)
}

// AddGroup steers the reuseport group of our socket: it loads a program
// for the group, puts our socket in slot 0 and attaches the program to the
// group (SO_ATTACH_REUSEPORT_EBPF, which replaces any program the group
// had). Call it after our socket is bound; udp says whether it is a UDP
// socket or a TCP listener. Adding a name again moves the group to a new
// socket of ours (after the old one was closed). At Off it only detaches
// a program a predecessor left on the group (see Leave), so that the group
// shares by the kernel's hash as Off promises.
//
// The group starts in the Steerer's mode, with its heartbeat as last
// written: until the first Heartbeat the program treats us as stalled and
// never selects our socket. If AddGroup fails the group is left unsteered
// (plain SO_REUSEPORT); the daemon should log it and serve on.
func (s *Steerer) AddGroup(name string, our syscall.RawConn, udp bool) error {
	if s.level == Off {
		return detachLeftover(our)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	g := s.groups[name]
	fresh := g == nil
	if fresh {
		var err error
		if g, err = loadGroup(name, udp); err != nil {
			return fmt.Errorf("steer group %s: %w", name, err)
		}
		if err := s.writeGroupLocked(g); err != nil {
			g.closeObjects()
			return fmt.Errorf("steer group %s: %w", name, err)
		}
	} else if g.udp != udp {
		return fmt.Errorf("steer group %s: already added as %s", name, protoName(g.udp))
	}
	err := s.attach(g, our)
	if err != nil {
		if fresh {
			g.closeObjects()
		}
		return fmt.Errorf("steer group %s: %w", name, err)
	}
	if fresh {
		s.groups[name] = g
		s.order = append(s.order, name)
	}
	s.log.Debug("steering group attached", "group", name, "addr", g.ourAddr.String(), "proto", protoName(udp))
	return nil
}

// attach puts our socket in slot 0 and attaches g's program through it.
func (s *Steerer) attach(g *group, our syscall.RawConn) error {
	var addr netip.AddrPort
	var cookie uint64
	var serr error
	err := our.Control(func(fd uintptr) {
		if addr, serr = checkSocket(int(fd), g.udp); serr != nil {
			if errors.Is(serr, ErrMPTCP) {
				serr = fmt.Errorf("our listener: %w (create it with net.ListenConfig.SetMultipathTCP(false))", serr)
			}
			return
		}
		if cookie, serr = unix.GetsockoptUint64(int(fd), unix.SOL_SOCKET, unix.SO_COOKIE); serr != nil {
			serr = fmt.Errorf("SO_COOKIE: %w", serr)
			return
		}
		serr = g.socks.Update(uint32(ourSlot), uint64(fd), ebpf.UpdateAny)
		if errors.Is(serr, unix.EBUSY) {
			// Our socket is still in a predecessor's sockarray: it was
			// handed over (systemd's fd store) while the old program,
			// left attached by Leave, holds it. Replacing that program
			// frees its maps; meanwhile our slot is empty, so the new
			// program sends our share to a peer or the hash.
			serr = s.attachThenFill(g, int(fd))
			return
		}
		if serr != nil {
			s.sockarrayErrors.Add(1)
			serr = fmt.Errorf("put our socket in slot %d: %w%s", ourSlot, serr, busyHint(serr))
			return
		}
		if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_EBPF, g.prog.FD()); serr != nil {
			serr = fmt.Errorf("SO_ATTACH_REUSEPORT_EBPF: %w", serr)
		}
	})
	if err = errors.Join(err, serr); err != nil {
		return err
	}
	g.our, g.ourAddr, g.ourCookie = our, addr, cookie
	return nil
}

// attachThenFill attaches g's program through fd, then puts fd in our
// slot once the predecessor's sockarray lets go of it (adoptBusyWait at
// most). It runs at start-up, under the Steerer's lock, before the first
// heartbeat: nothing waits on the lock yet.
func (s *Steerer) attachThenFill(g *group, fd int) error {
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_EBPF, g.prog.FD()); err != nil {
		return fmt.Errorf("SO_ATTACH_REUSEPORT_EBPF: %w", err)
	}
	deadline := time.Now().Add(adoptBusyWait)
	for {
		err := g.socks.Update(uint32(ourSlot), uint64(fd), ebpf.UpdateAny)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			s.sockarrayErrors.Add(1)
			// Leave the group unsteered, as AddGroup's failure says.
			_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DETACH_REUSEPORT_BPF, 0)
			return fmt.Errorf("put our socket in slot %d: %w%s", ourSlot, err, busyHint(err))
		}
		time.Sleep(adoptBusyRetry)
	}
}

// adoptBusyWait bounds how long Adopt waits for a socket to leave another
// sockarray. The kernel lets a socket be in one sockarray at a time; after
// a dnsstandby died without detaching and its successor's AddGroup replaced
// the dead one's program, the old maps (and their hold on LocalDNS's
// sockets) are freed after an RCU grace period and a workqueue pass:
// milliseconds, measured here, so 500 ms is ample. adoptBusyRetry is the
// pause between tries; it is taken without the Steerer's lock, so that
// heartbeats and mode changes go on meanwhile.
const (
	adoptBusyWait  = 500 * time.Millisecond
	adoptBusyRetry = 10 * time.Millisecond
)

// Adopt puts a LocalDNS socket into a free peer slot of the group and
// returns the slot (1..MaxPeers). fd is the caller's duplicate (from
// pidfd_getfd); Adopt does not keep it, and the caller should close it at
// once: the map holds the socket itself, and the slot empties by itself
// when LocalDNS closes the socket. Adopting a socket already in the group
// returns its slot. Only at level Adopt; ErrNotAdopt otherwise.
//
// While the socket is still in another sockarray (EBUSY) Adopt tries again
// for up to adoptBusyWait, pausing between tries without holding the lock
// that Heartbeat needs.
func (s *Steerer) Adopt(name string, fd int) (slot int, err error) {
	if s.level != Adopt {
		return 0, ErrNotAdopt
	}
	start := time.Now()
	busy := 0
	for {
		var retry bool
		slot, retry, err = s.adoptOnce(name, fd)
		if !retry {
			break
		}
		if time.Since(start) > adoptBusyWait {
			s.sockarrayErrors.Add(1)
			break
		}
		busy++
		time.Sleep(adoptBusyRetry)
	}
	if busy > 0 {
		s.log.Info("adopt waited for the socket to leave another steering map", "group", name,
			"waited", time.Since(start).Round(time.Millisecond).String(), "ok", err == nil)
	}
	return slot, err
}

// adoptOnce is one try of Adopt, under s.mu. busy reports that the only
// obstacle was the socket being in another sockarray (EBUSY): worth
// another try soon.
func (s *Steerer) adoptOnce(name string, fd int) (slot int, busy bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, false, ErrClosed
	}
	g := s.groups[name]
	if g == nil {
		return 0, false, fmt.Errorf("adopt into %s: %w", name, ErrNoGroup)
	}
	addr, err := checkSocket(fd, g.udp)
	if errors.Is(err, ErrMPTCP) {
		if !g.unadoptable {
			g.unadoptable = true
			s.log.Warn("LocalDNS's socket is MPTCP and cannot be adopted: this group steers at level own (mirror hashes)",
				"group", name, "addr", g.ourAddr.String())
			if werr := s.writeGroupLocked(g); werr != nil {
				err = errors.Join(err, werr)
			}
		}
		return 0, false, fmt.Errorf("adopt into %s: %w", name, err)
	}
	if err != nil {
		return 0, false, fmt.Errorf("adopt into %s: %w: %w", name, ErrWrongSocket, err)
	}
	if addr != g.ourAddr {
		return 0, false, fmt.Errorf("adopt into %s: %w: bound to %s, the group to %s", name, ErrWrongSocket, addr, g.ourAddr)
	}
	cookie, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE)
	if err != nil {
		return 0, false, fmt.Errorf("adopt into %s: SO_COOKIE: %w", name, err)
	}
	if cookie == g.ourCookie {
		return 0, false, fmt.Errorf("adopt into %s: %w: it is our own socket", name, ErrWrongSocket)
	}
	free := -1
	for slot := 1; slot <= MaxPeers; slot++ {
		var c uint64
		err := g.socks.Lookup(uint32(slot), &c)
		switch {
		case err == nil && c == cookie:
			return slot, false, nil // already adopted
		case errors.Is(err, ebpf.ErrKeyNotExist):
			if free < 0 {
				free = slot
			}
		case err != nil:
			return 0, false, fmt.Errorf("adopt into %s: read slot %d: %w", name, slot, err)
		}
	}
	if free < 0 {
		return 0, false, fmt.Errorf("adopt into %s: %w (%d)", name, ErrGroupFull, MaxPeers)
	}
	if err := g.socks.Update(uint32(free), uint64(fd), ebpf.UpdateNoExist); err != nil {
		busy = errors.Is(err, unix.EBUSY)
		if !busy {
			s.sockarrayErrors.Add(1)
		}
		return 0, busy, fmt.Errorf("adopt into %s slot %d: %w%s", name, free, err, busyHint(err))
	}
	s.adoptions.Add(1)
	if g.unadoptable {
		g.unadoptable = false
		if err := s.writeGroupLocked(g); err != nil {
			return free, false, err
		}
	}
	s.log.Debug("adopted peer socket", "group", name, "slot", free, "cookie", cookie)
	return free, false, nil
}

// busyHint explains EBUSY from a sockarray update.
func busyHint(err error) string {
	if errors.Is(err, unix.EBUSY) {
		return " (the socket is still in another REUSEPORT_SOCKARRAY: another steering program, e.g. of a dnsstandby that died without detaching, still holds it)"
	}
	return ""
}

// ClearPeers empties the group's peer slots: the program then reaches only
// our socket (and the hash reaches everyone). Nothing to do below Adopt.
func (s *Steerer) ClearPeers(name string) error {
	if s.level != Adopt {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	g := s.groups[name]
	if g == nil {
		return fmt.Errorf("clear peers of %s: %w", name, ErrNoGroup)
	}
	var errs []error
	for slot := 1; slot <= MaxPeers; slot++ {
		if err := g.socks.Delete(uint32(slot)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			s.sockarrayErrors.Add(1)
			errs = append(errs, fmt.Errorf("clear slot %d: %w", slot, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("clear peers of %s: %w", name, err)
	}
	return nil
}

// Peers returns how many live LocalDNS sockets the group holds now (a
// socket LocalDNS closed has already left its slot).
func (s *Steerer) Peers(name string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, ErrClosed
	}
	g := s.groups[name]
	if g == nil {
		return 0, fmt.Errorf("peers of %s: %w", name, ErrNoGroup)
	}
	return g.peers()
}

// GroupLevel is the level a group steers at: the Steerer's, except Own
// for a group whose LocalDNS socket could not be adopted (an MPTCP
// listener; see ErrMPTCP) until an Adopt into it succeeds.
func (s *Steerer) GroupLevel(name string) (Level, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.groups[name]
	if g == nil {
		return Off, fmt.Errorf("level of %s: %w", name, ErrNoGroup)
	}
	return g.level(s.level), nil
}

// Reads returns the read counter of the UDP group name, for the read
// loops of our socket in it: each adds 1 whenever a receive returns
// datagrams (once per batch). From the first add on, the program applies
// the read test to the group: once a packet it gave our socket has
// waited UnreadAfter with no add since, it stops selecting our socket,
// until the next add (our loops reading what waited). The counter is in
// the map's memory, mapped into ours: adding is a memory write, no
// system call. It stays safe to add to after Close and Leave (the adds
// then go nowhere). Repeated calls return the same counter.
//
// Not for TCP groups: a SYN given to our listener is accepted only once
// the client's ACK arrives, so a client that never sends one (a SYN
// flood) would make a reading dnsstandby look stalled; the heartbeat
// covers them. Before Linux 5.5 (no memory-mapped arrays) it fails and
// the read test stays off.
func (s *Steerer) Reads(name string) (*atomic.Uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	g := s.groups[name]
	if g == nil {
		return nil, fmt.Errorf("read counter of %s: %w", name, ErrNoGroup)
	}
	if !g.udp {
		return nil, fmt.Errorf("read counter of %s: a TCP group has no read test (the heartbeat covers it)", name)
	}
	if err := g.mapReads(); err != nil {
		return nil, fmt.Errorf("read counter of %s: %w", name, err)
	}
	return g.reads, nil
}

// Groups returns the names of the groups added, in order.
func (s *Steerer) Groups() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.order...)
}

func (g *group) peers() (int, error) {
	n := 0
	for slot := 1; slot <= MaxPeers; slot++ {
		var c uint64
		err := g.socks.Lookup(uint32(slot), &c)
		switch {
		case err == nil:
			n++
		case !errors.Is(err, ebpf.ErrKeyNotExist):
			return n, fmt.Errorf("read slot %d: %w", slot, err)
		}
	}
	return n, nil
}

// detachLeftover detaches whatever program the group of our socket has;
// none (ENOENT) is the usual case, and a socket without SO_REUSEPORT
// (EINVAL) is in no group.
func detachLeftover(our syscall.RawConn) error {
	var serr error
	if err := our.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_DETACH_REUSEPORT_BPF, 0)
	}); err != nil {
		return fmt.Errorf("detach a leftover program: %w", err)
	}
	if serr != nil && !errors.Is(serr, unix.ENOENT) && !errors.Is(serr, unix.EINVAL) {
		return fmt.Errorf("detach a leftover program (SO_DETACH_REUSEPORT_BPF): %w", serr)
	}
	return nil
}

// close detaches the group's program (through our socket) and closes it
// and the maps. A group with no program left (ENOENT) is already as found.
func (g *group) close() error {
	var serr error
	err := g.our.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_DETACH_REUSEPORT_BPF, 0)
		if errors.Is(serr, unix.ENOENT) {
			serr = nil
		}
	})
	if err != nil {
		err = fmt.Errorf("detach: our socket is gone (close the Steerer before the sockets): %w", err)
	} else if serr != nil {
		err = fmt.Errorf("SO_DETACH_REUSEPORT_BPF (Linux 5.3+): %w", serr)
	}
	return errors.Join(err, g.closeObjects())
}

// checkSocket checks that fd is a bound UDP socket (udp) or plain TCP
// socket and returns its local address.
func checkSocket(fd int, udp bool) (netip.AddrPort, error) {
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("SO_TYPE: %w", err)
	}
	want := unix.SOCK_STREAM
	if udp {
		want = unix.SOCK_DGRAM
	}
	if typ != want {
		return netip.AddrPort{}, fmt.Errorf("socket type %d, want %s", typ, protoName(udp))
	}
	proto, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("SO_PROTOCOL: %w", err)
	}
	if proto == unix.IPPROTO_MPTCP {
		return netip.AddrPort{}, ErrMPTCP
	}
	return sockname.Of(fd)
}

func protoName(udp bool) string {
	if udp {
		return "udp"
	}
	return "tcp"
}
