//go:build amd64 || arm64

package cache

import "unsafe"

// prefetch asks the CPU to bring p's cache line in, and returns at once:
// unlike a load, the hint waits for nothing, and nothing (not even a
// locked instruction after it) waits for it. Go has no such intrinsic
// outside its runtime, hence the assembly.
//
//go:noescape
func prefetch(p unsafe.Pointer)
