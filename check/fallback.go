package check

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
)

// fallbackChain is the iptables nat chain of the fallback's nat design.
const fallbackChain = "LOCALDNS-FALLBACK"

// fallbackFacts is what the node shows of AKS's LocalDNS fallback.
type fallbackFacts struct {
	LocalDNSUnit string // whose failure starts it
	Unit         string
	UnitOut      string // systemctl show's output
	UnitErr      error
	// Chain: the nat chain exists (true), does not (false), or is not
	// known (ChainErr).
	Chain    bool
	ChainErr error
}

// readFallback asks systemd for the fallback's unit and iptables for its
// chain (`iptables -S`, read-only).
func readFallback(ctx context.Context, localdnsUnit, unit string) fallbackFacts {
	f := fallbackFacts{LocalDNSUnit: localdnsUnit, Unit: unit}
	f.UnitOut, f.UnitErr = systemctlShow(ctx, unit)
	ctx, cancel := context.WithTimeout(ctx, systemctlTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "iptables", "-w", "-t", "nat", "-S", fallbackChain).CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		f.Chain = true
	case errors.As(err, &ee) && strings.Contains(string(out), "No chain"):
		// iptables says so: absent.
	default:
		f.ChainErr = fmt.Errorf("iptables -t nat -S %s: %w: %s", fallbackChain, err, strings.TrimSpace(string(out)))
	}
	return f
}

// fallbackResult reports AKS's own LocalDNS fallback: its unit (a second
// CoreDNS on 169.254.10.11 once localdns.service has failed) and its nat
// chain, and what the daemon sees of it. Never worse than INFO: the
// fallback is the platform's, and dnsstandby works beside each design
// (docs/design.md, Beside AKS's LocalDNS fallback).
func fallbackResult(f fallbackFacts, d daemonFacts) Result {
	const name = "localdns-fallback"
	var parts []string
	present := false
	if f.UnitErr == nil {
		if u, err := parseUnitShow(f.UnitOut); err == nil && u.LoadState == "loaded" {
			present = true
			s := fmt.Sprintf("%s installed, %s", f.Unit, u.ActiveState)
			if u.MainPID != 0 {
				s += fmt.Sprintf(" (MainPID %d)", u.MainPID)
			}
			parts = append(parts, s)
		}
	}
	switch {
	case f.ChainErr != nil:
		parts = append(parts, fmt.Sprintf("nat chain %s not known (%v)", fallbackChain, f.ChainErr))
	case f.Chain:
		present = true
		parts = append(parts, "nat chain "+fallbackChain+" present: queries to the listen addresses are DNATed away")
	}
	if st := d.Status; st != nil && st.LocalDNSFallback != "" {
		present = true
		parts = append(parts, "dnsstandby sees "+st.FallbackText())
	}
	if !present {
		found := "AKS's LocalDNS fallback (" + f.Unit + ", nat chain " + fallbackChain + ") not present"
		if len(parts) > 0 {
			found += "; " + strings.Join(parts, "; ")
		}
		return Result{Name: name, Status: Pass, Found: found}
	}
	return Result{Name: name, Status: Info, Found: "AKS's LocalDNS fallback: " + strings.Join(parts, "; "),
		Fix: "it starts only once " + f.LocalDNSUnit + " has failed for good, and its ExecStartPre stops it: fix and start LocalDNS; dnsstandby answers meanwhile (coredns design) or keeps its cache warm (nat)"}
}
