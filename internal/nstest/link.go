package nstest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// DefaultLinkKind is the kind AddLink creates when asked for none. Production
// nodes hold LocalDNS's addresses on a `dummy` link, but this project's
// machines lack the dummy driver; an empty bridge holds local addresses just
// as well.
const DefaultLinkKind = "bridge"

// maxLinkName is IFNAMSIZ less the terminating NUL.
const maxLinkName = 15

// linkUpTimeout bounds the wait for a veth's carrier. The kernel attaches a
// link's queueing discipline from its link-watch work after carrier comes
// up; packets sent before that are dropped, so a route over a fresh veth is
// not usable until its operational state says UP.
const linkUpTimeout = 5 * time.Second

// AddLink creates a link of the given kind (DefaultLinkKind if empty) named
// name, adds addrs (CIDR, e.g. "169.254.10.11/32") and sets it up. Use it
// for address anchors: an address on any up link of a namespace is local to
// the whole namespace.
func (n *Namespace) AddLink(name, kind string, addrs ...string) error {
	if kind == "" {
		kind = DefaultLinkKind
	}
	if err := n.usable(); err != nil {
		return err
	}
	if err := checkLinkName(name); err != nil {
		return err
	}
	attrs := netlink.LinkAttrs{Name: name}
	var link netlink.Link
	switch kind {
	case "bridge":
		link = &netlink.Bridge{LinkAttrs: attrs}
	case "dummy":
		link = &netlink.Dummy{LinkAttrs: attrs}
	default: // the kernel knows the kind by name; it needs no attributes
		link = &netlink.GenericLink{LinkAttrs: attrs, LinkType: kind}
	}
	if err := n.nl.LinkAdd(link); err != nil {
		return fmt.Errorf("%s: add %s link %s: %w%s", n.name, kind, name, err, kindHint(err, kind))
	}
	if err := n.AddAddr(name, addrs...); err != nil {
		return err
	}
	return n.setUp(name)
}

func kindHint(err error, kind string) string {
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENODEV) {
		return fmt.Sprintf(" (this kernel has no %q link driver; try kind %q)", kind, DefaultLinkKind)
	}
	return ""
}

// DelLink deletes the link named name, and with it its addresses and routes.
func (n *Namespace) DelLink(name string) error {
	link, err := n.link(name)
	if err != nil {
		return err
	}
	if err := n.nl.LinkDel(link); err != nil {
		return fmt.Errorf("%s: delete link %s: %w", n.name, name, err)
	}
	return nil
}

// AddAddr adds addresses (CIDR) to the link named name. IPv6 addresses skip
// duplicate address detection, which would otherwise leave them tentative
// (unbindable) for a second, or for good on a link without carrier.
func (n *Namespace) AddAddr(name string, addrs ...string) error {
	return n.eachAddr(name, addrs, "add", n.nl.AddrAdd)
}

// DelAddr removes addresses (CIDR) from the link named name.
func (n *Namespace) DelAddr(name string, addrs ...string) error {
	return n.eachAddr(name, addrs, "delete", n.nl.AddrDel)
}

func (n *Namespace) eachAddr(name string, addrs []string, verb string, op func(netlink.Link, *netlink.Addr) error) error {
	if len(addrs) == 0 {
		return nil
	}
	link, err := n.link(name)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		addr, err := parseAddr(a)
		if err != nil {
			return fmt.Errorf("%s: %s address on %s: %w", n.name, verb, name, err)
		}
		if err := op(link, addr); err != nil {
			return fmt.Errorf("%s: %s address %s on %s: %w", n.name, verb, a, name, err)
		}
	}
	return nil
}

func parseAddr(cidr string) (*netlink.Addr, error) {
	addr, err := netlink.ParseAddr(cidr)
	if err != nil {
		return nil, err
	}
	if addr.IP.To4() == nil {
		addr.Flags |= unix.IFA_F_NODAD
		return addr, nil
	}
	if ones, _ := addr.Mask.Size(); ones >= 31 {
		addr.Broadcast = net.IPv4zero // none, as `ip addr add` leaves it
	}
	return addr, nil
}

// End is one end of a veth pair.
type End struct {
	NS    *Namespace // always non-nil
	Name  string     // link name inside NS, at most 15 bytes
	Addrs []string   // CIDR addresses, or none
}

// AddVeth joins two namespaces by a veth pair, adds the addresses, sets both
// ends up and waits until they carry traffic. The pair is created with each
// end directly in its namespace, so no link ever appears in the caller's
// namespace; it goes away with either namespace.
func AddVeth(a, b End) error {
	for _, e := range []End{a, b} {
		if e.NS == nil {
			return fmt.Errorf("add veth %s-%s: nil namespace", a.Name, b.Name)
		}
		if err := e.NS.usable(); err != nil {
			return err
		}
		if err := checkLinkName(e.Name); err != nil {
			return err
		}
	}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: a.Name},
		PeerName:      b.Name,
		PeerNamespace: netlink.NsFd(b.NS.fd),
	}
	if err := a.NS.nl.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s/%s - %s/%s: %w", a.NS.name, a.Name, b.NS.name, b.Name, err)
	}
	for _, e := range []End{a, b} {
		if err := e.NS.AddAddr(e.Name, e.Addrs...); err != nil {
			return err
		}
		if err := e.NS.setUp(e.Name); err != nil {
			return err
		}
	}
	for _, e := range []End{a, b} {
		if err := e.NS.waitOperUp(e.Name, linkUpTimeout); err != nil {
			return err
		}
	}
	return nil
}

// Route is a route to add in a namespace.
type Route struct {
	Dst string // CIDR, or "default"
	Via string // gateway address, or "" for a route straight out of Dev
	Dev string // outgoing link name; may be "" when Via is given
	Src string // preferred source address, or ""
}

// AddRoute adds a route to the namespace's main table.
func (n *Namespace) AddRoute(r Route) error {
	if err := n.usable(); err != nil {
		return err
	}
	route, err := n.route(r)
	if err != nil {
		return err
	}
	if err := n.nl.RouteAdd(route); err != nil {
		return fmt.Errorf("%s: add route %+v: %w", n.name, r, err)
	}
	return nil
}

func (n *Namespace) route(r Route) (*netlink.Route, error) {
	route := &netlink.Route{}
	if r.Dst != "default" {
		_, dst, err := net.ParseCIDR(r.Dst)
		if err != nil {
			return nil, fmt.Errorf("%s: route %+v: %w", n.name, r, err)
		}
		route.Dst = dst
	}
	if r.Via != "" {
		if route.Gw = net.ParseIP(r.Via); route.Gw == nil {
			return nil, fmt.Errorf("%s: route %+v: bad gateway %q", n.name, r, r.Via)
		}
	}
	if r.Src != "" {
		if route.Src = net.ParseIP(r.Src); route.Src == nil {
			return nil, fmt.Errorf("%s: route %+v: bad source %q", n.name, r, r.Src)
		}
	}
	if r.Dev != "" {
		link, err := n.link(r.Dev)
		if err != nil {
			return nil, err
		}
		route.LinkIndex = link.Attrs().Index
		if r.Via == "" {
			route.Scope = netlink.SCOPE_LINK
		}
	} else if r.Via == "" {
		return nil, fmt.Errorf("%s: route %+v: needs Via or Dev", n.name, r)
	}
	return route, nil
}

// Links lists the names of the links in the namespace.
func (n *Namespace) Links() ([]string, error) {
	if err := n.usable(); err != nil {
		return nil, err
	}
	links, err := n.nl.LinkList()
	if err != nil {
		return nil, fmt.Errorf("%s: list links: %w", n.name, err)
	}
	names := make([]string, len(links))
	for i, l := range links {
		names[i] = l.Attrs().Name
	}
	return names, nil
}

func (n *Namespace) link(name string) (netlink.Link, error) {
	if err := n.usable(); err != nil {
		return nil, err
	}
	link, err := n.nl.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("%s: link %s: %w", n.name, name, err)
	}
	return link, nil
}

func (n *Namespace) setUp(name string) error {
	link, err := n.link(name)
	if err != nil {
		return err
	}
	if err := n.nl.LinkSetUp(link); err != nil {
		return fmt.Errorf("%s: set %s up: %w", n.name, name, err)
	}
	return nil
}

func (n *Namespace) waitOperUp(name string, timeout time.Duration) error {
	var state netlink.LinkOperState
	err := testkit.Poll(context.Background(), timeout, func() (bool, error) {
		link, err := n.link(name)
		if err != nil {
			return false, err
		}
		state = link.Attrs().OperState
		return state == netlink.OperUp, nil
	})
	if errors.Is(err, testkit.ErrNotWithin) {
		return fmt.Errorf("%s: link %s not up after %v (state %s)", n.name, name, timeout, state)
	}
	return err
}

func checkLinkName(name string) error {
	if name == "" || len(name) > maxLinkName {
		return fmt.Errorf("link name %q: want 1 to %d bytes (IFNAMSIZ)", name, maxLinkName)
	}
	return nil
}
