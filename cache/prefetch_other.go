//go:build !amd64 && !arm64

package cache

import "unsafe"

// prefetch is a hint this architecture goes without.
func prefetch(unsafe.Pointer) {}
