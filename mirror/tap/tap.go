// Package tap mirrors LocalDNS's answers into dnsstandby's cache by
// watching them leave the node: an AF_PACKET socket whose BPF filter, run
// in the kernel, passes only UDP datagrams this node sends from LocalDNS's
// listen addresses and port (not frames a bridge forwards from a pod; see
// local.go). The tap reads them in batches,
// parses the IP and UDP headers itself and hands each DNS payload to a
// Sink (usually (*cache.Cache).Insert). Nothing in LocalDNS changes.
//
// The tap sees the network namespace it is started in: the daemon starts
// it in the node's, where LocalDNS's replies to pods leave on the pods'
// veths (each seen once, as PACKET_OUTGOING) and replies to node-local
// clients cross lo (seen twice by the kernel; the filter keeps the
// outgoing copy only).
//
// With Config.Queries it also sees the queries LocalDNS receives (the
// PACKET_HOST copy), and an Observer is shown every query and reply with
// its kernel receive time and both endpoints, for hedged answers.
//
// In ring mode (ring.go; Config.RingSize, SetLocalDNS) no such socket
// stays open: eBPF programs copy the queries, and the replies LocalDNS's
// cgroup sends, into a BPF ring buffer, and the same per-packet path
// takes them from there.
package tap

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// slotSize is the largest packet the tap reads whole. Replies leaving on a
// pod's veth are at most its MTU (1500 on AKS, 9000 with jumbo frames;
// larger ones are fragmented and fragments are not taken); only lo (MTU
// 64 KiB) carries bigger ones, and a DNS reply over 16 KiB by UDP is
// unheard of. Longer packets are counted as "oversize".
const slotSize = 16 << 10

// dedupeWindow is how many recent packets a duplicate is looked for among.
// A reply to a pod behind a bridge (kubenet's cbr0) is sent twice, on the
// bridge and on its port, one right after the other in the same call
// chain; other CPUs' packets may fall between the copies.
const dedupeWindow = 16

// Config says what the tap takes. Start from DefaultConfig and set Addrs.
type Config struct {
	// Addrs are LocalDNS's listen addresses (169.254.10.11); replies from
	// these with source port Port are taken. IPv4 and IPv6 may be mixed;
	// at least one, at most 16.
	Addrs []netip.Addr
	// Port is LocalDNS's UDP port; not 0.
	Port uint16
	// Batch is the number of packets read per recvmmsg, 1 to 1024 (the
	// kernel's UIO_MAXIOV, the most one call returns). Each costs a 16 KiB
	// slot.
	Batch int
	// RcvBuf is the socket's receive buffer in bytes, set with
	// SO_RCVBUFFORCE when privileged (SO_RCVBUF, capped by
	// net.core.rmem_max, otherwise); 0 leaves the system's default.
	RcvBuf int
	// ExcludeMark, when not 0, leaves out packets whose skb mark equals
	// it: dnsstandby's own replies, if its sockets set SO_MARK to it, so
	// that mirroring can go on while it answers a share of the traffic.
	// It applies to queries too: dnsstandby's own queries to LocalDNS
	// (probes), if marked, are not clients' queries.
	ExcludeMark uint32
	// Queries, when true, makes the kernel filter also pass the UDP
	// datagrams this host receives for Addrs and Port: the queries
	// LocalDNS is asked, which go to Observer.Query (never to the sink).
	Queries bool
	// Observer, when not nil, sees every query (with Queries) and every
	// reply the tap takes, with its kernel receive time and endpoints.
	Observer Observer
	// Prefetch, when not nil, is shown each reply the ring holds before
	// the sink gets the reply before it, so that the sink can parse it
	// and have the CPU fetch what it will read meanwhile
	// (pipeline.Worker.PrefetchMirror). It runs on the tap's goroutine;
	// the slice stays where it is until the sink has had the reply.
	Prefetch func(reply []byte)
	// RingSize is the ring mode's BPF ring buffer in bytes: a power of
	// two, at least a page. 0 keeps the tap in packet mode for good.
	// The tap starts in ring mode, reading queries only, and reads
	// LocalDNS's replies once SetLocalDNS names LocalDNS's processes and
	// the egress program attaches to their cgroups (see ring.go).
	RingSize int
	// Logger receives start, stop, pause and read errors; nil discards.
	Logger *slog.Logger
}

// maxRingSize bounds Config.RingSize: the ring is locked kernel memory.
const maxRingSize = 1 << 30

// maxBatch is the most packets one recvmmsg returns (UIO_MAXIOV): a larger
// Batch would only hold slots that are never filled.
const maxBatch = 1024

// DefaultConfig returns the tap's settings for LocalDNS on port 53; Addrs
// is left for the caller.
func DefaultConfig() Config {
	return Config{
		Port: 53,
		// At 20k replies/s a batch of 64 fills in about 3 ms, so a busy
		// tap makes a few hundred system calls a second instead of 20,000.
		Batch: 64,
		// The kernel doubles it (8 MiB) and charges each queued packet its
		// whole skb, about 830 bytes for a small reply from a veth:
		// measured, it holds 10,000 replies, half a second at 20k
		// replies/s with the reader stopped.
		RcvBuf: 4 << 20,
		// Records are 256 bytes for a small query or reply: 16,000 of
		// them, most of a second at 20k queries and replies a second.
		RingSize: 4 << 20,
	}
}

// Validate checks c as Start takes it; errors name the field.
func (c *Config) Validate() error {
	_, err := c.validate()
	return err
}

func (c *Config) validate() (filterSpec, error) {
	if c.Batch < 1 || c.Batch > maxBatch {
		return filterSpec{}, fmt.Errorf("tap: Batch must be 1 to %d, got %d", maxBatch, c.Batch)
	}
	if c.RcvBuf < 0 {
		return filterSpec{}, fmt.Errorf("tap: RcvBuf must not be negative, got %d", c.RcvBuf)
	}
	if c.RingSize != 0 && (c.RingSize < 4096 || c.RingSize > maxRingSize || c.RingSize&(c.RingSize-1) != 0) {
		return filterSpec{}, fmt.Errorf("tap: RingSize must be 0 or a power of two from 4096 to %d, got %d", maxRingSize, c.RingSize)
	}
	spec, err := newFilterSpec(c.Addrs, c.Port, c.ExcludeMark, c.Queries)
	if err != nil {
		return filterSpec{}, fmt.Errorf("tap: %w", err)
	}
	return spec, nil
}

// Packet is one DNS datagram the tap saw, valid only during the call.
type Packet struct {
	At     int64          // kernel receive time, unix nanoseconds (CLOCK_REALTIME)
	Client netip.AddrPort // the querier: a query's source, a reply's destination
	Server netip.AddrPort // the listen address: a query's destination, a reply's source
	DNS    []byte         // the UDP payload
	// QueryAt is a reply's query's arrival (unix ns) where the kernel
	// matched the two (ring mode, standing by): that query was never
	// shown. 0 otherwise.
	QueryAt int64
}

// Observer sees every query and reply the tap takes, from the tap's
// goroutine, one at a time: a slow observer holds up the tap. A query's
// source is whatever its sender wrote (a pod can forge any), so an
// observer must treat queries as hostile input.
type Observer interface {
	Query(p *Packet)
	// Reply returns true when the reply is dnsstandby's own (a hedge it
	// sent): the tap then neither inserts it nor counts it as LocalDNS's.
	Reply(p *Packet) (own bool)
}

// Drainer is an Observer that also wants the tap's word, after each read
// that emptied the socket's queue, that it has been shown every packet
// queued until now (unix ns): periodic work done then runs on the tap's
// goroutine, which is awake anyway, instead of waking one of its own, and
// sees every packet up to now, but for the queries still held in their
// pending slots (ring mode), the first of which arrived at unseen (unix
// ns; 0 if none). It returns when it wants the next word (unix ns); the
// tap reads again then, within its batch pauses' bounds, and shows the
// held queries that have waited pendAge.
type Drainer interface {
	Drained(now, unseen int64) (next int64)
}

// Sink takes one DNS response, usually (*cache.Cache).Insert. It is called
// from the tap's goroutine, one packet at a time; resp is only valid
// during the call. A *cache.RejectError is counted by its reason.
type Sink func(resp []byte) error

// Tap is a running packet tap.
type Tap struct {
	sink  Sink         // always non-nil
	ahead func([]byte) // Config.Prefetch; nil: none
	obs   Observer     // nil: none
	drain Drainer      // obs, if it is one; else nil
	log   *slog.Logger // always non-nil
	spec  filterSpec   // what the kernel filter passes; checked again per packet
	b     *batch       // the reader's slots
	w     *waiter      // the reader's waits for packets
	// pauseT times the batch pause. The pause is a Go timer, not a
	// system call: a goroutine sleeping in ppoll holds its thread in the
	// kernel, and every pause then cost the runtime a P handed off and
	// taken back (sysmon, futexes), a fifth of the tap's CPU at 20,000
	// packets a second.
	pauseT *time.Timer
	stop   func() bool // unregisters the context's AfterFunc

	enabled atomic.Bool
	stats   counters

	// The reader's own state.
	seed    maphash.Seed
	recent  [dedupeWindow]uint64 // fingerprints of recent packets
	nRecent int
	pkt     Packet // what the observer is shown: a field, so that passing it allocates nothing

	quitOnce sync.Once
	quit     chan struct{} // closed when the reader is asked to stop
	done     chan struct{} // closed when the reader has stopped and closed the socket

	// localOnly: the kernel filter passes only packets this host sent
	// (the eBPF filter), not frames a bridge forwards (the classic one).
	localOnly bool

	mu sync.Mutex // guards fd and the ring's counters; the reader closes them when it ends
	fd int        // the packet socket, or -1

	// Ring mode (ring.go): ring is nil where the kernel refused it.
	ring       *ring
	epfd       int         // an epoll set of fd and the ring, which the reader waits on; -1 without a ring
	ringOn     atomic.Bool // in ring mode: replies at LocalDNS's egress, queries through the ring
	modeMu     sync.Mutex  // serialises SetLocalDNS, the query source SetEnabled moves, and the ring's closing
	ringClosed bool        // the reader closed the ring; guarded by modeMu
	procRoot   string      // /proc; tests give another
	modeErr    string      // the last SetLocalDNS error logged, so a repeated one is not
	queryErr   string      // the last settleQueries error logged, likewise
	countErr   string      // the last settleCounting error logged, likewise
	// watch: the observer gets the queries while paused too
	// (WatchQueries).
	watch atomic.Bool
}

// Start opens the tap in the calling goroutine's network namespace (the
// daemon calls it in the node's; tests call it inside nstest's ns.Do, the
// socket staying in that namespace afterwards) and starts its reader. The
// tap runs, inserting, until ctx ends or Close. It needs CAP_NET_RAW, and
// CAP_BPF (or CAP_SYS_ADMIN) for the filter that passes only what this
// node sent; without it the tap falls back to the classic filter and logs
// a warning (Stats.LocalOnly is false).
// cfg is taken as given (start from DefaultConfig); an invalid one is an
// error naming the field.
func Start(ctx context.Context, cfg Config, sink Sink) (*Tap, error) {
	return start(ctx, cfg, sink, loadLocal)
}

// start is Start with the loader of the local-only filter given (tests
// give one the kernel refuses).
func start(ctx context.Context, cfg Config, sink Sink, load localLoader) (*Tap, error) {
	if sink == nil {
		return nil, errors.New("tap: nil sink")
	}
	spec, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	prog, err := spec.program(kernelLoads)
	if err != nil {
		return nil, fmt.Errorf("tap: build filter: %w", err)
	}
	fd, refused, err := openSocket(prog, cfg.RcvBuf, load)
	if err != nil {
		return nil, fmt.Errorf("tap: %w", err)
	}
	t := &Tap{
		sink:   sink,
		ahead:  cfg.Prefetch,
		obs:    cfg.Observer,
		log:    log.With("component", "tap"),
		spec:   spec,
		b:      newBatch(cfg.Batch, slotSize),
		w:      newWaiter(fd),
		pauseT: time.NewTimer(time.Hour),
		seed:   maphash.MakeSeed(),
		quit:   make(chan struct{}),
		done:   make(chan struct{}),
		fd:     fd,

		localOnly: refused == nil,
	}
	t.drain, _ = cfg.Observer.(Drainer)
	t.epfd, t.procRoot = -1, "/proc"
	if cfg.RingSize > 0 {
		// In ring mode from the start: until SetLocalDNS names LocalDNS no
		// reply is read, and none is needed (the tap inserts, and the
		// hedger tracks, only once LocalDNS has been found), while
		// dnsstandby's own answers are never cloned for the tap.
		err := t.openRing(cfg.RingSize, load)
		if err == nil {
			err = t.setRing(true)
		}
		if err != nil {
			t.log.Warn("packet tap: ring mode unavailable, the packet socket reads everything: "+
				"while it is open the kernel clones every packet the node sends for it", slog.Any("err", err))
		}
	}
	t.enabled.Store(true)
	t.stop = context.AfterFunc(ctx, t.interrupt)
	t.log.Info("packet tap started", "addrs", addrList(cfg.Addrs), "port", cfg.Port, "batch", cfg.Batch,
		"rcvbuf", cfg.RcvBuf, "exclude_mark", cfg.ExcludeMark, "queries", cfg.Queries, "observer", cfg.Observer != nil,
		"filter_instructions", len(prog), "local_only", t.localOnly, "ring", t.ring != nil,
		"ring_netns_check", t.ring != nil && t.ring.netnsChecked, "ring_kernel_matching", t.ring != nil && t.ring.pend != nil)
	if t.ring != nil && t.ring.pendErr != nil {
		t.log.Warn("packet tap: the kernel cannot match queries with replies; every query is read and matched in dnsstandby",
			slog.Any("err", t.ring.pendErr))
	}
	if !t.localOnly {
		t.log.Warn("packet tap: the kernel refused the filter that passes only replies this node sent; "+
			"with the classic filter, a pod behind a Linux bridge can forge replies into the cache (see mirror/tap/README.md, or use the dnstap feed)",
			slog.Any("err", refused))
	}
	go t.run()
	return t, nil
}

// addrList is addrs for a log line: one string, comma-separated.
func addrList(addrs []netip.Addr) string {
	s := make([]string, len(addrs))
	for i, a := range addrs {
		s[i] = a.String()
	}
	return strings.Join(s, ",")
}

// SetEnabled pauses (false) or resumes (true) inserting. While paused the
// tap keeps reading, so its buffer does not fill, and counts what it reads
// as rejected ("disabled"): the caller pauses it while dnsstandby itself
// answers from 169.254.10.11, whose replies the filter cannot tell from
// LocalDNS's (unless Config.ExcludeMark is used). In ring mode it also
// says where the queries are read: at LocalDNS's sockets while inserting,
// as the node receives them while paused (see settleQueries). Safe from
// any goroutine.
func (t *Tap) SetEnabled(on bool) {
	if t.enabled.Swap(on) != on {
		t.log.Info("packet tap inserting", "enabled", on)
	}
	if t.ring != nil {
		t.modeMu.Lock()
		t.settleQueries()
		t.modeMu.Unlock()
	}
}

// WatchQueries says whether the observer needs the queries while the tap
// is paused. Standing by it always gets them. Paused (dnsstandby
// answers), in ring mode, the tap otherwise only counts them in the
// kernel, for Stats' Queries (the nat fallback's detection): a query
// then costs the query socket's filter a counter, and no record, no copy
// and no wake-up of the reader. In packet mode the tap reads them
// either way.
func (t *Tap) WatchQueries(on bool) {
	if t.watch.Swap(on) == on || t.ring == nil {
		return
	}
	t.modeMu.Lock()
	defer t.modeMu.Unlock()
	t.settleQueries()
}

// Enabled reports whether the tap inserts what it reads.
func (t *Tap) Enabled() bool { return t.enabled.Load() }

// Close stops the reader, waits for it and closes the socket. It is safe
// to call more than once and concurrently; later calls wait as the first.
func (t *Tap) Close() error {
	t.stop()
	t.interrupt()
	<-t.done
	return nil
}

// Done is closed once the tap has stopped (Close, or its context ended).
func (t *Tap) Done() <-chan struct{} { return t.done }

// interrupt asks the reader to stop and wakes it out of its wait.
func (t *Tap) interrupt() {
	t.quitOnce.Do(func() {
		close(t.quit)
		t.w.stop()
	})
}

// batchPause is the least the reader lets packets gather after it
// emptied the queue. Waking per packet costs more than everything else
// the tap does: at 20k replies/s on this project's 2-vCPU machines the
// tap cost 4.5 to 6 µs a reply reading each wake-up's few packets, and
// 0.9 to 1.3 µs a reply with this pause (batches of about 55).
const batchPause = 5 * time.Millisecond

// maxBatchPause is the most, standing by: the pause when nothing is due
// sooner (the Drainer's next deadline). Each wake-up costs the runtime and the kernel
// some tens of microseconds on a virtual machine, traffic or not, so the
// fewer the better; the cache learns of an answer at most this much later,
// and the receive buffer and the ring hold far more than 50 ms of any real
// reply rate.
const maxBatchPause = 50 * time.Millisecond

// pause sleeps for d, or until the tap is asked to stop, and reports
// whether it was (to stop).
func (t *Tap) pause(d time.Duration) (quit bool) {
	t.pauseT.Reset(d)
	select {
	case <-t.quit:
		return true
	case <-t.pauseT.C:
		return false
	}
}

// readErrorPause spaces retries after an unexpected read error, so that a
// persistent one (none is known for an unbound packet socket) logs and
// counts a few times a second instead of spinning.
const readErrorPause = 200 * time.Millisecond

func (t *Tap) run() {
	defer close(t.done)
	defer t.closeSockets()
	defer t.pauseT.Stop()
	packetLeft := true // the packet socket may hold packets: read it
	for {
		// Everything queued before now is read below, unless a full
		// batch leaves more.
		now := time.Now().UnixNano()
		// In ring mode the packet socket is parked: it is read only for
		// what it queued before (a system call the ring's drains need
		// not make otherwise).
		var n int
		var err error
		ring := t.ringOn.Load()
		if !ring || packetLeft {
			n, err = t.b.recv(t.fd)
		}
		packetLeft = !ring || n == len(t.b.hdrs)
		if err != nil {
			t.stats.readErrors.Add(1)
			t.log.Warn("packet tap read failed", slog.Any("err", err), "retry_in", readErrorPause.String())
			select {
			case <-time.After(readErrorPause):
				continue
			case <-t.quit:
				return
			}
		}
		if n > 0 {
			t.stats.reads.Add(1)
			for i := range n {
				// now: the fallback for a packet without a kernel
				// timestamp.
				pkt, a := t.b.packet(i, now)
				t.handle(pkt, a)
			}
		}
		// The pending slots are swept before the ring is read: a reply
		// that came too late for the egress program to match its query
		// is in the ring, and must follow the query.
		took, waiting, unseen := t.sweepPending()
		// The ring is read to its end each time.
		r := t.drainRing() + took
		full := n == len(t.b.hdrs)
		// Standing by (inserting: LocalDNS gets every query), the tap
		// reads as seldom as the hedger's deadlines allow. Paused, while
		// dnsstandby answers, it reads every batch pause: takeover then
		// compares the queries it saw with those dnsstandby's sockets got,
		// a second at a time (package dnat), and a count behind by 50 ms
		// of queries would blur that.
		standby := t.enabled.Load()
		wait := batchPause
		if standby {
			wait = maxBatchPause
		}
		if t.drain != nil && (n+r > 0 || waiting > 0) && !full {
			// The queues are empty: everything sent or received until
			// now has been shown (a full batch leaves more queued, and
			// judging then would take replies still unread for missing),
			// but for the queries waiting in their slots, the first of
			// which arrived at unseen. The next read comes when its
			// deadline does, and shows it then.
			next := time.Duration(t.drain.Drained(now, unseen) - now)
			if standby {
				wait = next
			}
		}
		switch {
		case full:
			// More may be queued; stop here only if asked to.
			select {
			case <-t.quit:
				return
			default:
			}
		case n+r > 0 || waiting > 0:
			// The queues are empty: rather than wake for the next packet
			// alone, let some gather. Queries waiting in their pending
			// slots wrote no record, and are swept then.
			if t.pause(min(max(wait, batchPause), maxBatchPause)) {
				return
			}
		default:
			if t.sleepNow() {
				// Read again, but stop first if asked to.
				select {
				case <-t.quit:
					return
				default:
				}
				continue
			}
			stopped, err := t.w.forPackets()
			t.sleeping(false)
			if stopped {
				return
			}
			if err != nil {
				t.stats.readErrors.Add(1)
				t.log.Warn("packet tap wait failed", slog.Any("err", err), "retry_in", readErrorPause.String())
				select {
				case <-time.After(readErrorPause):
				case <-t.quit:
					return
				}
			}
		}
	}
}

// sleepNow tells the ingress program that the reader is about to wait
// with no timeout, so that a query it holds in a pending slot wakes the
// reader, and reports awake if a query waits or a record came before the
// program could be told: then the reader must read again, not wait.
//
// A query waiting then is swept from here on until none waits
// (pendLive), even where the sweep had stopped: the ingress program may
// have held it after the sweep last looked and just before it was
// detached (the tap paused). Left unswept, it kept the reader from ever
// waiting again, and it spun, never seeing Close.
func (t *Tap) sleepNow() (awake bool) {
	if t.ring == nil || t.ring.pend == nil {
		return false
	}
	t.sleeping(true)
	waiting := t.ring.pend.anyWaiting()
	if waiting || t.ring.pending() {
		t.sleeping(false)
		t.ring.pendLive = t.ring.pendLive || waiting
		return true
	}
	return false
}

// closeSockets reads the kernel's counters a last time and closes the
// socket.
func (t *Tap) closeSockets() {
	t.pollKernelStats()
	t.modeMu.Lock()
	defer t.modeMu.Unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	unix.Close(t.fd)
	t.fd = -1
	if t.ring != nil {
		unix.Close(t.epfd)
		t.ring.close()
		t.ringClosed = true
	}
	t.log.Info("packet tap stopped")
}

// arrival is what the socket says about a packet besides its bytes.
type arrival struct {
	at    int64 // kernel receive time, unix nanoseconds
	query bool  // received for this host (PACKET_HOST): a query; else sent: a reply
	trunc bool  // longer than its slot (MSG_TRUNC)
	// once: the source shows each packet once (the ring), so the
	// duplicate check is skipped.
	once bool
	// queryAt: a reply's query's arrival, where the programs matched
	// them (unix ns); 0 otherwise.
	queryAt int64
}

// handle takes one packet from the socket.
func (t *Tap) handle(pkt []byte, a arrival) {
	t.stats.seen.Add(1)
	if a.query {
		t.handleQuery(pkt, a)
		return
	}
	if a.trunc {
		t.stats.reject(reasonOversize)
		return
	}
	src, dst, payload, r := parsePacket(pkt)
	if r != reasonNone {
		t.stats.reject(r)
		return
	}
	if !t.spec.matches(src) {
		t.stats.reject(reasonSource)
		return
	}
	if !a.once && t.duplicate(pkt) {
		t.stats.reject(reasonDuplicate)
		return
	}
	// The observer sees every reply, inserting or not: while dnsstandby
	// answers (paused), LocalDNS's replies still settle its hedges.
	if t.obs != nil {
		t.pkt = Packet{At: a.at, Client: dst, Server: src, DNS: payload, QueryAt: a.queryAt}
		own := t.obs.Reply(&t.pkt)
		t.pkt.DNS = nil
		if own {
			t.stats.reject(reasonOwnHedge)
			return
		}
	}
	if !t.enabled.Load() {
		t.stats.reject(reasonDisabled)
		return
	}
	t.stats.sinkResult(t.sink(payload))
}

// handleQuery takes a query: counted, and shown to the observer.
func (t *Tap) handleQuery(pkt []byte, a arrival) {
	if a.trunc {
		t.stats.rejectQuery(reasonOversize)
		return
	}
	src, dst, payload, r := parsePacket(pkt)
	switch {
	case r != reasonNone:
	case !t.spec.queries || !t.spec.matches(dst):
		r = reasonDestination
	case !a.once && t.duplicate(pkt):
		r = reasonDuplicate
	}
	if r != reasonNone {
		t.stats.rejectQuery(r)
		return
	}
	t.stats.queries.Add(1)
	if t.obs != nil {
		t.pkt = Packet{At: a.at, Client: src, Server: dst, DNS: payload}
		t.obs.Query(&t.pkt)
		t.pkt.DNS = nil
	}
}

// duplicate reports whether the same packet, byte for byte, was among the
// last dedupeWindow packets, and remembers it. Copies of one reply taken
// on two interfaces are identical (one skb); a retransmitted reply that is
// identical would store the very same entry, so skipping it loses nothing.
// The same holds for a query a bridge and its port both show. A client's
// retry identical to its first try (same port and ID) and among the last
// dedupeWindow packets is skipped too: the observer already has the first.
func (t *Tap) duplicate(pkt []byte) bool {
	h := maphash.Bytes(t.seed, pkt)
	for _, r := range t.recent[:min(t.nRecent, dedupeWindow)] {
		if r == h {
			return true
		}
	}
	t.recent[t.nRecent%dedupeWindow] = h
	t.nRecent++
	return false
}
