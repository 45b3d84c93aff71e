package check

import (
	"github.com/dnsstandby/dnsstandby/status"

	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"time"

	"github.com/dnsstandby/dnsstandby/takeover"
)

// daemonFacts is what the admin socket said, or why it said nothing.
type daemonFacts struct {
	Status *status.Daemon // nil when Err is set
	Err    error
	// Later is a second status read MirrorWindow after the first, or nil.
	Later  *status.Daemon
	Window time.Duration
}

// standbyFix is the fix for a dnsstandby that does not run.
const standbyFix = "systemctl start dnsstandby"

// daemonResult judges the daemon itself: does it answer, which mode is it
// in and why, is the address anchor in place. groups are the reuseport
// groups' members, which tell a daemon that does not run from one whose
// admin socket cannot be reached.
func daemonResult(d daemonFacts, groups []groupFacts) Result {
	const name = "dnsstandby"
	if d.Err != nil {
		if errors.Is(d.Err, fs.ErrPermission) {
			return Result{Name: name, Status: Warn, Found: fmt.Sprintf("admin socket: %v", d.Err),
				Fix: "run dnsstandby check as root (the admin socket is root's only)"}
		}
		if pids := standbyPIDs(groups); len(pids) > 0 {
			// It serves, so pods are answered; only this audit is blind.
			return Result{Name: name, Status: Warn,
				Found: fmt.Sprintf("dnsstandby runs (pid %s) but its admin socket does not answer: %v", joinInts(pids), d.Err),
				Fix:   "give --admin-socket the path the daemon was started with (its --admin-socket)"}
		}
		return Result{Name: name, Status: Fail, Found: fmt.Sprintf("dnsstandby is not running: %v", d.Err), Fix: standbyFix}
	}
	st := d.Status
	found := fmt.Sprintf("pid %d, mode %s (%s) for %s", st.PID, st.Mode, st.Reason, time.Since(st.Since).Round(time.Second))
	if st.PID == 0 {
		found = fmt.Sprintf("mode %s (%s) for %s", st.Mode, st.Reason, time.Since(st.Since).Round(time.Second))
	}
	var more []finding
	switch st.Mode {
	case "mirror":
	case "takeover":
		// Pods are answered, by dnsstandby alone: LocalDNS needs looking at.
		found += ": LocalDNS's sockets are gone, dnsstandby answers everything"
		more = append(more, finding{Warn, "systemctl status localdns.service: restart LocalDNS once its failure is understood"})
	case "hold":
		switch {
		case st.Holding:
			until := "until released"
			if st.HoldUntil != nil {
				until = "until " + st.HoldUntil.Format(time.RFC3339)
			}
			found += ": operator hold " + until
			more = append(more, finding{Warn, "dnsstandby release, once the planned work on LocalDNS is done"})
		case st.Reason == string(takeover.ReasonPeerHung):
			found += ": LocalDNS is bound but does not answer its probes"
			more = append(more, finding{Warn, "LocalDNS is hung: journalctl -u localdns.service, and restart it if it stays so"})
		default:
			// Just started or restarted: held until it passes the
			// hold-down (a few seconds), which a crash loop never does.
			found += ": LocalDNS is in its hold-down"
			more = append(more, finding{Warn, "wait a few seconds and check again; if it lasts, LocalDNS keeps restarting: journalctl -u localdns.service"})
		}
	default:
		more = append(more, finding{Warn, "upgrade dnsstandby check to the daemon's version"})
	}
	switch {
	case st.AnchorReady != nil && *st.AnchorReady:
		found += "; address anchor ready"
	case st.AnchorReady != nil:
		found += "; address anchor not in place"
		more = append(more, finding{Warn, "journalctl -u dnsstandby says why the anchor link is not in place (it needs CAP_NET_ADMIN)"})
	case st.Config != nil && st.Config.AnchorLink == "":
		found += "; no address anchor (--anchor-link '')"
		more = append(more, finding{Warn, "run dnsstandby with --anchor-link (default dnsstandby): the anchor keeps the listen addresses local when LocalDNS deletes its link"})
	default:
		// The controller reports no anchor both when none was asked for
		// and when it could not be made; only the daemon's log tells.
		found += "; no address anchor"
		if st.Config != nil {
			found += fmt.Sprintf(" (link %s could not be made)", st.Config.AnchorLink)
		}
		more = append(more, finding{Warn, "journalctl -u dnsstandby says why the anchor link could not be made: without it the listen addresses vanish when LocalDNS deletes its link"})
	}
	return verdict(name, found, more...)
}

// steeringResult judges the steering level: adopt is what the design
// configResult says where the daemon's configuration comes from: the
// Corefile passes; the last known good or the fallback warn, since the
// Corefile they stand in for is one LocalDNS's CoreDNS refuses too.
func configResult(d daemonFacts) (Result, bool) {
	const name = "config"
	if d.Status == nil || d.Status.Config == nil || d.Status.Config.Source == nil {
		return Result{}, false
	}
	s := d.Status.Config.Source
	switch s.From {
	case "file":
		return Result{Name: name, Status: Pass, Found: fmt.Sprintf("from the Corefile %s (sha256 %.12s)", s.Corefile, s.SHA256)}, true
	case "flags":
		return Result{Name: name, Status: Pass, Found: "from the flags: no --localdns-corefile"}, true
	}
	found := fmt.Sprintf("the Corefile is refused (%s): %s", s.Reason, s.Refused)
	fix := "fix the Corefile (LocalDNS's CoreDNS refuses it too: journalctl -u localdns.service); dnsstandby applies it as soon as it is good"
	switch s.From {
	case "last-good":
		found += fmt.Sprintf("; dnsstandby serves the last known good, from %s, first applied %s", s.Corefile, s.Applied)
	default:
		found += "; dnsstandby serves the fallback upstreams: no last known good"
		if s.LastGood != "" {
			found += " (" + s.LastGood + ")"
		}
	}
	return Result{Name: name, Status: Warn, Found: found, Fix: fix}, true
}

// needs for a LocalDNS that gets every query in mirror and none in hold;
// anything less is reported with the daemon's reason.
func steeringResult(d daemonFacts) (Result, bool) {
	const name = "steering"
	if d.Status == nil {
		return Result{}, false
	}
	st := d.Status
	want := "auto"
	if st.Config != nil && st.Config.Steering != "" {
		want = st.Config.Steering
	}
	level := st.Steering.Level
	found := fmt.Sprintf("level %s (wanted %s)", level, want)
	if level != "adopt" {
		found = joinFound(found, st.Steering.Why)
		fix := "give dnsstandby CAP_BPF (or CAP_SYS_ADMIN) and CAP_SYS_PTRACE, as deploy/systemd/dnsstandby.service does, and restart it"
		if want == "own" || want == "off" {
			fix = "run dnsstandby with --steering auto"
		}
		return Result{Name: name, Status: Warn, Found: found, Fix: fix}, true
	}
	// At adopt, mirror sends everything to LocalDNS only through the UDP
	// sockets it adopted; TCP may stay unadopted (MPTCP, see README).
	var groups []string
	for g := range st.Peer.Adopted {
		groups = append(groups, g)
	}
	slices.Sort(groups)
	var adopted, missing []string
	for _, g := range groups {
		n := st.Peer.Adopted[g]
		a := fmt.Sprintf("%s %d", g, n)
		if u := st.Peer.Unadoptable[g]; u > 0 {
			a += fmt.Sprintf(" (%d more MPTCP, not adoptable: hashed in mirror)", u)
		}
		adopted = append(adopted, a)
		if n == 0 && strings.HasSuffix(g, "/udp") && st.Peer.Bound {
			missing = append(missing, g)
		}
	}
	if len(adopted) > 0 {
		found += "; LocalDNS sockets adopted: " + strings.Join(adopted, ", ")
	}
	if len(missing) > 0 && st.Mode == "mirror" {
		return Result{Name: name, Status: Warn,
			Found: found + ": in " + strings.Join(missing, ", ") + " mirror shares by the kernel's hash",
			Fix:   "journalctl -u dnsstandby says why LocalDNS's sockets could not be adopted (pidfd_getfd needs CAP_SYS_PTRACE)"}, true
	}
	return Result{Name: name, Status: Pass, Found: found}, true
}

// mirrorResult judges the mirror feed: does LocalDNS's answering reach
// the cache, so that a takeover answers what pods asked.
func mirrorResult(d daemonFacts) (Result, bool) {
	const name = "mirror"
	if d.Status == nil {
		return Result{}, false
	}
	m := d.Status.Mirror
	if m == nil {
		return Result{Name: name, Status: Warn, Found: "the daemon does not report its mirror feed",
			Fix: "run a dnsstandby as new as this check"}, true
	}
	counts := fmt.Sprintf("replies accepted %d, rejected %d since start", m.Accepted, m.Rejected)
	if d.Later != nil && d.Later.Mirror != nil && d.Later.Mirror.Accepted >= m.Accepted {
		counts += fmt.Sprintf(" (accepted %d in the last %s)", d.Later.Mirror.Accepted-m.Accepted, d.Window)
	}
	switch {
	case m.Feed == "none":
		return Result{Name: name, Status: Warn, Found: "no mirror feed (--mirror none): the cache holds only what dnsstandby answered itself",
			Fix: "run dnsstandby with --mirror tap (the default)"}, true
	case !m.Running:
		return Result{Name: name, Status: Warn, Found: fmt.Sprintf("the %s feed is not running", m.Feed),
			Fix: "journalctl -u dnsstandby says why (the tap needs CAP_NET_RAW; dnstap a socket path it can create)"}, true
	case m.Feed == "dnstap" && m.Connections == 0:
		return Result{Name: name, Status: Warn, Found: "dnstap: LocalDNS is not connected; " + counts,
			Fix: "add `dnstap SOCKET full` to LocalDNS's .11 blocks and restart it after dnsstandby (deploy/corefile/README.md)"}, true
	case m.Feed == "tap" && m.LocalOnly != nil && !*m.LocalOnly:
		return Result{Name: name, Status: Warn, Found: "tap with the classic filter (the kernel refused the eBPF one): a pod behind a Linux bridge can forge replies into the cache; " + counts,
			Fix: "grant CAP_BPF (the unit does), or use --mirror dnstap:PATH"}, true
	case m.Feed == "tap" && !m.Enabled && d.Status.Mode == "mirror":
		// The tap inserts only while LocalDNS gets every query (mirror at
		// level adopt): here LocalDNS answers, and none of it is kept.
		return Result{Name: name, Status: Warn, Found: "tap paused although LocalDNS answers (steering is not adopt with LocalDNS's UDP sockets adopted); " + counts,
			Fix: "see the steering row: the tap mirrors only at level adopt"}, true
	case m.Feed == "tap" && !m.Enabled:
		return Result{Name: name, Status: Pass, Found: fmt.Sprintf("tap paused while dnsstandby answers itself (mode %s); %s", d.Status.Mode, counts)}, true
	}
	return Result{Name: name, Status: Pass, Found: fmt.Sprintf("%s feeding the cache; %s", m.Feed, counts)}, true
}

// cacheFull is the share of a bound above which the cache counts as full:
// it then evicts what pods asked least recently, which a takeover may need.
const cacheFull = 0.99

// cacheResult reports the cache's size against its bounds.
func cacheResult(d daemonFacts) (Result, bool) {
	const name = "cache"
	if d.Status == nil {
		return Result{}, false
	}
	c := d.Status.Cache
	if c == nil {
		return Result{Name: name, Status: Warn, Found: "the daemon does not report its cache",
			Fix: "run a dnsstandby as new as this check"}, true
	}
	found := fmt.Sprintf("%d of %d entries, %s of %s, %d evictions", c.Entries, c.MaxEntries, size(c.Bytes), size(c.MaxBytes), c.Evictions)
	full := (c.MaxEntries > 0 && float64(c.Entries) >= cacheFull*float64(c.MaxEntries)) ||
		(c.MaxBytes > 0 && float64(c.Bytes) >= cacheFull*float64(c.MaxBytes))
	if full && c.Evictions > 0 {
		return Result{Name: name, Status: Warn, Found: found + ": full, evicting",
			Fix: "raise --cache-max-entries or --cache-max-bytes (and MemoryMax= of dnsstandby.service with them)"}, true
	}
	return Result{Name: name, Status: Pass, Found: found}, true
}

// size prints a byte count in KiB or MiB.
func size(b int64) string {
	if b < 1<<20 {
		return fmt.Sprintf("%.0f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ",")
}
