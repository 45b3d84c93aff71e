package steer

import (
	"errors"
	"fmt"
	"strings"
)

// Level is how much of the steering the kernel and our privileges allow.
// Levels are ordered: a higher one can do everything a lower one can.
type Level int

const (
	// Off: no program; the reuseport group spreads packets by the kernel's
	// hash (plain SO_REUSEPORT). Always possible. No hold.
	Off Level = iota
	// Own: a program with only our socket in its map. ToUs holds all
	// traffic; ToPeer cannot reach LocalDNS and behaves as Hash.
	Own
	// Adopt: a program plus LocalDNS's sockets, adopted through
	// pidfd_getfd. ToPeer sends everything to LocalDNS, ToUs to us.
	Adopt
)

// String returns "off", "own" or "adopt".
func (l Level) String() string {
	switch l {
	case Off:
		return "off"
	case Own:
		return "own"
	case Adopt:
		return "adopt"
	}
	return fmt.Sprintf("level(%d)", int(l))
}

// Want is a requested level: "auto" (the best available), or "adopt",
// "own" or "off", each the highest level to try.
const (
	WantAuto  = "auto"
	WantAdopt = "adopt"
	WantOwn   = "own"
	WantOff   = "off"
)

// ErrBadLevel reports a steering level that is none of auto, adopt, own, off.
var ErrBadLevel = errors.New("steering level must be auto, adopt, own or off")

// ParseLevel parses a --steering value (case-insensitive, spaces
// trimmed) into the highest level to try: "auto" (or "") and "adopt" give
// Adopt, "own" Own, "off" Off.
func ParseLevel(s string) (Level, error) {
	l, _, err := parseWant(s)
	return l, err
}

// parseWant is ParseLevel that also says whether s was "auto".
func parseWant(s string) (l Level, auto bool, err error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case WantAuto, "":
		return Adopt, true, nil
	case WantAdopt:
		return Adopt, false, nil
	case WantOwn:
		return Own, false, nil
	case WantOff:
		return Off, false, nil
	}
	return Off, false, fmt.Errorf("%w: %q", ErrBadLevel, s)
}

// Mode is where the program sends packets. Its values are the ones the
// program reads from the config map.
type Mode uint32

const (
	// Hash selects nothing: the kernel's hash spreads packets over the
	// whole group. The mode a new Steerer starts in.
	Hash Mode = iota
	// ToPeer selects one of LocalDNS's adopted sockets, else ours (if our
	// heartbeat is fresh), else the hash. At level Own it is written as
	// Hash: with no peer adopted it would otherwise send everything to us.
	ToPeer
	// ToUs selects our socket if our heartbeat is fresh, else a peer, else
	// the hash.
	ToUs
)

// String returns "hash", "to-peer" or "to-us".
func (m Mode) String() string {
	switch m {
	case Hash:
		return "hash"
	case ToPeer:
		return "to-peer"
	case ToUs:
		return "to-us"
	}
	return fmt.Sprintf("mode(%d)", uint32(m))
}

// effective is the mode the program is given at level l.
func (m Mode) effective(l Level) Mode {
	switch {
	case l == Off:
		return Hash
	case l == Own && m == ToPeer:
		return Hash
	}
	return m
}
