package takeover

import (
	"errors"
	"fmt"
	"time"
)

// Mode is who should get the pods' queries.
type Mode uint8

const (
	// Mirror: LocalDNS is healthy and gets the traffic (all of it with
	// full steering); dnsstandby fills its cache from LocalDNS's answers.
	Mirror Mode = iota
	// Hold: LocalDNS is bound but must not get traffic: hung, just
	// restarted and not yet trusted, or drained by an operator.
	Hold
	// Takeover: LocalDNS's sockets are gone; dnsstandby answers alone.
	Takeover
)

func (m Mode) String() string {
	switch m {
	case Hold:
		return "hold"
	case Takeover:
		return "takeover"
	}
	return "mirror"
}

// Reason says why the mode changed.
type Reason string

const (
	ReasonStart           Reason = "start"            // the mode dnsstandby started in
	ReasonPeerExit        Reason = "peer-exit"        // LocalDNS's sockets are gone
	ReasonPeerHung        Reason = "peer-hung"        // bound, but failed HungAfter probes in a row
	ReasonPeerSilent      Reason = "peer-silent"      // bound, but answered none of the queries seen reaching it
	ReasonPeerRestarted   Reason = "peer-restarted"   // bound again: held until it passes the hold-down
	ReasonPeerHealthy     Reason = "peer-healthy"     // passed the hold-down
	ReasonOperator        Reason = "operator"         // `dnsstandby hold`
	ReasonOperatorRelease Reason = "operator-release" // `dnsstandby release`, or the hold's time ran out
)

// MachineConfig holds the mode machine's thresholds.
type MachineConfig struct {
	// HungAfter is how many probes in a row a bound LocalDNS may fail
	// before dnsstandby holds its traffic. With 1 s probes, 3 holds a hung
	// LocalDNS within about 3 s.
	HungAfter int
	// HealthyProbes and HealthyFor are the hold-down: a LocalDNS that
	// rebinds (or recovers from a hang) gets traffic back only after this
	// many probes in a row have passed, the first and the last at least
	// HealthyFor apart. A crash loop never gets that far, so it never eats
	// queries.
	HealthyProbes int
	HealthyFor    time.Duration
}

// DefaultMachineConfig: with 1 s probes, hung after 3 s, trusted again
// after 5 good probes in a row spanning at least 4 s (five probes a second
// apart). A CoreDNS that crashes again within seconds of starting never
// gets that far.
func DefaultMachineConfig() MachineConfig {
	return MachineConfig{HungAfter: 3, HealthyProbes: 5, HealthyFor: 4 * time.Second}
}

func (c MachineConfig) validate() error {
	var errs []error
	if c.HungAfter < 1 {
		errs = append(errs, fmt.Errorf("takeover: Machine.HungAfter must be at least 1, got %d", c.HungAfter))
	}
	if c.HealthyProbes < 1 {
		errs = append(errs, fmt.Errorf("takeover: Machine.HealthyProbes must be at least 1, got %d", c.HealthyProbes))
	}
	if c.HealthyFor < 0 {
		errs = append(errs, fmt.Errorf("takeover: Machine.HealthyFor must not be negative, got %s", c.HealthyFor))
	}
	return errors.Join(errs...)
}

// Transition is one change of mode.
type Transition struct {
	From, To Mode
	Reason   Reason
	At       time.Time
}

// Machine is the mode machine. It is pure: inputs carry their time, it
// starts nothing and touches nothing, so every transition can be tested
// without root. It is not safe for concurrent use; the controller owns it.
type Machine struct {
	cfg MachineConfig

	mode   Mode
	reason Reason
	since  time.Time

	bound   bool // LocalDNS has sockets in the groups
	trusted bool // LocalDNS passed the hold-down (or was healthy when we started)
	fails   int  // probes failed in a row while bound
	oks     int  // probes passed in a row
	okSince time.Time

	holding   bool      // an operator hold is in force
	holdUntil time.Time // zero: until released
}

// NewMachine starts the machine. A LocalDNS already bound at start is
// trusted — it has been serving; the probes will catch a hang — so that
// starting dnsstandby never pulls traffic away from a healthy LocalDNS.
func NewMachine(cfg MachineConfig, now time.Time, bound bool) (*Machine, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m := &Machine{cfg: cfg, bound: bound, trusted: bound, since: now, reason: ReasonStart}
	m.mode, _ = m.desired()
	return m, nil
}

// Mode returns the current mode, why it was entered, and since when.
func (m *Machine) Mode() (Mode, Reason, time.Time) { return m.mode, m.reason, m.since }

// Trusted reports whether LocalDNS is trusted with traffic: it was bound
// when the machine started, or passed the hold-down since it last exited
// or hung.
func (m *Machine) Trusted() bool { return m.trusted }

// PeerAnswers reports whether LocalDNS is known to answer now: bound, and
// either trusted with no probe failed since, or passing its probes (its
// last one passed) through a hold-down. One held for a hang or for
// silence does not answer until a probe passes. The steering program's
// read test gives our traffic to LocalDNS when dnsstandby stops reading;
// while LocalDNS does not answer that would only lose it, so the
// controller turns the test off then.
func (m *Machine) PeerAnswers() bool {
	return m.bound && m.fails == 0 && (m.trusted || m.oks > 0)
}

// Holding reports whether an operator hold is in force, and until when
// (zero: until released).
func (m *Machine) Holding() (bool, time.Time) { return m.holding, m.holdUntil }

// PeerBound records whether LocalDNS has sockets in the reuseport groups.
func (m *Machine) PeerBound(now time.Time, bound bool) *Transition {
	if bound == m.bound {
		return nil
	}
	m.bound = bound
	m.fails, m.oks = 0, 0
	var cause Reason
	if bound {
		// A LocalDNS that comes back is not trusted until the hold-down.
		cause = ReasonPeerRestarted
	} else {
		m.trusted = false
		cause = ReasonPeerExit
	}
	return m.step(now, cause)
}

// ProbeResult records one probe of LocalDNS. Probes while LocalDNS is not
// bound are ignored.
func (m *Machine) ProbeResult(now time.Time, ok bool) *Transition {
	if !m.bound {
		return nil
	}
	if !ok {
		m.oks = 0
		m.fails++
		if m.trusted && m.fails >= m.cfg.HungAfter {
			m.trusted = false
			return m.step(now, ReasonPeerHung)
		}
		return nil
	}
	m.fails = 0
	if m.oks == 0 {
		m.okSince = now
	}
	m.oks++
	if !m.trusted && m.oks >= m.cfg.HealthyProbes && now.Sub(m.okSince) >= m.cfg.HealthyFor {
		m.trusted = true
		return m.step(now, ReasonPeerHealthy)
	}
	return nil
}

// Silent records that a bound LocalDNS answered none of the queries seen
// reaching it on the wire for a while: it is held at once, as after
// HungAfter failed probes, well before the probes could tell. The probes
// and the hold-down bring it back.
func (m *Machine) Silent(now time.Time) *Transition {
	if !m.bound || !m.trusted {
		return nil
	}
	m.trusted = false
	m.fails, m.oks = 0, 0
	return m.step(now, ReasonPeerSilent)
}

// OperatorHold holds traffic away from LocalDNS for d (0: until released),
// e.g. to drain it before a planned restart. A hold replaces the one in
// force: the last hold asked says how long, so that a hold can be
// shortened as well as lengthened without a release, which would hand
// LocalDNS its traffic back in between. Hold reports what it replaced.
func (m *Machine) OperatorHold(now time.Time, d time.Duration) *Transition {
	m.holding = true
	m.holdUntil = time.Time{}
	if d > 0 {
		m.holdUntil = now.Add(d)
	}
	return m.step(now, ReasonOperator)
}

// OperatorRelease ends an operator hold. LocalDNS gets traffic back only if
// it is trusted; one that restarted meanwhile still serves its hold-down.
func (m *Machine) OperatorRelease(now time.Time) *Transition {
	if !m.holding {
		return nil
	}
	m.holding = false
	m.holdUntil = time.Time{}
	return m.step(now, ReasonOperatorRelease)
}

// Tick lets time-based rules fire: an operator hold that has run out.
func (m *Machine) Tick(now time.Time) *Transition {
	if m.holding && !m.holdUntil.IsZero() && !now.Before(m.holdUntil) {
		return m.OperatorRelease(now)
	}
	return nil
}

// desired is the mode the facts call for, and the reason to give when no
// single input caused it.
func (m *Machine) desired() (Mode, Reason) {
	switch {
	case m.holding:
		return Hold, ReasonOperator
	case !m.bound:
		return Takeover, ReasonPeerExit
	case m.trusted:
		return Mirror, ReasonPeerHealthy
	}
	return Hold, ReasonPeerRestarted
}

// step moves to the desired mode, if it differs, blaming cause.
func (m *Machine) step(now time.Time, cause Reason) *Transition {
	to, basis := m.desired()
	if to == m.mode {
		if cause == ReasonOperator || cause == ReasonOperatorRelease {
			m.reason = basis // same mode, new grounds: a hold now kept by the hold-down, say
		}
		return nil
	}
	t := &Transition{From: m.mode, To: to, Reason: cause, At: now}
	m.mode, m.reason, m.since = to, cause, now
	return t
}
