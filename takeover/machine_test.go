package takeover

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// step is one input to the machine at a time offset from the start.
type step struct {
	at    time.Duration
	input string // "bound", "gone", "ok", "fail", "silent", "hold", "hold:D", "release", "tick"
}

func (s step) apply(m *Machine, now time.Time) *Transition {
	switch {
	case s.input == "bound":
		return m.PeerBound(now, true)
	case s.input == "gone":
		return m.PeerBound(now, false)
	case s.input == "ok":
		return m.ProbeResult(now, true)
	case s.input == "fail":
		return m.ProbeResult(now, false)
	case s.input == "hold":
		return m.OperatorHold(now, 0)
	case strings.HasPrefix(s.input, "hold:"):
		d, err := time.ParseDuration(strings.TrimPrefix(s.input, "hold:"))
		if err != nil {
			panic(err)
		}
		return m.OperatorHold(now, d)
	case s.input == "release":
		return m.OperatorRelease(now)
	case s.input == "tick":
		return m.Tick(now)
	case s.input == "silent":
		return m.Silent(now)
	}
	panic("unknown input " + s.input)
}

// probes returns n probe steps of kind, one a second from start.
func probes(start time.Duration, n int, kind string) []step {
	out := make([]step, n)
	for i := range out {
		out[i] = step{at: start + time.Duration(i)*time.Second, input: kind}
	}
	return out
}

func seq(parts ...[]step) []step {
	var out []step
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func one(at time.Duration, input string) []step { return []step{{at, input}} }

func TestMachine(t *testing.T) {
	tests := []struct {
		name       string
		boundStart bool
		steps      []step
		want       []string // "from>to:reason@seconds"
		final      string   // "mode:reason"
	}{
		{
			name: "healthy LocalDNS at start: mirror, and probes keep it there", boundStart: true,
			steps: probes(time.Second, 10, "ok"),
			final: "mirror:start",
		},
		{
			name:  "no LocalDNS at start: takeover",
			final: "takeover:start",
		},
		{
			name: "crash: takeover at once", boundStart: true,
			steps: one(2*time.Second, "gone"),
			want:  []string{"mirror>takeover:peer-exit@2"},
			final: "takeover:peer-exit",
		},
		{
			name: "restart: held until 5 probes spanning 4 s, then mirror", boundStart: true,
			steps: seq(one(time.Second, "gone"), one(3*time.Second, "bound"), probes(4*time.Second, 6, "ok")),
			want:  []string{"mirror>takeover:peer-exit@1", "takeover>hold:peer-restarted@3", "hold>mirror:peer-healthy@8"},
			final: "mirror:peer-healthy",
		},
		{
			name: "5 quick probes are not enough: the hold-down also needs 4 s", boundStart: true,
			steps: seq(one(0, "gone"), one(time.Second, "bound"),
				[]step{{1100 * time.Millisecond, "ok"}, {1200 * time.Millisecond, "ok"}, {1300 * time.Millisecond, "ok"}, {1400 * time.Millisecond, "ok"}, {1500 * time.Millisecond, "ok"}, {5900 * time.Millisecond, "ok"}, {6100 * time.Millisecond, "ok"}}),
			want:  []string{"mirror>takeover:peer-exit@0", "takeover>hold:peer-restarted@1", "hold>mirror:peer-healthy@5.9"},
			final: "mirror:peer-healthy",
		},
		{
			name: "crash loop: LocalDNS dies inside every hold-down and never gets traffic", boundStart: true,
			steps: seq(one(0, "gone"),
				one(2*time.Second, "bound"), probes(3*time.Second, 2, "ok"), one(5*time.Second, "gone"),
				one(7*time.Second, "bound"), probes(8*time.Second, 3, "ok"), one(11*time.Second, "gone"),
				one(13*time.Second, "bound"), probes(14*time.Second, 4, "ok"), one(18*time.Second, "gone")),
			want: []string{"mirror>takeover:peer-exit@0",
				"takeover>hold:peer-restarted@2", "hold>takeover:peer-exit@5",
				"takeover>hold:peer-restarted@7", "hold>takeover:peer-exit@11",
				"takeover>hold:peer-restarted@13", "hold>takeover:peer-exit@18"},
			final: "takeover:peer-exit",
		},
		{
			name: "a failed probe restarts the hold-down", boundStart: true,
			steps: seq(one(0, "gone"), one(time.Second, "bound"), probes(2*time.Second, 4, "ok"), one(6*time.Second, "fail"), probes(7*time.Second, 5, "ok")),
			want:  []string{"mirror>takeover:peer-exit@0", "takeover>hold:peer-restarted@1", "hold>mirror:peer-healthy@11"},
			final: "mirror:peer-healthy",
		},
		{
			name: "hang: hold after 3 failed probes, back after the hold-down", boundStart: true,
			steps: seq(probes(time.Second, 2, "ok"), probes(3*time.Second, 3, "fail"), probes(6*time.Second, 5, "ok")),
			want:  []string{"mirror>hold:peer-hung@5", "hold>mirror:peer-healthy@10"},
			final: "mirror:peer-healthy",
		},
		{
			name: "silent on the wire: hold at once, back after the hold-down", boundStart: true,
			steps: seq(probes(time.Second, 2, "ok"), []step{{2500 * time.Millisecond, "silent"}}, probes(3*time.Second, 5, "ok")),
			want:  []string{"mirror>hold:peer-silent@2.5", "hold>mirror:peer-healthy@7"},
			final: "mirror:peer-healthy",
		},
		{
			// Held, LocalDNS gets no queries to be silent to: a late report
			// says nothing new.
			name: "silent again while held: the hold-down goes on", boundStart: true,
			steps: seq(one(time.Second, "silent"), probes(2*time.Second, 4, "ok"), one(5500*time.Millisecond, "silent"), probes(6*time.Second, 5, "ok")),
			want:  []string{"mirror>hold:peer-silent@1", "hold>mirror:peer-healthy@6"},
			final: "mirror:peer-healthy",
		},
		{
			name:  "silent while LocalDNS is gone: ignored",
			steps: one(time.Second, "silent"),
			final: "takeover:start",
		},
		{
			name: "two failed probes are not a hang", boundStart: true,
			steps: seq(probes(time.Second, 2, "fail"), one(3*time.Second, "ok"), probes(4*time.Second, 2, "fail")),
			final: "mirror:start",
		},
		{
			name: "hung LocalDNS that then exits: takeover", boundStart: true,
			steps: seq(probes(time.Second, 3, "fail"), one(5*time.Second, "gone")),
			want:  []string{"mirror>hold:peer-hung@3", "hold>takeover:peer-exit@5"},
			final: "takeover:peer-exit",
		},
		{
			name:  "probes while LocalDNS is gone are ignored",
			steps: probes(time.Second, 5, "ok"),
			final: "takeover:start",
		},
		{
			name: "planned restart under an operator hold: no traffic to LocalDNS until it passed the hold-down", boundStart: true,
			steps: seq(one(time.Second, "hold"), one(2*time.Second, "gone"), one(8*time.Second, "bound"),
				one(9*time.Second, "release"), probes(10*time.Second, 5, "ok")),
			want:  []string{"mirror>hold:operator@1", "hold>mirror:peer-healthy@14"},
			final: "mirror:peer-healthy",
		},
		{
			name: "release while LocalDNS is healthy: mirror at once", boundStart: true,
			steps: seq(one(time.Second, "hold"), probes(2*time.Second, 3, "ok"), one(5*time.Second, "release")),
			want:  []string{"mirror>hold:operator@1", "hold>mirror:operator-release@5"},
			final: "mirror:operator-release",
		},
		{
			name: "release while LocalDNS is gone: takeover", boundStart: true,
			steps: seq(one(time.Second, "hold"), one(2*time.Second, "gone"), one(3*time.Second, "release")),
			want:  []string{"mirror>hold:operator@1", "hold>takeover:operator-release@3"},
			final: "takeover:operator-release",
		},
		{
			name: "timed hold runs out on a tick", boundStart: true,
			steps: seq(one(time.Second, "hold:10s"), one(5*time.Second, "tick"), one(11*time.Second, "tick")),
			want:  []string{"mirror>hold:operator@1", "hold>mirror:operator-release@11"},
			final: "mirror:operator-release",
		},
		{
			name: "operator hold over a hang; release leaves it held by the hold-down", boundStart: true,
			steps: seq(probes(time.Second, 3, "fail"), one(5*time.Second, "hold"), one(6*time.Second, "release")),
			want:  []string{"mirror>hold:peer-hung@3"},
			final: "hold:peer-restarted",
		},
		{
			name: "release without a hold does nothing", boundStart: true,
			steps: one(time.Second, "release"),
			final: "mirror:start",
		},
		{
			name:  "operator hold in takeover keeps steering to us and says why",
			steps: seq(one(time.Second, "hold"), one(2*time.Second, "bound"), probes(3*time.Second, 6, "ok")),
			want:  []string{"takeover>hold:operator@1"},
			final: "hold:operator",
		},
	}
	t0 := time.Unix(1_800_000_000, 0)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := NewMachine(DefaultMachineConfig(), t0, tt.boundStart)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, s := range tt.steps {
				if tr := s.apply(m, t0.Add(s.at)); tr != nil {
					got = append(got, fmt.Sprintf("%s>%s:%s@%v", tr.From, tr.To, tr.Reason, tr.At.Sub(t0).Seconds()))
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("transitions\n got %v\nwant %v", got, tt.want)
			}
			mode, reason, _ := m.Mode()
			if final := fmt.Sprintf("%s:%s", mode, reason); final != tt.final {
				t.Errorf("final %s, want %s", final, tt.final)
			}
		})
	}
}

func TestMachineConfigValidate(t *testing.T) {
	for _, c := range []MachineConfig{{HungAfter: 0, HealthyProbes: 5}, {HungAfter: 3, HealthyProbes: 0}, {HungAfter: 3, HealthyProbes: 1, HealthyFor: -time.Second}} {
		if _, err := NewMachine(c, time.Now(), true); err == nil {
			t.Errorf("config %+v accepted", c)
		}
	}
}

// TestPossibleTransitions drives the Machine with random inputs (every
// input it has: bound, hold, release, tick, silence, probes), long
// enough to reach every mode change many times, and checks that the
// changes it makes are exactly possibleTransitions, whose counters the
// metrics start at zero.
func TestPossibleTransitions(t *testing.T) {
	key := func(tr Transition) string { return tr.From.String() + ">" + tr.To.String() + ":" + string(tr.Reason) }
	want := map[string]bool{}
	for _, tr := range possibleTransitions {
		want[key(tr)] = true
	}
	seen := map[string]bool{}
	rng := rand.New(rand.NewPCG(1, 2))
	for walk := range 200 {
		now := time.Unix(0, 0)
		m, err := NewMachine(DefaultMachineConfig(), now, walk%2 == 0)
		if err != nil {
			t.Fatal(err)
		}
		for range 500 {
			now = now.Add(time.Duration(200+rng.IntN(1300)) * time.Millisecond)
			var tr *Transition
			switch r := rng.IntN(20); {
			case r < 1:
				tr = m.PeerBound(now, rng.IntN(2) == 0)
			case r < 2:
				tr = m.OperatorHold(now, time.Duration(rng.IntN(2))*3*time.Second)
			case r < 3:
				tr = m.OperatorRelease(now)
			case r < 4:
				tr = m.Tick(now)
			case r < 5:
				tr = m.Silent(now)
			default: // probes, mostly passing
				tr = m.ProbeResult(now, rng.IntN(4) != 0)
			}
			if tr != nil {
				if !want[key(*tr)] {
					t.Fatalf("transition %s is not in possibleTransitions", key(*tr))
				}
				seen[key(*tr)] = true
			}
		}
	}
	for k := range want {
		if !seen[k] {
			t.Errorf("possibleTransitions lists %s, which the Machine never made", k)
		}
	}
}

// TestPeerAnswers: LocalDNS answers while bound and passing its probes
// (trusted, or in a hold-down with its last probe passed); a failed
// probe, a silence, a restart before its first good probe, and its
// absence say it does not. An operator hold changes nothing.
func TestPeerAnswers(t *testing.T) {
	start := time.Unix(1000, 0)
	tests := []struct {
		name  string
		bound bool // at start
		steps []string
		want  bool
	}{
		{"bound at start, no probe yet", true, nil, true},
		{"not bound", false, nil, false},
		{"passing", true, []string{"ok", "ok"}, true},
		{"one failed probe", true, []string{"ok", "fail"}, false},
		{"hung", true, []string{"fail", "fail", "fail"}, false},
		{"hung, then a good probe in the hold-down", true, []string{"fail", "fail", "fail", "ok"}, true},
		{"silent", true, []string{"ok", "silent"}, false},
		{"silent, then a good probe", true, []string{"silent", "ok"}, true},
		{"restarted, before its first probe", true, []string{"gone", "bound"}, false},
		{"restarted, passing its hold-down", true, []string{"gone", "bound", "ok"}, true},
		{"gone", true, []string{"ok", "gone"}, false},
		{"operator hold", true, []string{"ok", "hold"}, true},
	}
	for _, tt := range tests {
		m, err := NewMachine(DefaultMachineConfig(), start, tt.bound)
		if err != nil {
			t.Fatal(err)
		}
		for i, in := range tt.steps {
			step{input: in}.apply(m, start.Add(time.Duration(i+1)*time.Second))
		}
		if got := m.PeerAnswers(); got != tt.want {
			mode, reason, _ := m.Mode()
			t.Errorf("%s: PeerAnswers %v, want %v (mode %s, %s)", tt.name, got, tt.want, mode, reason)
		}
	}
}
