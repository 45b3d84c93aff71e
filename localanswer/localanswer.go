// Package localanswer makes the answers LocalDNS makes without asking an
// upstream — the whoami, template and hosts plugins of its Corefile — the
// way CoreDNS 1.13.1's plugins make them, so that dnsstandby answers those
// names as LocalDNS did when LocalDNS cannot. Each plugin's settings come
// from package corefile; this package only answers.
package localanswer

import (
	"net/netip"

	"github.com/miekg/dns"
)

// Request is one query as a plugin sees it.
type Request struct {
	Msg    *dns.Msg       // the query, parsed; not modified
	Client netip.AddrPort // who asked
	Local  netip.AddrPort // the listen address it was sent to
	TCP    bool           // it came over TCP
}

// Answerer is one plugin of a server block.
type Answerer interface {
	// Answer returns the plugin's reply to r and true, or nil and false
	// when the plugin passes the query on to the next plugin of the
	// block, as CoreDNS's plugin.NextOrFailure does (fallthrough, or a
	// name outside the plugin's zones).
	Answer(r Request) (*dns.Msg, bool)
}
