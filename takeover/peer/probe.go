package peer

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// probeUDPSize is the EDNS buffer size the probe advertises (the DNS flag
// day 2020 value); whoami's reply is far smaller.
const probeUDPSize = 1232

// ProbeConfig says what a Prober asks and where. Start from
// DefaultProbeConfig.
type ProbeConfig struct {
	// Server is the LocalDNS address to ask (169.254.10.11:53).
	Server netip.AddrPort
	// Name is the question (type A).
	Name string
	// Timeout bounds the wait for a reply; positive.
	Timeout time.Duration
	// SourcePort is the local port to send from, one that the steering
	// program routes to LocalDNS's socket; 0 lets the kernel pick one
	// (SourcePort then tells which).
	SourcePort uint16
}

// DefaultProbeConfig returns the defaults, all but Server. Name is
// LocalDNS's whoami block's (AgentBaker's Corefile binds it on .10 and
// .11): it answers locally, without an upstream, so a failed probe means
// LocalDNS itself is not answering; that block has no nsid plugin, so its
// replies carry no NSID. Timeout is half a second: CoreDNS answers whoami
// in well under a millisecond on the node itself, so half a second is a
// hung or overloaded LocalDNS, not a slow one.
func DefaultProbeConfig() ProbeConfig {
	return ProbeConfig{Name: "health-check.localdns.local.", Timeout: 500 * time.Millisecond}
}

// ProbeResult is the outcome of one probe.
type ProbeResult struct {
	// OK is true for a well-formed reply to our question whose NSID is not
	// SelfNSID: LocalDNS is answering. The rcode does not matter.
	OK bool
	// RTT is the time from sending to the reply, if one came.
	RTT time.Duration
	// NSID is the reply's NSID ("" if it had none).
	NSID string
	// Rcode is the reply's (extended) rcode, or -1 without a reply.
	Rcode int
	// Err says why OK is false: no reply in time (os.ErrDeadlineExceeded),
	// nothing bound (ECONNREFUSED), the context ended, or ErrSelfReply.
	Err error
}

// Prober asks LocalDNS a question from one socket, bound once, so that its
// source port stays the same for the steering program.
type Prober struct {
	cfg  ProbeConfig  // Name fully qualified, Server unmapped
	conn *net.UDPConn // connected to cfg.Server; good until Close
	src  netip.AddrPort
	q    dns.Question

	closeOnce sync.Once
	closeErr  error

	mu  sync.Mutex // serializes Probe (one question in flight); guards buf
	buf []byte
}

// NewProber binds the probe socket (in the calling thread's network
// namespace), connected to cfg.Server so that only the server's replies
// reach it and an unbound server shows at once (ECONNREFUSED).
func NewProber(cfg ProbeConfig) (*Prober, error) {
	if !cfg.Server.IsValid() {
		return nil, errors.New("peer: Server must be set")
	}
	if _, ok := dns.IsDomainName(cfg.Name); !ok || cfg.Name == "" {
		return nil, fmt.Errorf("peer: Name %q is not a domain name", cfg.Name)
	}
	cfg.Name = dns.Fqdn(cfg.Name)
	if cfg.Timeout <= 0 {
		return nil, fmt.Errorf("peer: Timeout must be positive, got %s", cfg.Timeout)
	}
	server := netip.AddrPortFrom(cfg.Server.Addr().Unmap(), cfg.Server.Port())
	cfg.Server = server
	network, local := "udp4", netip.IPv4Unspecified()
	if server.Addr().Is6() {
		network, local = "udp6", netip.IPv6Unspecified()
	}
	conn, err := net.DialUDP(network,
		net.UDPAddrFromAddrPort(netip.AddrPortFrom(local, cfg.SourcePort)),
		net.UDPAddrFromAddrPort(server))
	if err != nil {
		return nil, fmt.Errorf("new prober: bind source port %d: %w", cfg.SourcePort, err)
	}
	return &Prober{
		cfg:  cfg,
		conn: conn,
		src:  conn.LocalAddr().(*net.UDPAddr).AddrPort(),
		q:    dns.Question{Name: cfg.Name, Qtype: dns.TypeA, Qclass: dns.ClassINET},
		buf:  make([]byte, probeUDPSize),
	}, nil
}

// SourcePort is the local port probes are sent from.
func (p *Prober) SourcePort() uint16 { return p.src.Port() }

// Source is the local address and port probes are sent from: the socket
// is connected, so the kernel chose the address once, at NewProber (for
// LocalDNS's address, that address itself).
func (p *Prober) Source() netip.AddrPort {
	return netip.AddrPortFrom(p.src.Addr().Unmap(), p.src.Port())
}

// Probe asks the question once, with a random ID and the EDNS NSID option,
// and waits for the matching reply until the timeout or ctx ends. Replies
// to earlier probes that came too late are skipped. Concurrent calls take
// turns.
func (p *Prober) Probe(ctx context.Context) ProbeResult {
	p.mu.Lock()
	defer p.mu.Unlock()
	res := ProbeResult{Rcode: -1}
	if err := ctx.Err(); err != nil {
		res.Err = fmt.Errorf("probe %s: %w", p.cfg.Server, err)
		return res
	}
	id := uint16(rand.Uint32())
	wire, err := p.query(id).Pack()
	if err != nil {
		res.Err = fmt.Errorf("probe %s: pack query: %w", p.cfg.Server, err)
		return res
	}
	deadline, byCtx := time.Now().Add(p.cfg.Timeout), false
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline, byCtx = d, true
	}
	if err := p.conn.SetReadDeadline(deadline); err != nil {
		res.Err = fmt.Errorf("probe %s: %w", p.cfg.Server, err)
		return res
	}
	// Wake the read when ctx ends; the next Probe sets its own deadline.
	stop := context.AfterFunc(ctx, func() { p.conn.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	p.clearSocketError()

	start := time.Now()
	if _, err := p.conn.Write(wire); err != nil {
		res.Err = fmt.Errorf("probe %s: send: %w", p.cfg.Server, err)
		return res
	}
	var malformed error
	for {
		n, err := p.conn.Read(p.buf)
		if err != nil {
			switch {
			case ctx.Err() != nil:
				err = ctx.Err()
			case byCtx && errors.Is(err, os.ErrDeadlineExceeded):
				// The read deadline was ctx's, and ctx's timer may not
				// have fired yet.
				err = context.DeadlineExceeded
			case errors.Is(err, os.ErrDeadlineExceeded):
				err = fmt.Errorf("no reply within %v: %w", p.cfg.Timeout, err)
				if malformed != nil {
					err = fmt.Errorf("%w (a malformed reply came: %v)", err, malformed)
				}
			}
			res.Err = fmt.Errorf("probe %s %s: %w", p.cfg.Server, p.cfg.Name, err)
			return res
		}
		r := new(dns.Msg)
		if err := r.Unpack(p.buf[:n]); err != nil {
			malformed = err
			continue
		}
		if !p.answers(r, id) {
			continue // a late reply to an earlier probe, or not ours
		}
		res.RTT = time.Since(start)
		res.Rcode = r.Rcode
		if opt := r.IsEdns0(); opt != nil {
			for _, o := range opt.Option {
				if nsid, ok := o.(*dns.EDNS0_NSID); ok {
					if b, err := hex.DecodeString(nsid.Nsid); err == nil {
						res.NSID = string(b)
					}
				}
			}
		}
		if res.NSID == SelfNSID {
			res.Err = fmt.Errorf("probe %s: %w", p.cfg.Server, ErrSelfReply)
			return res
		}
		res.OK = true
		return res
	}
}

// query is the probe's question with EDNS and an empty NSID option.
func (p *Prober) query(id uint16) *dns.Msg {
	m := &dns.Msg{
		MsgHdr:   dns.MsgHdr{Id: id, RecursionDesired: true},
		Question: []dns.Question{p.q},
	}
	opt := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
	opt.SetUDPSize(probeUDPSize)
	opt.Option = append(opt.Option, &dns.EDNS0_NSID{Code: dns.EDNS0NSID})
	m.Extra = append(m.Extra, opt)
	return m
}

// answers reports whether r is the reply to our query with ID id.
func (p *Prober) answers(r *dns.Msg, id uint16) bool {
	if !r.Response || r.Id != id || len(r.Question) != 1 {
		return false
	}
	q := r.Question[0]
	return q.Qtype == p.q.Qtype && q.Qclass == p.q.Qclass && strings.EqualFold(q.Name, p.q.Name)
}

// clearSocketError drops an error an earlier probe left pending on the
// socket (an ICMP port unreachable that came after it gave up), which the
// next read would otherwise report as this probe's.
func (p *Prober) clearSocketError() {
	rc, err := p.conn.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) { _, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR) })
}

// Close closes the probe socket; safe to call more than once.
func (p *Prober) Close() error {
	p.closeOnce.Do(func() {
		if err := p.conn.Close(); err != nil {
			p.closeErr = fmt.Errorf("close prober: %w", err)
		}
	})
	return p.closeErr
}
