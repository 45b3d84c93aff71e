// Package anchor keeps dnsstandby's listen addresses local to the node on a
// link of its own.
//
// LocalDNS holds 169.254.10.11 on its `localdns` link and deletes that link
// whenever it stops or cleans up, taking the address off the node: packets
// from pods to .11 are then dropped before any socket sees them. An address
// held on two links survives deleting one of them (the local route of the
// other stays), so the anchor holds the same addresses on a second link,
// named `dnsstandby` by default, and puts them back at once when anyone
// removes them. It watches with netlink subscriptions, never by polling, and
// never touches any other link. Its IPv4 local routes name the node's own
// address as source (source.go), so that the node's lookups survive a DNAT.
package anchor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// startWait bounds how long Start waits for the kernel to make the
// addresses usable (see errRoutePending); normally under a millisecond.
const startWait = 2 * time.Second

// Anchor holds the addresses on the anchor link until Close.
type Anchor struct {
	cfg Config // validated; cfg.Logger non-nil, tagged component=anchor
	// kind is the kind of the link held: cfg.Kind, or another of a link
	// dnsstandby made earlier (see ownerAlias). Used by reconcile (Start,
	// then the watch goroutine) and then by Close.
	kind string
	tune tuning          // knobs for tests
	ns   netns.NsHandle  // the namespace worked in; good until Close
	nl   *netlink.Handle // netlink requests in ns; used by Start, then only by watch, then by Close

	ctx    context.Context // good until Close (or the caller's ctx ends)
	cancel context.CancelFunc
	done   chan struct{} // closed when the watch goroutine has returned

	ready   atomic.Bool                               // link up with every address usable, as of the last check
	index   atomic.Int64                              // the link's ifindex, as of the last check
	present atomic.Int64                              // configured addresses usable, as of the last check
	sources atomic.Pointer[map[netip.Addr]netip.Addr] // the IPv4 local routes' sources (setSources), where not the address itself
	// sourceFailed: Start's setSources failed; the watch retries soon.
	sourceFailed bool

	readdLink    atomic.Uint64 // link re-created after start
	readdUp      atomic.Uint64 // link set up again after start
	readdAddress atomic.Uint64 // address re-added to a link that still existed
	resyncs      atomic.Uint64 // full resyncs after a subscription failed
	repairErrors atomic.Uint64 // reconcile passes that failed

	closeOnce sync.Once
	closeErr  error
}

// tuning holds what tests change; the zero value is production's.
type tuning struct {
	// rcvbuf is the subscription sockets' receive buffer; 0 means
	// defaultRcvbuf.
	rcvbuf int
	// gate, if set, is locked and unlocked by the watch goroutine before it
	// handles each event: a test holds it to stall the watch and overflow
	// the subscription sockets.
	gate *sync.Mutex
}

// Stats is a snapshot of the anchor's state and counters.
type Stats struct {
	Ready     bool // link up with every address usable
	LinkIndex int  // the link's ifindex, 0 if it never existed
	Addresses int  // configured addresses usable: on the link (IPv6: with their local route)
	// Sources are the sources the node's own packets to the IPv4
	// addresses take through the link's local routes, where
	// Config.SourceToward gave one (else the address itself).
	Sources map[netip.Addr]netip.Addr

	LinkReadds    uint64 // link re-created after someone deleted it
	UpReadds      uint64 // link set up again after someone set it down
	AddressReadds uint64 // addresses re-added after someone removed them
	Resyncs       uint64 // full resyncs after a netlink subscription failed (ENOBUFS)
	RepairErrors  uint64 // repair passes that failed (each is retried)
}

// Start creates the anchor link (or adopts an existing link of that name and
// kind), sets it up, adds the addresses, and watches them until Close or
// until ctx is done: a link or address that anyone removes is put back at
// once. It fails with ErrUnknownKind when the kernel lacks the link kind,
// and ErrWrongKind when a link of that name has another kind and was not
// made by dnsstandby (see ownerAlias). Close must be called even after ctx
// ends.
func Start(ctx context.Context, cfg Config) (*Anchor, error) {
	return start(ctx, cfg, tuning{})
}

func start(ctx context.Context, cfg Config, tune tuning) (*Anchor, error) {
	cfg, err := cfg.validated()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("start anchor: %w", err)
	}
	a := &Anchor{cfg: cfg, kind: cfg.Kind, tune: tune, done: make(chan struct{})}
	if a.ns, err = openNetns(cfg.Netns); err != nil {
		return nil, fmt.Errorf("start anchor: %w", err)
	}
	if a.nl, err = netlink.NewHandleAt(a.ns); err != nil {
		a.ns.Close()
		return nil, fmt.Errorf("start anchor: netlink socket: %w", err)
	}
	fail := func(err error) (*Anchor, error) {
		a.nl.Close()
		a.ns.Close()
		return nil, err
	}
	// Subscribe before the first reconcile, so that a removal between the
	// two is seen.
	sub, err := a.subscribe()
	if err != nil {
		return fail(fmt.Errorf("start anchor: %w", err))
	}
	rep, err := a.reconcile()
	// Return with the addresses usable, not merely listed: wait (briefly)
	// for the kernel to install IPv6 local routes.
	deadline := time.Now().Add(startWait)
	for wait := pendingMin; errors.Is(err, errRoutePending) && time.Now().Before(deadline); wait = min(2*wait, 50*time.Millisecond) {
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-time.After(wait):
			var more repair
			more, err = a.reconcile()
			rep.created = rep.created || more.created
		}
	}
	if errors.Is(err, errSource) {
		// Not a reason to fail: the addresses are usable, from themselves.
		cfg.Logger.Warn("anchor: cannot set the local routes' source; retrying", "link", cfg.Link, slog.Any("err", err))
		a.sourceFailed, err = true, nil
	}
	if errors.Is(err, errRoutePending) {
		// Not a reason to fail: the watch keeps checking, and Ready says
		// when they are usable.
		cfg.Logger.Warn("anchor: addresses not usable yet", "link", cfg.Link, "waited", startWait.String(), slog.Any("err", err))
		err = nil
	}
	if err != nil {
		sub.stop()
		return fail(err)
	}
	verb := "adopted existing link"
	if rep.created {
		verb = "created link"
	}
	cfg.Logger.Info("anchor: "+verb, "link", cfg.Link, "kind", a.kind, "index", a.index.Load(),
		"addrs", addrStrings(cfg.Addrs), "cleanup_on_exit", cfg.Cleanup)
	a.ctx, a.cancel = context.WithCancel(ctx)
	go a.watch(sub)
	return a, nil
}

// openNetns returns a handle on the namespace at path, or on the calling
// thread's namespace for "".
func openNetns(path string) (netns.NsHandle, error) {
	if path == "" {
		// Our own namespace: no handle. With one, the netlink library
		// would setns(2) into it for every socket, which needs
		// CAP_SYS_ADMIN and is refused under RestrictNamespaces=.
		return netns.None(), nil
	}
	h, err := netns.GetFromPath(path)
	if err != nil {
		return netns.None(), fmt.Errorf("open network namespace %s: %w", path, err)
	}
	return h, nil
}

// Ready reports whether the link is up with every address usable (on the
// link, and for IPv6 with its local route installed), as of the last event
// the anchor saw: a removal is usually repaired within a millisecond.
func (a *Anchor) Ready() bool { return a.ready.Load() }

// Link is the anchor link's name.
func (a *Anchor) Link() string { return a.cfg.Link }

// Stats returns the current state and counters.
func (a *Anchor) Stats() Stats {
	return Stats{
		Ready:         a.ready.Load(),
		LinkIndex:     int(a.index.Load()),
		Addresses:     int(a.present.Load()),
		Sources:       maps.Clone(a.currentSources()),
		LinkReadds:    a.readdLink.Load(),
		UpReadds:      a.readdUp.Load(),
		AddressReadds: a.readdAddress.Load(),
		Resyncs:       a.resyncs.Load(),
		RepairErrors:  a.repairErrors.Load(),
	}
}

// swapSources records the sources in use and returns those before.
func (a *Anchor) swapSources(src map[netip.Addr]netip.Addr) map[netip.Addr]netip.Addr {
	if was := a.sources.Swap(&src); was != nil {
		return *was
	}
	return nil
}

// currentSources are the sources in use (not to be changed).
func (a *Anchor) currentSources() map[netip.Addr]netip.Addr {
	if p := a.sources.Load(); p != nil {
		return *p
	}
	return nil
}

// Close stops the watch and, with Cleanup, deletes the link (only if it is
// still of the configured kind). Without Cleanup the link and its addresses
// stay for the next dnsstandby. Close is safe to call more than once.
func (a *Anchor) Close() error {
	a.closeOnce.Do(func() {
		a.cancel()
		<-a.done
		var errs []error
		if a.cfg.Cleanup {
			if err := a.remove(); err != nil {
				errs = append(errs, err)
			}
		}
		a.ready.Store(false)
		a.nl.Close()
		if a.ns.IsOpen() {
			if err := a.ns.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close network namespace handle: %w", err))
			}
		}
		a.closeErr = errors.Join(errs...)
	})
	return a.closeErr
}

// remove deletes the anchor link if it exists and is of our kind.
func (a *Anchor) remove() error {
	link, err := a.nl.LinkByName(a.cfg.Link)
	if errors.As(err, &netlink.LinkNotFoundError{}) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("anchor cleanup: find link %s: %w", a.cfg.Link, err)
	}
	if kind := link.Type(); kind != a.kind {
		return fmt.Errorf("anchor cleanup: link %s is a %q link now, not our %q: left alone", a.cfg.Link, kind, a.kind)
	}
	if err := a.nl.LinkDel(link); err != nil {
		return fmt.Errorf("anchor cleanup: delete link %s: %w", a.cfg.Link, err)
	}
	a.cfg.Logger.Info("anchor: deleted link", "link", a.cfg.Link)
	return nil
}

// addrStrings is addrs for a log line.
func addrStrings(addrs []netip.Addr) []string {
	out := make([]string, len(addrs))
	for i, a := range addrs {
		out[i] = a.String()
	}
	return out
}
