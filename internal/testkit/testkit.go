// Package testkit holds the test tools several packages share: a logger
// that writes to the test's own output, the one polling loop (Poll,
// PollEvery, and Eventually for "becomes true within"), the LocalDNS
// Corefile as AgentBaker renders it, the test binary run again as another
// user (RunAs), and a watch on a directory's file events (WatchDir). It is
// imported by tests and test tools only.
package testkit

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"
)

// Logger returns a text logger at debug level writing to t's output, so
// that a failing test shows what the code under test logged, and a
// passing one (without -v) shows nothing.
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// ErrNotWithin is what Poll returns when its condition did not hold in
// time; callers say what they waited for.
var ErrNotWithin = errors.New("not within the time allowed")

// Poll is the one polling loop of the project's tests and test tools: it
// calls cond until cond reports done (nil) or fails (its error), ctx ends
// (ctx's error), or within passes (ErrNotWithin). The pause between calls
// grows from 1 ms to at most 50 ms, so short waits stay short and long
// ones do not spin. It returns errors rather than failing a test, for the
// tools that run outside go test too (internal/nstest, the lab's testbed).
func Poll(ctx context.Context, within time.Duration, cond func() (done bool, err error)) error {
	return poll(ctx, within, time.Millisecond, 50*time.Millisecond, cond)
}

// PollEvery is Poll with a steady pause of every between calls, for a
// test whose wait is its measurement (how long until something happens),
// which a growing pause would blur.
func PollEvery(ctx context.Context, within, every time.Duration, cond func() (done bool, err error)) error {
	return poll(ctx, within, every, every, cond)
}

func poll(ctx context.Context, within, first, most time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(within)
	for pause := first; ; pause = min(2*pause, most) {
		done, err := cond()
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return ErrNotWithin
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pause):
		}
	}
}

// Eventually polls cond (as Poll does) until it returns true, and fails t
// if it has not within the given time. what names the condition in the
// failure.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	if err := Poll(context.Background(), within, func() (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("%s: not within %s (%v)", what, within, err)
	}
}
