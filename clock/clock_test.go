package clock

import (
	"context"
	"sync"
	"testing"
	"time"
)

func TestCoarseNeverEarly(t *testing.T) {
	c := NewCoarse()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { c.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()

	deadline := time.Now().Add(300 * time.Millisecond)
	late := 0
	for time.Now().Before(deadline) {
		before := time.Now()
		got := c.Now()
		if got.Before(before.Add(-time.Millisecond)) {
			// A tick can be delayed by the scheduler; tolerate rare ones.
			late++
		}
		if got.After(time.Now().Add(Resolution + time.Millisecond)) {
			t.Fatalf("coarse clock %s is more than one resolution ahead", got.Sub(time.Now()))
		}
		time.Sleep(time.Millisecond)
	}
	if late > 5 {
		t.Fatalf("coarse clock behind the real clock %d times", late)
	}
}

func TestCoarseStopsOnCancel(t *testing.T) {
	c := NewCoarse()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	cancel()
	select {
	case <-done:
	case <-time.After(time.Second):
		t.Fatal("Run did not return after cancel")
	}
	frozen := c.Now()
	time.Sleep(3 * Resolution)
	if !c.Now().Equal(frozen) {
		t.Fatal("clock still ticking after Run returned")
	}
}
