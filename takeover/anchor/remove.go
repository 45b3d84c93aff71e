package anchor

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
)

// ErrNotOurs is returned by Remove for a link that does not carry the
// alias dnsstandby marks its anchor with (see ownerAlias).
var ErrNotOurs = errors.New("not marked as dnsstandby's anchor")

// Remove deletes the link name in the network namespace at netnsPath (""
// : the caller's) if dnsstandby made it: it carries ownerAlias. It
// reports whether there was a link to delete. A link of that name that is
// not marked is left alone (ErrNotOurs). It is for `dnsstandby cleanup`,
// after a dnsstandby that kept its anchor (the default) has stopped for
// good; a running one would re-create it at once.
func Remove(name, netnsPath string) (bool, error) {
	ns, err := openNetns(netnsPath)
	if err != nil {
		return false, err
	}
	defer ns.Close()
	nl, err := netlink.NewHandleAt(ns)
	if err != nil {
		return false, fmt.Errorf("netlink socket: %w", err)
	}
	defer nl.Close()
	link, err := nl.LinkByName(name)
	if errors.As(err, &netlink.LinkNotFoundError{}) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("find link %s: %w", name, err)
	}
	if alias := link.Attrs().Alias; alias != ownerAlias {
		return false, fmt.Errorf("link %s (alias %q): %w; left alone", name, alias, ErrNotOurs)
	}
	if err := nl.LinkDel(link); err != nil {
		return false, fmt.Errorf("delete link %s: %w", name, err)
	}
	return true, nil
}
