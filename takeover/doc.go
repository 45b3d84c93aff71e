// Package takeover decides who answers the listen addresses — LocalDNS or
// dnsstandby — and makes the kernel follow.
//
// It owns the mode machine (mirror, hold, takeover) and the parts that
// carry its decisions out: the anchor that keeps the listen addresses
// local (anchor), the watch on LocalDNS's sockets and the probes of its
// health (peer), and the eBPF steering of the reuseport groups (steer).
// Controller ties them together.
//
// It never reaches into the pipeline or the responder: from the daemon it
// gets their sockets (to steer and to tell from LocalDNS's), a Healthy
// func (the heartbeat is sent only while it returns nil) and an Answered
// counter (for the event log). It only chooses where the kernel sends
// queries, and tells the daemon through OnMirrorSafe when LocalDNS's
// replies may be mirrored.
package takeover
