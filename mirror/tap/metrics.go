package tap

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dnsstandby/dnsstandby/cache"
)

// counters are the tap's numbers. The reader is their only writer; the
// atomics let Stats and Collect read them from any goroutine.
type counters struct {
	seen, accepted atomic.Uint64
	tapRejects     [numReasons]atomic.Uint64
	queries        atomic.Uint64 // queries taken (shown to the observer, if any)
	queriesMatched atomic.Uint64 // of those, the queries the programs matched to their reply
	queryRejects   [numReasons]atomic.Uint64
	cacheRejects   [256]atomic.Uint64 // by cache.Reason
	readErrors     atomic.Uint64
	reads          atomic.Uint64 // recvmmsg calls that returned packets

	// From the kernel's PACKET_STATISTICS, which resets on each read, so
	// they are summed here.
	kernelPackets, kernelDrops atomic.Uint64
}

func (c *counters) reject(r reason) { c.tapRejects[r].Add(1) }

func (c *counters) rejectQuery(r reason) { c.queryRejects[r].Add(1) }

// sinkResult counts what the sink said about one response.
func (c *counters) sinkResult(err error) {
	if err == nil {
		c.accepted.Add(1)
		return
	}
	// The type assertion first: cache.Insert returns the *RejectError
	// itself, and errors.As's target escapes (one allocation per reject).
	if re, ok := err.(*cache.RejectError); ok {
		c.cacheRejects[re.Reason].Add(1)
		return
	}
	c.wrappedSinkError(err)
}

func (c *counters) wrappedSinkError(err error) {
	var re *cache.RejectError
	if errors.As(err, &re) {
		c.cacheRejects[re.Reason].Add(1)
		return
	}
	c.tapRejects[reasonSinkError].Add(1)
}

// Stats is a snapshot of the tap's counters: what the daemon's status
// shows (Enabled, Accepted, RejectedTotal) and more. Seen = Accepted +
// RejectedTotal() + Queries + QueriesRejectedTotal(). The records metric
// is Accepted and Rejected; the queries metric Queries and
// QueriesRejected.
type Stats struct {
	Seen     uint64            // packets read from the socket (the kernel filter passed them), replies and queries
	Accepted uint64            // responses the sink took (returned nil): records into the cache
	Rejected map[string]uint64 // the other replies by reason, only those counted at least once: the tap's own, and the cache's passed through
	// Queries counts the queries taken (Config.Queries): shown to the
	// Observer if there is one, or matched to their reply in the kernel.
	Queries uint64
	// QueriesMatched counts, of Queries, those the ring's programs
	// matched to LocalDNS's reply (standing by): each shown to the
	// Observer only as its reply's Packet.QueryAt.
	QueriesMatched uint64
	// QueriesRejected counts the other queries read, by reason
	// ("duplicate", "short", ...), only those counted at least once.
	QueriesRejected map[string]uint64
	// Reads counts the recvmmsg calls that returned packets: Seen/Reads is
	// the mean batch.
	Reads uint64
	// ReadErrors counts failed reads other than those of stopping.
	ReadErrors uint64
	// KernelPackets and KernelDrops are PACKET_STATISTICS: packets the
	// filter passed, and of those the ones dropped for a full receive
	// buffer (never read, so not in Seen). In ring mode, the same for
	// the ring's records: those written, and those lost for a full ring.
	KernelPackets, KernelDrops uint64
	// Enabled is whether the tap inserts what it reads (SetEnabled); a
	// paused tap's reads are rejected as "disabled".
	Enabled bool
	// LocalOnly is whether the kernel filter passes only packets this
	// host sent (the eBPF filter). False: the classic filter, which also
	// passes frames a Linux bridge forwards from one pod to another, so a
	// pod can forge what the tap inserts.
	LocalOnly bool
	// Ring is whether the tap is in ring mode: LocalDNS's replies read at
	// its cgroup's egress and the queries through the ring, with no
	// packet socket on the transmit path (SetLocalDNS).
	Ring bool
	// QueriesAtLocalDNS is whether, in ring mode, the queries are read
	// where LocalDNS's sockets receive them (its cgroup's ingress:
	// standing by, inserting) rather than as the node receives them.
	QueriesAtLocalDNS bool
	// Programs are the ring's eBPF programs' runs, by name ("egress",
	// "ingress", "query"), as the kernel counts them while
	// kernel.bpf_stats_enabled is 1: what watching costs in the kernel,
	// in LocalDNS's sends and receives and in the node's receive path.
	// Nil without a ring.
	Programs map[string]ProgramStats
}

// ProgramStats is what the kernel counted of one eBPF program.
type ProgramStats struct {
	Runs uint64
	Time time.Duration
}

// RejectedTotal sums Rejected: every record read and not inserted.
func (s Stats) RejectedTotal() uint64 {
	var n uint64
	for _, v := range s.Rejected {
		n += v
	}
	return n
}

// QueriesRejectedTotal sums QueriesRejected.
func (s Stats) QueriesRejectedTotal() uint64 {
	var n uint64
	for _, v := range s.QueriesRejected {
		n += v
	}
	return n
}

// pollKernelStats adds the kernel's counters since the last poll. It fails
// quietly once the socket is closed: the reader polls a last time before.
func (t *Tap) pollKernelStats() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.fd < 0 {
		return // closed, or a tap without a socket in tests
	}
	packets, drops, err := kernelStats(t.fd)
	if err != nil {
		return
	}
	t.stats.kernelPackets.Add(uint64(packets))
	t.stats.kernelDrops.Add(uint64(drops))
	if t.ring != nil {
		// What the ring's programs passed counts as the filter's: a
		// record lost for a full ring, as a packet dropped for a full
		// buffer.
		c := t.ring.countsSince()
		t.stats.kernelPackets.Add(c.taken + c.lost)
		t.stats.kernelDrops.Add(c.lost)
		// A query's retransmission the ingress program dropped while the
		// first waits in its pending slot is seen, and a duplicate.
		t.stats.seen.Add(c.repeated)
		t.stats.queryRejects[reasonDuplicate].Add(c.repeated)
		// A query the query socket's filter only counted is seen, and a
		// query: it went to a listen address and port.
		t.stats.seen.Add(c.counted)
		t.stats.queries.Add(c.counted)
	}
}

// Stats returns the tap's counters, the kernel's read just now.
func (t *Tap) Stats() Stats {
	t.pollKernelStats()
	c := &t.stats
	s := Stats{
		Seen:            c.seen.Load(),
		Accepted:        c.accepted.Load(),
		Rejected:        map[string]uint64{},
		Queries:         c.queries.Load(),
		QueriesMatched:  c.queriesMatched.Load(),
		QueriesRejected: map[string]uint64{},
		Reads:           c.reads.Load(),
		ReadErrors:      c.readErrors.Load(),
		KernelPackets:   c.kernelPackets.Load(),
		KernelDrops:     c.kernelDrops.Load(),
		Enabled:         t.enabled.Load(),
		LocalOnly:       t.localOnly,
		Ring:            t.ringOn.Load(),
	}
	if t.ring != nil {
		s.QueriesAtLocalDNS = t.ring.atLocalDNS.Load()
		t.mu.Lock()
		if t.fd >= 0 { // the ring is open
			s.Programs = t.ring.programStats()
		}
		t.mu.Unlock()
	}
	c.eachReject(func(name string, v uint64) { s.Rejected[name] += v })
	for r := reason(1); r < numReasons; r++ {
		if v := c.queryRejects[r].Load(); v > 0 {
			s.QueriesRejected[r.String()] = v
		}
	}
	return s
}

// eachReject calls fn for every reject reason counted at least once.
func (c *counters) eachReject(fn func(reason string, v uint64)) {
	for r := reason(1); r < numReasons; r++ {
		if v := c.tapRejects[r].Load(); v > 0 {
			fn(r.String(), v)
		}
	}
	for r := range c.cacheRejects {
		if v := c.cacheRejects[r].Load(); v > 0 {
			fn(cache.Reason(r).String(), v)
		}
	}
}

// recordsHelp is the help text of dnsstandby_mirror_records_total. Every
// mirror source (this tap, mirror/dnstap) exports that metric with its own
// constant source label, and a Prometheus registry accepts one metric name
// from several collectors only with identical help text and label names:
// keep it the same as mirror/dnstap's.
const recordsHelp = "Mirrored LocalDNS replies handed to the cache, by source, result (accepted, rejected) and reason."

var (
	// descRecords counts every packet read: accepted ones (inserted) with
	// reason "", rejected ones by reason.
	descRecords = prometheus.NewDesc("dnsstandby_mirror_records_total", recordsHelp,
		[]string{"result", "reason"}, prometheus.Labels{"source": "tap"})
	// descDrops counts packets the kernel passed through the filter but
	// dropped because the tap's receive buffer, or its ring, was full.
	descDrops = prometheus.NewDesc("dnsstandby_mirror_tap_drops_total",
		"Packets the kernel dropped because the packet tap's receive buffer (PACKET_STATISTICS tp_drops) or, in ring mode, its ring was full.", nil, nil)
	// descQueries counts the queries the tap read (Config.Queries): taken
	// ones (shown to the observer) with reason "", rejected ones by reason.
	// They are not records: the mirror inserts replies only.
	descQueries = prometheus.NewDesc("dnsstandby_mirror_tap_queries_total",
		"Queries to LocalDNS the packet tap read, by result (observed, rejected) and reason.",
		[]string{"result", "reason"}, nil)
	// descQueriesMatched counts the observed queries matched to their
	// reply in the kernel.
	descQueriesMatched = prometheus.NewDesc("dnsstandby_mirror_tap_queries_matched_total",
		"Observed queries that the packet tap's eBPF programs matched to LocalDNS's reply in the kernel (ring mode, standing by), so that neither was matched in user space.",
		nil, nil)
	// descReadErrors counts failed reads of the tap's socket.
	descReadErrors = prometheus.NewDesc("dnsstandby_mirror_tap_read_errors_total",
		"Failed reads of the packet tap's socket.", nil, nil)
	// descEnabled is 1 while the tap inserts, 0 while paused because
	// dnsstandby answers itself.
	descEnabled = prometheus.NewDesc("dnsstandby_mirror_tap_enabled",
		"1 while the packet tap inserts what it reads into the cache, 0 while paused.", nil, nil)
	// descLocalOnly is 1 while the tap's kernel filter passes only what
	// this node sent, 0 with the classic filter (forgeable on a bridge).
	descLocalOnly = prometheus.NewDesc("dnsstandby_mirror_tap_local_only",
		"1 if the packet tap's filter passes only replies this node sent; 0 if the kernel refused it and frames a bridge forwards from pods can pass too.", nil, nil)
	// descProgramRuns and descProgramSeconds are the ring's programs'
	// runs and time in the kernel (kernel.bpf_stats_enabled=1).
	descProgramRuns = prometheus.NewDesc("dnsstandby_mirror_tap_program_runs_total",
		"Runs of the packet tap's eBPF programs in ring mode (egress: each packet LocalDNS sends; ingress: each packet LocalDNS receives, while standing by; query: each frame the node receives, while dnsstandby answers), counted while kernel.bpf_stats_enabled is 1.",
		[]string{"program"}, nil)
	descProgramSeconds = prometheus.NewDesc("dnsstandby_mirror_tap_program_seconds_total",
		"Time the packet tap's eBPF programs ran in the kernel, counted while kernel.bpf_stats_enabled is 1.",
		[]string{"program"}, nil)
	// descRing is 1 in ring mode, 0 while the packet socket reads.
	descRing = prometheus.NewDesc("dnsstandby_mirror_tap_ring",
		"1 in ring mode: the packet tap reads the queries, and LocalDNS's replies at its cgroup's egress once LocalDNS is found, through a BPF ring buffer; 0 while its packet socket reads both.", nil, nil)
	// descQueriesAtLocalDNS is 1 while ring mode reads the queries at
	// LocalDNS's cgroup's ingress.
	descQueriesAtLocalDNS = prometheus.NewDesc("dnsstandby_mirror_tap_queries_at_localdns",
		"1 while the packet tap reads the queries where LocalDNS's sockets receive them (ring mode, standing by); 0 while it reads them as the node receives them, before netfilter.", nil, nil)
)

// Describe implements prometheus.Collector.
func (t *Tap) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRecords, descQueries, descQueriesMatched, descDrops, descReadErrors, descEnabled, descLocalOnly, descRing, descQueriesAtLocalDNS, descProgramRuns, descProgramSeconds} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (t *Tap) Collect(ch chan<- prometheus.Metric) {
	s := t.Stats()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	counter(descRecords, s.Accepted, "accepted", "")
	// Every reason from the start, the tap's own and the cache's, so that
	// rate() by reason sees the first reject of each (Stats lists only
	// those counted).
	rejected := map[string]uint64{}
	for r := reason(1); r < numReasons; r++ {
		rejected[r.String()] = 0
	}
	for _, r := range cache.Reasons() {
		rejected[r.String()] = 0
	}
	for r, v := range s.Rejected {
		rejected[r] += v
	}
	for r, v := range rejected {
		counter(descRecords, v, "rejected", r)
	}
	counter(descQueries, s.Queries, "observed", "")
	counter(descQueriesMatched, s.QueriesMatched)
	for r, v := range s.QueriesRejected {
		counter(descQueries, v, "rejected", r)
	}
	counter(descDrops, s.KernelDrops)
	counter(descReadErrors, s.ReadErrors)
	gauge := func(d *prometheus.Desc, on bool) {
		v := 0.0
		if on {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	gauge(descEnabled, s.Enabled)
	gauge(descLocalOnly, s.LocalOnly)
	gauge(descRing, s.Ring)
	gauge(descQueriesAtLocalDNS, s.QueriesAtLocalDNS)
	for name, p := range s.Programs {
		counter(descProgramRuns, p.Runs, name)
		ch <- prometheus.MustNewConstMetric(descProgramSeconds, prometheus.CounterValue, p.Time.Seconds(), name)
	}
}
