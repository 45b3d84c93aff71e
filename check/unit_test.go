package check

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestParseTimespan(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		err  bool
	}{
		{"100ms", 100 * time.Millisecond, false},
		{"2s", 2 * time.Second, false},
		{"5min", 5 * time.Minute, false},
		{"10s", 10 * time.Second, false},
		{"1min 30s", 90 * time.Second, false},
		{"1.500000s", 1500 * time.Millisecond, false},
		{"500us", 500 * time.Microsecond, false},
		{"1h 2min", time.Hour + 2*time.Minute, false},
		{"0", 0, false},
		{"300", 300 * time.Second, false}, // a bare number is seconds, as systemd reads it
		{"infinity", math.MaxInt64, false},
		{"", 0, true},
		{"2 parsecs", 0, true},
		{"fast", 0, true},
	}
	for _, tt := range tests {
		got, err := parseTimespan(tt.in)
		if (err != nil) != tt.err || got != tt.want {
			t.Errorf("parseTimespan(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.err)
		}
	}
}

// systemctl show --property=LoadState,ActiveState,Restart,RestartUSec,
// StartLimitBurst,StartLimitIntervalUSec,KillMode,MainPID as systemd 252
// printed it in the lab's guests (bench/cmd/lab): in its own order, not
// the order asked, and for a unit that does not exist its defaults with
// LoadState=not-found.
const (
	showPR9439 = `Restart=on-failure
RestartUSec=2s
MainPID=90
KillMode=mixed
LoadState=loaded
ActiveState=active
StartLimitIntervalUSec=12min
StartLimitBurst=5
`
	showShipped = `Restart=on-failure
RestartUSec=100ms
MainPID=90
KillMode=mixed
LoadState=loaded
ActiveState=active
StartLimitIntervalUSec=10s
StartLimitBurst=5
`
	showMissing = `Restart=no
RestartUSec=100ms
MainPID=0
KillMode=control-group
LoadState=not-found
ActiveState=inactive
StartLimitIntervalUSec=10s
StartLimitBurst=5
`
)

// show builds `systemctl show` output in that order: the shipped unit's,
// with overrides.
func show(overrides ...string) string {
	props := map[string]string{
		"Restart": "on-failure", "RestartUSec": "100ms", "MainPID": "90", "KillMode": "mixed",
		"StartLimitIntervalUSec": "10s", "StartLimitBurst": "5", "LoadState": "loaded", "ActiveState": "active",
	}
	for _, o := range overrides {
		k, v, _ := strings.Cut(o, "=")
		props[k] = v
	}
	var b strings.Builder
	for _, k := range []string{"Restart", "RestartUSec", "MainPID", "KillMode", "LoadState", "ActiveState", "StartLimitIntervalUSec", "StartLimitBurst"} {
		b.WriteString(k + "=" + props[k] + "\n")
	}
	return b.String()
}

func TestLocalDNSUnitResult(t *testing.T) {
	pr9439 := []string{"RestartUSec=2s", "StartLimitIntervalUSec=12min", "StartLimitBurst=5"}
	tests := []struct {
		name      string
		out       string
		err       error
		want      Status
		wantFound string // a part of Found
		wantFix   string // a part of Fix
	}{
		// As AKS ships it: systemd's defaults, 5 starts 100 ms apart in 10
		// s. Advice, not a failure: dnsstandby answers while it is down.
		{"shipped", showShipped, nil, Info, "localdns.service active (MainPID 90): Restart=on-failure RestartSec=100ms StartLimitBurst=5 StartLimitIntervalSec=10s KillMode=mixed; a crash loop spends the start limit in about 0.5s", "StartLimitIntervalSec=720, StartLimitBurst=5"},
		// AgentBaker PR 9439 as reviewed: 5 starts 2 s apart in 720 s.
		{"pr9439", showPR9439, nil, Pass, "RestartSec=2s StartLimitBurst=5 StartLimitIntervalSec=12min KillMode=mixed; a crash loop spends the start limit only after about 10s", ""},
		// PR 9439's first revision: 30 starts 2 s apart in 300 s.
		{"pr9439 first revision", show("RestartUSec=2s", "StartLimitIntervalUSec=5min", "StartLimitBurst=30"), nil, Pass, "only after about 60s", ""},
		{"missing", showMissing, nil, Warn, "localdns.service is not-found: LocalDNS does not run here, dnsstandby then is the only responder", "--localdns-unit"},
		{"same as built", show(pr9439...), nil, Pass, "only after about 10s", ""},
		{"pr9439 restarting", show(append(pr9439, "ActiveState=activating", "MainPID=0")...), nil, Pass, "activating", ""},
		{"masked", show("LoadState=masked", "ActiveState=inactive"), nil, Warn, "masked", "unmask"},
		{"bad setting", show("LoadState=bad-setting"), nil, Warn, "did not load (bad-setting)", "daemon-reload"},
		{"no start limit", show("StartLimitIntervalUSec=0"), nil, Pass, "no start limit", ""},
		{"burst zero", show("StartLimitBurst=0"), nil, Pass, "no start limit", ""},
		// 5 × 3 s ≥ 10 s: the window ends before the fifth restart.
		{"limit out of reach", show("RestartUSec=3s"), nil, Pass, "cannot reach the start limit", ""},
		{"exactly out of reach", show("RestartUSec=2s"), nil, Pass, "cannot reach the start limit", ""},
		// 5 s of crash loop: better than shipped, still short of PR 9439.
		{"short budget", show("RestartUSec=1s", "StartLimitIntervalUSec=12min"), nil, Info, "in about 5s", "RestartSec=2"},
		{"restart no", show(append(pr9439, "Restart=no")...), nil, Info, "never restarted", "Restart=on-failure"},
		{"restart on-success", show("Restart=on-success"), nil, Info, "never restarted", "Restart=on-failure"},
		{"restart on-watchdog", show(append(pr9439, "Restart=on-watchdog")...), nil, Info, "only some crashes", ""},
		{"restart always", show(append(pr9439, "Restart=always")...), nil, Pass, "Restart=always", ""},
		{"failed now", show(append(pr9439, "ActiveState=failed", "MainPID=0")...), nil, Warn, "failed", "reset-failed"},
		{"stopped", show(append(pr9439, "ActiveState=inactive", "MainPID=0")...), nil, Warn, "inactive", "systemctl start localdns.service"},
		{"kill mode none", show(append(pr9439, "KillMode=none")...), nil, Info, "KillMode=none", "KillMode=mixed"},
		// Two pieces of advice: the first found is the row's.
		{"shipped with kill mode none", show("KillMode=none"), nil, Info, "KillMode=none", "StartLimitBurst=5"},
		// Down now outranks advice: dnsstandby answers alone.
		{"shipped and failed", show("ActiveState=failed", "MainPID=0"), nil, Warn, "in about 0.5s", "reset-failed"},
		{"no systemd", "", errors.New("System has not been booted with systemd"), Warn, "cannot read", "on the node itself"},
		{"property missing", "LoadState=loaded\n", nil, Warn, "no ActiveState", "systemctl show"},
		{"bad number", show("StartLimitBurst=many"), nil, Warn, "StartLimitBurst", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := localdnsUnitResult("localdns.service", tt.out, tt.err, where{})
			if r.Name != "localdns-unit" || r.Status != tt.want {
				t.Fatalf("%s %s, want %s: %s (fix: %s)", r.Name, r.Status, tt.want, r.Found, r.Fix)
			}
			checkRow(t, r, tt.wantFound, tt.wantFix)
		})
	}
}

// checkRow checks what every row must hold: a one-line Found containing
// wantFound, and a one-line Fix containing wantFix exactly when it did not
// pass.
func checkRow(t *testing.T, r Result, wantFound, wantFix string) {
	t.Helper()
	if !strings.Contains(r.Found, wantFound) {
		t.Errorf("found %q does not mention %q", r.Found, wantFound)
	}
	if strings.Contains(r.Found, "\n") || strings.Contains(r.Fix, "\n") {
		t.Errorf("found or fix spans lines: %q / %q", r.Found, r.Fix)
	}
	if (r.Status == Pass) != (r.Fix == "") {
		t.Errorf("status %s with fix %q: a fix is wanted exactly when not PASS", r.Status, r.Fix)
	}
	if !strings.Contains(r.Fix, wantFix) {
		t.Errorf("fix %q does not mention %q", r.Fix, wantFix)
	}
}
