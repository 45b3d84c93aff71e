package main

import (
	"reflect"
	"testing"
	"time"

	"github.com/dnsstandby/dnsstandby/bench/lab"
)

// TestEventsOnEachClock: a node's marks and down spans are kept in wall
// time and placed on each client's clock, so that the pods' and the
// node's runs show the fault at the same moment although their loads
// started apart.
func TestEventsOnEachClock(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ev := &events{marks: []mark{{t0.Add(5 * time.Second), "SIGKILL"}, {t0.Add(6 * time.Second), "stopped"}}}
	spans := []span{{from: t0.Add(5200 * time.Millisecond), to: t0.Add(9 * time.Second), label: "LocalDNS not active"}}
	tests := []struct {
		name       string
		origin     time.Time
		wantEvents []lab.Event
		wantDown   []lab.Interval
	}{
		{"pods' load started first", t0,
			[]lab.Event{{At: 5 * time.Second, Label: "SIGKILL"}, {At: 6 * time.Second, Label: "stopped"}},
			[]lab.Interval{{From: 5200 * time.Millisecond, To: 9 * time.Second, Label: "LocalDNS not active"}}},
		{"node's load 3 ms later", t0.Add(3 * time.Millisecond),
			[]lab.Event{{At: 4997 * time.Millisecond, Label: "SIGKILL"}, {At: 5997 * time.Millisecond, Label: "stopped"}},
			[]lab.Interval{{From: 5197 * time.Millisecond, To: 8997 * time.Millisecond, Label: "LocalDNS not active"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := ev.list(tc.origin); !reflect.DeepEqual(got, tc.wantEvents) {
				t.Errorf("events %v, want %v", got, tc.wantEvents)
			}
			if got := intervals(spans, tc.origin); !reflect.DeepEqual(got, tc.wantDown) {
				t.Errorf("down %v, want %v", got, tc.wantDown)
			}
		})
	}
	if got := (&events{}).list(t0); len(got) != 0 {
		t.Errorf("no marks: %v", got)
	}
}
