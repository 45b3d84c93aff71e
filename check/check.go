// Package check audits a node for dnsstandby (`dnsstandby check`): is
// LocalDNS's unit able to stay down for good, do pods ask 169.254.10.11 at
// all, are the listen addresses local, do LocalDNS and dnsstandby share
// one reuseport group, does dnsstandby listen wherever LocalDNS's Corefile
// has LocalDNS listen, and what does the running daemon report (steering,
// mode, upstreams, mirror feed, cache).
//
// It only reads: `systemctl show`, files (kubelet's, LocalDNS's Corefile), netlink and sock_diag dumps,
// /proc, and the daemon's admin socket. The one thing it sends is a DNS
// query to each upstream, to see that it answers. It binds nothing on the
// listen addresses and changes no unit, file or setting.
//
// The work is split in two: gathering (gather.go: every system call, each
// fact with its error) and deciding (one small pure function per check,
// in the file of its subject), so that every decision is table-tested
// without a node.
package check

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/dnsstandby/dnsstandby/admin"
	"github.com/dnsstandby/dnsstandby/takeover/peer"
)

// Status is a check's verdict. Its order matters: a row folding several
// findings takes the worst, and a report is as bad as its worst row. Only
// WARN and FAIL change the exit code: SKIP and INFO say something worth
// reading about a node where dnsstandby does its job.
type Status int

const (
	Pass Status = iota // as it should be
	Skip               // not checkable from here (a container): run on the node
	Info               // advice about LocalDNS's own setup; dnsstandby covers for it
	Warn               // dnsstandby works, with a risk: weaker than it should be, or not known
	Fail               // dnsstandby cannot do its job: pods' DNS is, or can become, unanswered
)

var statusNames = [...]string{Pass: "PASS", Skip: "SKIP", Info: "INFO", Warn: "WARN", Fail: "FAIL"}

// String returns "PASS", "SKIP", "INFO", "WARN" or "FAIL".
func (s Status) String() string {
	if s >= 0 && int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("Status(%d)", int(s))
}

// MarshalText writes the status as String does, so JSON says "PASS".
func (s Status) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads what MarshalText writes.
func (s *Status) UnmarshalText(b []byte) error {
	for i, n := range statusNames {
		if string(b) == n {
			*s = Status(i)
			return nil
		}
	}
	return fmt.Errorf("check status %q: want PASS, SKIP, INFO, WARN or FAIL", b)
}

// Result is one row of the report.
type Result struct {
	Name   string `json:"name"`          // what was checked, e.g. "localdns-unit"
	Status Status `json:"status"`        // PASS, SKIP, INFO, WARN or FAIL
	Found  string `json:"found"`         // what was found, one line
	Fix    string `json:"fix,omitempty"` // one line: the fix, or for SKIP and INFO the advice; empty when PASS
}

// Report is every row, in the order the checks ran.
type Report struct {
	Results []Result `json:"results"`
}

// Worst is the status of the worst row (Pass for an empty report).
func (r Report) Worst() Status {
	w := Pass
	for _, res := range r.Results {
		w = max(w, res.Status)
	}
	return w
}

// Overall is the report's verdict: FAIL when any row failed, else WARN
// when any warned, else PASS (rows skipped or with advice included).
func (r Report) Overall() Status {
	if w := r.Worst(); w >= Warn {
		return w
	}
	return Pass
}

// ExitCode is the command's exit code: 0 when no row warned or failed
// (PASS, SKIP and INFO rows), 1 when some warned and none failed, 2 when
// any failed.
func (r Report) ExitCode() int {
	switch r.Overall() {
	case Fail:
		return 2
	case Warn:
		return 1
	}
	return 0
}

// MarshalJSON adds the overall status to the rows, so a script reads one
// field.
func (r Report) MarshalJSON() ([]byte, error) {
	type plain Report // without this method
	return json.Marshal(struct {
		Status Status `json:"status"`
		plain
	}{r.Overall(), plain(r)})
}

// Config says what to audit and where to look.
type Config struct {
	// LocalDNSUnit is LocalDNS's systemd unit (localdns.service).
	LocalDNSUnit string
	// FallbackUnit is AKS's LocalDNS fallback unit
	// (localdns-fallback.service).
	FallbackUnit string
	// LocalDNSCorefile is LocalDNS's Corefile, which says the listeners
	// LocalDNS serves: a path, or several separated by commas of which
	// the first that exists is read, as `dnsstandby run
	// --localdns-corefile` reads it.
	LocalDNSCorefile string
	// KubeletConfig is kubelet's config file; "" means the --config named
	// in KubeletFlags, else DefaultKubeletConfig.
	KubeletConfig string
	// KubeletFlags is the environment file holding kubelet's flags
	// (/etc/default/kubelet on AKS).
	KubeletFlags string
	// Listen are dnsstandby's (and LocalDNS's) pod-facing addresses; nil
	// means those the daemon reports, else status.DefaultListen.
	Listen []netip.AddrPort
	// AdminSocket is the daemon's control socket.
	AdminSocket string
	// Upstreams are tested besides the ones the daemon reports.
	Upstreams []netip.AddrPort
	// ClusterDomain is asked for (its SOA) when an upstream serves the root
	// zone; "" means the kubelet config's clusterDomain, else cluster.local.
	ClusterDomain string
	// Timeout bounds each probe: one DNS query, one admin request.
	Timeout time.Duration
	// MirrorWindow is how long to watch the mirror feed's counters to say
	// what it accepted recently; 0 reads them once.
	MirrorWindow time.Duration
}

// Defaults for Config, as on an AKS node and for dnsstandby's own flags.
const (
	DefaultLocalDNSUnit = "localdns.service"
	// DefaultLocalDNSCorefile: on an AKS node, what LocalDNS's CoreDNS
	// runs (localdns.sh writes it at each start), then what it is written
	// from.
	DefaultLocalDNSCorefile = "/opt/azure/containers/localdns/updated.localdns.corefile,/opt/azure/containers/localdns/localdns.corefile"
	DefaultKubeletConfig    = "/var/lib/kubelet/config.yaml"
	DefaultKubeletFlags     = "/etc/default/kubelet"
	DefaultClusterDomain    = "cluster.local"
	// DefaultTimeout: a reachable upstream on the cluster network answers
	// a SOA query for its own zone in milliseconds; one that takes longer
	// than this is as good as unreachable for a pod whose resolver waits 5 s
	// in all.
	DefaultTimeout = 2 * time.Second
	// DefaultMirrorWindow: long enough to see replies on a node with any
	// pod traffic, short enough that the audit stays quick.
	DefaultMirrorWindow = time.Second
)

// DefaultConfig returns the defaults for every field.
func DefaultConfig() Config {
	return Config{
		LocalDNSUnit:     DefaultLocalDNSUnit,
		FallbackUnit:     peer.DefaultFallbackUnit,
		LocalDNSCorefile: DefaultLocalDNSCorefile,
		KubeletFlags:     DefaultKubeletFlags,
		AdminSocket:      admin.DefaultSocket,
		Timeout:          DefaultTimeout,
		MirrorWindow:     DefaultMirrorWindow,
	}
}

// finding is one thing a check noticed, for checks that weigh several: the
// row gets the worst status and that finding's fix.
type finding struct {
	status Status
	fix    string
}

// verdict folds findings into a row: the worst status wins, and its first
// fix is the row's (a row has room for one).
func verdict(name, found string, fs ...finding) Result {
	r := Result{Name: name, Status: Pass, Found: found}
	for _, f := range fs {
		if f.status > r.Status {
			r.Status, r.Fix = f.status, f.fix
		}
	}
	return r
}

// joinFound joins parts of a Found line, skipping empty ones.
func joinFound(parts ...string) string {
	var keep []string
	for _, p := range parts {
		if p != "" {
			keep = append(keep, p)
		}
	}
	return strings.Join(keep, "; ")
}
