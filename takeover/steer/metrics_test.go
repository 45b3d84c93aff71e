package steer

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestMetricsAtOff(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Want = WantOff
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.SetMode(ToUs); err != nil {
		t.Fatal(err)
	}
	// No groups at off, and no heartbeat age before the first beat.
	const want = `
# HELP dnsstandby_steer_adoptions_total LocalDNS sockets adopted into a steering map.
# TYPE dnsstandby_steer_adoptions_total counter
dnsstandby_steer_adoptions_total 0
# HELP dnsstandby_steer_level Steering level in use (1) among off, own and adopt.
# TYPE dnsstandby_steer_level gauge
dnsstandby_steer_level{level="adopt"} 0
dnsstandby_steer_level{level="off"} 1
dnsstandby_steer_level{level="own"} 0
# HELP dnsstandby_steer_level_wanted Highest steering level asked for (1) among off, own and adopt; auto asks for adopt.
# TYPE dnsstandby_steer_level_wanted gauge
dnsstandby_steer_level_wanted{level="adopt"} 0
dnsstandby_steer_level_wanted{level="off"} 1
dnsstandby_steer_level_wanted{level="own"} 0
# HELP dnsstandby_steer_map_update_errors_total Failed writes to the steering maps.
# TYPE dnsstandby_steer_map_update_errors_total counter
dnsstandby_steer_map_update_errors_total{map="config"} 0
dnsstandby_steer_map_update_errors_total{map="sockarray"} 0
# HELP dnsstandby_steer_mode Steering mode the program applies (1) among hash, to-peer and to-us.
# TYPE dnsstandby_steer_mode gauge
dnsstandby_steer_mode{mode="hash"} 1
dnsstandby_steer_mode{mode="to-peer"} 0
dnsstandby_steer_mode{mode="to-us"} 0
`
	if err := testutil.CollectAndCompare(s, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}
