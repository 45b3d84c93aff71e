// Package clock provides a coarse wall clock for the hot path. Reading the
// system clock costs about 40 ns on this project's VMs (a third of a whole
// cache hit); a coarse clock costs one atomic load. DNS TTLs count whole
// seconds, so tens of milliseconds of resolution lose nothing.
package clock

import (
	"context"
	"sync/atomic"
	"time"
)

// Resolution is how often a Coarse clock ticks while it is read. Each
// tick wakes the process (some tens of microseconds of the runtime's and
// the kernel's time on a virtual machine); 50 ms ages a TTL at most
// that much early, nothing against TTLs of whole seconds.
const Resolution = 50 * time.Millisecond

// Coarse is a wall clock updated every Resolution by the goroutine Run
// while it is read. It errs late: Now returns the last tick plus
// Resolution, so while Run keeps up, ages measured with it are never
// shorter than the truth and a TTL aged by it never exceeds the original
// minus the real age. A tick the scheduler delays makes it early by the
// delay (milliseconds on a busy node; served TTLs round ages up to whole
// seconds).
//
// A tick that finds the clock unread since the one before stops the
// ticker: on an idle node, or one whose LocalDNS answers everything (the
// clock is read only to answer and to mirror), it costs no wake-up at all.
// The next Now reads the system clock itself and starts the ticker again.
type Coarse struct {
	now    atomic.Int64                // unix nanoseconds of the last tick
	read   atomic.Bool                 // Now was called since the last tick
	asleep atomic.Bool                 // Run's ticker is stopped until Now wakes it
	wake   chan struct{}               // Now's call to a sleeping Run; buffered
	ticks  atomic.Int64                // ticks so far (tests)
	ticker atomic.Pointer[time.Ticker] // Run's, for Advance; nil before Run
}

// NewCoarse returns a clock set to the current time. Call Run to keep it
// current.
func NewCoarse() *Coarse {
	c := &Coarse{wake: make(chan struct{}, 1)}
	c.now.Store(time.Now().UnixNano())
	return c
}

// Run ticks the clock until ctx is done.
func (c *Coarse) Run(ctx context.Context) {
	t := time.NewTicker(Resolution)
	defer t.Stop()
	c.ticker.Store(t)
	// Once Run has returned, the clock stands still.
	defer c.asleep.Store(false)
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			c.now.Store(now.UnixNano())
			c.ticks.Add(1)
		}
		if c.read.Swap(false) {
			continue
		}
		t.Stop()
		c.asleep.Store(true)
		// A Now between the Swap and the Store saw the clock awake (and
		// fresh: it just ticked); it must not be left to sleep.
		if !c.read.Load() || !c.asleep.CompareAndSwap(true, false) {
			select {
			case <-ctx.Done():
				return
			case <-c.wake:
			}
		}
		t.Reset(Resolution)
	}
}

// Advance moves the clock to now (unix ns), as a tick would, for a caller
// awake on a schedule of its own that read the system clock anyway (the
// mirror tap, at each read): Run's next tick is pushed a Resolution past
// it, so that while such a caller comes back within a Resolution, the
// clock costs no wake-up of its own.
func (c *Coarse) Advance(now int64) {
	if prev := c.now.Load(); now <= prev || !c.now.CompareAndSwap(prev, now) {
		return // later already (a tick, or another caller)
	}
	if t := c.ticker.Load(); t != nil && !c.asleep.Load() {
		t.Reset(Resolution)
	}
}

// Now returns the coarse time.
func (c *Coarse) Now() time.Time {
	if !c.read.Load() {
		c.read.Store(true)
	}
	if c.asleep.Load() {
		// Fresh before the ticker is told: a reader that sees it awake
		// sees this time or a later tick.
		c.now.Store(time.Now().UnixNano())
		if c.asleep.CompareAndSwap(true, false) {
			select {
			case c.wake <- struct{}{}:
			default:
			}
		}
	}
	return time.Unix(0, c.now.Load()+int64(Resolution))
}

// UntilNext returns how long until the wall clock next reaches a whole
// multiple of d, in (0, d]. Periodic work that waits with it instead of
// a ticker of its own wakes at the same instants as the rest: on a
// virtual machine each wake-up of an idle process costs the runtime and
// the kernel some hundreds of microseconds (threads woken, sysmon's
// polling restarted), so the heartbeat, the controller's tick and probe,
// the peer rescan and the reload check share theirs. A step of the wall
// clock misplaces one wait, no more.
func UntilNext(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	return d - time.Duration(time.Now().UnixNano()%int64(d))
}
