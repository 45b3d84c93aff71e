package clock

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// running returns a clock whose Run goes until the test ends. In a
// synctest bubble, the cleanup runs inside it.
func running(t *testing.T) *Coarse {
	c := NewCoarse()
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { c.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return c
}

// TestCoarse runs the clock in a synctest bubble, where ticks come exactly
// on time, and reads it at offsets across many ticks: it must never be
// early (behind the true time) and never more than one Resolution late.
// On a real machine a tick the scheduler delays makes it early by the
// delay; the bubble takes the scheduler out of the test.
func TestCoarse(t *testing.T) {
	tests := []struct {
		name string
		step time.Duration // between readings
	}{
		{"every millisecond", time.Millisecond},
		{"every 3ms", 3 * time.Millisecond},
		{"on the tick", Resolution},
		{"every 7ms", 7 * time.Millisecond},
		{"every 95ms: the ticker sleeps between", 95 * time.Millisecond},
		{"every 2s", 2 * time.Second},
	}
	for _, tt := range tests {
		synctest.Test(t, func(t *testing.T) {
			c := running(t)
			for range 100 {
				time.Sleep(tt.step)
				now, got := time.Now(), c.Now()
				if got.Before(now) {
					t.Fatalf("%s: coarse clock %s early", tt.name, now.Sub(got))
				}
				if got.After(now.Add(Resolution)) {
					t.Fatalf("%s: coarse clock %s late, more than one resolution", tt.name, got.Sub(now))
				}
			}
		})
	}
}

// TestCoarseStopsOnCancel: Run returns when its context ends, and the
// clock stands still from then on.
func TestCoarseStopsOnCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := NewCoarse()
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { c.Run(ctx); close(done) }()
		time.Sleep(5 * Resolution)
		cancel()
		select {
		case <-done:
		case <-time.After(time.Second):
			t.Fatal("Run did not return after cancel")
		}
		frozen := c.Now()
		time.Sleep(3 * Resolution) // fake time: three ticks that must not come
		if !c.Now().Equal(frozen) {
			t.Fatal("clock still ticking after Run returned")
		}
	})
}

// TestCoarseSleepsUnread: unread, the clock stops ticking after one idle
// tick, whatever time passes; a read wakes it, and it ticks on while read.
func TestCoarseSleepsUnread(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := running(t)
		time.Sleep(10 * time.Second)
		if n := c.ticks.Load(); n != 1 {
			t.Errorf("unread for 10s: %d ticks, want 1", n)
		}
		// Read every 3 ms for 10 resolutions: about 10 ticks more.
		for range 10 * Resolution / (3 * time.Millisecond) {
			c.Now()
			time.Sleep(3 * time.Millisecond)
		}
		if n := c.ticks.Load(); n < 9 || n > 12 {
			t.Errorf("read for 10 resolutions: %d ticks in all, want 9 to 12", n)
		}
	})
}

// TestCoarseAdvance: a caller that advances the clock more often than a
// Resolution keeps Run from ticking at all, and the clock still reads
// within a Resolution of the truth, never early.
func TestCoarseAdvance(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := running(t)
		time.Sleep(time.Millisecond) // Run has started
		step := Resolution * 4 / 5
		for range 50 {
			time.Sleep(step)
			c.Advance(time.Now().UnixNano())
			now, got := time.Now(), c.Now()
			if got.Before(now) || got.After(now.Add(Resolution)) {
				t.Fatalf("coarse clock %s off the truth", got.Sub(now))
			}
		}
		if n := c.ticks.Load(); n != 0 {
			t.Errorf("%d ticks while advanced every %s", n, step)
		}
	})
}

// TestUntilNext: waits end at whole multiples of the period on the wall
// clock (the bubble's starts at midnight), so periodic work of periods
// that divide one another wakes together.
func TestUntilNext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		steps := []struct {
			sleep time.Duration // before asking
			d     time.Duration
			want  time.Duration
		}{
			{0, time.Second, time.Second},
			{0, 250 * time.Millisecond, 250 * time.Millisecond},
			{300 * time.Millisecond, time.Second, 700 * time.Millisecond},
			{0, 250 * time.Millisecond, 200 * time.Millisecond},
			{0, 200 * time.Millisecond, 100 * time.Millisecond},
			{700 * time.Millisecond, time.Second, time.Second},
			{1, time.Second, time.Second - 1},
			{0, 0, 0},
		}
		for _, st := range steps {
			time.Sleep(st.sleep)
			if got := UntilNext(st.d); got != st.want {
				t.Errorf("%v after midnight: UntilNext(%v) = %v, want %v", time.Now().Sub(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)), st.d, got, st.want)
			}
		}
	})
}
