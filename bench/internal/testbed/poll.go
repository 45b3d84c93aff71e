package testbed

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// Poll waits, through testkit.Poll (the project's one polling loop), for
// cond to return true, with what the programs here wait on besides: done
// closing (the process waited for exited) ends the wait, and cond's last
// reason for false is in the error.
func Poll(ctx context.Context, what string, timeout time.Duration, done <-chan struct{},
	cond func() (ok bool, why string)) error {
	why := "not checked"
	err := testkit.Poll(ctx, timeout, func() (bool, error) {
		var ok bool
		if ok, why = cond(); ok {
			return true, nil
		}
		select {
		case <-done:
			return false, fmt.Errorf("%s: the process exited (%s)", what, why)
		default:
			return false, nil
		}
	})
	if errors.Is(err, testkit.ErrNotWithin) {
		return fmt.Errorf("%s: not after %v: %s", what, timeout, why)
	}
	return err
}
