package dnstap

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dnsstandby/dnsstandby/cache"
)

// Reasons a record was not mirrored, besides the cache's own reject reasons
// (cache.Reason.String()), as they appear in the reason label.
const (
	ReasonNotClientResponse = "not_client_response" // another message type, or no Message
	ReasonNoResponseMessage = "no_response_message" // CLIENT_RESPONSE without the reply: dnstap lacks "full"
	ReasonBadProtobuf       = "bad_protobuf"        // a data frame that is no dnstap.Dnstap
	ReasonBadFrame          = "bad_frame"           // a frame that broke the Frame Streams protocol (oversize, truncated, malformed); its connection is closed
	ReasonSinkError         = "sink_error"          // the sink failed with an error other than *cache.RejectError
)

// cause says why a connection ended; it labels
// dnsstandby_mirror_dnstap_disconnects_total.
type cause uint8

const (
	causeStop             cause = iota // the sender sent STOP (CoreDNS reload or shutdown)
	causeEOF                           // the sender closed between frames without STOP (CoreDNS killed, or reconnecting)
	causeHandshakeTimeout              // no complete handshake within Config.HandshakeTimeout
	causeContentType                   // the sender does not offer ContentType
	causeProtocol                      // a malformed or unexpected control frame, or a data frame before START
	causeOversize                      // a frame over its limit
	causeTruncated                     // the stream ended inside a frame
	causeReadError                     // any other read or write error
	causeEvicted                       // closed to admit a new connection at Config.MaxConns
	causeShutdown                      // the receiver closed
	numCauses
)

var causeNames = [numCauses]string{
	"stop", "eof", "handshake_timeout", "content_type", "protocol", "oversize", "truncated", "read_error", "evicted", "shutdown",
}

func (c cause) String() string { return causeNames[c] }

// stats are the receiver's counters: atomics bumped on the read path and
// read by Stats and Collect.
type stats struct {
	accepted     atomic.Uint64
	notClient    atomic.Uint64
	noResponse   atomic.Uint64
	badProtobuf  atomic.Uint64
	badFrame     atomic.Uint64
	sinkErrors   atomic.Uint64
	cacheRejects [256]atomic.Uint64 // by cache.Reason, a uint8
	open         atomic.Int64
	conns        atomic.Uint64
	refused      atomic.Uint64
	disconnects  [numCauses]atomic.Uint64
}

// Stats is a point-in-time copy of the receiver's counters.
type Stats struct {
	Accepted         uint64            // replies the sink took
	Rejected         map[string]uint64 // by reason: the Reason* constants and the cache's reasons; only nonzero cache reasons appear
	Connections      int               // open now
	ConnectionsTotal uint64            // accepted since Listen
	Refused          uint64            // connections closed at accept: the peer was neither PeerUID nor root
	Disconnects      map[string]uint64 // closed connections by cause (see README)
}

// RejectedTotal sums Rejected.
func (s Stats) RejectedTotal() uint64 {
	var n uint64
	for _, v := range s.Rejected {
		n += v
	}
	return n
}

// Stats returns the receiver's counters.
func (r *Receiver) Stats() Stats {
	st := &r.stats
	// Disconnects first: a connection counts everything else before its
	// disconnect (conn.finish), so a snapshot that sees a disconnect sees
	// the counts that came with it.
	disconnects := make(map[string]uint64, numCauses)
	for c := range numCauses {
		disconnects[c.String()] = st.disconnects[c].Load()
	}
	s := Stats{
		Accepted: st.accepted.Load(),
		Rejected: map[string]uint64{
			ReasonNotClientResponse: st.notClient.Load(),
			ReasonNoResponseMessage: st.noResponse.Load(),
			ReasonBadProtobuf:       st.badProtobuf.Load(),
			ReasonBadFrame:          st.badFrame.Load(),
			ReasonSinkError:         st.sinkErrors.Load(),
		},
		Connections:      int(st.open.Load()),
		ConnectionsTotal: st.conns.Load(),
		Refused:          st.refused.Load(),
		Disconnects:      disconnects,
	}
	for i := range st.cacheRejects {
		if n := st.cacheRejects[i].Load(); n > 0 {
			s.Rejected[cache.Reason(i).String()] += n
		}
	}
	return s
}

// recordsHelp is the help text of dnsstandby_mirror_records_total. Every
// mirror source (this receiver, mirror/tap) exports that metric with its
// own constant source label, and a Prometheus registry accepts one metric
// name from several collectors only with identical help text and label
// names: keep it the same as mirror/tap's.
const recordsHelp = "Mirrored LocalDNS replies handed to the cache, by source, result (accepted, rejected) and reason."

var (
	// descRecords counts data frames by result (accepted, rejected) and
	// reason ("" when accepted).
	descRecords = prometheus.NewDesc("dnsstandby_mirror_records_total", recordsHelp,
		[]string{"result", "reason"}, prometheus.Labels{"source": "dnstap"})
	// descConns is the number of Frame Streams connections open now.
	descConns = prometheus.NewDesc("dnsstandby_mirror_dnstap_connections",
		"Open dnstap (Frame Streams) connections.", nil, nil)
	// descConnsTotal counts connections accepted.
	descConnsTotal = prometheus.NewDesc("dnsstandby_mirror_dnstap_connections_total",
		"dnstap (Frame Streams) connections accepted.", nil, nil)
	// descRefused counts connections refused for their peer's uid.
	descRefused = prometheus.NewDesc("dnsstandby_mirror_dnstap_refused_total",
		"dnstap connections closed at accept because the peer was neither LocalDNS's user (PeerUID) nor root.", nil, nil)
	// descDisconnects counts closed connections by cause.
	descDisconnects = prometheus.NewDesc("dnsstandby_mirror_dnstap_disconnects_total",
		"dnstap connections closed, by cause (stop, eof, handshake_timeout, content_type, protocol, oversize, truncated, read_error, evicted, shutdown).",
		[]string{"cause"}, nil)
)

// Describe implements prometheus.Collector.
func (r *Receiver) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRecords, descConns, descConnsTotal, descRefused, descDisconnects} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (r *Receiver) Collect(ch chan<- prometheus.Metric) {
	s := r.Stats()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	counter(descRecords, s.Accepted, "accepted", "")
	// The cache's reasons from the start too, as the receiver's own, so
	// that rate() by reason sees the first reject of each (Stats lists
	// only those counted).
	rejected := map[string]uint64{}
	for _, r := range cache.Reasons() {
		rejected[r.String()] = 0
	}
	for reason, n := range s.Rejected {
		rejected[reason] += n
	}
	for reason, n := range rejected {
		counter(descRecords, n, "rejected", reason)
	}
	ch <- prometheus.MustNewConstMetric(descConns, prometheus.GaugeValue, float64(s.Connections))
	counter(descConnsTotal, s.ConnectionsTotal)
	counter(descRefused, s.Refused)
	for c, n := range s.Disconnects {
		counter(descDisconnects, n, c)
	}
}
