package tap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/dnsstandby/dnsstandby/internal/cgroupv2"
)

// ring is the ring mode's kernel side: the ring buffer and its counters,
// the query sockets (one per address family, parked while the tap is in
// packet mode), and the egress program with its attachments to
// LocalDNS's cgroups.
type ring struct {
	buf     *ebpf.Map // the ring
	counts  *ebpf.Map // per CPU: records by kind, then those lost by kind
	egress  *ebpf.Program
	query   *ebpf.Program // nil without query sockets
	rd      *consumer
	qfds    []int    // query sockets
	qprotos []uint16 // the EtherType each binds to in ring mode
	links   map[string]link.Link
	seen    [numCounts]uint64 // counts already added to the tap's counters
	// offset turns the programs' CLOCK_MONOTONIC times into unix
	// nanoseconds; set from mono before each drain.
	offset int64
	mono   monoClock
	// netnsChecked: the egress program takes only the tap's network
	// namespace's packets.
	netnsChecked bool
}

// newRing loads the programs and opens the query sockets (hooked to
// nothing until bindQueries). It
// fails, and the tap stays in packet mode for good, where the kernel
// refuses any of it (no CAP_BPF, a kernel before 5.8). netns is the
// cookie of the namespace whose replies the egress program takes; where
// the kernel has no bpf_get_netns_cookie for it (before 6.x) or netns is
// 0, it takes those of any namespace (netnsChecked false).
func newRing(spec filterSpec, size int, load localLoader, netns uint64) (_ *ring, err error) {
	r := &ring{links: map[string]link.Link{}}
	if r.mono, err = newMonoClock(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	if r.buf, err = ebpf.NewMap(&ebpf.MapSpec{Name: "dnsstandby_ring", Type: ebpf.RingBuf, MaxEntries: uint32(size)}); err != nil {
		return nil, fmt.Errorf("create ring buffer: %w", err)
	}
	if r.counts, err = ebpf.NewMap(&ebpf.MapSpec{Name: "dnsstandby_cnt", Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 8, MaxEntries: numCounts}); err != nil {
		return nil, fmt.Errorf("create ring counters: %w", err)
	}
	bind := func(insns asm.Instructions) error {
		return errors.Join(insns.AssociateMap(ringMapName, r.buf), insns.AssociateMap(countsMapName, r.counts))
	}
	loadEgress := func(netns uint64) (*ebpf.Program, error) {
		eg := egressProgram(spec, netns)
		if err := bind(eg); err != nil {
			return nil, err
		}
		return ebpf.NewProgram(&ebpf.ProgramSpec{
			Name: "dnsstandby_egr", Type: ebpf.CGroupSKB, AttachType: ebpf.AttachCGroupInetEgress,
			Instructions: eg, License: "Dual MIT/GPL",
		})
	}
	if netns != 0 {
		r.egress, err = loadEgress(netns)
		r.netnsChecked = err == nil
	}
	if r.egress == nil {
		if r.egress, err = loadEgress(0); err != nil {
			return nil, fmt.Errorf("load egress program: %w", err)
		}
	}
	if !spec.queries {
		r.rd, err = newConsumer(r.buf)
		return r, err
	}
	classic, err := spec.program(kernelLoads)
	if err != nil {
		return nil, fmt.Errorf("build query filter: %w", err)
	}
	qi, err := queryRingProgram(classic)
	if err != nil {
		return nil, fmt.Errorf("translate query filter: %w", err)
	}
	if err := bind(qi); err != nil {
		return nil, err
	}
	qprog, err := load(qi)
	if err != nil {
		return nil, fmt.Errorf("load query filter: %w", err)
	}
	r.query = qprog // kept for its run statistics; the sockets hold it too
	for _, fam := range []struct {
		n     int
		proto uint16
	}{{len(spec.v4), unix.ETH_P_IP}, {len(spec.v6), unix.ETH_P_IPV6}} {
		if fam.n == 0 {
			continue
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("query socket: %w", err)
		}
		r.qfds, r.qprotos = append(r.qfds, fd), append(r.qprotos, fam.proto)
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ATTACH_BPF, qprog.FD()); err != nil {
			return nil, fmt.Errorf("attach query filter: %w", err)
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_LOCK_FILTER, 1); err != nil {
			return nil, fmt.Errorf("lock query filter: %w", err)
		}
	}
	r.rd, err = newConsumer(r.buf)
	return r, err
}

// soNetnsCookie is SO_NETNS_COOKIE (include/uapi/asm-generic/socket.h,
// the same on every architecture dnsstandby builds for), which
// golang.org/x/sys/unix does not name.
const soNetnsCookie = 71

// parkedProto is where a packet socket is bound while it should see
// nothing: IEEE 802's Local Experimental EtherType 1, which nothing on a
// node sends (a frame of it that a pod sends anyway fails the filter).
// Binding to protocol 0 cannot unhook a socket: bind(2) on a packet
// socket takes 0 to mean "the protocol it has". Off the ETH_P_ALL list,
// a packet socket costs the transmit path nothing.
const parkedProto = 0x88b5

// bindQueries hooks the query sockets to their EtherTypes (on) or parks
// them.
func (r *ring) bindQueries(on bool) error {
	for i, fd := range r.qfds {
		proto := uint16(parkedProto)
		if on {
			proto = r.qprotos[i]
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(proto)}); err != nil {
			return fmt.Errorf("bind query socket: %w", err)
		}
	}
	return nil
}

// attach makes the egress program see what the processes in the cgroups
// send (their directories under the cgroup2 mount), and stops it seeing
// what other cgroups send. A cgroup is known by its directory's inode, not
// its path: systemd removes a unit's cgroup when the unit stops and makes
// a new one, with the same path, when it starts again. On error the
// attachments are as before. It returns the cgroups newly attached to.
func (r *ring) attach(dirs []string) (added []string, err error) {
	want := map[string]bool{}
	for _, d := range dirs {
		var st unix.Stat_t
		if err := unix.Stat(d, &st); err != nil {
			return nil, fmt.Errorf("cgroup %s: %w", d, err)
		}
		key := fmt.Sprintf("%s (inode %d)", d, st.Ino)
		want[key] = true
		if r.links[key] != nil {
			continue
		}
		l, err := link.AttachCgroup(link.CgroupOptions{Path: d, Attach: ebpf.AttachCGroupInetEgress, Program: r.egress})
		if err != nil {
			return nil, fmt.Errorf("attach egress program to cgroup %s: %w", d, err)
		}
		r.links[key] = l
		added = append(added, key)
	}
	for key, l := range r.links {
		if !want[key] {
			l.Close()
			delete(r.links, key)
		}
	}
	return added, nil
}

// pending reports whether the ring holds records, without a system call.
func (r *ring) pending() bool { return r.rd.pending() }

// countsSince returns the records written and lost (the ring was full),
// over both kinds and every CPU, since the last call.
func (r *ring) countsSince() (recorded, lost uint64) {
	var d [numCounts]uint64
	for k := range d {
		var perCPU []uint64
		if r.counts.Lookup(uint32(k), &perCPU) != nil {
			continue
		}
		var v uint64
		for _, c := range perCPU {
			v += c
		}
		if v >= r.seen[k] {
			d[k], r.seen[k] = v-r.seen[k], v
		}
	}
	return d[countRecorded+recordQuery] + d[countRecorded+recordReply], d[countLost+recordQuery] + d[countLost+recordReply]
}

// programStats returns, for each program, how often the kernel ran it and
// for how long in all: counted only while kernel.bpf_stats_enabled is 1
// (the benchmarks set it); zero otherwise.
func (r *ring) programStats() map[string]ProgramStats {
	out := map[string]ProgramStats{}
	for name, p := range map[string]*ebpf.Program{"egress": r.egress, "query": r.query} {
		if p == nil {
			continue
		}
		if st, err := p.Stats(); err == nil {
			out[name] = ProgramStats{Runs: st.RunCount, Time: st.Runtime}
		}
	}
	return out
}

func (r *ring) close() {
	for _, l := range r.links {
		l.Close()
	}
	for _, fd := range r.qfds {
		unix.Close(fd)
	}
	if r.rd != nil {
		r.rd.close()
	}
	if r.egress != nil {
		r.egress.Close()
	}
	if r.query != nil {
		r.query.Close()
	}
	if r.buf != nil {
		r.buf.Close()
	}
	if r.counts != nil {
		r.counts.Close()
	}
}

// monoClock turns the programs' CLOCK_MONOTONIC times into unix time
// without a system call (x/sys/unix's ClockGettime is one, and each
// system call's return may wake the Go runtime's monitor thread): Go's
// own monotonic readings are CLOCK_MONOTONIC, so CLOCK_MONOTONIC now is
// its value at base plus the monotonic time since.
type monoClock struct {
	base     time.Time // wall and monotonic readings
	baseMono int64     // CLOCK_MONOTONIC at base, ns
}

func newMonoClock() (monoClock, error) {
	var ts unix.Timespec
	base := time.Now()
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return monoClock{}, fmt.Errorf("read CLOCK_MONOTONIC: %w", err)
	}
	return monoClock{base: base, baseMono: ts.Nano()}, nil
}

// offset is unix time minus CLOCK_MONOTONIC now, in nanoseconds: it
// follows the wall clock when it is set.
func (m monoClock) offset() int64 {
	now := time.Now()
	return now.UnixNano() - (m.baseMono + int64(now.Sub(m.base)))
}

// openRing loads the ring mode's programs and makes the set the reader
// waits on: the packet socket and the ring.
func (t *Tap) openRing(size int, load localLoader) error {
	// 0 where the kernel has no SO_NETNS_COOKIE (before 5.14).
	netns, _ := unix.GetsockoptUint64(t.fd, unix.SOL_SOCKET, soNetnsCookie)
	r, err := newRing(t.spec, size, load, netns)
	if err != nil {
		return err
	}
	// Non-blocking, so that Go's poller takes the waiter's duplicate.
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err == nil {
		err = unix.SetNonblock(ep, true)
	}
	if err != nil {
		r.close()
		return fmt.Errorf("epoll: %w", err)
	}
	for _, fd := range []int{t.fd, r.buf.FD()} {
		if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}); err != nil {
			unix.Close(ep)
			r.close()
			return fmt.Errorf("epoll: %w", err)
		}
	}
	t.ring, t.epfd = r, ep
	t.w = newWaiter(ep)
	return nil
}

// SetLocalDNS tells the tap which processes are LocalDNS (the holders of
// its sockets; the takeover controller's peer watcher finds them). With
// a ring, the tap attaches its egress program to their cgroups and goes
// to ring mode; where it cannot (no cgroup2, a cgroup outside this cgroup
// namespace, LocalDNS in dnsstandby's own cgroup), it goes back to packet
// mode and says why.
// An empty pids (LocalDNS is gone) changes nothing: its cgroup, and what
// is attached there, goes with it. Safe from any goroutine.
func (t *Tap) SetLocalDNS(pids []int) {
	if t.ring == nil || len(pids) == 0 {
		return
	}
	t.modeMu.Lock()
	defer t.modeMu.Unlock()
	if t.ringClosed {
		return
	}
	added, err := t.attachLocalDNS(pids)
	if err != nil {
		// Back to packet mode, with nothing left attached (an attach
		// that failed part way would show replies twice): setRing
		// detaches, and so does attach(nil) where packet mode is in
		// force already.
		var back error
		if t.ringOn.Load() {
			back = t.setRing(false)
		} else {
			_, back = t.ring.attach(nil)
		}
		err = errors.Join(err, back)
		if msg := err.Error(); msg != t.modeErr {
			t.modeErr = msg
			t.log.Warn("packet tap: cannot read LocalDNS's replies at its cgroup; the packet socket reads everything, "+
				"and while it is open the kernel clones every packet the node sends for it",
				"pids", fmt.Sprint(pids), slog.Any("err", err))
		}
		return
	}
	t.modeErr = ""
	if !t.ringOn.Load() {
		if err := t.setRing(true); err != nil {
			t.log.Warn("packet tap: ring mode failed, the packet socket reads everything", slog.Any("err", err))
			return
		}
	}
	if len(added) > 0 {
		// Once per LocalDNS start: each gets a cgroup of its own.
		t.log.Info("packet tap reads LocalDNS's replies at its cgroup's egress (ring mode)",
			"pids", fmt.Sprint(pids), "cgroups", strings.Join(added, ","))
	}
}

// attachLocalDNS attaches the egress program to the cgroups of pids, and
// returns those newly attached to.
func (t *Tap) attachLocalDNS(pids []int) ([]string, error) {
	root, err := cgroupv2.Mount(t.procRoot)
	if err != nil {
		return nil, err
	}
	own, err := cgroupv2.Of(t.procRoot, root, os.Getpid())
	if err != nil {
		return nil, err
	}
	var dirs []string
	for _, pid := range pids {
		d, err := cgroupv2.Of(t.procRoot, root, pid)
		if err != nil {
			return nil, err
		}
		if own == d || strings.HasPrefix(own, d+"/") {
			// There the program would see dnsstandby's own sends, and
			// every other process's below: LocalDNS is not in a cgroup
			// of its own (a test, not a unit).
			return nil, fmt.Errorf("LocalDNS (pid %d) is in dnsstandby's cgroup or one above it (%s): not a cgroup of its own", pid, d)
		}
		dirs = append(dirs, d)
	}
	return t.ring.attach(dirs)
}

// setRing switches mode: the sockets of the new one hooked first, then
// those of the old one unhooked, so that no packet goes unseen (one seen
// twice in between is dropped as a duplicate, or settles a hedge twice).
func (t *Tap) setRing(on bool) error {
	all := unix.ETH_P_ALL
	if on {
		if err := t.ring.bindQueries(true); err != nil {
			return err
		}
		all = parkedProto
	}
	if err := unix.Bind(t.fd, &unix.SockaddrLinklayer{Protocol: htons(uint16(all))}); err != nil {
		if on {
			_ = t.ring.bindQueries(false)
		}
		return fmt.Errorf("bind packet socket: %w", err)
	}
	if !on {
		// The packet socket reads the replies now: none may come twice.
		_, detach := t.ring.attach(nil)
		if err := errors.Join(t.ring.bindQueries(false), detach); err != nil {
			return err
		}
	}
	t.ringOn.Store(on)
	return nil
}

// drainRing hands every record in the ring to handle, and returns how
// many there were.
func (t *Tap) drainRing() int {
	r := t.ring
	if r == nil || !r.pending() {
		return 0
	}
	r.offset = r.mono.offset()
	n := r.rd.each(t.handleRecord)
	if n > 0 {
		t.stats.reads.Add(1)
	}
	return n
}

// handleRecord takes one ring record: a header and the packet, cut to
// the record's class.
func (t *Tap) handleRecord(b []byte) {
	if len(b) < recHeader {
		t.stats.seen.Add(1)
		t.stats.reject(reasonShort)
		return
	}
	whole := int(binary.NativeEndian.Uint32(b[recLen:]))
	pkt := b[recHeader:]
	a := arrival{
		at:    int64(binary.NativeEndian.Uint64(b[recTime:])) + t.ring.offset,
		query: binary.NativeEndian.Uint32(b[recKind:]) == recordQuery,
		trunc: whole > len(pkt),
		// A query is received once (ETH_P_IP sees neither a bridge's
		// port nor the transmit side), a reply sent once.
		once: true,
	}
	t.handle(pkt[:min(whole, len(pkt))], a)
}
