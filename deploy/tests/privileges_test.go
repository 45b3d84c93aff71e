package tests

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dnsstandby/dnsstandby/internal/gendoc"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
	"github.com/dnsstandby/dnsstandby/internal/testkit"
)

// privilegeCase is one row of docs/privileges.md's table: dnsstandby run
// with the DaemonSet's args but --steering=auto, as root with caps only,
// in the node's PID namespace or in one of its own (a pod without
// hostPID), and the level it reaches.
type privilegeCase struct {
	name    string
	caps    []string // capabilities kept (bounding and inheritable sets)
	hostPID bool
	level   string // dnsstandby_steer_level and `dnsstandby status`'s steering line
	adopted bool   // LocalDNS's UDP socket in the steering map on both listeners
	anchor  bool   // dnsstandby_anchor_ready 1
	tap     bool   // the packet tap runs
	lost    string // what the row costs, for the document
}

// privilegeCases are measured by TestPrivilegeLevels and written into
// docs/privileges.md by TestPrivilegeLevelsDocs.
var privilegeCases = []privilegeCase{
	{"the DaemonSet and the unit", []string{"NET_BIND_SERVICE", "NET_ADMIN", "NET_RAW", "BPF", "SYS_PTRACE"}, true, "adopt", true, true, true,
		"nothing"},
	{"the DaemonSet without hostPID", []string{"NET_BIND_SERVICE", "NET_ADMIN", "NET_RAW", "BPF", "SYS_PTRACE"}, false, "adopt", false, true, true,
		"LocalDNS's sockets: level adopt, but nothing adopted (its processes are not in the PID namespace), so it steers as own"},
	{"deploy/kubernetes-reduced", []string{"NET_BIND_SERVICE", "NET_ADMIN", "NET_RAW", "BPF"}, false, "own", false, true, true,
		"adopting LocalDNS's sockets: in mirror dnsstandby answers its hash share of queries itself; a hold keeps only what reaches our socket"},
	{"without SYS_PTRACE with host PIDs", []string{"NET_BIND_SERVICE", "NET_ADMIN", "NET_RAW", "BPF"}, true, "own", false, true, true,
		"as deploy/kubernetes-reduced"},
	{"without BPF", []string{"NET_BIND_SERVICE", "NET_ADMIN", "NET_RAW", "SYS_PTRACE"}, true, "off", false, true, true,
		"the steering program: the kernel's hash shares every query between LocalDNS and dnsstandby, in every mode, and no hold; the tap falls back to a classic filter, which a pod behind a bridge can forge replies into"},
	{"NET_BIND_SERVICE alone", []string{"NET_BIND_SERVICE"}, false, "off", false, false, false,
		"steering, the anchor (LocalDNS's cleanup takes .10 and .11 off the node) and the tap (nothing mirrored into the cache)"},
}

// TestPrivilegeLevels runs dnsstandby beside a real CoreDNS as LocalDNS
// (localDNSNode) with each privilegeCase and checks the steering level
// `--steering auto` reaches, in its metrics and in `dnsstandby status`,
// and what else works. Needs root, CoreDNS (make bin/coredns), setpriv
// and unshare (util-linux). About 5 s a case.
func TestPrivilegeLevels(t *testing.T) {
	nstest.RequireRoot(t)
	nstest.CoreDNSBinary(t)
	setpriv, err1 := exec.LookPath("setpriv")
	unshare, err2 := exec.LookPath("unshare")
	if err1 != nil || err2 != nil {
		t.Skip("setpriv or unshare (util-linux) not installed")
	}
	m := loadManifest(t, readFile(t, daemonSetFile))
	args, err := m.expandArgs("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := ""
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--metrics-addr="); ok {
			metricsAddr = v
		}
		if strings.HasPrefix(a, "--steering=") {
			args[i] = "--steering=auto"
		}
	}
	bin := buildDNSStandby(t)
	ns, corefile := localDNSNode(t, "privs")

	for _, tc := range privilegeCases {
		t.Run(tc.name, func(t *testing.T) {
			runArgs := caseArgs(t, args, corefile)
			var admin string
			for _, a := range runArgs {
				if v, ok := strings.CutPrefix(a, "--admin-socket="); ok {
					admin = v
				}
			}
			set := "-all"
			for _, c := range tc.caps {
				set += ",+" + strings.ToLower(c)
			}
			cmd := append([]string{setpriv, "--bounding-set", set, "--inh-caps", set, "--no-new-privs", "--", bin}, runArgs...)
			if !tc.hostPID {
				// A PID namespace and a /proc of its own, as a container
				// without hostPID has; SIGTERM to unshare reaches dnsstandby.
				cmd = append([]string{"--pid", "--fork", "--mount-proc", "--kill-child=SIGTERM", "--"}, cmd...)
			} else {
				cmd = cmd[1:]
			}
			name := setpriv
			if !tc.hostPID {
				name = unshare
			}
			p := nstest.Start(t, ns, name, cmd...)
			t.Cleanup(func() {
				_ = p.Signal(syscall.SIGTERM)
				select {
				case <-p.Done():
				case <-time.After(10 * time.Second):
				}
				_ = p.Stop()
				_ = ns.DelLink("dnsstandby")
			})
			want := map[string]float64{
				`dnsstandby_steer_level{level="` + tc.level + `"}`: 1,
				`dnsstandby_anchor_ready`:                          b2f(tc.anchor),
			}
			if tc.adopted {
				want[`dnsstandby_steer_peers{group="169.254.10.10:53/udp"}`] = 1
				want[`dnsstandby_steer_peers{group="169.254.10.11:53/udp"}`] = 1
			}
			var last error
			testkit.Eventually(t, 15*time.Second, "dnsstandby at level "+tc.level, func() bool {
				r := &capsRun{}
				select {
				case <-p.Done():
					t.Fatalf("dnsstandby exited:\n%s", p.Output())
				default:
				}
				if r.metrics, last = scrape(ns, metricsAddr); last != nil {
					return false
				}
				if last = r.expect(want); last != nil {
					return false
				}
				_, tap := r.value(`dnsstandby_mirror_tap_enabled{listener="169.254.10.11:53"}`)
				if tap != tc.tap {
					last = fmt.Errorf("tap running %v, want %v", tap, tc.tap)
					return false
				}
				if !tc.adopted && tc.level != "off" {
					// Nothing adopted: the peer gauges say 0.
					if v, _ := r.value(`dnsstandby_steer_peers{group="169.254.10.11:53/udp"}`); v != 0 {
						last = fmt.Errorf("%v LocalDNS sockets adopted, want none", v)
						return false
					}
				}
				return true
			})
			if t.Failed() {
				t.Logf("last: %v\n%s", last, p.Output())
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, bin, "status", "--admin-socket", admin).CombinedOutput()
			if err != nil {
				t.Fatalf("dnsstandby status: %v\n%s", err, out)
			}
			lines := strings.Split(string(out), "\n")
			i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "steering:") })
			if i < 0 || !strings.HasPrefix(lines[i], "steering:  "+tc.level+" ") {
				t.Errorf("dnsstandby status: want steering %s:\n%s", tc.level, out)
			}
			t.Logf("dnsstandby status:\n%s", grepStatus(string(out), "steering:", "anchor:", "localdns:", "mirror:"))
		})
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// grepStatus keeps the status lines that start with one of prefixes.
func grepStatus(out string, prefixes ...string) string {
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		for _, p := range prefixes {
			if strings.HasPrefix(l, p) {
				keep = append(keep, l)
			}
		}
	}
	return strings.Join(keep, "\n")
}

// TestPrivilegeLevelsDocs writes privilegeCases into docs/privileges.md.
func TestPrivilegeLevelsDocs(t *testing.T) {
	var b strings.Builder
	b.WriteString("| run as | capabilities | host PIDs | `--steering auto` reaches | LocalDNS's sockets adopted | anchor | tap | lost |\n|---|---|---|---|---|---|---|---|\n")
	yes := map[bool]string{true: "yes", false: "no"}
	for _, c := range privilegeCases {
		fmt.Fprintf(&b, "| %s | %s | %s | **%s** | %s | %s | %s | %s |\n", c.name, strings.Join(c.caps, " "), yes[c.hostPID], c.level,
			yes[c.adopted], yes[c.anchor], yes[c.tap], c.lost)
	}
	gendoc.Check(t, filepath.Join(moduleRoot(t), "docs", "privileges.md"), "privilege-levels", b.String())
}
