package anchor

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
)

const (
	// DefaultLink is the anchor link's name in DefaultConfig.
	DefaultLink = "dnsstandby"
	// DefaultKind is the anchor link's kind in DefaultConfig: what
	// LocalDNS itself uses for `localdns`, so every AKS node has the
	// driver. Machines without it (this project's test machines) use
	// "bridge": an empty bridge has no carrier, but its local addresses
	// work the same.
	DefaultKind = "dummy"
	// maxLinkName is IFNAMSIZ less the terminating NUL.
	maxLinkName = 15
)

// Config says which link to keep and what it holds. Start from
// DefaultConfig.
type Config struct {
	// Link is the anchor link's name. Nothing else on the node may use
	// this name: the anchor re-creates a link of this name whenever it
	// goes away, and deletes it on Close with Cleanup.
	Link string
	// Kind is the kernel link kind (`ip link add ... type KIND`) used to
	// create the link: "bridge" where the kernel lacks the dummy driver.
	// Any kind that needs no attributes works. A link of another kind
	// that dnsstandby made is kept, and re-created with its kind.
	Kind string
	// Addrs are held on the link, each as a host address (/32, or /128 with
	// IFA_F_NODAD so it is usable at once, and IFA_F_NOPREFIXROUTE so the
	// link adds no route to the main table). At least one.
	Addrs []netip.Addr
	// Cleanup deletes the link on Close. By default it stays, so the
	// addresses stay local while dnsstandby restarts (LocalDNS may have
	// deleted its own copy meanwhile).
	Cleanup bool
	// SourceToward maps a held IPv4 address to an address (an upstream DNS
	// server) whose route's source the address's local route on the link
	// names as preferred source, instead of the held address itself: so
	// that the node's own packets to it leave from an address replies can
	// reach if a DNAT sends them elsewhere (see setSources). An address
	// not in it, or whose route gives no usable source (none, link-local,
	// loopback), keeps the kernel's choice.
	SourceToward map[netip.Addr]netip.Addr
	// Netns is the path of the network namespace to work in (for example
	// /run/netns/NAME); "" means the namespace of the thread calling Start.
	// For tests and the lab.
	Netns string
	// Logger receives start-up, repair and error lines; nil discards.
	Logger *slog.Logger
}

// DefaultConfig returns the defaults: link DefaultLink of kind
// DefaultKind, kept on Close, in the caller's namespace, no addresses.
func DefaultConfig() Config {
	return Config{Link: DefaultLink, Kind: DefaultKind}
}

// Validate checks c as the anchor takes it, without touching the
// system; errors name the field.
func (c Config) Validate() error {
	_, err := c.validated()
	return err
}

// validated checks c and returns it with Addrs unmapped, deduplicated and
// in order, and a Logger tagged component=anchor (discarding if nil). It
// does not touch the system.
func (c Config) validated() (Config, error) {
	if c.Link == "" || len(c.Link) > maxLinkName || strings.ContainsAny(c.Link, "/: \t\n\x00") || c.Link == "." || c.Link == ".." {
		return c, fmt.Errorf("anchor: Link %q: want 1 to %d bytes, no '/', ':' or spaces (IFNAMSIZ)", c.Link, maxLinkName)
	}
	if c.Kind == "" || strings.ContainsAny(c.Kind, " \t\n\x00/") {
		return c, fmt.Errorf("anchor: Kind %q: not a kernel link kind", c.Kind)
	}
	if len(c.Addrs) == 0 {
		return c, errors.New("anchor: Addrs must hold at least one address")
	}
	addrs := make([]netip.Addr, 0, len(c.Addrs))
	seen := make(map[netip.Addr]bool, len(c.Addrs))
	for _, a := range c.Addrs {
		if !a.IsValid() {
			return c, errors.New("anchor: Addrs: invalid (zero) address")
		}
		a = a.Unmap().WithZone("")
		if a.IsUnspecified() || a.IsMulticast() {
			return c, fmt.Errorf("anchor: Addrs: cannot hold %s: not a unicast address", a)
		}
		if !seen[a] {
			seen[a] = true
			addrs = append(addrs, a)
		}
	}
	c.Addrs = addrs
	if len(c.SourceToward) > 0 {
		toward := make(map[netip.Addr]netip.Addr, len(c.SourceToward))
		for held, to := range c.SourceToward {
			held, to = held.Unmap().WithZone(""), to.Unmap().WithZone("")
			if !seen[held] || !held.Is4() {
				return c, fmt.Errorf("anchor: SourceToward: %s is not one of Addrs' IPv4 addresses", held)
			}
			if !to.Is4() || to.IsUnspecified() || to.IsMulticast() {
				return c, fmt.Errorf("anchor: SourceToward[%s]: %s is not an IPv4 unicast address", held, to)
			}
			toward[held] = to
		}
		c.SourceToward = toward
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Logger = c.Logger.With("component", "anchor")
	return c, nil
}
