package anchor

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

var (
	// ErrUnknownKind means the kernel has no driver for the configured link
	// kind (no `dummy` module, for instance).
	ErrUnknownKind = errors.New("kernel does not know this link kind")
	// ErrWrongKind means a link of the anchor's name exists with another
	// kind, without the alias of a link dnsstandby made: it is not ours,
	// and the anchor leaves it alone.
	ErrWrongKind = errors.New("a link of that name exists with another kind")
)

// repair is what one reconcile pass had to do.
type repair struct {
	created bool // the link was missing and was created
	setUp   bool // the link existed but was down
	added   int  // addresses added to a link that already existed
}

func (r repair) any() bool { return r.created || r.setUp || r.added > 0 }

// reconcile makes the system match the config: the link exists with the
// configured kind (or, if dnsstandby made it, another: see ownerAlias), is
// up, and holds every address. It touches no other
// link, and changes nothing that is already right. Run only by Start and
// then by the watch goroutine (it uses the handle without a lock); it
// records the link's index and readiness.
func (a *Anchor) reconcile() (repair, error) {
	var rep repair
	link, err := a.nl.LinkByName(a.cfg.Link)
	if errors.As(err, &netlink.LinkNotFoundError{}) {
		link, err = a.create()
		if errors.Is(err, unix.EEXIST) {
			// Someone made a link of this name between the lookup and the
			// create: look again, and check its kind below.
			link, err = a.nl.LinkByName(a.cfg.Link)
		} else if err == nil {
			rep.created = true
		}
	}
	if err != nil {
		a.setNotReady()
		if errors.Is(err, ErrUnknownKind) {
			return rep, err
		}
		return rep, fmt.Errorf("anchor link %s: %w", a.cfg.Link, err)
	}
	if kind := link.Type(); kind != a.kind {
		if link.Attrs().Alias != ownerAlias {
			a.setNotReady()
			return rep, fmt.Errorf("anchor link %s: %w: it is a %q link, not %q; it is not dnsstandby's and is left alone: remove it (`ip link del %s`) or choose another Link",
				a.cfg.Link, ErrWrongKind, kind, a.kind, a.cfg.Link)
		}
		// An earlier dnsstandby made it, of the kind it fell back to on
		// this kernel (bridge where dummy is missing): keep it, and that
		// kind, which the kernel is known to have, for re-creating it.
		a.cfg.Logger.Info("anchor: the link is dnsstandby's, of another kind than configured: keeping it", "link", a.cfg.Link,
			"kind", kind, "configured_kind", a.cfg.Kind)
		a.kind = kind
	}
	attrs := link.Attrs()
	a.index.Store(int64(attrs.Index))
	if attrs.Flags&net.FlagUp == 0 {
		if err := a.nl.LinkSetUp(link); err != nil {
			a.setNotReady()
			return rep, fmt.Errorf("anchor link %s: set up: %w", a.cfg.Link, err)
		}
		rep.setUp = !rep.created
	}
	if attrs.Alias == "" {
		// Mark it dnsstandby's (see ownerAlias), whoever made it: it is
		// held as ours from now on. An alias that someone else gave it is
		// left alone.
		if err := a.nl.LinkSetAlias(link, ownerAlias); err != nil {
			a.setNotReady()
			return rep, fmt.Errorf("anchor link %s: set alias: %w", a.cfg.Link, err)
		}
	}
	// A link that went down and up again lost its IPv6 addresses (unless
	// keep_addr_on_down), so list after setting it up.
	have, err := a.nl.AddrList(link, netlink.FAMILY_ALL)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		// (An interrupted dump may miss an address; adding it again below
		// then meets EEXIST, which is fine.)
		a.ready.Store(false)
		return rep, fmt.Errorf("anchor link %s: list addresses: %w", a.cfg.Link, err)
	}
	present := make(map[netip.Addr]bool, len(have))
	for _, h := range have {
		if ip, ok := netip.AddrFromSlice(h.IP); ok {
			present[ip.Unmap()] = true
		}
	}
	var addErrs []error
	for _, want := range a.cfg.Addrs {
		if present[want] {
			continue
		}
		err := a.nl.AddrAdd(link, hostAddr(want))
		switch {
		case err == nil:
			if !rep.created {
				rep.added++
			}
		case errors.Is(err, unix.EEXIST):
		default:
			addErrs = append(addErrs, fmt.Errorf("add %s: %w", want, err))
		}
	}
	if len(addErrs) > 0 {
		a.ready.Store(false)
		a.present.Store(int64(len(a.cfg.Addrs) - len(addErrs)))
		return rep, fmt.Errorf("anchor link %s: %w", a.cfg.Link, errors.Join(addErrs...))
	}
	pending, err := a.routesPending(attrs.Index)
	if err != nil {
		a.ready.Store(false)
		return rep, fmt.Errorf("anchor link %s: list local routes: %w", a.cfg.Link, err)
	}
	a.present.Store(int64(len(a.cfg.Addrs) - len(pending)))
	if len(pending) > 0 {
		a.ready.Store(false)
		return rep, fmt.Errorf("anchor link %s: %w: %v", a.cfg.Link, errRoutePending, pending)
	}
	a.ready.Store(true)
	if err := a.setSources(attrs.Index); err != nil {
		return rep, fmt.Errorf("%w: %w", errSource, err)
	}
	return rep, nil
}

// errSource means the addresses are usable but their local routes do not
// name the source wanted (setSources): retried, never a reason to fail.
var errSource = errors.New("local route source not set")

// errRoutePending means an IPv6 address is on the link but its local route
// is not in yet: the kernel installs it from a work queue after the address
// is added (and the work waits for the rtnl lock), so for a moment — longer
// while other namespaces or links are being torn down — the address is
// listed but packets to it find no route. IPv4 installs the route in the
// request itself.
var errRoutePending = errors.New("local route not installed yet")

// routesPending returns the IPv6 addresses without a local route through
// the link.
func (a *Anchor) routesPending(index int) ([]netip.Addr, error) {
	var want []netip.Addr
	for _, addr := range a.cfg.Addrs {
		if addr.Is6() {
			want = append(want, addr)
		}
	}
	if len(want) == 0 {
		return nil, nil
	}
	have := make(map[netip.Addr]bool, len(want))
	err := a.nl.RouteListFilteredIter(netlink.FAMILY_V6, &netlink.Route{Table: unix.RT_TABLE_LOCAL, LinkIndex: index},
		netlink.RT_FILTER_TABLE|netlink.RT_FILTER_OIF, func(r netlink.Route) bool {
			if r.Type == unix.RTN_LOCAL && r.Dst != nil {
				if ip, ok := netip.AddrFromSlice(r.Dst.IP); ok {
					have[ip] = true
				}
			}
			return true
		})
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, err
	}
	var pending []netip.Addr
	for _, addr := range want {
		if !have[addr] {
			pending = append(pending, addr)
		}
	}
	return pending, nil
}

// ownerAlias is the alias (IFLA_IFALIAS, shown by `ip link show`) that
// reconcile gives the link it holds, unless someone else named it. It
// tells a link dnsstandby made from one someone else made of the same
// name: a link of the configured kind is adopted whoever made it, but one
// of another kind only if it has this alias — the bridge an earlier
// dnsstandby fell back to where the kernel lacks dummy, found by a start
// that asks for dummy again.
const ownerAlias = "dnsstandby anchor"

// create adds the link, already up. (The kernel ignores an alias given
// here; reconcile sets it next.)
func (a *Anchor) create() (netlink.Link, error) {
	link := &netlink.GenericLink{
		LinkAttrs: netlink.LinkAttrs{Name: a.cfg.Link, Flags: net.FlagUp},
		LinkType:  a.kind,
	}
	if err := a.nl.LinkAdd(link); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			return nil, fmt.Errorf("create anchor link %s: %w: %q (%v); load its module (`modprobe %s`) or use a Kind this kernel has, e.g. bridge",
				a.cfg.Link, ErrUnknownKind, a.kind, err, a.kind)
		}
		return nil, fmt.Errorf("create %s link: %w", a.kind, err)
	}
	// LinkAdd looked the new link up to learn its index; use that rather
	// than a second lookup.
	return link, nil
}

// hostAddr is addr as a host address on the anchor: /32, or /128 without
// duplicate address detection (which would leave it tentative, unusable,
// for a second, and for good on a link without carrier) and without a
// prefix route.
func hostAddr(addr netip.Addr) *netlink.Addr {
	bits := addr.BitLen()
	a := &netlink.Addr{IPNet: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(bits, bits)}}
	if addr.Is6() {
		a.Flags = unix.IFA_F_NODAD | unix.IFA_F_NOPREFIXROUTE
	}
	return a
}

// setNotReady records a link that is missing, not ours or unusable: none
// of the addresses is held.
func (a *Anchor) setNotReady() {
	a.ready.Store(false)
	a.present.Store(0)
}
