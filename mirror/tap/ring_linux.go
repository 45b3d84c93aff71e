package tap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/dnsstandby/dnsstandby/internal/cgroupv2"
)

// ring is the ring mode's kernel side: the ring buffer and its counters,
// the query socket (parked while the tap is in packet mode or reads the
// queries at LocalDNS's cgroups), and the cgroup programs with their
// attachments to LocalDNS's cgroups.
type ring struct {
	buf     *ebpf.Map // the ring
	counts  *ebpf.Map // per CPU: records by kind, then those lost by kind
	qmode   *ebpf.Map // the query socket's filter's mode (nil without queries)
	qonce   *ebpf.Map // per CPU, the last query it took (nil without queries)
	egress  *ebpf.Program
	ingress *ebpf.Program // nil without queries
	query   *ebpf.Program // nil without queries
	rd      *consumer
	// pend: the pending slots, where the ingress program holds queries
	// for the egress program to match (nil where the kernel cannot: the
	// programs then record every query).
	pend    *pendSlotMaps
	pendErr error // why pend is nil, with queries
	// pendLive: a query waited in a slot at the last sweep, or when the
	// reader was about to sleep (sleepNow); the tap's goroutine only.
	pendLive bool
	qfd      int // the query socket; -1 without queries
	// cgroups are LocalDNS's cgroups the programs are attached to, by
	// path and inode.
	cgroups map[string]*cgroupLinks
	// atLocalDNS: the queries are read at the cgroups' ingress, and the
	// query socket is parked.
	atLocalDNS atomic.Bool
	// counting: the query socket's filter counts the queries it takes
	// rather than recording them (countQueries).
	counting atomic.Bool
	seen     [numCounts]uint64 // counts already added to the tap's counters
	// offset turns the programs' CLOCK_MONOTONIC times into unix
	// nanoseconds; set from mono before each drain.
	offset int64
	mono   monoClock
	// netnsChecked: the egress program takes only the tap's network
	// namespace's packets.
	netnsChecked bool
}

// newRing loads the programs and opens the query socket (hooked to
// nothing until bindQueries). It
// fails, and the tap stays in packet mode for good, where the kernel
// refuses any of it (no CAP_BPF, a kernel before 5.8). netns is the
// cookie of the namespace whose replies the egress program takes; where
// the kernel has no bpf_get_netns_cookie for it (before 6.x) or netns is
// 0, it takes those of any namespace (netnsChecked false).
func newRing(spec filterSpec, size int, load localLoader, netns uint64) (_ *ring, err error) {
	r := &ring{cgroups: map[string]*cgroupLinks{}, qfd: -1}
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
	if spec.queries {
		// Where the kernel has no mmapable arrays (before 5.5) or no
		// atomic compare-and-swap for programs (before 5.12), every query
		// is recorded.
		r.pend, r.pendErr = newPendSlotMaps()
	}
	loadCgroup := func(netns uint64, kind int32) (*ebpf.Program, error) {
		insns := cgroupProgram(spec, netns, kind, r.pend != nil)
		if err := bind(insns); err != nil {
			return nil, err
		}
		if r.pend != nil {
			err := insns.AssociateMap(pendMapName, r.pend.meta)
			if kind == recordQuery {
				err = errors.Join(err, insns.AssociateMap(pendDataMapName, r.pend.data))
			}
			if err != nil {
				return nil, err
			}
		}
		ps := &ebpf.ProgramSpec{
			Name: "dnsstandby_egr", Type: ebpf.CGroupSKB, AttachType: ebpf.AttachCGroupInetEgress,
			Instructions: insns, License: "Dual MIT/GPL",
		}
		if kind == recordQuery {
			ps.Name, ps.AttachType = "dnsstandby_ing", ebpf.AttachCGroupInetIngress
		}
		return ebpf.NewProgram(ps)
	}
	if r.pend != nil {
		// Matching needs both programs; without it, neither matches.
		if p, err := loadCgroup(0, recordQuery); err != nil {
			r.pend.close()
			r.pend, r.pendErr = nil, fmt.Errorf("load the matching ingress program: %w", err)
		} else {
			p.Close()
		}
	}
	if netns != 0 {
		r.egress, err = loadCgroup(netns, recordReply)
		r.netnsChecked = err == nil
	}
	if !r.netnsChecked {
		netns = 0
		if r.egress, err = loadCgroup(0, recordReply); err != nil {
			return nil, fmt.Errorf("load egress program: %w", err)
		}
	}
	if !spec.queries {
		r.rd, err = newConsumer(r.buf)
		return r, err
	}
	if r.ingress, err = loadCgroup(netns, recordQuery); err != nil {
		return nil, fmt.Errorf("load ingress program: %w", err)
	}
	if r.qmode, err = ebpf.NewMap(&ebpf.MapSpec{Name: "dnsstandby_qmod", Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1}); err != nil {
		return nil, fmt.Errorf("create query mode map: %w", err)
	}
	if r.qonce, err = ebpf.NewMap(&ebpf.MapSpec{Name: "dnsstandby_qone", Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: queryOnceLen, MaxEntries: 1}); err != nil {
		return nil, fmt.Errorf("create query memo map: %w", err)
	}
	classic, err := spec.program(kernelLoads)
	if err != nil {
		return nil, fmt.Errorf("build query filter: %w", err)
	}
	qi, err := queryRingProgram(classic)
	if err != nil {
		return nil, fmt.Errorf("translate query filter: %w", err)
	}
	if err := errors.Join(bind(qi), qi.AssociateMap(queryModeMapName, r.qmode), qi.AssociateMap(queryOnceMapName, r.qonce)); err != nil {
		return nil, err
	}
	qprog, err := load(qi)
	if err != nil {
		return nil, fmt.Errorf("load query filter: %w", err)
	}
	r.query = qprog // kept for its run statistics; the socket holds it too
	// One socket for both families, on the receive side only: see
	// "queries, while dnsstandby answers" above.
	if r.qfd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0); err != nil {
		return nil, fmt.Errorf("query socket: %w", err)
	}
	for _, o := range []struct {
		level, name, value int
		what               string
	}{
		{unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1, "ignore the transmit side on the query socket"},
		{unix.SOL_SOCKET, unix.SO_ATTACH_BPF, qprog.FD(), "attach query filter"},
		{unix.SOL_SOCKET, unix.SO_LOCK_FILTER, 1, "lock query filter"},
	} {
		if err := unix.SetsockoptInt(r.qfd, o.level, o.name, o.value); err != nil {
			return nil, fmt.Errorf("%s: %w", o.what, err)
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

// bindQueries hooks the query socket to every packet the node receives
// (on) or parks it.
func (r *ring) bindQueries(on bool) error {
	if r.qfd < 0 {
		return nil
	}
	proto := uint16(parkedProto)
	if on {
		proto = unix.ETH_P_ALL
	}
	if err := unix.Bind(r.qfd, &unix.SockaddrLinklayer{Protocol: htons(proto)}); err != nil {
		return fmt.Errorf("bind query socket: %w", err)
	}
	return nil
}

// cgroupLinks are the programs' attachments to one of LocalDNS's
// cgroups.
type cgroupLinks struct {
	dir     string
	ino     uint64    // the directory's inode when attached
	egress  link.Link // always
	ingress link.Link // while the queries are read at LocalDNS
}

func (c *cgroupLinks) close() {
	c.egress.Close()
	if c.ingress != nil {
		c.ingress.Close()
	}
}

// attachCgroup attaches prog to the cgroup dir at its own attach point.
func attachCgroup(dir string, prog *ebpf.Program, at ebpf.AttachType, what string) (link.Link, error) {
	l, err := link.AttachCgroup(link.CgroupOptions{Path: dir, Attach: at, Program: prog})
	if err != nil {
		return nil, fmt.Errorf("attach %s program to cgroup %s: %w", what, dir, err)
	}
	return l, nil
}

// attach makes the egress program (and, reading the queries at LocalDNS,
// the ingress program) see what the processes in the cgroups send and
// receive (their directories under the cgroup2 mount), and stops them
// seeing other cgroups'. A cgroup is known by its directory's inode, not
// its path: systemd removes a unit's cgroup when the unit stops and makes
// a new one, with the same path, when it starts again. On error the
// attachments are as before. It returns the cgroups newly attached to.
func (r *ring) attach(dirs []string) (added []string, err error) {
	want := map[string]bool{}
	defer func() {
		if err != nil {
			for _, key := range added {
				r.cgroups[key].close()
				delete(r.cgroups, key)
			}
			added = nil
		}
	}()
	for _, d := range dirs {
		var st unix.Stat_t
		if err := unix.Stat(d, &st); err != nil {
			return added, fmt.Errorf("cgroup %s: %w", d, err)
		}
		key := fmt.Sprintf("%s (inode %d)", d, st.Ino)
		want[key] = true
		if r.cgroups[key] != nil {
			continue
		}
		cg := &cgroupLinks{dir: d, ino: st.Ino}
		if cg.egress, err = attachCgroup(d, r.egress, ebpf.AttachCGroupInetEgress, "egress"); err != nil {
			return added, err
		}
		r.cgroups[key] = cg
		added = append(added, key)
		if r.atLocalDNS.Load() {
			if cg.ingress, err = attachCgroup(d, r.ingress, ebpf.AttachCGroupInetIngress, "ingress"); err != nil {
				return added, err
			}
		}
	}
	for key, cg := range r.cgroups {
		if !want[key] {
			cg.close()
			delete(r.cgroups, key)
		}
	}
	return added, nil
}

// detach detaches the programs from every cgroup; the query socket reads
// the queries, if it is hooked.
func (r *ring) detach() {
	for key, cg := range r.cgroups {
		cg.close()
		delete(r.cgroups, key)
	}
	r.atLocalDNS.Store(false)
}

// queriesAtLocalDNS moves where the queries are read: at LocalDNS's
// cgroups' ingress (on, where a cgroup is attached to) or by the query
// sockets as the node receives them. The new source is hooked before the
// old one is unhooked, so that no query goes unseen (one seen twice in
// between is tracked twice). On error the source is as before.
func (r *ring) queriesAtLocalDNS(on bool) error {
	on = on && len(r.cgroups) > 0
	if r.ingress == nil || on == r.atLocalDNS.Load() {
		return nil
	}
	if !on {
		if err := r.bindQueries(true); err != nil {
			return err
		}
		r.detachIngress()
		r.atLocalDNS.Store(false)
		return nil
	}
	for _, cg := range r.cgroups {
		var st unix.Stat_t
		err := unix.Stat(cg.dir, &st)
		if err == nil && st.Ino != cg.ino {
			err = errors.New("made again since (LocalDNS restarted, not yet found again)")
		}
		if err == nil {
			cg.ingress, err = attachCgroup(cg.dir, r.ingress, ebpf.AttachCGroupInetIngress, "ingress")
		}
		if err != nil {
			r.detachIngress()
			return fmt.Errorf("cgroup %s: %w", cg.dir, err)
		}
	}
	if err := r.bindQueries(false); err != nil {
		// Hooked again before the ingress attachments go: none unseen.
		err = errors.Join(err, r.bindQueries(true))
		r.detachIngress()
		return err
	}
	r.atLocalDNS.Store(true)
	return nil
}

// detachIngress detaches the ingress program from every cgroup.
func (r *ring) detachIngress() {
	for _, cg := range r.cgroups {
		if cg.ingress != nil {
			cg.ingress.Close()
			cg.ingress = nil
		}
	}
}

// pending reports whether the ring holds records, without a system call.
func (r *ring) pending() bool { return r.rd.pending() }

// ringCounts are what the programs counted, over every CPU, since the
// last countsSince.
type ringCounts struct {
	// taken: packets the programs took (recorded, held in a pending
	// slot, dropped as a query's retransmission while it waits there, or
	// counted without a record).
	taken uint64
	lost  uint64 // records lost: the ring was full
	// repeated: retransmissions of a query waiting in its pending slot.
	repeated uint64
	// counted: queries the query socket's filter counted without
	// recording them (queryCount).
	counted uint64
}

// countsSince returns what the programs counted since the last call.
func (r *ring) countsSince() ringCounts {
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
	return ringCounts{
		taken:    d[countRecorded+recordQuery] + d[countRecorded+recordReply] + d[countPended] + d[countRepeated] + d[countCounted],
		lost:     d[countLost+recordQuery] + d[countLost+recordReply],
		repeated: d[countRepeated],
		counted:  d[countCounted],
	}
}

// countQueries sets what the query socket's filter does with a query it
// takes: counts it (on), or copies it into the ring.
func (r *ring) countQueries(on bool) error {
	if r.qmode == nil {
		return nil
	}
	mode := uint32(queryRecord)
	if on {
		mode = queryCount
	}
	if err := r.qmode.Update(uint32(0), mode, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("set the query filter's mode: %w", err)
	}
	r.counting.Store(on)
	return nil
}

// programStats returns, for each program, how often the kernel ran it and
// for how long in all: counted only while kernel.bpf_stats_enabled is 1
// (the benchmarks set it); zero otherwise.
func (r *ring) programStats() map[string]ProgramStats {
	out := map[string]ProgramStats{}
	for name, p := range map[string]*ebpf.Program{"egress": r.egress, "ingress": r.ingress, "query": r.query} {
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
	r.detach()
	if r.qfd >= 0 {
		unix.Close(r.qfd)
	}
	if r.rd != nil {
		r.rd.close()
	}
	for _, p := range []*ebpf.Program{r.egress, r.ingress} {
		if p != nil {
			p.Close()
		}
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
	for _, m := range []*ebpf.Map{r.qmode, r.qonce} {
		if m != nil {
			m.Close()
		}
	}
	if r.pend != nil {
		r.pend.close()
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

// now is CLOCK_MONOTONIC now, in nanoseconds.
func (m monoClock) now() int64 { return m.baseMono + int64(time.Since(m.base)) }

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
		// detaches, and detach does where packet mode is in force
		// already.
		var back error
		if t.ringOn.Load() {
			back = t.setRing(false)
		} else {
			t.ring.detach()
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
	t.settleQueries()
}

// settleQueries reads the queries where LocalDNS's sockets receive them
// (its cgroups' ingress) while the tap stands by in ring mode, inserting:
// LocalDNS then gets every query, and what the hedger needs is exactly
// what reaches it. Otherwise, while dnsstandby answers, the query socket
// takes them as the node receives them, before netfilter: the nat
// fallback's detection counts queries that reach no socket. The query
// socket's filter runs for every frame the node receives; the ingress
// program only for what LocalDNS's sockets receive. Called with modeMu
// held.
//
// It also settles what the query socket does with a query: while paused,
// and unless WatchQueries asked for them, it only counts it, in the
// kernel; the observer gets no query then, and the reader no record.
// Recording is set before the queries move back to LocalDNS's ingress,
// and counting after they moved away from it.
func (t *Tap) settleQueries() {
	r := t.ring
	if r == nil || t.ringClosed {
		return
	}
	count := !t.enabled.Load() && !t.watch.Load()
	if !count {
		t.settleCounting(false)
	}
	defer func() {
		if count {
			t.settleCounting(true)
		}
	}()
	was := r.atLocalDNS.Load()
	if err := r.queriesAtLocalDNS(t.ringOn.Load() && t.enabled.Load()); err != nil {
		if msg := err.Error(); msg != t.queryErr {
			t.queryErr = msg
			t.log.Warn("packet tap: cannot read the queries at LocalDNS's cgroup; reading them as the node receives them",
				slog.Any("err", err))
		}
		return
	}
	t.queryErr = ""
	if now := r.atLocalDNS.Load(); now != was {
		t.log.Info("packet tap reads the queries", "at", queriesAt(now))
	}
}

// settleCounting makes the query socket count the queries it takes
// (on) or record them, and logs a failure once. Called with modeMu held.
func (t *Tap) settleCounting(on bool) {
	if t.ring.counting.Load() == on {
		return
	}
	if err := t.ring.countQueries(on); err != nil {
		// Recording stays: it costs more, and loses nothing.
		if msg := err.Error(); msg != t.countErr {
			t.countErr = msg
			t.log.Warn("packet tap: cannot switch the query socket between counting and recording the queries", "count", on, slog.Any("err", err))
		}
		return
	}
	t.countErr = ""
}

// queriesAt names where the queries are read, for the log.
func queriesAt(atLocalDNS bool) string {
	if atLocalDNS {
		return "localdns_ingress"
	}
	return "node_receive"
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
// Ring mode starts with the queries read by the query socket
// (settleQueries moves them to LocalDNS's ingress).
func (t *Tap) setRing(on bool) error {
	all := unix.ETH_P_ALL
	if on {
		if err := t.ring.bindQueries(true); err != nil {
			return err
		}
		all = parkedProto
	} else if err := stampPackets(t.fd, true); err != nil {
		return err
	}
	if err := unix.Bind(t.fd, &unix.SockaddrLinklayer{Protocol: htons(uint16(all))}); err != nil {
		if on {
			_ = t.ring.bindQueries(false)
		}
		return fmt.Errorf("bind packet socket: %w", err)
	}
	if on {
		// Parked, the packet socket needs no receive times (the ring's
		// records carry the programs' own), and while any socket asks for
		// them the kernel stamps every packet the machine receives. What
		// it queued before is read stamped when read, a little late:
		// hedging's deadlines only move later.
		if err := stampPackets(t.fd, false); err != nil {
			t.log.Warn("packet tap: cannot stop the parked packet socket's receive times", slog.Any("err", err))
		}
	} else {
		// The packet socket reads queries and replies now: none may come
		// twice.
		t.ring.detach()
		if err := t.ring.bindQueries(false); err != nil {
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
	var ahead func([]byte)
	if t.ahead != nil && t.enabled.Load() {
		ahead = t.prefetchRecord
	}
	n := r.rd.each(t.handleRecord, ahead)
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
	kind := binary.NativeEndian.Uint32(b[recKind:])
	if kind == recordWake {
		return // it woke the reader, which sweeps the slots
	}
	whole := int(binary.NativeEndian.Uint32(b[recLen:]))
	pkt := b[recHeader:]
	a := arrival{
		at:    int64(binary.NativeEndian.Uint64(b[recTime:])) + t.ring.offset,
		query: kind == recordQuery,
		trunc: whole > len(pkt),
		// A query is taken once (the query socket ignores the transmit
		// side, and its filter a bridge's second copy), a reply sent
		// once.
		once: true,
	}
	if q := int64(binary.NativeEndian.Uint64(b[recQueryTime:])); q != 0 {
		// Its query, held in a pending slot, was never read: it is taken
		// here.
		a.queryAt = q + t.ring.offset
		t.stats.seen.Add(1)
		t.stats.queries.Add(1)
		t.stats.queriesMatched.Add(1)
	}
	t.handle(pkt[:min(whole, len(pkt))], a)
}

// prefetchRecord shows the reply in ring record b, if it is one the sink
// may get, to Config.Prefetch.
func (t *Tap) prefetchRecord(b []byte) {
	if len(b) < recHeader || binary.NativeEndian.Uint32(b[recKind:]) != recordReply ||
		int(binary.NativeEndian.Uint32(b[recLen:])) > len(b)-recHeader {
		return
	}
	if _, _, payload, r := parsePacket(b[recHeader:]); r == reasonNone {
		t.ahead(payload)
	}
}

// sweepPending shows the observer each query that has waited in its
// pending slot for pendAge, before the ring's records (a reply that
// came too late for the egress program to match follows it there), and
// returns how many it showed, how many still wait, and when the first of
// those arrived (unix ns; 0 if none).
func (t *Tap) sweepPending() (took, waiting int, unseen int64) {
	r := t.ring
	if r == nil || r.pend == nil || !(r.pendLive || r.atLocalDNS.Load()) {
		return 0, 0, 0
	}
	mono := r.mono.now()
	r.offset = r.mono.offset()
	took, waiting, first := r.pend.sweep(mono-int64(pendAge), func(at int64, pkt []byte) {
		t.handle(pkt, arrival{at: at + r.offset, query: true, once: true})
	})
	if waiting > 0 {
		unseen = first + r.offset
	}
	// Only the ingress program fills the slots: once it is detached, they
	// are swept until none waits.
	r.pendLive = waiting > 0
	return took, waiting, unseen
}

// sleeping tells the ingress program whether the reader is about to wait
// with no timeout (see pendWake).
func (t *Tap) sleeping(on bool) {
	if t.ring != nil && t.ring.pend != nil {
		t.ring.pend.sleeping(on)
	}
}
