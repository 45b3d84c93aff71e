package check

import (
	"github.com/dnsstandby/dnsstandby/status"

	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/takeover/peer"
)

// daemon returns a healthy daemon's status: mirror at level adopt,
// LocalDNS's UDP socket adopted, the tap feeding, the anchor ready;
// edit changes it.
func daemon(edit ...func(*status.Daemon)) *status.Daemon {
	ready := true
	st := &status.Daemon{
		PID:       640,
		Config:    &status.Config{Steering: "auto", Mirror: "tap", Listen: []string{"169.254.10.11:53"}, AnchorLink: "dnsstandby"},
		Upstreams: []status.Upstream{{Zone: ".", Server: "10.0.0.10:53", Healthy: true}},
		Mirror:    &status.Mirror{Feed: "tap", Running: true, Enabled: true, Accepted: 1200, Rejected: 30},
		Cache:     &status.Cache{Entries: 1000, Bytes: 300 << 10, MaxEntries: 100000, MaxBytes: 64 << 20},
	}
	st.Mode, st.Reason, st.Since = "mirror", "peer-healthy", time.Now().Add(-time.Minute)
	st.Steering.Level = "adopt"
	st.Steering.Why = "adopt: eBPF and pidfd_getfd available"
	st.Peer.Bound = true
	st.Peer.Adopted = map[string]int{"169.254.10.11:53/udp": 1, "169.254.10.11:53/tcp": 0}
	st.AnchorReady = &ready
	for _, e := range edit {
		e(st)
	}
	return st
}

func TestDaemonResult(t *testing.T) {
	notReady := false
	until := time.Now().Add(5 * time.Minute)
	noSocket := fmt.Errorf("admin socket /run/dnsstandby/admin.sock: %w", &fs.PathError{Op: "dial", Path: "x", Err: syscall.ENOENT})
	denied := fmt.Errorf("admin socket: %w", syscall.EACCES)
	running := []groupFacts{{UDP: []peer.Socket{{Comm: "dnsstandby", PID: 640}}}}
	tests := []struct {
		name      string
		d         daemonFacts
		groups    []groupFacts
		want      Status
		wantFound string
		wantFix   string
	}{
		{"mirror", daemonFacts{Status: daemon()}, nil, Pass, "pid 640, mode mirror (peer-healthy)", ""},
		{"not running", daemonFacts{Err: noSocket}, nil, Fail, "not running", "systemctl start dnsstandby"},
		{"running, admin socket elsewhere", daemonFacts{Err: noSocket}, running, Warn, "runs (pid 640)", "--admin-socket"},
		{"not root", daemonFacts{Err: denied}, nil, Warn, "permission denied", "as root"},
		{"takeover", daemonFacts{Status: daemon(func(s *status.Daemon) { s.Mode, s.Reason = "takeover", "peer-exit" })}, nil, Warn, "answers everything", "localdns.service"},
		{"operator hold", daemonFacts{Status: daemon(func(s *status.Daemon) { s.Mode, s.Reason, s.Holding, s.HoldUntil = "hold", "operator", true, &until })}, nil, Warn, "operator hold until", "dnsstandby release"},
		{"hung", daemonFacts{Status: daemon(func(s *status.Daemon) { s.Mode, s.Reason = "hold", "peer-hung" })}, nil, Warn, "does not answer its probes", "hung"},
		{"hold-down", daemonFacts{Status: daemon(func(s *status.Daemon) { s.Mode, s.Reason = "hold", "start" })}, nil, Warn, "hold-down", "wait a few seconds"},
		{"no anchor asked for", daemonFacts{Status: daemon(func(s *status.Daemon) { s.AnchorReady, s.Config.AnchorLink = nil, "" })}, nil, Warn, "no address anchor (--anchor-link '')", "--anchor-link"},
		{"anchor failed", daemonFacts{Status: daemon(func(s *status.Daemon) { s.AnchorReady = nil })}, nil, Warn, "link dnsstandby could not be made", "journalctl -u dnsstandby"},
		{"no anchor, older daemon", daemonFacts{Status: daemon(func(s *status.Daemon) { s.AnchorReady, s.Config = nil, nil })}, nil, Warn, "no address anchor", "journalctl -u dnsstandby"},
		{"anchor not ready", daemonFacts{Status: daemon(func(s *status.Daemon) { s.AnchorReady = &notReady })}, nil, Warn, "anchor not in place", "CAP_NET_ADMIN"},
		// A status without the check's figures (an older daemon) still
		// has everything this row needs but the PID.
		{"older daemon", daemonFacts{Status: daemon(func(s *status.Daemon) { s.PID = 0 })}, nil, Pass, "mode mirror", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := daemonResult(tt.d, tt.groups)
			if r.Name != "dnsstandby" || r.Status != tt.want {
				t.Fatalf("%s %s, want %s: %s (fix: %s)", r.Name, r.Status, tt.want, r.Found, r.Fix)
			}
			checkRow(t, r, tt.wantFound, tt.wantFix)
		})
	}
}

func TestSteeringResult(t *testing.T) {
	tests := []struct {
		name      string
		st        *status.Daemon
		want      Status
		wantFound string
		wantFix   string
	}{
		{"adopt", daemon(), Pass, "level adopt (wanted auto); LocalDNS sockets adopted: 169.254.10.11:53/tcp 0, 169.254.10.11:53/udp 1", ""},
		{"own by necessity", daemon(func(s *status.Daemon) {
			s.Steering.Level, s.Steering.Why = "own", "own: pidfd_getfd not permitted (CAP_SYS_PTRACE missing)"
		}), Warn, "level own (wanted auto); own: pidfd_getfd not permitted", "CAP_SYS_PTRACE"},
		{"off by request", daemon(func(s *status.Daemon) { s.Steering.Level, s.Config.Steering = "off", "off" }), Warn, "wanted off", "--steering auto"},
		{"udp not adopted in mirror", daemon(func(s *status.Daemon) { s.Peer.Adopted["169.254.10.11:53/udp"] = 0 }), Warn, "mirror shares by the kernel's hash", "CAP_SYS_PTRACE"},
		// In takeover LocalDNS has nothing to adopt.
		{"takeover, nothing adopted", daemon(func(s *status.Daemon) {
			s.Mode, s.Peer.Bound, s.Peer.Adopted = "takeover", false, map[string]int{"169.254.10.11:53/udp": 0}
		}), Pass, "level adopt", ""},
		{"older daemon", daemon(func(s *status.Daemon) { s.Config = nil }), Pass, "wanted auto", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, ok := steeringResult(daemonFacts{Status: tt.st})
			if !ok || r.Name != "steering" || r.Status != tt.want {
				t.Fatalf("%v %s %s, want %s: %s (fix: %s)", ok, r.Name, r.Status, tt.want, r.Found, r.Fix)
			}
			checkRow(t, r, tt.wantFound, tt.wantFix)
		})
	}
	if _, ok := steeringResult(daemonFacts{Err: errors.New("down")}); ok {
		t.Error("a steering row without a status")
	}
}

func TestConfigResult(t *testing.T) {
	src := func(s status.Source) *status.Daemon {
		return daemon(func(d *status.Daemon) { d.Config.Source = &s })
	}
	refused := "/opt/azure/containers/localdns/updated.localdns.corefile:59: unknown directive 'froward'"
	tests := []struct {
		name      string
		st        *status.Daemon
		want      Status
		wantFound string
		wantFix   string
	}{
		{"the Corefile", src(status.Source{From: "file", Corefile: "/c", SHA256: "0123456789abcdef"}), Pass, "from the Corefile /c (sha256 0123456789ab)", ""},
		{"flags", src(status.Source{From: "flags"}), Pass, "from the flags", ""},
		{"last known good", src(status.Source{From: "last-good", Corefile: "/c", Applied: "2026-12-01T10:00:00Z", Refused: refused, Reason: "unknown_directive"}), Warn,
			"the Corefile is refused (unknown_directive): " + refused + "; dnsstandby serves the last known good, from /c, first applied 2026-12-01T10:00:00Z", "fix the Corefile"},
		{"fallback", src(status.Source{From: "fallback", Refused: refused, Reason: "unknown_directive", LastGood: "decode: unexpected EOF"}), Warn,
			"dnsstandby serves the fallback upstreams: no last known good (decode: unexpected EOF)", "applies it as soon as it is good"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, ok := configResult(daemonFacts{Status: tt.st})
			if !ok || r.Name != "config" || r.Status != tt.want {
				t.Fatalf("%v %s %s, want %s: %s (fix: %s)", ok, r.Name, r.Status, tt.want, r.Found, r.Fix)
			}
			checkRow(t, r, tt.wantFound, tt.wantFix)
		})
	}
	for _, d := range []daemonFacts{{Err: errors.New("down")}, {Status: daemon(func(s *status.Daemon) { s.Config.Source = nil })}} {
		if _, ok := configResult(d); ok {
			t.Errorf("a config row for %+v", d)
		}
	}
}

func TestMirrorResult(t *testing.T) {
	later := daemon(func(s *status.Daemon) { s.Mirror.Accepted = 1250 })
	tests := []struct {
		name      string
		d         daemonFacts
		want      Status
		wantFound string
		wantFix   string
	}{
		{"tap feeding", daemonFacts{Status: daemon(), Later: later, Window: time.Second}, Pass, "tap feeding the cache; replies accepted 1200, rejected 30 since start (accepted 50 in the last 1s)", ""},
		{"tap paused in takeover", daemonFacts{Status: daemon(func(s *status.Daemon) { s.Mode, s.Mirror.Enabled = "takeover", false })}, Pass, "paused while dnsstandby answers itself (mode takeover)", ""},
		{"tap paused in mirror", daemonFacts{Status: daemon(func(s *status.Daemon) { s.Mirror.Enabled = false })}, Warn, "tap paused although LocalDNS answers", "steering row"},
		{"tap with the classic filter", daemonFacts{Status: daemon(func(s *status.Daemon) { s.Mirror.LocalOnly = new(false) })}, Warn, "classic filter", "CAP_BPF"},
		{"tap with the eBPF filter", daemonFacts{Status: daemon(func(s *status.Daemon) { s.Mirror.LocalOnly = new(true) })}, Pass, "tap feeding", ""},
		{"tap not running", daemonFacts{Status: daemon(func(s *status.Daemon) { s.Mirror.Running, s.Mirror.Enabled = false, false })}, Warn, "not running", "CAP_NET_RAW"},
		{"none", daemonFacts{Status: daemon(func(s *status.Daemon) { *s.Mirror = status.Mirror{Feed: "none"} })}, Warn, "--mirror none", "--mirror tap"},
		{"dnstap connected", daemonFacts{Status: daemon(func(s *status.Daemon) { s.Mirror.Feed, s.Mirror.Connections = "dnstap", 1 })}, Pass, "dnstap feeding", ""},
		{"dnstap unconnected", daemonFacts{Status: daemon(func(s *status.Daemon) { s.Mirror.Feed = "dnstap" })}, Warn, "not connected", "dnstap SOCKET full"},
		{"older daemon", daemonFacts{Status: daemon(func(s *status.Daemon) { s.Mirror = nil })}, Warn, "does not report", "as new"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, ok := mirrorResult(tt.d)
			if !ok || r.Name != "mirror" || r.Status != tt.want {
				t.Fatalf("%v %s %s, want %s: %s (fix: %s)", ok, r.Name, r.Status, tt.want, r.Found, r.Fix)
			}
			checkRow(t, r, tt.wantFound, tt.wantFix)
		})
	}
}

func TestCacheResult(t *testing.T) {
	tests := []struct {
		name      string
		c         *status.Cache
		want      Status
		wantFound string
	}{
		{"room", &status.Cache{Entries: 1000, Bytes: 300 << 10, MaxEntries: 100000, MaxBytes: 64 << 20}, Pass, "1000 of 100000 entries, 300 KiB of 64.0 MiB, 0 evictions"},
		{"full by entries", &status.Cache{Entries: 100000, Bytes: 30 << 20, Evictions: 812, MaxEntries: 100000, MaxBytes: 64 << 20}, Warn, "full, evicting"},
		{"full by bytes", &status.Cache{Entries: 50000, Bytes: 64 << 20, Evictions: 3, MaxEntries: 100000, MaxBytes: 64 << 20}, Warn, "full, evicting"},
		// Full without evictions: just filled, nothing lost yet.
		{"full, no evictions yet", &status.Cache{Entries: 100000, MaxEntries: 100000, MaxBytes: 64 << 20}, Pass, "0 evictions"},
		{"older daemon", nil, Warn, "does not report"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, ok := cacheResult(daemonFacts{Status: daemon(func(s *status.Daemon) { s.Cache = tt.c })})
			if !ok || r.Status != tt.want {
				t.Fatalf("%v %s, want %s: %s", ok, r.Status, tt.want, r.Found)
			}
			checkRow(t, r, tt.wantFound, "")
		})
	}
}

func TestUpstreamTargets(t *testing.T) {
	st := daemon(func(s *status.Daemon) {
		s.Upstreams = append(s.Upstreams, status.Upstream{Zone: "example.com.", Server: "10.0.0.20:53"})
	})
	flags := []netip.AddrPort{netip.MustParseAddrPort("10.0.0.10:53"), netip.MustParseAddrPort("10.0.0.30:53")}
	got := upstreamTargets(st, flags, "cluster.local")
	want := []upstreamTarget{
		{"10.0.0.10:53", ".", "cluster.local."},
		{"10.0.0.20:53", "example.com.", "example.com."},
		{"10.0.0.30:53", ".", "cluster.local."},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if got := upstreamTargets(nil, nil, "cluster.local"); len(got) != 0 {
		t.Fatalf("got %v without a daemon or flags", got)
	}
}

func TestUpstreamResult(t *testing.T) {
	target := upstreamTarget{Server: "10.0.0.10:53", Zone: ".", Question: "cluster.local."}
	ok := upstreamProbe{upstreamTarget: target, Rcode: dns.RcodeSuccess, RTT: 420 * time.Microsecond}
	other := upstreamTarget{Server: "10.0.0.11:53", Zone: ".", Question: "cluster.local."}
	timeout := upstreamProbe{upstreamTarget: other, Err: errors.New("timed out after 2s")}
	refused := upstreamProbe{upstreamTarget: other, Rcode: dns.RcodeRefused, RTT: time.Millisecond}
	nx := upstreamProbe{upstreamTarget: upstreamTarget{Server: "10.0.0.20:53", Zone: "example.com.", Question: "example.com."}, Rcode: dns.RcodeNameError, RTT: time.Millisecond}
	tests := []struct {
		name      string
		probes    []upstreamProbe
		reported  bool
		want      Status
		wantFound string
		wantFix   string
	}{
		{"answers", []upstreamProbe{ok}, true, Pass, "10.0.0.10:53 NOERROR for SOA cluster.local. in 420µs", ""},
		{"nxdomain is an answer", []upstreamProbe{ok, nx}, true, Pass, "10.0.0.20:53 (zone example.com.) NXDOMAIN", ""},
		{"one of two", []upstreamProbe{ok, timeout}, true, Warn, "10.0.0.11:53 no answer: timed out", "check 10.0.0.11:53"},
		{"refused", []upstreamProbe{ok, refused}, true, Warn, "REFUSED", "10.0.0.11:53"},
		{"none answers", []upstreamProbe{timeout}, true, Fail, "no upstream answers", "route"},
		{"nothing to test", nil, false, Warn, "daemon does not report", "--upstream"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := upstreamResult(tt.probes, tt.reported)
			if r.Name != "upstreams" || r.Status != tt.want {
				t.Fatalf("%s %s, want %s: %s (fix: %s)", r.Name, r.Status, tt.want, r.Found, r.Fix)
			}
			checkRow(t, r, tt.wantFound, tt.wantFix)
		})
	}
}

func TestReport(t *testing.T) {
	tests := []struct {
		statuses []Status
		want     int
	}{
		{nil, 0},
		{[]Status{Pass, Pass}, 0},
		{[]Status{Pass, Warn, Pass}, 1},
		{[]Status{Warn, Fail, Pass}, 2},
	}
	for _, tt := range tests {
		var r Report
		for i, s := range tt.statuses {
			r.Results = append(r.Results, Result{Name: fmt.Sprint(i), Status: s})
		}
		if got := r.ExitCode(); got != tt.want {
			t.Errorf("%v: exit code %d, want %d", tt.statuses, got, tt.want)
		}
	}

	r := Report{Results: []Result{{Name: "a", Status: Pass, Found: "x"}, {Name: "b", Status: Warn, Found: "y", Fix: "z"}}}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"status":"WARN","results":[{"name":"a","status":"PASS","found":"x"},{"name":"b","status":"WARN","found":"y","fix":"z"}]}`
	if string(b) != want {
		t.Fatalf("JSON\n%s\nwant\n%s", b, want)
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil || len(back.Results) != 2 || back.Results[1].Status != Warn {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
	if err := json.Unmarshal([]byte(`{"results":[{"status":"MAYBE"}]}`), &back); err == nil || !strings.Contains(err.Error(), "MAYBE") {
		t.Fatalf("bad status accepted: %v", err)
	}
}
