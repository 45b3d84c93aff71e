package testbed

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestPoll(t *testing.T) {
	exited := make(chan struct{})
	close(exited)
	tests := []struct {
		name    string
		timeout time.Duration
		done    <-chan struct{}
		okAt    int // the call cond first returns true on; 0: never
		wantErr string
	}{
		{"third call", time.Minute, nil, 3, ""},
		{"process exited", time.Minute, exited, 0, "the process exited (not yet)"},
		{"timeout", 20 * time.Millisecond, nil, 0, "not after 20ms: not yet"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls := 0
			err := Poll(context.Background(), "x", tt.timeout, tt.done, func() (bool, string) {
				calls++
				return calls == tt.okAt, "not yet"
			})
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("err %v, want %q", err, tt.wantErr)
			}
		})
	}
}
