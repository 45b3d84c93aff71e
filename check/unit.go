package check

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// unitProperties are the properties `systemctl show` is asked for: whether
// the unit exists and runs, and everything that decides whether a crash
// loop can leave it failed for good.
var unitProperties = []string{
	"LoadState", "ActiveState", "Restart", "RestartUSec",
	"StartLimitBurst", "StartLimitIntervalUSec", "KillMode", "MainPID",
}

// unitInfo is LocalDNS's unit as `systemctl show` describes it.
type unitInfo struct {
	LoadState   string // loaded, not-found, masked, bad-setting, error
	ActiveState string // active, failed, inactive, activating, ...
	Restart     string // no, on-success, on-failure, on-abnormal, on-watchdog, on-abort, always
	KillMode    string // control-group, mixed, process, none
	MainPID     int

	RestartSec    time.Duration // the delay before each restart
	StartLimit    int           // StartLimitBurst: starts allowed per interval
	StartInterval time.Duration // StartLimitIntervalSec; 0 disables the limit

	// The two durations as systemctl printed them ("100ms", "5min"), for
	// the report.
	RestartSecText, StartIntervalText string
}

// parseUnitShow reads `systemctl show --property=...` output (KEY=VALUE
// lines). Every property in unitProperties must be there: systemctl prints
// them all, with defaults, even for a unit that does not exist.
func parseUnitShow(out string) (unitInfo, error) {
	props := map[string]string{}
	for line := range strings.Lines(out) {
		k, v, ok := strings.Cut(strings.TrimRight(line, "\r\n"), "=")
		if ok {
			props[k] = v
		}
	}
	for _, p := range unitProperties {
		if _, ok := props[p]; !ok {
			return unitInfo{}, fmt.Errorf("systemctl show printed no %s", p)
		}
	}
	u := unitInfo{
		LoadState:         props["LoadState"],
		ActiveState:       props["ActiveState"],
		Restart:           props["Restart"],
		KillMode:          props["KillMode"],
		RestartSecText:    props["RestartUSec"],
		StartIntervalText: props["StartLimitIntervalUSec"],
	}
	var err error
	if u.MainPID, err = strconv.Atoi(props["MainPID"]); err != nil {
		return u, fmt.Errorf("MainPID %q: %w", props["MainPID"], err)
	}
	if u.StartLimit, err = strconv.Atoi(props["StartLimitBurst"]); err != nil {
		return u, fmt.Errorf("StartLimitBurst %q: %w", props["StartLimitBurst"], err)
	}
	if u.RestartSec, err = parseTimespan(u.RestartSecText); err != nil {
		return u, fmt.Errorf("RestartUSec: %w", err)
	}
	if u.StartInterval, err = parseTimespan(u.StartIntervalText); err != nil {
		return u, fmt.Errorf("StartLimitIntervalUSec: %w", err)
	}
	return u, nil
}

// timespanUnits are the suffixes systemd writes (format_timespan) and the
// common ones it reads (parse_sec), longest first where one is a prefix of
// another's tail.
var timespanUnits = []struct {
	suffix string
	d      time.Duration
}{
	{"month", 2629800 * time.Second}, // systemd's month: 30.44 days
	{"min", time.Minute},
	{"msec", time.Millisecond},
	{"usec", time.Microsecond},
	{"sec", time.Second},
	{"ms", time.Millisecond},
	{"us", time.Microsecond},
	{"µs", time.Microsecond},
	{"ns", time.Nanosecond},
	{"y", 31557600 * time.Second}, // systemd's year: 365.25 days
	{"w", 7 * 24 * time.Hour},
	{"d", 24 * time.Hour},
	{"h", time.Hour},
	{"m", time.Minute},
	{"s", time.Second},
}

// parseTimespan reads a systemd time span as systemctl show prints it:
// "100ms", "2s", "5min", "1min 30s", "1.500000s", "0", "infinity". A bare
// number is seconds, as systemd reads it.
func parseTimespan(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	switch s {
	case "":
		return 0, fmt.Errorf("empty time span")
	case "infinity":
		return math.MaxInt64, nil
	}
	var total time.Duration
	for _, word := range strings.Fields(s) {
		num := strings.TrimRightFunc(word, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
		suffix := word[len(num):]
		v, err := strconv.ParseFloat(num, 64)
		if err != nil || v < 0 {
			return 0, fmt.Errorf("time span %q: bad number %q", s, num)
		}
		unit := time.Duration(0)
		if suffix == "" {
			unit = time.Second
		}
		for _, u := range timespanUnits {
			if suffix == u.suffix {
				unit = u.d
				break
			}
		}
		if unit == 0 {
			return 0, fmt.Errorf("time span %q: unknown unit %q", s, suffix)
		}
		total += time.Duration(v * float64(unit))
	}
	return total, nil
}

// AgentBaker PR 9439's restart budget for localdns.service, as its review
// settled it: 5 starts in 720 s, 2 s apart. It bounds the crash loop on
// purpose, so that an unrecoverable LocalDNS lands in failed (where
// dnsstandby answers) instead of restarting forever; the 2 s backoff lets
// a short burst of crashes settle instead of spending the budget at once.
const (
	pr9439Burst      = 5
	pr9439RestartSec = 2 * time.Second
)

// minCrashLoop is the shortest crash loop a bounded restart budget must
// outlast to pass: PR 9439's, 5 starts 2 s apart. The shipped defaults (5
// starts 100 ms apart) last 0.5 s: the reported harness, kills 300 ms
// apart, wedged the unit after six.
const minCrashLoop = pr9439Burst * pr9439RestartSec

// pr9439Fix is the advice for a restart policy short of PR 9439's: its
// values, as a drop-in so the VHD's unit stays as shipped.
const pr9439Fix = "add a drop-in (systemctl edit localdns.service) with [Unit] StartLimitIntervalSec=720, StartLimitBurst=5 and [Service] Restart=on-failure, RestartSec=2 (AgentBaker PR 9439)"

// localdnsUnitResult judges LocalDNS's unit. Its restart policy and kill
// mode are advice (INFO): however LocalDNS's unit restarts, dnsstandby
// answers while it is down. A LocalDNS that is down now, or whose unit
// does not load, is a risk (WARN): dnsstandby answers alone. out and err
// are systemctl's; w says whether the audit runs in a container, which has
// no systemd to ask.
func localdnsUnitResult(unit, out string, err error, w where) Result {
	const name = "localdns-unit"
	if err != nil {
		if w.Container {
			return Result{Name: name, Status: Skip, Found: w.notCheckable("LocalDNS's unit is the node's systemd's"), Fix: onTheNode}
		}
		// No systemd here, or no permission: the audit cannot tell,
		// which is not the same as broken.
		return Result{Name: name, Status: Warn,
			Found: fmt.Sprintf("cannot read %s: %v", unit, err),
			Fix:   "run dnsstandby check on the node itself (as root); --localdns-unit names LocalDNS's unit if it is not " + DefaultLocalDNSUnit}
	}
	u, perr := parseUnitShow(out)
	if perr != nil {
		return Result{Name: name, Status: Warn, Found: fmt.Sprintf("%s: unreadable systemctl show output: %v", unit, perr),
			Fix: "check with: systemctl show " + unit}
	}
	switch u.LoadState {
	case "loaded":
	case "not-found", "masked":
		// Not broken by itself: with dnsstandby running, pods are still
		// answered (the dnsstandby row fails if it does not run). But the
		// audit cannot judge LocalDNS, and a node meant to run it should.
		return Result{Name: name, Status: Warn,
			Found: fmt.Sprintf("%s is %s: LocalDNS does not run here, dnsstandby then is the only responder", unit, u.LoadState),
			Fix:   "if LocalDNS should run here, name its unit with --localdns-unit (or unmask it); else keep dnsstandby's upstreams reachable"}
	default:
		// bad-setting, error: LocalDNS is meant to run and systemd cannot
		// start it, now or after its next crash; dnsstandby answers alone.
		return Result{Name: name, Status: Warn,
			Found: fmt.Sprintf("%s did not load (%s): systemd cannot (re)start LocalDNS, dnsstandby answers alone once it stops", unit, u.LoadState),
			Fix:   "systemctl status " + unit + " says why; fix the unit file, then systemctl daemon-reload"}
	}

	found := fmt.Sprintf("%s %s", unit, u.ActiveState)
	if u.MainPID != 0 {
		found += fmt.Sprintf(" (MainPID %d)", u.MainPID)
	}
	found += fmt.Sprintf(": Restart=%s RestartSec=%s StartLimitBurst=%d StartLimitIntervalSec=%s KillMode=%s",
		u.Restart, u.RestartSecText, u.StartLimit, u.StartIntervalText, u.KillMode)
	policy, why := restartPolicy(u)
	fs := []finding{policy}
	fs = append(fs, activeFinding(unit, u.ActiveState))
	if u.KillMode == "none" {
		// systemd itself calls KillMode=none unsafe: a CoreDNS left behind
		// by a stopped localdns.sh keeps its sockets and answers with
		// whatever state it was in, beside the next start's CoreDNS.
		fs = append(fs, finding{Info, "set KillMode=mixed (as AKS ships it), so a stop or crash of localdns.sh takes CoreDNS with it"})
	}
	return verdict(name, joinFound(found, why), fs...)
}

// restartPolicy weighs how LocalDNS's unit comes back from crashes, and
// says why in words for the report. Anything short of PR 9439's budget is
// advice: dnsstandby answers while LocalDNS is down, for good or not.
func restartPolicy(u unitInfo) (finding, string) {
	switch u.Restart {
	case "on-failure", "on-abnormal", "always":
		// Restarted after any crash: the start limit decides.
	case "no", "on-success":
		// Never restarted after a crash, so never wedged by the start
		// limit either: one crash leaves LocalDNS down until someone
		// starts it, its own cache and plugins gone.
		return finding{Info, pr9439Fix}, "a crash is never restarted: LocalDNS stays down after its first crash and dnsstandby answers"
	case "on-watchdog", "on-abort":
		// Only some failures restart it: an exit with an error code (and,
		// for on-watchdog, a signal) leaves it down, as above.
		return finding{Info, pr9439Fix}, "only some crashes are restarted: the others leave LocalDNS down and dnsstandby answers"
	default:
		return finding{Info, pr9439Fix}, fmt.Sprintf("unknown Restart=%q", u.Restart)
	}
	// systemd's start limit is off when either value is 0 (ratelimit_configured).
	if u.StartInterval == 0 || u.StartLimit == 0 {
		return finding{Pass, ""}, "no start limit: restarted however often it crashes"
	}
	// systemd counts starts in a fixed window: StartLimitBurst starts, each
	// RestartSec after the last crash (plus LocalDNS's own start-up, left
	// out here to stay on the safe side), spread over at least
	// burst × RestartSec. When that reaches the interval, the window ends
	// before the limit is hit.
	loop := time.Duration(u.StartLimit) * u.RestartSec
	if u.RestartSec > 0 && loop/u.RestartSec != time.Duration(u.StartLimit) {
		loop = math.MaxInt64 // overflow: hours of restarts
	}
	if loop >= u.StartInterval {
		return finding{Pass, ""}, "a crash loop cannot reach the start limit (StartLimitBurst × RestartSec ≥ StartLimitIntervalSec)"
	}
	if loop >= minCrashLoop {
		// Bounded, as PR 9439 means it to be: a crash loop longer than
		// this ends failed, which is what dnsstandby is for.
		return finding{Pass, ""}, fmt.Sprintf("a crash loop spends the start limit only after about %s (at least PR 9439's budget); longer, it stays failed and dnsstandby answers", roundSpan(loop))
	}
	return finding{Info, pr9439Fix},
		fmt.Sprintf("a crash loop spends the start limit in about %s, then the unit stays failed and dnsstandby answers alone (with PR 9439's backoff a burst of crashes settles instead)", roundSpan(loop))
}

// activeFinding weighs the unit's current state. A unit that is down now
// is worth a warning (dnsstandby answers alone), not a failure: whether
// pods are answered meanwhile is the dnsstandby and reuseport-group rows'
// business.
func activeFinding(unit, state string) finding {
	switch state {
	case "failed":
		return finding{Warn, "find why in journalctl -u " + unit + ", then systemctl reset-failed " + unit + " && systemctl start " + unit}
	case "inactive":
		return finding{Warn, "systemctl start " + unit}
	}
	return finding{Pass, ""} // active, or on its way (activating, reloading, deactivating)
}

// roundSpan prints a crash loop's length for the report in seconds, as
// the crash reports and PR 9439 speak of them: "0.5s", "60s".
func roundSpan(d time.Duration) string {
	return strconv.FormatFloat(d.Round(100*time.Millisecond).Seconds(), 'f', -1, 64) + "s"
}
