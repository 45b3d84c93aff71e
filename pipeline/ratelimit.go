package pipeline

import (
	"sync"
	"time"
)

// tokenBucket bounds a rate: refill per second, up to burst saved.
type tokenBucket struct {
	rate, burst float64

	mu     sync.Mutex // guards following
	tokens float64
	last   time.Time
}

func newTokenBucket(rate, burst float64) *tokenBucket {
	return &tokenBucket{rate: rate, burst: burst, tokens: burst}
}

// allow takes a token if one is there.
func (b *tokenBucket) allow() bool {
	if b.rate <= 0 {
		return false
	}
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.last.IsZero() {
		b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	}
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
