// Package peer finds and watches LocalDNS (the CoreDNS process whose
// SO_REUSEPORT sockets dnsstandby shares) from dnsstandby's side.
//
//   - FindSockets lists the sockets other than ours bound to a listen address
//     (UDP sockets and TCP listeners), with the UID that owns them, through
//     sock_diag, and the process holding each, through /proc/PID/fd.
//   - Process holds such a process by a pidfd: Exited learns of its exit the
//     moment it happens, and DupSocket duplicates one of its sockets
//     (pidfd_getfd) for the steering program's socket map.
//   - Watcher combines both into a State that changes at once when LocalDNS
//     exits and within a rescan interval when it binds again.
//   - Prober asks LocalDNS a question from a fixed source port (which the
//     steering program routes to LocalDNS's socket) and tells a reply from
//     LocalDNS from one dnsstandby gave itself (NSID).
//
// sock_diag and the probe socket see the network namespace of the thread
// that creates them (FindSockets, StartWatcher, NewProber); /proc and pidfds
// see the PID namespace of the process (on Kubernetes: hostPID).
package peer

import (
	"errors"
	"fmt"
	"net/netip"
)

// Proto is a transport protocol of a listen socket.
type Proto string

// The protocols a DNS listen address is served on.
const (
	UDP Proto = "udp"
	TCP Proto = "tcp"
)

// SelfNSID is the NSID dnsstandby answers with: a reply that
// carries it came from dnsstandby, not LocalDNS.
const SelfNSID = "dnsstandby"

// Socket is one of LocalDNS's sockets as the kernel reports it.
type Socket struct {
	Proto Proto          `json:"proto"`          // UDP, or TCP (listeners only)
	Addr  netip.AddrPort `json:"addr"`           // the bound address and port
	Inode uint64         `json:"inode"`          // the socket's inode: socket:[Inode] in /proc/PID/fd
	UID   uint32         `json:"uid"`            // the socket's owner UID (the creator's effective UID)
	PID   int            `json:"pid,omitempty"`  // a process holding it, or 0 if none is visible in /proc
	Comm  string         `json:"comm,omitempty"` // that process's name (/proc/PID/comm), or ""
	Unit  string         `json:"unit,omitempty"` // that process's systemd unit (/proc/PID/cgroup), or ""
}

// String describes the socket for logs: address, protocol, inode, UID and
// holder (with its systemd unit, when known).
func (s Socket) String() string {
	owner := "owner not visible"
	if s.PID != 0 {
		owner = fmt.Sprintf("%s[%d]", s.Comm, s.PID)
		if s.Unit != "" {
			owner += " in " + s.Unit
		}
	}
	return fmt.Sprintf("%s/%s inode %d uid %d %s", s.Addr, s.Proto, s.Inode, s.UID, owner)
}

// Errors that callers may want to tell apart (errors.Is).
var (
	// ErrSelfReply means a probe was answered by dnsstandby itself (NSID
	// SelfNSID), which proves nothing about LocalDNS: the steering program
	// did not route the probe's source port to LocalDNS's socket.
	ErrSelfReply = errors.New("reply came from dnsstandby itself (NSID " + SelfNSID + "), not from LocalDNS")
	// ErrSocketNotHeld means the process holds no file descriptor for the
	// socket (it closed it, or exited).
	ErrSocketNotHeld = errors.New("process holds no such socket")
)
