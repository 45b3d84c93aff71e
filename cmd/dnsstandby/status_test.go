package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dnsstandby/dnsstandby/admin"
	"github.com/dnsstandby/dnsstandby/cache"
	"github.com/dnsstandby/dnsstandby/check"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/mirror/dnstap"
	"github.com/dnsstandby/dnsstandby/takeover"
	"github.com/dnsstandby/dnsstandby/upstream"
)

// fakeController stands in for the takeover controller behind the admin
// socket.
type fakeController struct{ st takeover.Status }

func (f fakeController) Status() any              { return f.st }
func (fakeController) Hold(d time.Duration) error { return nil }
func (fakeController) Release() error             { return nil }

// mirrorStatus returns a healthy controller status: mirror at level adopt,
// LocalDNS's UDP socket on listen adopted, the anchor ready.
func mirrorStatus(listen netip.AddrPort) takeover.Status {
	var st takeover.Status
	st.Mode, st.Reason, st.Since = "mirror", "peer-healthy", time.Now().Add(-time.Minute)
	st.Steering.Level = "adopt"
	st.Peer.Bound = true
	st.Peer.Adopted = map[string]int{listen.String() + "/udp": 1}
	ready := true
	st.AnchorReady = &ready
	return st
}

// TestStatusForCheck runs the admin socket with the status wrapper over
// the parts run registers (cache, an upstream group under its zone label,
// a dnstap receiver), checks that `dnsstandby status` and `dnsstandby
// check` both read what it answers, and runs the audit against it.
func TestStatusForCheck(t *testing.T) {
	dir := t.TempDir()
	up := startUpstream(t)
	listen := nstest.FreeLoopbackAddr(t)
	tapPath := filepath.Join(dir, "dnstap.sock")
	sock := filepath.Join(dir, "admin.sock")
	o, err := parseRunFlags([]string{"--listen", listen.String(), "--upstream", up.String(),
		"--mirror", "dnstap:" + tapPath, "--cache-max-entries", "500", "--steering", "auto"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	c, err := cache.New(cache.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(c)
	reply := new(dns.Msg)
	reply.SetQuestion("svc.example.", dns.TypeA)
	reply.Response = true
	rr, _ := dns.NewRR("svc.example. 60 IN A 192.0.2.1")
	reply.Answer = []dns.RR{rr}
	if err := c.InsertMsg(reply); err != nil {
		t.Fatal(err)
	}
	g, err := upstream.New(upstream.Config{Servers: []netip.AddrPort{up}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	prometheus.WrapRegistererWith(prometheus.Labels{"zone": "."}, reg).MustRegister(g)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	rx, err := dnstap.Listen(ctx, dnstap.Config{Path: tapPath}, c.InsertMirror)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rx.Close() })
	reg.MustRegister(rx)

	srv, err := admin.Listen(sock, newStatusHandler(fakeController{mirrorStatus(listen)}, o, reg), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })

	resp, err := admin.Do(ctx, sock, admin.Request{Cmd: "status"})
	if err != nil {
		t.Fatal(err)
	}
	var ds check.DaemonStatus
	if err := json.Unmarshal(resp.Status, &ds); err != nil {
		t.Fatal(err)
	}
	if ds.PID != os.Getpid() || ds.Mode != "mirror" || ds.Steering.Level != "adopt" {
		t.Errorf("pid %d mode %s level %s", ds.PID, ds.Mode, ds.Steering.Level)
	}
	if ds.Config == nil || ds.Config.Steering != "auto" || ds.Config.Mirror != "dnstap:"+tapPath || strings.Join(ds.Config.Listen, ",") != listen.String() {
		t.Errorf("config %+v", ds.Config)
	}
	if len(ds.Upstreams) != 1 || ds.Upstreams[0] != (check.DaemonUpstream{Zone: ".", Server: up.String(), Healthy: true}) {
		t.Errorf("upstreams %+v", ds.Upstreams)
	}
	if m := ds.Mirror; m == nil || *m != (check.DaemonMirror{Feed: "dnstap", Running: true, Enabled: true}) {
		t.Errorf("mirror %+v", m)
	}
	if cs := ds.Cache; cs == nil || cs.Entries != 1 || cs.Bytes == 0 || cs.MaxEntries != 500 || cs.MaxBytes != 64<<20 {
		t.Errorf("cache %+v", cs)
	}

	// `dnsstandby status` reads the same answer as a takeover.Status.
	var out, errb bytes.Buffer
	if code := dispatch([]string{"status", "--admin-socket", sock}, &out, &errb); code != exitOK || !strings.Contains(out.String(), "mode:      mirror (peer-healthy)") {
		t.Fatalf("status: exit %d\n%s%s", code, out.String(), errb.String())
	}

	// The audit. The listen address gets a socket of this process, which
	// the daemon's status names as its own (PID): dnsstandby's side of the
	// group, with no LocalDNS beside it.
	pc, err := net.ListenPacket("udp", listen.String())
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	kubelet := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(kubelet, []byte("clusterDNS:\n- 127.0.0.1\nclusterDomain: example.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	errb.Reset()
	code := dispatch([]string{"check", "--json", "--admin-socket", sock, "--kubelet-config", kubelet,
		"--kubelet-flags", filepath.Join(dir, "absent"), "--localdns-unit", "dnsstandby-test-absent.service", "--mirror-window", "50ms"}, &out, &errb)
	t.Logf("dnsstandby check --json (exit %d):\n%s", code, out.String())
	var rep check.Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("exit %d, unreadable JSON: %v\n%s%s", code, err, out.String(), errb.String())
	}
	got := map[string]check.Result{}
	for _, r := range rep.Results {
		got[r.Name] = r
	}
	for name, want := range map[string]check.Status{
		// No systemd here, or no such unit: either way not known.
		"localdns-unit":                     check.Warn,
		"cluster-dns":                       check.Pass,
		"address " + listen.Addr().String(): check.Pass,
		// Only dnsstandby's socket: LocalDNS is down.
		"reuseport-group " + listen.String(): check.Warn,
		"dnsstandby":                         check.Pass,
		"steering":                           check.Pass,
		"upstreams":                          check.Pass,
		"mirror":                             check.Warn, // no CoreDNS streams dnstap here
		"cache":                              check.Pass,
	} {
		r, ok := got[name]
		if !ok {
			t.Errorf("no row %q in %s", name, out.String())
			continue
		}
		if r.Status != want {
			t.Errorf("%s: %s, want %s: %s (fix: %s)", name, r.Status, want, r.Found, r.Fix)
		}
	}
	if len(got) != 9 {
		t.Errorf("%d rows, want 9:\n%s", len(got), out.String())
	}
	if g := got["reuseport-group "+listen.String()]; !strings.Contains(g.Found, "uid") || !strings.Contains(g.Found, "LocalDNS has no UDP socket") {
		t.Errorf("group row: %s", g.Found)
	}
	if u := got["upstreams"]; !strings.Contains(u.Found, up.String()+" NOERROR for SOA example.") {
		t.Errorf("upstreams row (the cluster domain from kubelet's config): %s", u.Found)
	}
	if code != 1 || rep.ExitCode() != 1 {
		t.Errorf("exit %d, want 1 (WARN)", code)
	}
}
