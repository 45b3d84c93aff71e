package takeover

import (
	"testing"
	"time"
)

func TestEventLog(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	var answered uint64 = 100
	l := NewEventLog(Mirror, ReasonStart, t0, func() uint64 { return answered })
	answered = 150
	ended := l.Record(Transition{From: Mirror, To: Takeover, Reason: ReasonPeerExit, At: t0.Add(10 * time.Second)})
	if ended.Mode != "mirror" || ended.DurationS != 10 || ended.Answered != 50 || ended.End == nil {
		t.Fatalf("ended %+v", ended)
	}
	answered = 1150
	evs := l.List(t0.Add(13 * time.Second))
	if len(evs) != 2 {
		t.Fatalf("%d events", len(evs))
	}
	cur := evs[1]
	if cur.Mode != "takeover" || cur.From != "mirror" || cur.Reason != "peer-exit" || cur.DurationS != 3 || cur.Answered != 1000 || cur.End != nil {
		t.Fatalf("current %+v", cur)
	}
	for i := range 2 * maxEvents {
		l.Record(Transition{From: Takeover, To: Hold, Reason: ReasonPeerRestarted, At: t0.Add(time.Duration(20+i) * time.Second)})
	}
	if n := len(l.List(t0.Add(time.Hour))); n != maxEvents {
		t.Fatalf("%d events kept, want %d", n, maxEvents)
	}
}
