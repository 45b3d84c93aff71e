package anchor

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

const (
	// defaultRcvbuf is the subscription sockets' receive buffer. A node
	// that starts or stops many pods at once sends a burst of link and
	// address events (a veth with its addresses is a few KiB of messages)
	// that we filter for our one link; 1 MiB rides out a few hundred before
	// the kernel drops and we fall back to a full resync.
	defaultRcvbuf = 1 << 20
	// eventQueue is the capacity of the channels between the library's
	// reader goroutines and ours.
	eventQueue = 64
	// retryMin and retryMax bound the wait before a failed repair or
	// subscription is tried again. The first retry comes soon because the
	// usual failure is a race with the kernel still tearing the old link
	// down (ENODEV); the events that follow trigger a repair anyway.
	retryMin = 5 * time.Millisecond
	retryMax = 5 * time.Second
	// pendingMin is the first wait for the kernel to install an IPv6
	// local route (see errRoutePending): measured at under 0.5 ms here.
	pendingMin = time.Millisecond
	// pendingWarn is how long that may take before it is logged: only
	// rtnl contention (namespaces or links torn down elsewhere) makes it
	// that slow.
	pendingWarn = time.Second
)

// subscription is one pair of netlink subscriptions (links, addresses) in
// the anchor's namespace. The library runs a reader goroutine for each and
// one more that closes its socket when done closes; stop ends all of them.
type subscription struct {
	links   chan netlink.LinkUpdate
	addrs   chan netlink.AddrUpdate
	done    chan struct{}
	stopped atomic.Bool // set before done closes: errors after it are ours
}

func (a *Anchor) subscribe() (*subscription, error) {
	s := &subscription{
		links: make(chan netlink.LinkUpdate, eventQueue),
		addrs: make(chan netlink.AddrUpdate, eventQueue),
		done:  make(chan struct{}),
	}
	rcvbuf := a.tune.rcvbuf
	if rcvbuf == 0 {
		rcvbuf = defaultRcvbuf
	}
	onError := func(what string) func(error) {
		return func(err error) {
			if s.stopped.Load() {
				return // the socket was closed by stop
			}
			hint := ""
			if errors.Is(err, unix.ENOBUFS) || errorsContain(err, "no buffer space") {
				hint = " (events came faster than they were read and the kernel dropped some: resyncing in full)"
			}
			a.cfg.Logger.Warn("anchor: netlink subscription failed"+hint, "link", a.cfg.Link, "subscription", what, slog.Any("err", err))
		}
	}
	err := netlink.LinkSubscribeWithOptions(s.links, s.done, netlink.LinkSubscribeOptions{
		Namespace:              &a.ns,
		ErrorCallback:          onError("link"),
		ReceiveBufferSize:      rcvbuf,
		ReceiveBufferForceSize: true,
	})
	if err != nil {
		close(s.done)
		return nil, fmt.Errorf("subscribe to link events: %w", err)
	}
	err = netlink.AddrSubscribeWithOptions(s.addrs, s.done, netlink.AddrSubscribeOptions{
		Namespace:              &a.ns,
		ErrorCallback:          onError("address"),
		ReceiveBufferSize:      rcvbuf,
		ReceiveBufferForceSize: true,
	})
	if err != nil {
		s.stopped.Store(true)
		close(s.done)
		for range s.links {
		}
		return nil, fmt.Errorf("subscribe to address events: %w", err)
	}
	return s, nil
}

// stop closes both sockets and waits for the library's reader goroutines
// to finish, reading what they still hold so that none stays blocked on a
// send.
func (s *subscription) stop() {
	if s.stopped.Swap(true) {
		return
	}
	close(s.done)
	for range s.links {
	}
	for range s.addrs {
	}
}

// errorsContain is for the library's errors, which it formats with %v and
// so loses the errno.
func errorsContain(err error, text string) bool {
	return err != nil && strings.Contains(strings.ToLower(err.Error()), text)
}

// watch repairs the anchor whenever an event says it may be broken, until
// ctx ends. A subscription that fails (the kernel dropped events: ENOBUFS)
// is replaced and followed by a full repair pass, since any event may have
// been lost.
func (a *Anchor) watch(sub *subscription) {
	defer close(a.done)
	defer func() {
		if sub != nil {
			sub.stop()
		}
	}()
	r := retrier{timer: time.NewTimer(pendingMin), a: a}
	if a.ready.Load() && !a.sourceFailed {
		r.timer.Stop() // else Start left routes pending or the source unset: check soon
	}
	defer r.timer.Stop()
	var (
		dirty bool      // a repair pass is due
		since time.Time // when the first event of this batch arrived
	)
	mark := func() {
		if !dirty {
			dirty, since = true, time.Now()
		}
	}
	for {
		// A nil subscription (it failed and could not be renewed yet) is
		// only waited on through the retry timer.
		var links <-chan netlink.LinkUpdate
		var addrs <-chan netlink.AddrUpdate
		if sub != nil {
			links, addrs = sub.links, sub.addrs
		}
		select {
		case <-a.ctx.Done():
			return
		case u, ok := <-links:
			a.pause()
			if !ok {
				sub = a.resubscribe(sub)
				mark()
				break
			}
			if a.linkEvent(u) {
				mark()
			}
		case u, ok := <-addrs:
			a.pause()
			if !ok {
				sub = a.resubscribe(sub)
				mark()
				break
			}
			if a.addrEvent(u) {
				mark()
			}
		case <-r.timer.C:
			if sub == nil {
				sub = a.resubscribe(nil)
			}
			mark()
		}
		// Fold whatever else is queued into the same pass.
		if sub != nil {
			sub = a.drain(sub, mark)
		}
		if !dirty {
			continue
		}
		if sub == nil {
			r.failed(errors.New("no netlink subscription"))
			continue
		}
		dirty = false
		rep, err := a.reconcile()
		if rep.any() {
			a.count(rep)
			a.cfg.Logger.Warn("anchor: put back what was removed", "link", a.cfg.Link, "index", a.index.Load(),
				"link_recreated", rep.created, "set_up", rep.setUp, "addresses_readded", rep.added,
				// Includes waiting for the kernel to finish a deletion: the
				// first event comes as a link starts going away, and nobody
				// can create a link until it is gone (tens of ms for a
				// bridge).
				"since_event", time.Since(since).String())
		}
		switch {
		case err == nil:
			r.succeeded()
		case errors.Is(err, errRoutePending):
			r.pending(err)
		default:
			r.failed(err)
		}
	}
}

// retrier schedules the next repair pass after one that did not finish,
// and keeps the log to one line per distinct problem.
type retrier struct {
	a            *Anchor
	timer        *time.Timer
	failingSince time.Time // when passes started to fail, or zero
	lastErr      string    // the failure logged last, so a repeat logs at debug level

	pendingSince  time.Time // when routes started to be awaited, or zero
	pendingLogged bool
}

// retryWait is the wait before the next pass of a problem that has lasted
// for elapsed: as long again, within [floor, retryMax], so the checks
// thin out exponentially over time. It depends on time only, not on how
// many passes ran: a burst of events, each followed by a pass, must not
// push the next check seconds away (a route that came in between would
// then go unnoticed, the anchor reporting not ready, that long).
func retryWait(elapsed, floor time.Duration) time.Duration {
	return min(max(elapsed, floor), retryMax)
}

func (r *retrier) succeeded() {
	if r.lastErr != "" || r.pendingLogged {
		r.a.cfg.Logger.Info("anchor: whole again", "link", r.a.cfg.Link)
	}
	*r = retrier{a: r.a, timer: r.timer}
	r.timer.Stop()
}

func (r *retrier) failed(err error) {
	r.a.repairErrors.Add(1)
	if r.failingSince.IsZero() {
		r.failingSince = time.Now()
	}
	wait := retryWait(time.Since(r.failingSince), retryMin)
	level := slog.LevelWarn
	if err.Error() == r.lastErr {
		level = slog.LevelDebug // retried every retryMax while it lasts
	}
	r.lastErr = err.Error()
	r.a.cfg.Logger.Log(r.a.ctx, level, "anchor: repair failed; retrying", "link", r.a.cfg.Link, "retry_in", wait.String(), slog.Any("err", err))
	r.timer.Reset(wait)
}

// pending waits for the kernel to install local routes: nothing to repair,
// so it is not an error, only a check soon (the route is usually there
// within a millisecond).
func (r *retrier) pending(err error) {
	if r.pendingSince.IsZero() {
		r.pendingSince = time.Now()
	}
	if !r.pendingLogged && time.Since(r.pendingSince) > pendingWarn {
		r.pendingLogged = true
		r.a.cfg.Logger.Warn("anchor: addresses not usable yet", "link", r.a.cfg.Link, "waiting", time.Since(r.pendingSince).String(), slog.Any("err", err))
	}
	r.timer.Reset(retryWait(time.Since(r.pendingSince), pendingMin))
}

// drain handles the events already queued without blocking, and returns
// the subscription to use from now on.
func (a *Anchor) drain(sub *subscription, mark func()) *subscription {
	for {
		select {
		case u, ok := <-sub.links:
			if !ok {
				sub = a.resubscribe(sub)
				mark()
				if sub == nil {
					return nil
				}
				continue
			}
			if a.linkEvent(u) {
				mark()
			}
		case u, ok := <-sub.addrs:
			if !ok {
				sub = a.resubscribe(sub)
				mark()
				if sub == nil {
					return nil
				}
				continue
			}
			if a.addrEvent(u) {
				mark()
			}
		default:
			return sub
		}
	}
}

// resubscribe replaces a failed subscription (old may be nil); it returns
// nil if a new one cannot be had now, and the caller retries later.
func (a *Anchor) resubscribe(old *subscription) *subscription {
	if old != nil {
		old.stop()
		a.resyncs.Add(1)
		a.ready.Store(false) // unknown until the full pass that follows
	}
	sub, err := a.subscribe()
	if err != nil {
		a.repairErrors.Add(1)
		a.cfg.Logger.Error("anchor: cannot renew netlink subscriptions; retrying", "link", a.cfg.Link, slog.Any("err", err))
		return nil
	}
	return sub
}

func (a *Anchor) pause() {
	if g := a.tune.gate; g != nil {
		g.Lock()
		g.Unlock() // an empty critical section: this only waits for the test
	}
}

// linkEvent reports whether u may mean our link is broken: it is ours (by
// index) and was deleted, set down or renamed, or it is a link of our name
// that we do not know (ours re-created by someone, or a stranger).
func (a *Anchor) linkEvent(u netlink.LinkUpdate) bool {
	attrs := u.Attrs()
	ours := int64(attrs.Index) == a.index.Load()
	if !ours && attrs.Name != a.cfg.Link {
		return false
	}
	if ours && u.Header.Type == unix.RTM_DELLINK {
		a.ready.Store(false)
		return true
	}
	if ours && (u.IfInfomsg.Flags&unix.IFF_UP == 0 || attrs.Name != a.cfg.Link) {
		// Maybe stale (a new link is registered down, then set up): the
		// repair pass looks at the link as it is now.
		return true
	}
	return !ours
}

// addrEvent reports whether u removed one of our addresses from our link,
// or may change the local routes' source (setSources): the source removed
// (the kernel deletes the routes that name it), or, with SourceToward, an
// IPv4 address added elsewhere (the node's address toward it may change).
func (a *Anchor) addrEvent(u netlink.AddrUpdate) bool {
	ip, ok := netip.AddrFromSlice(u.LinkAddress.IP)
	if !ok {
		return false
	}
	ip = ip.Unmap()
	if int64(u.LinkIndex) != a.index.Load() {
		if len(a.cfg.SourceToward) == 0 || !ip.Is4() {
			return false
		}
		if u.NewAddr {
			return true
		}
		for _, src := range a.currentSources() {
			if src == ip {
				return true
			}
		}
		return false
	}
	if u.NewAddr {
		return false
	}
	for _, want := range a.cfg.Addrs {
		if want == ip {
			a.ready.Store(false)
			return true
		}
	}
	return false
}

func (a *Anchor) count(rep repair) {
	if rep.created {
		a.readdLink.Add(1)
	}
	if rep.setUp {
		a.readdUp.Add(1)
	}
	a.readdAddress.Add(uint64(rep.added))
}
