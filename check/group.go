package check

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/dnsstandby/dnsstandby/takeover/peer"
)

// standbyComm is the daemon's process name (/proc/PID/comm): it tells
// dnsstandby's sockets from LocalDNS's when the daemon's PID is not known.
const standbyComm = "dnsstandby"

// groupFacts are the members of one listen address's reuseport groups:
// every UDP socket and TCP listener bound to it, with owner UID and the
// process holding it (peer.FindSockets).
type groupFacts struct {
	Addr           netip.AddrPort
	UDP, TCP       []peer.Socket
	UDPErr, TCPErr error
}

// side is whose a socket is.
type side int

const (
	sideLocalDNS side = iota // anything that is not dnsstandby: the daemon's own rule
	sideStandby
	sideUnknown // held by no process this audit can see
)

func sideOf(s peer.Socket, daemonPID int) side {
	switch {
	case s.PID == 0:
		return sideUnknown
	case (daemonPID != 0 && s.PID == daemonPID) || s.Comm == standbyComm:
		return sideStandby
	}
	return sideLocalDNS
}

// standbyPIDs are the processes holding dnsstandby's sockets, found by name.
func standbyPIDs(groups []groupFacts) []int {
	var pids []int
	for _, g := range groups {
		for _, s := range slices.Concat(g.UDP, g.TCP) {
			if s.Comm == standbyComm && !slices.Contains(pids, s.PID) {
				pids = append(pids, s.PID)
			}
		}
	}
	slices.Sort(pids)
	return pids
}

// describe sums up one group's members for the report:
// "coredns[812] uid 0, dnsstandby[640] uid 0 ×2".
func describe(socks []peer.Socket) string {
	if len(socks) == 0 {
		return "none"
	}
	type owner struct {
		comm string
		pid  int
		uid  uint32
	}
	counts := map[owner]int{}
	var order []owner
	for _, s := range socks {
		o := owner{s.Comm, s.PID, s.UID}
		if o.pid == 0 {
			o.comm = "owner not visible"
		}
		if counts[o] == 0 {
			order = append(order, o)
		}
		counts[o]++
	}
	slices.SortFunc(order, func(a, b owner) int { return cmp.Or(cmp.Compare(a.comm, b.comm), cmp.Compare(a.pid, b.pid)) })
	parts := make([]string, len(order))
	for i, o := range order {
		p := fmt.Sprintf("%s[%d] uid %d", o.comm, o.pid, o.uid)
		if o.pid == 0 {
			p = fmt.Sprintf("%s uid %d", o.comm, o.uid)
		}
		if counts[o] > 1 {
			p += fmt.Sprintf(" ×%d", counts[o])
		}
		parts[i] = p
	}
	return strings.Join(parts, ", ")
}

// groupResult judges one listen address's groups: LocalDNS and dnsstandby
// both in them, under one UID. daemonPID is the daemon's process as its
// status reports it, or 0.
func groupResult(g groupFacts, daemonPID int) Result {
	name := "reuseport-group " + g.Addr.String()
	if g.UDPErr != nil || g.TCPErr != nil {
		return Result{Name: name, Status: Warn, Found: fmt.Sprintf("cannot list sockets: %v", cmp.Or(g.UDPErr, g.TCPErr)),
			Fix: "run dnsstandby check as root, in the node's network namespace (UDP needs the udp_diag module)"}
	}
	found := fmt.Sprintf("udp: %s; tcp: %s", describe(g.UDP), describe(g.TCP))
	var more []finding

	// The kernel puts sockets in one reuseport group only if their owners
	// share an effective UID: the second bind fails (or, with SO_REUSEADDR
	// on UDP, the two share without steering).
	for _, socks := range [][]peer.Socket{g.UDP, g.TCP} {
		uids := map[uint32]bool{}
		var localUID uint32
		for _, s := range socks {
			uids[s.UID] = true
			if sideOf(s, daemonPID) == sideLocalDNS {
				localUID = s.UID
			}
		}
		if len(uids) > 1 {
			found += ": owners have different UIDs, the kernel will not let them share a group"
			more = append(more, finding{Fail, fmt.Sprintf("run dnsstandby as LocalDNS's UID %d (User= in dnsstandby.service)", localUID)})
			break
		}
	}

	var local, standby, unknown int
	for _, s := range g.UDP {
		switch sideOf(s, daemonPID) {
		case sideLocalDNS:
			local++
		case sideStandby:
			standby++
		default:
			unknown++
		}
	}
	switch {
	case unknown > 0:
		found += ": some owners are not visible"
		more = append(more, finding{Warn, "run dnsstandby check as root, so it can see which process holds each socket"})
	case local == 0 && standby == 0:
		// Nothing answers: pods' queries are refused (ICMP port
		// unreachable) until one of the two binds again.
		found += ": nothing listens on UDP, pods' queries go unanswered"
		more = append(more, finding{Fail, "systemctl start dnsstandby localdns.service"})
	case local == 0:
		found += ": LocalDNS has no UDP socket (it is down), dnsstandby answers everything"
		more = append(more, finding{Warn, "systemctl status localdns.service says why LocalDNS is down"})
	case standby == 0:
		found += ": dnsstandby has no UDP socket, nothing stands by if LocalDNS fails"
		more = append(more, finding{Warn, standbyFix})
	}
	return verdict(name, found, more...)
}
