package steer_test

import (
	"fmt"

	"github.com/dnsstandby/dnsstandby/takeover/steer"
)

// The daemon's wiring: decide the level once, steer each group our
// responder listens on, adopt LocalDNS's sockets as the peer watch finds
// them (Adopt level only), beat from the liveness loop, and set the mode
// from the mode machine. With Want off every call succeeds and
// nothing is steered.
func Example() {
	cfg := steer.DefaultConfig()
	cfg.Want = steer.WantOff
	s, err := steer.New(cfg)
	if err != nil {
		panic(err) // only an invalid Config
	}
	defer s.Close() // before closing the sockets: it detaches through them

	// For each listener: s.AddGroup("udp 169.254.10.11:53", rawConn, true)
	// For each LocalDNS socket found: slot, err := s.Adopt(group, dupFD); close(dupFD)
	_ = s.Heartbeat()         // every 250 ms
	_ = s.SetMode(steer.ToUs) // hold or takeover; ToPeer in mirror

	fmt.Println(s.Level(), "-", s.Why())
	fmt.Println("applied mode:", s.Effective())
	// Output:
	// off - off: requested
	// applied mode: hash
}
