package corefile

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/miekg/dns"
)

// Transports as CoreDNS names them in keys and forward targets
// (plugin/pkg/transport). dnsstandby serves and forwards plain DNS only.
const (
	transportDNS   = "dns"
	transportTLS   = "tls"
	transportQUIC  = "quic"
	transportGRPC  = "grpc"
	transportHTTPS = "https"
	transportUNIX  = "unix"
)

// defaultPorts are CoreDNS's ports for a key without one.
var defaultPorts = map[string]int{
	transportDNS:   53,
	transportTLS:   853,
	transportQUIC:  853,
	transportGRPC:  443,
	transportHTTPS: 443,
}

// splitTransport strips a "dns://"-style prefix, as CoreDNS's
// parse.Transport does; no prefix means plain DNS.
func splitTransport(s string) (transport, rest string) {
	for _, t := range []string{transportTLS, transportDNS, transportQUIC, transportGRPC, transportHTTPS, transportUNIX} {
		if strings.HasPrefix(s, t+"://") {
			return t, s[len(t)+3:]
		}
	}
	return transportDNS, s
}

// key is a parsed server block key such as "cluster.local:53".
type key struct {
	text      string
	transport string
	zones     []string // fully qualified, lower case; several for a classless reverse CIDR
	port      int
}

// parseKey reads a server block key the way CoreDNS's InspectServerBlocks
// does: optional transport, zone or CIDR, optional port.
func parseKey(s string) (key, error) {
	trans, rest := splitTransport(s)
	zones, port, err := splitHostPort(rest)
	if err != nil {
		return key{}, err
	}
	if port < 0 {
		port = defaultPorts[trans]
	}
	return key{text: s, transport: trans, zones: zones, port: port}, nil
}

// zoneArg normalizes a zone given as a plugin argument (forward FROM,
// cache ZONES), as CoreDNS's plugin.Host.NormalizeExact does.
func zoneArg(s string) ([]string, error) {
	_, rest := splitTransport(s)
	zones, _, err := splitHostPort(rest)
	return zones, err
}

// splitHostPort is CoreDNS's plugin.SplitHostPort: a trailing ":N" is the
// port (-1 when absent), the rest a domain name or a CIDR, which becomes
// the reverse zones covering it. Names come back fully qualified and lower
// case.
func splitHostPort(s string) (zones []string, port int, err error) {
	port = -1
	colon := strings.LastIndex(s, ":")
	if colon == len(s)-1 {
		return nil, 0, fmt.Errorf("expecting data after last colon: %q", s)
	}
	if colon != -1 {
		if p, err := strconv.Atoi(s[colon+1:]); err == nil {
			if p < 0 || p > 65535 {
				return nil, 0, fmt.Errorf("port %d out of range", p)
			}
			port = p
			s = s[:colon]
		}
	}
	if len(s) > 255 {
		return nil, 0, fmt.Errorf("zone is too long: %d > 255", len(s))
	}
	if _, ok := dns.IsDomainName(s); !ok {
		return nil, 0, fmt.Errorf("zone is not a valid domain name: %q", s)
	}
	// CoreDNS checks the fully qualified form as well: some names pass
	// without the dot and fail with it.
	if _, ok := dns.IsDomainName(dns.Fqdn(s)); !ok {
		return nil, 0, fmt.Errorf("zone is not a valid domain name: %q", s)
	}
	prefix, err := netip.ParsePrefix(s)
	if err != nil {
		return []string{normalizeName(s)}, port, nil
	}
	if s[0] == ':' || (s[0] == '0' && strings.Contains(s, ":")) {
		return nil, 0, fmt.Errorf("invalid CIDR %s", s)
	}
	return reverseZones(prefix), port, nil
}

func normalizeName(s string) string { return strings.ToLower(dns.Fqdn(s)) }

// reverseZones returns the reverse zones that together cover p: one per
// subnet of p on the next label boundary (8 bits for IPv4, 4 for IPv6), as
// CoreDNS's cidr.Split and cidr.Reverse do. 10.0.0.0/23 gives
// 0.0.10.in-addr.arpa. and 1.0.10.in-addr.arpa.
func reverseZones(p netip.Prefix) []string {
	p = p.Masked()
	a := p.Addr()
	var digits []uint64 // most significant first
	step, base, suffix := 8, 10, "in-addr.arpa."
	if a.Is4() {
		for _, b := range a.As4() {
			digits = append(digits, uint64(b))
		}
	} else {
		step, base, suffix = 4, 16, "ip6.arpa."
		for _, b := range a.As16() {
			digits = append(digits, uint64(b>>4), uint64(b&0xf))
		}
	}
	labels := (p.Bits() + step - 1) / step
	if labels == 0 {
		return []string{suffix}
	}
	// The subnets differ only in the last digit kept, and p is masked, so
	// that digit counts up from its value in p.
	n := 1 << (labels*step - p.Bits())
	zones := make([]string, 0, n)
	for i := range n {
		var b strings.Builder
		b.WriteString(strconv.FormatUint(digits[labels-1]+uint64(i), base))
		for j := labels - 2; j >= 0; j-- {
			b.WriteByte('.')
			b.WriteString(strconv.FormatUint(digits[j], base))
		}
		b.WriteByte('.')
		b.WriteString(suffix)
		zones = append(zones, b.String())
	}
	return zones
}
