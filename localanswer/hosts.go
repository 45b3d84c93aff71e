package localanswer

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/corefile"
)

// HostsConfig configures a Hosts answerer.
type HostsConfig struct {
	// Hosts is the plugin's stanza as package corefile read it (File,
	// Zones, Inline, TTL, NoReverse, Reload, Fallthrough). It has no
	// default here: take it from corefile.Zone.Hosts.
	Hosts corefile.Hosts

	// MaxFileSize is the most bytes of the hosts file read. A larger file
	// is not read and the entries read before stay, as when the file
	// cannot be opened. CoreDNS has no limit; AKS's file is about 1 KiB.
	MaxFileSize int64

	// MaxRecords is the most records in one answer. CoreDNS has no limit;
	// a name with more addresses (or an address with more names) gets
	// the first MaxRecords, in file order. 1024 A or AAAA records fit in
	// a TCP message.
	MaxRecords int

	Logger *slog.Logger // nil discards
}

// DefaultHostsConfig returns the default HostsConfig; the caller sets Hosts.
func DefaultHostsConfig() HostsConfig {
	return HostsConfig{
		MaxFileSize: 1 << 20,
		MaxRecords:  1024,
	}
}

// Hosts answers as CoreDNS 1.13.1's hosts plugin does: A and AAAA for the
// names of a hosts file and of the stanza's inline lines, PTR for their
// addresses. It reads the file in NewHosts and, after Start, again every
// Reload when its modification time or size changed.
type Hosts struct {
	cfg    HostsConfig
	log    *slog.Logger
	inline *hostsTable                // the stanza's inline lines; never changes
	file   atomic.Pointer[hostsTable] // the file's entries as last read

	// The file as last read; only NewHosts and then the reload goroutine
	// touch them.
	mtime time.Time
	size  int64

	mu      sync.Mutex
	started bool
	closed  bool
	cancel  context.CancelFunc
	done    chan struct{} // closed when the reload goroutine returns
}

// hostsTable is one parse of hosts-file text; read-only once made.
type hostsTable struct {
	name4, name6 map[string][]netip.Addr // by lower-case fully qualified name, in file order
	addr         map[netip.Addr][]string // names by address (IPv4 unmapped); empty with no_reverse
}

// Validate checks cfg as NewHosts takes it; errors name the field.
func (cfg HostsConfig) Validate() error {
	hc := cfg.Hosts
	switch {
	case hc.TTL < 1 || hc.TTL > 65535:
		return fmt.Errorf("localanswer: hosts: Hosts.TTL must be 1 to 65535 seconds, got %d", hc.TTL)
	case hc.Reload < 0:
		return fmt.Errorf("localanswer: hosts: Hosts.Reload must not be negative, got %s", hc.Reload)
	case hc.File == "":
		return errors.New("localanswer: hosts: Hosts.File is empty")
	case cfg.MaxFileSize <= 0:
		return fmt.Errorf("localanswer: hosts: MaxFileSize must be positive, got %d", cfg.MaxFileSize)
	case cfg.MaxRecords <= 0:
		return fmt.Errorf("localanswer: hosts: MaxRecords must be positive, got %d", cfg.MaxRecords)
	}
	return nil
}

// NewHosts validates cfg and reads the inline lines and the hosts file.
// A missing or unreadable file is logged and gives no entries, as in
// CoreDNS; it is read when it appears.
func NewHosts(cfg HostsConfig) (*Hosts, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	hc := cfg.Hosts
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := &Hosts{
		cfg: cfg,
		log: log.With("component", "hosts", "file", hc.File),
	}
	h.inline = parseHosts(strings.NewReader(strings.Join(hc.Inline, "\n")), hc.Zones, !hc.NoReverse)
	h.file.Store(&hostsTable{})
	h.reload()
	return h, nil
}

// Start starts re-reading the file every Reload, until ctx is done or
// Close is called. With Reload 0 it starts nothing, as CoreDNS. It may be
// called once.
func (h *Hosts) Start(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.started || h.closed {
		return errors.New("hosts: Start called twice or after Close")
	}
	h.started = true
	if h.cfg.Hosts.Reload == 0 {
		return nil
	}
	ctx, h.cancel = context.WithCancel(ctx)
	h.done = make(chan struct{})
	go h.run(ctx)
	return nil
}

func (h *Hosts) run(ctx context.Context) {
	defer close(h.done)
	t := time.NewTicker(h.cfg.Hosts.Reload)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			h.reload()
		}
	}
}

// Close stops the reload goroutine and waits for it; safe to call more
// than once.
func (h *Hosts) Close() error {
	h.mu.Lock()
	h.closed = true
	cancel, done := h.cancel, h.done
	h.cancel = nil
	h.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	return nil
}

// reload reads the file when its modification time or size changed since
// the last read, as CoreDNS's readHosts does. When it cannot be read the
// entries read before stay.
func (h *Hosts) reload() {
	// O_NONBLOCK: a FIFO put in the file's place must not hang the open.
	f, err := os.OpenFile(h.cfg.Hosts.File, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			h.log.Debug("hosts file does not exist")
		} else {
			h.log.Warn("cannot open hosts file", slog.Any("err", err))
		}
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		h.log.Warn("cannot stat hosts file", slog.Any("err", err))
		return
	}
	if st.ModTime().Equal(h.mtime) && st.Size() == h.size {
		return
	}
	var data []byte
	switch {
	case st.Mode().IsRegular():
		data, err = io.ReadAll(io.LimitReader(f, h.cfg.MaxFileSize+1))
		if err != nil {
			h.log.Warn("cannot read hosts file", slog.Any("err", err))
			return
		}
		if int64(len(data)) > h.cfg.MaxFileSize {
			h.log.Warn("hosts file too large; not read", slog.Int64("size", st.Size()), slog.Int64("max", h.cfg.MaxFileSize))
			return
		}
	case st.IsDir():
		// CoreDNS reads a directory as a file with no lines.
	default:
		h.log.Warn("hosts file is not a regular file; not read", slog.String("mode", st.Mode().String()))
		return
	}
	t := parseHosts(bytes.NewReader(data), h.cfg.Hosts.Zones, !h.cfg.Hosts.NoReverse)
	h.file.Store(t)
	h.mtime, h.size = st.ModTime(), st.Size()
	h.log.Debug("read hosts file", slog.Int("names", len(t.name4)+len(t.name6)), slog.Int("addrs", len(t.addr)))
}

// parseHosts reads hosts-file text as CoreDNS's Hostsfile.parse does:
// "#" starts a comment; a line is an address and one or more names; an
// IPv6 zone is dropped; an address that does not parse drops the line;
// names are lower-cased, made fully qualified and kept only inside zones.
// Like CoreDNS it stops at a line longer than bufio.MaxScanTokenSize.
func parseHosts(r io.Reader, zones []string, reverse bool) *hostsTable {
	t := &hostsTable{
		name4: map[string][]netip.Addr{},
		name6: map[string][]netip.Addr{},
		addr:  map[netip.Addr][]string{},
	}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Bytes()
		if i := bytes.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		f := bytes.Fields(line)
		if len(f) < 2 {
			continue
		}
		a, ok := hostsParseIP(string(f[0]))
		if !ok {
			continue
		}
		byName := t.name6
		if a.Is4() {
			byName = t.name4
		}
		for _, n := range f[1:] {
			name := strings.ToLower(dns.Fqdn(string(n)))
			if hostsZoneMatch(zones, name) == "" {
				continue
			}
			byName[name] = append(byName[name], a)
			if reverse {
				t.addr[a] = append(t.addr[a], name)
			}
		}
	}
	return t
}

// hostsParseIP parses an address as net.ParseIP does after CoreDNS drops
// an IPv6 zone; IPv4 and IPv4-mapped IPv6 addresses come back as IPv4.
func hostsParseIP(s string) (netip.Addr, bool) {
	if i := strings.IndexByte(s, '%'); i >= 0 {
		s = s[:i]
	}
	ip := net.ParseIP(s)
	if ip == nil {
		return netip.Addr{}, false
	}
	a, ok := netip.AddrFromSlice(ip)
	return a.Unmap(), ok
}

// hostsZoneMatch is CoreDNS's plugin.Zones.Matches: the longest zone name
// is a subdomain of, "" for none.
func hostsZoneMatch(zones []string, name string) string {
	best := ""
	for _, z := range zones {
		if len(z) > len(best) && dns.IsSubDomain(z, name) {
			best = z
		}
	}
	return best
}

// Answer implements Answerer as CoreDNS's hosts ServeDNS does. Names
// outside Zones pass on, except PTR queries; a PTR query for an address
// with no names passes on whatever fallthrough says. A name with
// addresses asked for another type gets NOERROR, AA and no records (no
// SOA: the plugin has none). A name without addresses passes on where
// Fallthrough covers it, else gets the SERVFAIL CoreDNS's server writes
// when a plugin fails without writing (not authoritative, nothing else).
func (h *Hosts) Answer(r Request) (*dns.Msg, bool) {
	if r.Msg == nil || len(r.Msg.Question) == 0 {
		return nil, false
	}
	q := r.Msg.Question[0]
	qname := strings.ToLower(q.Name)
	hc := &h.cfg.Hosts
	if q.Qtype != dns.TypePTR && hostsZoneMatch(hc.Zones, qname) == "" {
		return nil, false
	}
	file := h.file.Load()
	var answer []dns.RR
	switch q.Qtype {
	case dns.TypePTR:
		a, ok := hostsReverse(qname)
		if !ok {
			return nil, false
		}
		names := hostsLimit(h.cfg.MaxRecords, file.addr[a], h.inline.addr[a])
		if len(names) == 0 {
			return nil, false
		}
		answer = make([]dns.RR, len(names))
		for i, n := range names {
			answer[i] = &dns.PTR{Hdr: h.header(qname, dns.TypePTR), Ptr: n}
		}
	case dns.TypeA:
		for _, a := range hostsLimit(h.cfg.MaxRecords, file.name4[qname], h.inline.name4[qname]) {
			answer = append(answer, &dns.A{Hdr: h.header(qname, dns.TypeA), A: a.AsSlice()})
		}
	case dns.TypeAAAA:
		for _, a := range hostsLimit(h.cfg.MaxRecords, file.name6[qname], h.inline.name6[qname]) {
			answer = append(answer, &dns.AAAA{Hdr: h.header(qname, dns.TypeAAAA), AAAA: a.AsSlice()})
		}
	}
	if len(answer) == 0 && !hostsKnown(file, h.inline, qname) {
		if hostsZoneMatch(hc.Fallthrough, qname) != "" {
			return nil, false
		}
		m := new(dns.Msg)
		m.SetRcode(r.Msg, dns.RcodeServerFailure)
		return m, true
	}
	m := new(dns.Msg)
	m.SetReply(r.Msg)
	m.Authoritative = true
	m.Answer = answer
	return m, true
}

func (h *Hosts) header(name string, rrtype uint16) dns.RR_Header {
	return dns.RR_Header{Name: name, Rrtype: rrtype, Class: dns.ClassINET, Ttl: h.cfg.Hosts.TTL}
}

// hostsLimit returns the file's entries then the inline ones, as CoreDNS
// joins them, at most max of them, in a new slice.
func hostsLimit[T any](max int, file, inline []T) []T {
	out := make([]T, 0, min(max, len(file)+len(inline)))
	out = append(out, file[:min(len(file), max)]...)
	return append(out, inline[:min(len(inline), max-len(out))]...)
}

func hostsKnown(file, inline *hostsTable, name string) bool {
	return len(file.name4[name]) > 0 || len(file.name6[name]) > 0 ||
		len(inline.name4[name]) > 0 || len(inline.name6[name]) > 0
}

// hostsReverse is CoreDNS's dnsutil.ExtractAddressFromReverse followed by
// its parse in LookupStaticAddr: the labels before in-addr.arpa. or
// ip6.arpa. in reverse order, joined by dots (IPv4) or in fours by colons
// (IPv6), parsed by net.ParseIP.
func hostsReverse(name string) (netip.Addr, bool) {
	var labels []string
	v6 := false
	switch {
	case strings.HasSuffix(name, ".in-addr.arpa."):
		labels = strings.Split(strings.TrimSuffix(name, ".in-addr.arpa."), ".")
	case strings.HasSuffix(name, ".ip6.arpa."):
		labels = strings.Split(strings.TrimSuffix(name, ".ip6.arpa."), ".")
		v6 = true
	default:
		return netip.Addr{}, false
	}
	if len(labels) > 64 {
		// No address has more: 32 nibbles at most. (A name has at most
		// 127 labels, so this only saves work.)
		return netip.Addr{}, false
	}
	for i, j := 0, len(labels)-1; i < j; i, j = i+1, j-1 {
		labels[i], labels[j] = labels[j], labels[i]
	}
	var ip net.IP
	if v6 {
		groups := make([]string, 0, len(labels)/4)
		for i := 0; i+4 <= len(labels); i += 4 {
			groups = append(groups, strings.Join(labels[i:i+4], ""))
		}
		ip = net.ParseIP(strings.Join(groups, ":")).To16()
	} else {
		ip = net.ParseIP(strings.Join(labels, ".")).To4()
	}
	if ip == nil {
		return netip.Addr{}, false
	}
	a, ok := netip.AddrFromSlice(ip)
	return a.Unmap(), ok
}
