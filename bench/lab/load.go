package lab

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"golang.org/x/sys/unix"
)

const (
	// LoadDefaultQPS is the lab's query rate (issue 4's default); a 100 ms
	// bin of the timeline then holds 200 queries.
	LoadDefaultQPS = 2000
	// LoadDefaultTimeout is how long one try waits for its answer before
	// the one retry: 1 s, the lab's definition of "answered on the first
	// try" (glibc waits 5 s, which would hide short gaps).
	LoadDefaultTimeout = time.Second
	// LoadDefaultSockets is how many source sockets the queries are spread
	// over: like that many pods, so the kernel's reuseport hash spreads
	// them over every socket of the group at 169.254.10.11:53.
	LoadDefaultSockets = 64

	// LoadNSIDLocalDNS, LoadNSIDLocalDNSNode and LoadNSIDStandby are the
	// NSIDs the responders answer with: LocalDNS on the pods' listener
	// (the Corefile's `nsid localdns-pod`), LocalDNS on the node's
	// (`nsid localdns`), and dnsstandby on either.
	LoadNSIDLocalDNS     = "localdns-pod"
	LoadNSIDLocalDNSNode = "localdns"
	LoadNSIDStandby      = "dnsstandby"

	// loadTick is the load's clock: each tick reads the replies that have
	// come, sends every query that is due (2 at 2,000 qps) and expires the
	// tries whose time is up. Send times are taken per query and receive
	// times come from the kernel (SO_TIMESTAMPNS), so the tick bounds only
	// how late a query can leave its slot, not what is measured. One
	// wake-up per tick instead of one per reply keeps three loads at 2,000
	// qps cheap on two cores.
	loadTick = time.Millisecond
	// loadChunk is how many queries one block of records holds: blocks are
	// allocated as the load goes and never copied while it runs.
	loadChunk = 1 << 14
	// loadMaxNSIDs bounds how many distinct unexpected NSID strings are
	// kept; further ones are recorded as LoadNSIDOther.
	loadMaxNSIDs = 32
	// loadForget is how long a try's ID stays known after the try ended
	// (answered, failed or timed out): replies to it until then are checked
	// against its question and count as late or duplicate, later ones as
	// mismatched. Long enough for the replies a LocalDNS stopped for the
	// lab's 20 s hang sends to the queries waiting in its socket when it
	// runs again, short enough that the IDs kept stay a small share of a
	// socket's 65,536: about QPS × 31 s keys over all sockets (62,000 at
	// 2,000 qps, under 1,000 a socket).
	loadForget = 30 * time.Second
	// LoadNSIDOther stands for an NSID beyond the first loadMaxNSIDs.
	LoadNSIDOther = "(other)"
	// loadReadBuffer holds the largest UDP datagram, so no reply is cut.
	loadReadBuffer = 65535
)

// LoadName is one entry of the name mix; queries go round the mix in order,
// so repeat an entry to weight it.
type LoadName struct {
	FQDN  string // absolute, with the trailing dot
	Type  uint16 // query type (dns.TypeA, ...)
	Rcode int    // the rcode an acceptable answer carries: dns.RcodeSuccess or dns.RcodeNameError
	// Fresh makes each query of the entry ask a name never asked before:
	// a first label unique to the load and the query (LoadFreshLabelLen
	// hex digits) under FQDN; the retry asks the same name. No cache can
	// hold such a name, so only a server that reaches an upstream answers
	// it.
	Fresh bool
}

// LoadFreshLabelLen is the length of a fresh name's first label: the
// load's random nonce and the query's number, 32 bits each, in hex.
const LoadFreshLabelLen = 16

// wireName is the name a query of n carries on the wire; for a fresh
// entry, with a placeholder first label the load overwrites per query.
func (n LoadName) wireName() string {
	if n.Fresh {
		return strings.Repeat("0", LoadFreshLabelLen) + "." + n.FQDN
	}
	return n.FQDN
}

// LoadConfig is a load to run. Zero fields take the defaults.
type LoadConfig struct {
	NS      *nstest.Namespace // the client's namespace (a pod's, the node's), always non-nil: the sockets are created inside it
	Server  netip.AddrPort    // where queries go: 169.254.10.11:53 from a pod, 169.254.10.10:53 from the node
	QPS     int               // queries per second; LoadDefaultQPS if 0
	Names   []LoadName        // the name mix; at least one
	Timeout time.Duration     // per try; LoadDefaultTimeout if 0
	Sockets int               // source sockets; LoadDefaultSockets if 0
}

func (c LoadConfig) withDefaults() (LoadConfig, error) {
	if c.QPS == 0 {
		c.QPS = LoadDefaultQPS
	}
	if c.Timeout == 0 {
		c.Timeout = LoadDefaultTimeout
	}
	if c.Sockets == 0 {
		c.Sockets = LoadDefaultSockets
	}
	switch {
	case c.NS == nil:
		return c, errors.New("load: no pod namespace")
	case !c.Server.IsValid():
		return c, errors.New("load: no server address")
	case len(c.Names) == 0:
		return c, errors.New("load: empty name mix")
	case c.QPS < 0 || c.Timeout < 0:
		return c, fmt.Errorf("load: QPS %d, timeout %v: want positive values", c.QPS, c.Timeout)
	case c.Sockets < 0 || c.Sockets > 1<<16:
		return c, fmt.Errorf("load: %d sockets: want 1 to 65536", c.Sockets)
	}
	return c, nil
}

// LoadOutcome is how a query ended.
type LoadOutcome uint8

const (
	LoadUnanswered LoadOutcome = iota // no acceptable answer to either try
	LoadFirstTry                      // acceptable answer to the first try within the timeout
	LoadAfterRetry                    // first try failed; acceptable answer to the retry
)

func (o LoadOutcome) String() string {
	switch o {
	case LoadUnanswered:
		return "unanswered"
	case LoadFirstTry:
		return "first-try"
	case LoadAfterRetry:
		return "after-retry"
	}
	return fmt.Sprintf("LoadOutcome(%d)", uint8(o))
}

// LoadRecord is one query. A try fails when its timeout passes without a
// reply, or at once when a reply carries another rcode than the mix
// expects (SERVFAIL, REFUSED, ...), or for a fresh name no answer record
// (the upstreams answer each with one: an empty NOERROR was made up on
// the way): the retry then goes out immediately, as glibc moves on at
// once after a SERVFAIL.
type LoadRecord struct {
	Sent       time.Duration // first try's send time, since LoadResult.Start
	Latency    time.Duration // from Sent to the answer that counted (so a retried answer includes the failed try); 0 if unanswered
	By         string        // NSID of the answer that counted: LoadNSIDLocalDNS, LoadNSIDLocalDNSNode, LoadNSIDStandby, "" if unanswered or none sent
	Name       int32         // index into LoadResult.Names
	Rcode      int16         // rcode of the answer that counted, else of the last reply seen; -1 if no reply
	BadReplies uint8         // replies that failed a try (unexpected rcode, a fresh name's empty answer)
	Outcome    LoadOutcome
}

// LoadResult is what a load recorded.
type LoadResult struct {
	Start    time.Time     // the first query's slot; every Sent is relative to it
	Duration time.Duration // how long queries were sent: Start to Stop
	QPS      int           // the rate asked for
	Timeout  time.Duration // per try
	Sockets  int
	Names    []LoadName
	Records  []LoadRecord // one per query, in send order

	BadRcodes   map[int]int   // replies that failed a try by their rcode, by rcode
	Empty       int           // replies that failed a try of a fresh name by carrying no answer record
	Truncated   int           // acceptable or not, replies with TC set (no TCP retry is made)
	Late        int           // replies to a try that had already timed out; they do not count
	Duplicates  int           // further replies to a try that already had one (same socket, ID and question): a client takes the first
	Mismatched  int           // replies whose ID no try on that socket was sent with (or was forgotten, loadForget after its try ended), or whose question is not the try's
	Malformed   int           // datagrams that do not parse as a reply
	SendErrors  int           // sends the kernel refused; the try then times out
	RecvErrors  int           // ICMP errors (port or host unreachable) reported on a socket
	MaxLag      time.Duration // furthest the sender fell behind its schedule
	Aborted     bool          // the context ended before Stop: queries then in flight count as unanswered
	ReceiverErr string        // why reading replies failed, if it did
	NoTimestamp int           // replies without a plausible kernel receive time (timed when read instead)
}

// Load is a running load; Stop ends it.
type Load struct {
	cfg       LoadConfig
	tmpl      []loadTemplate // per name of the mix
	fds       []int          // UDP sockets made in the pod namespace, connected to the server
	epfd      int            // epoll over fds; the event's data is the socket's index
	start     time.Time
	startWall int64           // start in Unix nanoseconds, to place kernel receive times
	ctx       context.Context // good until the load ends
	// nonce starts every fresh name of this load, so that loads running
	// side by side (and earlier runs) never ask one another's.
	nonce uint32

	stopCh   chan struct{} // closed by Stop: send no more queries
	done     chan struct{} // closed when the loop has returned
	stopOnce sync.Once
	result   LoadResult

	// Owned by the loop goroutine until done is closed.
	chunks   [][]loadQuery
	n        int              // queries sent
	open     int              // queries not yet settled
	pending  map[uint32]int32 // socket<<16|ID → query<<1|try, for tries sent and not yet forgotten (loadForget after they ended)
	timers   loadTimers       // tries' timeouts
	forgets  loadTimers       // ended tries' keys to drop from pending
	rng      *rand.Rand
	nsids    map[string]string // interned unexpected NSIDs
	sendEnd  time.Duration     // set when sending stopped
	stopping bool
	res      LoadResult // counters; Records filled at the end
	sbuf     []byte     // query being sent
	qbuf     []byte     // a fresh query's question, to match its replies
	rbuf     []byte     // reply being read
	oob      []byte     // its control messages
	events   []unix.EpollEvent
}

// loadQuery is a record with the state of its tries.
type loadQuery struct {
	rec     LoadRecord
	try     uint8 // current try: 0 first, 1 retry
	done    bool
	replied uint8 // bit try: that try got a reply, so another is a duplicate
	sock    [2]uint16
	id      [2]uint16
	sent    [2]time.Duration // each try's send time
}

// loadTimer is when a try's time is up, or when an ended try's ID is
// dropped.
type loadTimer struct {
	at  time.Duration
	q   int32
	try uint8
}

// loadTimers is a queue of timers that all wait the same time from when
// they are set, by the one goroutine, so it is in firing order.
type loadTimers struct {
	items []loadTimer
	head  int // first live entry
}

func (t *loadTimers) push(v loadTimer) {
	if t.head > 0 && t.head >= len(t.items)/2 {
		n := copy(t.items, t.items[t.head:])
		t.items = t.items[:n]
		t.head = 0
	}
	t.items = append(t.items, v)
}

// pop returns the first timer due at now, if any.
func (t *loadTimers) pop(now time.Duration) (loadTimer, bool) {
	if t.head >= len(t.items) || t.items[t.head].at > now {
		return loadTimer{}, false
	}
	t.head++
	return t.items[t.head-1], true
}

// len is how many timers are set.
func (t *loadTimers) len() int { return len(t.items) - t.head }

// StartLoad opens the sockets in the pod namespace and starts sending. One
// goroutine runs the load whatever the rate. The load ends with Stop, which
// must always be called; if ctx ends first, the load ends then and Stop
// returns at once, marked Aborted.
func StartLoad(ctx context.Context, cfg LoadConfig) (*Load, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	l := &Load{
		cfg:     cfg,
		epfd:    -1,
		ctx:     ctx,
		stopCh:  make(chan struct{}),
		done:    make(chan struct{}),
		pending: make(map[uint32]int32, 4*cfg.QPS),
		timers:  loadTimers{items: make([]loadTimer, 0, 4*cfg.QPS)},
		forgets: loadTimers{items: make([]loadTimer, 0, 4*cfg.QPS)},
		rng:     rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
		nonce:   rand.Uint32(),
		nsids:   map[string]string{},
		sbuf:    make([]byte, 0, 512),
		qbuf:    make([]byte, 0, 512),
		rbuf:    make([]byte, loadReadBuffer),
		oob:     make([]byte, 128),
	}
	for _, n := range cfg.Names {
		t, err := newLoadTemplate(n)
		if err != nil {
			return nil, fmt.Errorf("load: %w", err)
		}
		l.tmpl = append(l.tmpl, t)
	}
	if err := l.openSockets(); err != nil {
		l.closeFDs()
		return nil, err
	}
	l.events = make([]unix.EpollEvent, len(l.fds))
	l.res = LoadResult{
		QPS:       cfg.QPS,
		Timeout:   cfg.Timeout,
		Sockets:   cfg.Sockets,
		Names:     append([]LoadName(nil), cfg.Names...),
		BadRcodes: map[int]int{},
	}
	l.start = time.Now()
	l.startWall = l.start.UnixNano()
	go l.loop()
	return l, nil
}

// openSockets creates the sockets inside the pod namespace and the epoll
// set over them.
func (l *Load) openSockets() error {
	addr := l.cfg.Server.Addr().Unmap()
	family := unix.AF_INET
	var sa unix.Sockaddr = &unix.SockaddrInet4{Port: int(l.cfg.Server.Port()), Addr: addr.As4()}
	if addr.Is6() {
		family = unix.AF_INET6
		sa = &unix.SockaddrInet6{Port: int(l.cfg.Server.Port()), Addr: addr.As16()}
	}
	l.fds = make([]int, 0, l.cfg.Sockets)
	err := l.cfg.NS.Do(func() error {
		for range l.cfg.Sockets {
			fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("socket: %w", err)
			}
			l.fds = append(l.fds, fd)
			if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1); err != nil {
				return fmt.Errorf("SO_TIMESTAMPNS: %w", err)
			}
			// Connected: the kernel picks a distinct source port for each
			// and drops datagrams from anyone but the server.
			if err := unix.Connect(fd, sa); err != nil {
				return fmt.Errorf("connect to %s: %w", l.cfg.Server, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("load: open sockets in %s: %w", l.cfg.NS, err)
	}
	if l.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return fmt.Errorf("load: epoll: %w", err)
	}
	for i, fd := range l.fds {
		ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(i)}
		if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
			return fmt.Errorf("load: epoll add: %w", err)
		}
	}
	return nil
}

func (l *Load) closeFDs() {
	for _, fd := range l.fds {
		unix.Close(fd)
	}
	l.fds = nil
	if l.epfd >= 0 {
		unix.Close(l.epfd)
		l.epfd = -1
	}
}

// Start is the first query's slot: the origin of every record's Sent. Use
// it to place Down intervals and Events on the same clock.
func (l *Load) Start() time.Time { return l.start }

// Stop sends no more queries, waits until every query sent is settled (at
// most two timeouts, less if the context ends), and returns what was
// recorded. It is safe to call more than once; later calls return the same
// result.
func (l *Load) Stop() LoadResult {
	l.stopOnce.Do(func() {
		close(l.stopCh)
		<-l.done
		l.closeFDs()
		res := l.res
		res.Start = l.start
		res.Duration = l.sendEnd
		res.Records = make([]LoadRecord, l.n)
		for i := range res.Records {
			res.Records[i] = l.chunks[i/loadChunk][i%loadChunk].rec
		}
		l.chunks = nil
		l.result = res
	})
	return l.result
}

// since is the load's clock.
func (l *Load) since() time.Duration { return time.Since(l.start) }

func (l *Load) query(q int32) *loadQuery {
	return &l.chunks[q/loadChunk][q%loadChunk]
}

// loop runs the load: each tick it reads replies, sends what is due and
// expires tries, in that order, so a reply that came before its deadline
// counts however late the tick. After Stop it drains (waits for the tries
// in flight); when the context ends it returns at once.
func (l *Load) loop() {
	defer close(l.done)
	tick := time.NewTicker(loadTick)
	defer tick.Stop()
	stopCh := l.stopCh
	var drainUntil time.Duration
	for {
		select {
		case <-tick.C:
		case <-stopCh:
			stopCh = nil
			l.stopping = true
			l.sendEnd = l.since()
			// Each query settles within two timeouts of its first send
			// (plus a few ticks for the retry to leave).
			drainUntil = l.sendEnd + 2*l.cfg.Timeout + 10*loadTick
		case <-l.ctx.Done():
			l.res.Aborted = true
			if !l.stopping {
				l.stopping = true
				l.sendEnd = l.since()
			}
			return
		}
		l.receive()
		if !l.stopping {
			// Catch up: send every query whose slot has come, however late
			// this tick is, so the rate holds over the run.
			now := l.since()
			due := int(int64(now)*int64(l.cfg.QPS)/int64(time.Second)) + 1
			if l.n < due {
				slot := time.Duration(int64(l.n) * int64(time.Second) / int64(l.cfg.QPS))
				l.res.MaxLag = max(l.res.MaxLag, now-slot)
			}
			for l.n < due {
				l.sendNew()
			}
		}
		now := l.since()
		l.expire(now)
		if l.stopping && (l.open == 0 || now >= drainUntil) {
			return
		}
	}
}

// sendNew records and sends the next query's first try.
func (l *Load) sendNew() {
	if l.n%loadChunk == 0 {
		l.chunks = append(l.chunks, make([]loadQuery, loadChunk))
	}
	q := int32(l.n)
	l.n++
	l.open++
	qq := l.query(q)
	qq.rec.Name = int32(int(q) % len(l.tmpl))
	qq.rec.Rcode = -1
	l.sendTry(q, 0)
	qq.rec.Sent = qq.sent[0]
}

// sendTry sends try (0 or 1) of query q with a fresh ID: the first try on
// a random socket (round robin would tie each name of the mix to a few
// sockets, and so to a few members of the server's reuseport group), the
// retry on the next one.
func (l *Load) sendTry(q int32, try uint8) {
	qq := l.query(q)
	sock := uint16(l.rng.IntN(len(l.fds)))
	if try == 1 {
		sock = uint16((int(qq.sock[0]) + 1) % len(l.fds))
	}
	var key uint32
	for {
		id := uint16(l.rng.Uint32())
		key = uint32(sock)<<16 | uint32(id)
		if _, busy := l.pending[key]; !busy {
			qq.id[try] = id
			break
		}
	}
	l.pending[key] = q<<1 | int32(try)
	qq.sock[try] = sock
	qq.try = try

	tmpl := &l.tmpl[qq.rec.Name]
	l.sbuf = append(l.sbuf[:0], tmpl.wire...)
	if tmpl.fresh {
		l.freshLabel(l.sbuf[13:13+LoadFreshLabelLen], q)
	}
	binary.BigEndian.PutUint16(l.sbuf, qq.id[try])
	qq.sent[try] = l.since()
	l.write(l.fds[sock], l.sbuf)
	l.timers.push(loadTimer{at: l.since() + l.cfg.Timeout, q: q, try: try})
}

// write sends one datagram. A failed send is counted and left to time out,
// as a lost datagram would.
func (l *Load) write(fd int, b []byte) {
	for attempt := 0; ; attempt++ {
		_, err := unix.Write(fd, b)
		switch {
		case err == nil:
			return
		case err == unix.EINTR:
			continue
		case attempt == 0 && loadICMPError(err):
			// A connected UDP socket reports an ICMP error that arrived
			// for an earlier datagram on the next send, which the kernel
			// then does not send; the error is consumed, so send again.
			l.res.RecvErrors++
			continue
		}
		l.res.SendErrors++
		return
	}
}

// loadICMPError tells the errors a connected UDP socket reports for an
// ICMP error to an earlier datagram.
func loadICMPError(err error) bool {
	return err == unix.ECONNREFUSED || err == unix.EHOSTUNREACH || err == unix.ENETUNREACH
}

// forget drops try's ID from pending loadForget from now.
func (l *Load) forget(q int32, try uint8) {
	l.forgets.push(loadTimer{at: l.since() + loadForget, q: q, try: try})
}

// expire fires the timers that are due: a try still open has timed out
// (retry, or the query is unanswered); a forgotten try's ID is dropped.
func (l *Load) expire(now time.Duration) {
	for t, ok := l.forgets.pop(now); ok; t, ok = l.forgets.pop(now) {
		qq := l.query(t.q)
		key := uint32(qq.sock[t.try])<<16 | uint32(qq.id[t.try])
		if v, ok := l.pending[key]; ok && v == t.q<<1|int32(t.try) {
			delete(l.pending, key)
		}
	}
	for t, ok := l.timers.pop(now); ok; t, ok = l.timers.pop(now) {
		qq := l.query(t.q)
		if qq.done || qq.try != t.try {
			continue // settled by a reply
		}
		l.forget(t.q, t.try)
		if t.try == 0 {
			l.sendTry(t.q, 1)
			continue
		}
		qq.done = true
		l.open--
	}
}

// receive reads every reply waiting on any socket.
func (l *Load) receive() {
	if l.res.ReceiverErr != "" {
		return
	}
	n, err := unix.EpollWait(l.epfd, l.events, 0)
	if err == unix.EINTR {
		return // next tick
	}
	if err != nil {
		l.res.ReceiverErr = fmt.Sprintf("epoll_wait: %v", err)
		return
	}
	for _, ev := range l.events[:n] {
		l.drain(int(ev.Fd))
	}
}

// drain reads socket i until it would block.
func (l *Load) drain(i int) {
	for {
		n, oobn, _, _, err := unix.Recvmsg(l.fds[i], l.rbuf, l.oob, unix.MSG_DONTWAIT)
		switch {
		case err == unix.EAGAIN:
			return
		case err == unix.EINTR:
			continue
		case loadICMPError(err):
			// An ICMP error for a datagram sent from this socket (nothing
			// bound at the server, no route); reading it clears it.
			l.res.RecvErrors++
			continue
		case err != nil:
			l.res.ReceiverErr = fmt.Sprintf("recvmsg: %v", err)
			return
		}
		l.handleReply(i, l.rbuf[:n], l.rxTime(l.oob[:oobn]))
	}
}

// rxTime is when the kernel received the datagram whose control messages
// are oob, on the load's clock: the kernel stamps it with the wall clock,
// so a stamp in the future (the wall clock stepped) or none at all gives
// the time now instead.
func (l *Load) rxTime(oob []byte) time.Duration {
	now := l.since()
	for len(oob) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		if int(h.Len) < unix.SizeofCmsghdr || int(h.Len) > len(oob) {
			break
		}
		data := oob[unix.CmsgLen(0):h.Len]
		if h.Level == unix.SOL_SOCKET && h.Type == unix.SCM_TIMESTAMPNS && len(data) >= int(unsafe.Sizeof(unix.Timespec{})) {
			ts := (*unix.Timespec)(unsafe.Pointer(&data[0]))
			if at := time.Duration(ts.Nano() - l.startWall); at <= now {
				return at
			}
			break
		}
		oob = oob[min(unix.CmsgSpace(int(h.Len)-unix.CmsgLen(0)), len(oob)):]
	}
	l.res.NoTimestamp++
	return now
}

// handleReply matches a reply, received at `at`, to its try by socket, ID
// and question, and settles the try. Every reply is checked, also one to a
// try already settled: a second reply to a try is a duplicate, one whose
// ID or question matches no try is mismatched. A try's key stays in
// pending for loadForget after it ended, which bounds the map.
func (l *Load) handleReply(sock int, b []byte, at time.Duration) {
	r, err := loadParseReply(b)
	if err != nil {
		l.res.Malformed++
		return
	}
	key := uint32(sock)<<16 | uint32(r.id)
	v, ok := l.pending[key]
	if !ok {
		l.res.Mismatched++
		return
	}
	q, try := v>>1, uint8(v&1)
	qq := l.query(q)
	tmpl := &l.tmpl[qq.rec.Name]
	if !loadSameQuestion(r.question, l.question(q, tmpl)) {
		l.res.Mismatched++
		return
	}
	if qq.replied&(1<<try) != 0 {
		l.res.Duplicates++
		return
	}
	qq.replied |= 1 << try
	// A stamp before the query left means the wall clock stepped back.
	at = max(at, qq.sent[try])
	// After its deadline the try is lost even if its timer has not fired
	// yet (a late tick); the timer settles it and sets its forget timer.
	if qq.done || qq.try != try || at-qq.sent[try] > l.cfg.Timeout {
		l.res.Late++
		return
	}
	// Its timeout timer will find it settled.
	l.forget(q, try)
	qq.rec.Rcode = int16(r.rcode)
	if r.truncated {
		l.res.Truncated++
	}
	switch {
	case r.rcode != tmpl.rcode:
		l.res.BadRcodes[r.rcode]++
	case tmpl.fresh && r.answers == 0:
		l.res.Empty++
	default:
		qq.rec.Outcome = LoadFirstTry
		if try == 1 {
			qq.rec.Outcome = LoadAfterRetry
		}
		qq.rec.Latency = at - qq.rec.Sent
		qq.rec.By = l.intern(r.nsid)
		qq.done = true
		l.open--
		return
	}
	if qq.rec.BadReplies < 255 {
		qq.rec.BadReplies++
	}
	if try == 0 {
		l.sendTry(q, 1)
		return
	}
	qq.done = true
	l.open--
}

// freshLabel writes query q's fresh label (LoadFreshLabelLen bytes) into
// dst: the same for both tries, distinct for every query of every load.
func (l *Load) freshLabel(dst []byte, q int32) {
	var b [LoadFreshLabelLen / 2]byte
	binary.BigEndian.PutUint32(b[:4], l.nonce)
	binary.BigEndian.PutUint32(b[4:], uint32(q))
	hex.Encode(dst, b[:])
}

// question is the question section query q was sent with: the template's,
// with q's own first label for a fresh name (in l.qbuf, good until the
// next call).
func (l *Load) question(q int32, tmpl *loadTemplate) []byte {
	if !tmpl.fresh {
		return tmpl.question
	}
	l.qbuf = append(l.qbuf[:0], tmpl.question...)
	l.freshLabel(l.qbuf[1:1+LoadFreshLabelLen], q)
	return l.qbuf
}

// intern returns the NSID as a string without allocating for the known
// ones.
func (l *Load) intern(nsid []byte) string {
	switch string(nsid) {
	case "":
		return ""
	case LoadNSIDLocalDNS:
		return LoadNSIDLocalDNS
	case LoadNSIDLocalDNSNode:
		return LoadNSIDLocalDNSNode
	case LoadNSIDStandby:
		return LoadNSIDStandby
	}
	if s, ok := l.nsids[string(nsid)]; ok {
		return s
	}
	if len(l.nsids) >= loadMaxNSIDs {
		return LoadNSIDOther
	}
	s := string(nsid)
	l.nsids[s] = s
	return s
}
