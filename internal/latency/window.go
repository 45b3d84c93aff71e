// Package latency keeps a sliding window of latencies in fixed,
// log-spaced buckets and reads quantiles from it: the hedger's deadlines
// (LocalDNS's p99) and the upstream group's speculative deadlines (each
// server's p99) both come from one. It allocates nothing after Init and
// is not safe for concurrent use: its owner holds a lock.
package latency

import "time"

// Latency buckets: upper bounds 50 µs × 1.25^i, i < numBuckets (to about
// 63 s). A quantile is read as its bucket's upper bound, so it errs long
// by at most 25%, which the deadline multipliers dwarf.
const numBuckets = 64

var bucketBounds = func() (b [numBuckets]int64) {
	v := float64(50 * time.Microsecond)
	for i := range b {
		b[i] = int64(v)
		v *= 1.25
	}
	return b
}()

func bucketOf(d int64) int {
	lo, hi := 0, numBuckets-1
	for lo < hi { // the first bound ≥ d
		m := (lo + hi) / 2
		if bucketBounds[m] >= d {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return lo
}

// Window counts latencies over the last span in two halves: the older
// half is cleared when the clock enters a new one, so the counts always
// cover between half a span and a whole one. Fixed size, no allocation.
// Times are unix nanoseconds, latencies nanoseconds.
type Window struct {
	half   int64
	epoch  [2]int64
	counts [2][numBuckets]uint32
}

// Init readies w to cover span.
func (w *Window) Init(span time.Duration) {
	w.half = int64(span / 2)
	w.epoch = [2]int64{-1, -1}
}

// Add counts latency d seen at now.
func (w *Window) Add(now, d int64) {
	ep := now / w.half
	s := ep & 1
	if w.epoch[s] != ep {
		w.counts[s] = [numBuckets]uint32{}
		w.epoch[s] = ep
	}
	w.counts[s][bucketOf(d)]++
}

// Quantile returns the q-quantile (nearest rank, rounded up, so with
// fewer than 1/(1-q) samples it is the largest) or 0 with no samples.
func (w *Window) Quantile(now int64, q float64) int64 {
	cur := now / w.half
	var use [2]bool
	var total uint64
	for s := range 2 {
		if ep := w.epoch[s]; ep == cur || ep == cur-1 {
			use[s] = true
			for _, c := range w.counts[s] {
				total += uint64(c)
			}
		}
	}
	if total == 0 {
		return 0
	}
	rank := uint64(float64(total)*q + 0.999999)
	rank = min(max(rank, 1), total)
	var cum uint64
	for b := range numBuckets {
		for s := range 2 {
			if use[s] {
				cum += uint64(w.counts[s][b])
			}
		}
		if cum >= rank {
			return bucketBounds[b]
		}
	}
	return bucketBounds[numBuckets-1]
}

// Samples returns how many latencies the window holds now.
func (w *Window) Samples(now int64) uint64 {
	cur := now / w.half
	var total uint64
	for s := range 2 {
		if ep := w.epoch[s]; ep == cur || ep == cur-1 {
			for _, c := range w.counts[s] {
				total += uint64(c)
			}
		}
	}
	return total
}
