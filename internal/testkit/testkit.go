// Package testkit holds the test tools several packages share: a logger
// that writes to the test's own output, one polling helper for "becomes
// true within", the LocalDNS Corefile as AgentBaker renders it, the test
// binary run again as another user (RunAs), and a watch on a directory's
// file events (WatchDir). It is imported by tests only.
package testkit

import (
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

// Eventually polls cond until it returns true, and fails t if it has not
// within the given time. what names the condition in the failure.
// The poll interval grows from 1 ms to at most 50 ms, so short waits stay
// short and long ones do not spin.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for pause := time.Millisecond; ; pause = min(2*pause, 50*time.Millisecond) {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(pause)
	}
}
