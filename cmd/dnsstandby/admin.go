package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/dnsstandby/dnsstandby/admin"
	"github.com/dnsstandby/dnsstandby/status"
)

// adminCommand runs status, hold or release against a running daemon.
func adminCommand(cmd string, args []string, stdout, stderr io.Writer) int {
	fs, o := adminFlags(cmd)
	if err := parseWithEnv(fs, args, os.LookupEnv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return exitOK
		}
		fmt.Fprintf(stderr, "dnsstandby %s: %v\n", cmd, err)
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "dnsstandby %s: unexpected argument %q\n", cmd, fs.Arg(0))
		return exitUsage
	}
	req := admin.Request{Cmd: cmd}
	if o.holdFor > 0 {
		req.For = o.holdFor.String()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := admin.Do(ctx, o.path, req)
	if err != nil {
		fmt.Fprintf(stderr, "dnsstandby %s: %v\n", cmd, err)
		return exitFail
	}
	if o.asJSON {
		fmt.Fprintf(stdout, "%s\n", resp.Status)
		return exitOK
	}
	var st status.Daemon
	if err := json.Unmarshal(resp.Status, &st); err != nil {
		fmt.Fprintf(stderr, "dnsstandby %s: unreadable status: %v\n", cmd, err)
		return exitFail
	}
	if resp.Replaced != nil {
		// A hold replaces the one in force: say so, first.
		fmt.Fprintf(stdout, "hold: now %s; was %s\n", admin.StatusHold(st), resp.Replaced)
	}
	printStatus(stdout, &st)
	return exitOK
}

// adminOptions are the settings of status, hold and release.
type adminOptions struct {
	path    string
	asJSON  bool
	holdFor time.Duration
}

// adminFlags binds the flags of status, hold or release (cmd).
func adminFlags(cmd string) (*flag.FlagSet, *adminOptions) {
	o := &adminOptions{}
	fs := flag.NewFlagSet("dnsstandby "+cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.path, "admin-socket", admin.DefaultSocket, "the daemon's control socket")
	fs.BoolVar(&o.asJSON, "json", false, "status: print the daemon's JSON")
	if cmd == "hold" {
		// Positive only: a hold of 0 would be one without end, which is
		// what leaving --for out says (and -h says so, with no default).
		fs.Var(positiveOrUnset(&o.holdFor), "for", "hold for this `DURATION`, then release by itself (without it: until dnsstandby release)")
	}
	return fs, o
}

// printStatus writes the status for a person.
func printStatus(w io.Writer, st *status.Daemon) {
	fmt.Fprintf(w, "mode:      %s (%s) since %s (%s ago)\n", st.Mode, st.Reason, st.Since.Format(time.RFC3339), time.Since(st.Since).Round(time.Second))
	if st.Holding {
		until := "until released"
		if st.HoldUntil != nil {
			until = "until " + st.HoldUntil.Format(time.RFC3339)
		}
		fmt.Fprintf(w, "hold:      operator hold %s\n", until)
	}
	if st.Config != nil && st.Config.Source != nil {
		printSource(w, st.Config.Source)
	}
	fmt.Fprintf(w, "steering:  %s", st.Steering.Level)
	if st.Steering.Why != "" {
		fmt.Fprintf(w, " (%s)", st.Steering.Why)
	}
	fmt.Fprintln(w)
	if st.AnchorReady != nil {
		fmt.Fprintf(w, "anchor:    ready=%v\n", *st.AnchorReady)
	}
	p := st.Peer
	fmt.Fprintf(w, "localdns:  bound=%v sockets=%d adopted=%s", p.Bound, len(p.Sockets), counts(p.Adopted))
	if len(p.Unadoptable) > 0 {
		fmt.Fprintf(w, " unadoptable(MPTCP)=%s", counts(p.Unadoptable))
	}
	fmt.Fprintf(w, " last probe ok=%v", p.LastProbe.OK)
	if p.LastProbe.Error != "" {
		fmt.Fprintf(w, " (%s)", p.LastProbe.Error)
	}
	fmt.Fprintln(w)
	for _, s := range p.Sockets {
		fmt.Fprintf(w, "           %s/%s pid %d (%s) uid %d\n", s.Addr, s.Proto, s.PID, s.Comm, s.UID)
	}
	for _, warn := range p.Warnings {
		fmt.Fprintf(w, "WARNING:   %s\n", warn)
	}
	fmt.Fprintf(w, "AKS LocalDNS fallback: %s\n", st.FallbackText())
	if m := st.Mirror; m != nil {
		fmt.Fprintf(w, "mirror:    %s running=%v inserting=%v accepted=%d rejected=%d", m.Feed, m.Running, m.Enabled, m.Accepted, m.Rejected)
		if m.LocalOnly != nil {
			fmt.Fprintf(w, " local-only=%v", *m.LocalOnly)
		}
		if m.Ring != nil {
			fmt.Fprintf(w, " ring=%v", *m.Ring)
		}
		fmt.Fprintln(w)
	}
	for _, h := range st.Hedging {
		fmt.Fprintf(w, "hedging:   %s tracking=%v tracked=%d hedges=%s localdns-later=%d silent=%d deadlines %gms/%gms\n",
			h.Listener, h.Tracking, h.Tracked, sources(h.Hedges), h.LocalDNSLater, h.Silent, h.CacheDeadlineMs, h.UpstreamDeadlineMs)
	}
	fmt.Fprintln(w, "recent mode changes:")
	evs := st.Events
	if len(evs) > 10 {
		evs = evs[len(evs)-10:]
	}
	for _, e := range evs {
		fmt.Fprintf(w, "  %s  %-8s %-16s %8.1fs  answered %d\n", e.Start.Format(time.RFC3339), e.Mode, e.Reason, e.DurationS, e.Answered)
	}
}

// printSource is the status's config line: where the configuration in
// force comes from, and, when it is not the Corefile, why not and how old
// what stands in is.
func printSource(w io.Writer, s *status.Source) {
	fmt.Fprintf(w, "config:    %s", s.From)
	if s.Corefile != "" {
		fmt.Fprintf(w, " %s sha256 %.12s", s.Corefile, s.SHA256)
	}
	if t, err := time.Parse(time.RFC3339, s.Applied); err == nil {
		fmt.Fprintf(w, " applied %s (%s ago)", s.Applied, time.Since(t).Round(time.Second))
	}
	fmt.Fprintln(w)
	if s.Refused != "" {
		fmt.Fprintf(w, "WARNING:   the Corefile is refused (%s): %s\n", s.Reason, s.Refused)
	}
	if s.LastGood != "" {
		fmt.Fprintf(w, "WARNING:   the last known good is unusable: %s\n", s.LastGood)
	}
}

// sources writes counts by source in a fixed order: "cache 3, stale 0,
// upstream 1".
func sources(m map[string]uint64) string {
	return fmt.Sprintf("cache %d, stale %d, upstream %d", m["cache"], m["stale"], m["upstream"])
}

// counts writes a count per reuseport group, in group order:
// "169.254.10.11:53/tcp 1, 169.254.10.11:53/udp 2", or "none".
func counts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, g := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", g, m[g]))
	}
	return strings.Join(parts, ", ")
}
