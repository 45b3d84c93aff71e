package takeover

import (
	"sync"
	"time"
)

// Event is one stretch of time in one mode, as /debug/events and
// `dnsstandby status` show it.
type Event struct {
	Mode      string     `json:"mode"`
	From      string     `json:"from,omitempty"` // the mode before; empty for the first
	Reason    string     `json:"reason"`
	Start     time.Time  `json:"start"`
	End       *time.Time `json:"end,omitempty"` // nil while it lasts
	DurationS float64    `json:"duration_s"`    // so far, for the current one
	// Answered is how many queries dnsstandby answered while it lasted.
	Answered uint64 `json:"answered"`

	startAnswered uint64
}

// maxEvents bounds the log: a flapping LocalDNS must not grow memory.
const maxEvents = 256

// EventLog keeps the recent mode stretches, newest last.
type EventLog struct {
	answered func() uint64 // always non-nil: queries dnsstandby answered so far

	mu     sync.Mutex // guards events
	events []Event
}

// NewEventLog starts a log whose first event is the mode dnsstandby
// started in. answered reports the running total of queries answered.
func NewEventLog(start Mode, reason Reason, at time.Time, answered func() uint64) *EventLog {
	if answered == nil {
		answered = func() uint64 { return 0 }
	}
	l := &EventLog{answered: answered}
	l.events = []Event{{Mode: start.String(), Reason: string(reason), Start: at, startAnswered: answered()}}
	return l
}

// Record closes the current event and opens one for tr; it returns the
// event that ended.
func (l *EventLog) Record(tr Transition) Event {
	n := l.answered()
	l.mu.Lock()
	defer l.mu.Unlock()
	cur := &l.events[len(l.events)-1]
	end := tr.At
	cur.End = &end
	cur.DurationS = tr.At.Sub(cur.Start).Seconds()
	cur.Answered = n - cur.startAnswered
	ended := *cur
	l.events = append(l.events, Event{Mode: tr.To.String(), From: tr.From.String(), Reason: string(tr.Reason), Start: tr.At, startAnswered: n})
	if len(l.events) > maxEvents {
		l.events = append(l.events[:0:0], l.events[len(l.events)-maxEvents:]...)
	}
	return ended
}

// List returns the events, the current one with its duration and answers
// so far.
func (l *EventLog) List(now time.Time) []Event {
	n := l.answered()
	l.mu.Lock()
	defer l.mu.Unlock()
	out := append([]Event(nil), l.events...)
	cur := &out[len(out)-1]
	cur.DurationS = now.Sub(cur.Start).Seconds()
	cur.Answered = n - cur.startAnswered
	return out
}
