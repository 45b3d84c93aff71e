package testbed

import (
	"context"
	"fmt"
	"time"
)

// Poll calls cond every interval until it returns true, ctx ends, done
// closes (the process waited for exited), or timeout passes. cond's last
// reason for false is in the error.
func Poll(ctx context.Context, what string, timeout, interval time.Duration, done <-chan struct{},
	cond func() (ok bool, why string)) error {
	deadline := time.Now().Add(timeout)
	why := "not checked"
	for {
		var ok bool
		if ok, why = cond(); ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not after %v: %s", what, timeout, why)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-done:
			return fmt.Errorf("%s: the process exited (%s)", what, why)
		case <-time.After(interval):
		}
	}
}
