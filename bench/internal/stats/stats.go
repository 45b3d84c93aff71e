// Package stats holds the summary statistics the benchmarks and the lab
// report, computed one way for all of them.
package stats

import (
	"cmp"
	"math"
)

// Percentile is the nearest-rank p-quantile (p in [0, 1]) of sorted, which
// is in ascending order; the zero value for none.
func Percentile[T cmp.Ordered](sorted []T, p float64) T {
	if len(sorted) == 0 {
		var zero T
		return zero
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
