package check

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/dnsstandby/dnsstandby/corefile"
	"github.com/dnsstandby/dnsstandby/status"
)

// localdnsDefaultListeners are the listeners AgentBaker's Corefile gives
// LocalDNS: the node's (kubelet, hostNetwork and dnsPolicy:Default pods)
// and the pods' (dnsPolicy:ClusterFirst).
func localdnsDefaultListeners() []netip.AddrPort {
	return []netip.AddrPort{status.NodeListen, status.DefaultListen}
}

// corefileFacts is where LocalDNS's Corefile says LocalDNS listens, or
// why that is not known.
type corefileFacts struct {
	Tried []string // the paths looked for, in order
	Path  string   // the first of them that exists; "" when none does
	Err   error    // Path could not be read, or not parsed
	// Listeners are the addresses some block of the Corefile serves plain
	// DNS on, the defaults first.
	Listeners []netip.AddrPort
}

// corefileListeners finds the addresses LocalDNS serves, from its Corefile
// (data, read from file): 169.254.10.10:53 and 169.254.10.11:53, and every
// address a block's bind names (corefile.Source.Listeners).
func corefileListeners(file string, data []byte) ([]netip.AddrPort, error) {
	// A Corefile CoreDNS refuses serves nowhere: LocalDNS does not start.
	src, err := corefile.ReadFrom(file, bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	return src.Listeners(localdnsDefaultListeners())
}

// localdnsListenersResult judges whether dnsstandby stands in for LocalDNS
// on every listener LocalDNS serves: a listener it does not serve goes
// unanswered when LocalDNS fails. AKS's LocalDNS serves two, the node's
// 169.254.10.10:53 and the pods' 169.254.10.11:53.
func localdnsListenersResult(f corefileFacts, d daemonFacts) Result {
	const name = "localdns-listeners"
	fixPath := "give --localdns-corefile the Corefile LocalDNS runs (its CoreDNS's -conf: ps -C coredns -o args)"
	switch {
	case f.Path == "":
		return Result{Name: name, Status: Warn,
			Found: "LocalDNS's Corefile is not at " + strings.Join(f.Tried, " nor ") + ": which listeners LocalDNS serves is not known",
			Fix:   fixPath}
	case f.Err != nil:
		found := fmt.Sprintf("cannot read LocalDNS's Corefile %s: %v", f.Path, f.Err)
		if ce := (*corefile.Error)(nil); errors.As(f.Err, &ce) {
			found = fmt.Sprintf("LocalDNS's Corefile %s is refused (%s): CoreDNS would not start with it either: %v", f.Path, corefile.Reason(f.Err), f.Err)
		}
		return Result{Name: name, Status: Warn, Found: found, Fix: "fix the Corefile, or " + fixPath}
	case len(f.Listeners) == 0:
		return Result{Name: name, Status: Warn,
			Found: fmt.Sprintf("no block of %s serves plain DNS on %s or on an address it binds", f.Path, joinAddrPorts(localdnsDefaultListeners())),
			Fix:   fixPath}
	}
	served := f.Listeners
	var more []finding
	found := fmt.Sprintf("LocalDNS serves %s (%s)", joinAddrPorts(served), f.Path)
	var listen []netip.AddrPort
	if d.Status != nil && d.Status.Config != nil {
		for _, s := range d.Status.Config.Listen {
			if ap, err := netip.ParseAddrPort(s); err == nil {
				listen = append(listen, ap)
			}
		}
	}
	switch {
	case d.Status == nil:
		return Result{Name: name, Status: Warn, Found: found + "; dnsstandby's listen addresses are not known: its status is not",
			Fix: "see the dnsstandby row"}
	case len(listen) == 0:
		return Result{Name: name, Status: Warn, Found: found + "; the daemon does not report its listen addresses",
			Fix: "run a dnsstandby as new as this check"}
	}
	var uncovered []netip.AddrPort
	for _, ap := range served {
		if !corefile.Covers(listen, ap) {
			uncovered = append(uncovered, ap)
		}
	}
	found += "; dnsstandby listens on " + joinAddrPorts(listen)
	if len(uncovered) > 0 {
		found += ": " + joinAddrPorts(uncovered) + " not covered, unanswered when LocalDNS fails"
		add := make([]string, len(uncovered))
		for i, ap := range uncovered {
			add[i] = "--listen " + ap.String()
		}
		more = slices.Insert(more, 0, finding{Warn, "add " + strings.Join(add, " ") + " to dnsstandby's options (/etc/default/dnsstandby, or the DaemonSet's args) and restart it"})
	}
	return verdict(name, found, more...)
}

func joinAddrPorts(aps []netip.AddrPort) string {
	s := make([]string, len(aps))
	for i, ap := range aps {
		s[i] = ap.String()
	}
	return strings.Join(s, ", ")
}
