package nstest

import (
	"errors"
	"time"
)

// errPollTimeout is what poll returns when its condition did not hold in
// time; callers replace it with what they waited for.
var errPollTimeout = errors.New("timed out")

// poll calls cond until it reports done or fails, or timeout passes
// (errPollTimeout). The pause between calls grows from 1 ms to at most
// 50 ms, as testkit.Eventually's does; this is that loop for code that
// returns errors, since the lab runs nstest outside go test. Every wait
// in this package goes through it.
func poll(timeout time.Duration, cond func() (done bool, err error)) error {
	deadline := time.Now().Add(timeout)
	for pause := time.Millisecond; ; pause = min(2*pause, 50*time.Millisecond) {
		done, err := cond()
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return errPollTimeout
		}
		time.Sleep(pause)
	}
}
