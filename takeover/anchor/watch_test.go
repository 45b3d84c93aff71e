package anchor

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

func TestRetryWait(t *testing.T) {
	for _, c := range []struct {
		elapsed, floor, want time.Duration
	}{
		{0, pendingMin, pendingMin},
		{300 * time.Microsecond, pendingMin, pendingMin},
		{40 * time.Millisecond, pendingMin, 40 * time.Millisecond},
		{0, retryMin, retryMin},
		{2 * time.Second, retryMin, 2 * time.Second},
		{time.Minute, retryMin, retryMax},
	} {
		if got := retryWait(c.elapsed, c.floor); got != c.want {
			t.Errorf("retryWait(%v, %v) = %v, want %v", c.elapsed, c.floor, got, c.want)
		}
	}
}

// TestRetrierBurst: many passes in a row, each still waiting for a route
// or failing (a burst of events, each followed by a pass), leave the next
// check as close as the problem is young, not pushed out by the number of
// passes. (A check pushed 5 s away left the anchor reporting not ready
// for seconds after the route had come.)
func TestRetrierBurst(t *testing.T) {
	for _, c := range []struct {
		name string
		pass func(*retrier)
	}{
		{"route pending", func(r *retrier) { r.pending(errRoutePending) }},
		{"repair failed", func(r *retrier) { r.failed(errors.New("link gone")) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := &Anchor{ctx: context.Background(), cfg: Config{Logger: testkit.Logger(t)}}
			r := retrier{a: a, timer: time.NewTimer(time.Hour)}
			defer r.timer.Stop()
			for range 40 {
				c.pass(&r)
			}
			select {
			case <-r.timer.C:
			case <-time.After(time.Second):
				t.Fatal("no check within 1s of 40 passes in a row")
			}
		})
	}
}
