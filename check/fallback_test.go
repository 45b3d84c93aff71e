package check

import (
	"errors"
	"strings"
	"testing"

	"github.com/dnsstandby/dnsstandby/status"
	"github.com/dnsstandby/dnsstandby/takeover/peer"
)

func TestFallbackResult(t *testing.T) {
	daemonSees := func(design string, pid int) daemonFacts {
		st := &status.Daemon{}
		st.LocalDNSFallback, st.LocalDNSFallbackPID = design, pid
		return daemonFacts{Status: st}
	}
	noChain := fallbackFacts{LocalDNSUnit: DefaultLocalDNSUnit, Unit: peer.DefaultFallbackUnit}
	with := func(out string, unitErr error, chain bool, chainErr error) fallbackFacts {
		f := noChain
		f.UnitOut, f.UnitErr, f.Chain, f.ChainErr = out, unitErr, chain, chainErr
		return f
	}
	tests := []struct {
		name   string
		f      fallbackFacts
		d      daemonFacts
		status Status
		found  []string // substrings of Found
	}{
		{"not installed", with(showMissing, nil, false, nil), daemonFacts{}, Pass,
			[]string{"localdns-fallback.service", "LOCALDNS-FALLBACK", "not present"}},
		{"installed, inactive", with(show("ActiveState=inactive", "MainPID=0"), nil, false, nil), daemonSees("", 0), Info,
			[]string{"localdns-fallback.service installed, inactive"}},
		{"running, the daemon sees it", with(show("MainPID=4242"), nil, false, nil), daemonSees("coredns", 4242), Info,
			[]string{"localdns-fallback.service installed, active (MainPID 4242)", "dnsstandby sees coredns (pid 4242)"}},
		{"nat chain", with(show("ActiveState=inactive", "MainPID=0"), nil, true, nil), daemonSees("nat", 0), Info,
			[]string{"nat chain LOCALDNS-FALLBACK present", "dnsstandby sees nat"}},
		{"in a container: nothing readable, the daemon sees nat", with("", errors.New("no systemd"), false, errors.New("no iptables")), daemonSees("nat", 0), Info,
			[]string{"LOCALDNS-FALLBACK not known", "dnsstandby sees nat"}},
		{"nothing readable, nothing seen", with("", errors.New("no systemd"), false, errors.New("no iptables")), daemonFacts{Err: errors.New("not running")}, Pass,
			[]string{"not present", "not known"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := fallbackResult(tt.f, tt.d)
			if r.Name != "localdns-fallback" || r.Status != tt.status || r.Status > Info {
				t.Errorf("%s %s: %s, want %s (never worse than INFO)", r.Name, r.Status, r.Found, tt.status)
			}
			for _, s := range tt.found {
				if !strings.Contains(r.Found, s) {
					t.Errorf("Found %q lacks %q", r.Found, s)
				}
			}
			if (r.Status == Info) != (r.Fix != "") {
				t.Errorf("Fix %q with status %s", r.Fix, r.Status)
			}
		})
	}
}
