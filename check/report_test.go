package check

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"strings"
	"testing"

	"github.com/dnsstandby/dnsstandby/status"
)

// TestReportExitCode: FAIL is dnsstandby unable to do its job, WARN a
// risk; advice about LocalDNS's unit (INFO) and rows a container cannot
// see (SKIP) leave the exit code at 0.
func TestReportExitCode(t *testing.T) {
	listen := []netip.AddrPort{status.DefaultListen}
	pass := Result{Name: "dnsstandby", Status: Pass, Found: "pid 1, mode mirror"}
	container := where{true, "KUBERNETES_SERVICE_HOST is set: a Kubernetes pod"}
	noSystemctl := fmt.Errorf("systemctl show localdns.service: %w", errors.New(`exec: "systemctl": executable file not found in $PATH`))
	noKubelet := kubeletFacts{ConfigPath: DefaultKubeletConfig, ConfigErr: fs.ErrNotExist, FlagsPath: DefaultKubeletFlags, FlagsErr: fs.ErrNotExist}
	kubeletOK := kubeletFacts{ConfigPath: DefaultKubeletConfig, Config: kubeletConfig{ClusterDNS: []string{"169.254.10.11"}}, FlagsPath: DefaultKubeletFlags, FlagsErr: fs.ErrNotExist}

	tests := []struct {
		name     string
		rows     []Result
		want     int
		overall  Status
		wantRows map[string]Status // the rows that matter
		advice   string            // in some row's fix
	}{
		{"stock AKS node: the shipped unit is advice",
			[]Result{localdnsUnitResult("localdns.service", showShipped, nil, where{}), clusterDNSResult(kubeletOK, listen, where{}), pass},
			0, Pass, map[string]Status{"localdns-unit": Info, "cluster-dns": Pass}, "AgentBaker PR 9439"},
		{"stock AKS node with LocalDNS down now",
			[]Result{localdnsUnitResult("localdns.service", show("ActiveState=failed", "MainPID=0"), nil, where{}), pass},
			1, Warn, map[string]Status{"localdns-unit": Warn}, "reset-failed"},
		{"PR 9439's unit", []Result{localdnsUnitResult("localdns.service", showPR9439, nil, where{}), pass},
			0, Pass, map[string]Status{"localdns-unit": Pass}, ""},
		{"in the DaemonSet's container: what it cannot see is skipped",
			[]Result{localdnsUnitResult("localdns.service", "", noSystemctl, container), clusterDNSResult(noKubelet, listen, container), pass},
			0, Pass, map[string]Status{"localdns-unit": Skip, "cluster-dns": Skip}, "on the node itself"},
		{"on a node without systemd or kubelet: not known is a risk",
			[]Result{localdnsUnitResult("localdns.service", "", noSystemctl, where{}), clusterDNSResult(noKubelet, listen, where{}), pass},
			1, Warn, map[string]Status{"localdns-unit": Warn, "cluster-dns": Warn}, ""},
		{"in a container that sees the kubelet's files: checked",
			[]Result{clusterDNSResult(kubeletOK, listen, container), pass},
			0, Pass, map[string]Status{"cluster-dns": Pass}, ""},
		{"dnsstandby not running fails",
			[]Result{localdnsUnitResult("localdns.service", showShipped, nil, where{}), daemonResult(daemonFacts{Err: fs.ErrNotExist}, nil)},
			2, Fail, map[string]Status{"localdns-unit": Info, "dnsstandby": Fail}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := Report{Results: tt.rows}
			if got := rep.ExitCode(); got != tt.want || rep.Overall() != tt.overall {
				t.Errorf("exit %d, overall %s; want %d, %s: %+v", got, rep.Overall(), tt.want, tt.overall, rep.Results)
			}
			var advice []string
			for _, r := range rep.Results {
				if want, ok := tt.wantRows[r.Name]; ok && r.Status != want {
					t.Errorf("%s: %s, want %s: %s (fix: %s)", r.Name, r.Status, want, r.Found, r.Fix)
				}
				checkRow(t, r, "", "")
				advice = append(advice, r.Fix)
			}
			if !strings.Contains(strings.Join(advice, "\n"), tt.advice) {
				t.Errorf("no row advises %q: %q", tt.advice, advice)
			}
			b, err := json.Marshal(rep)
			if err != nil {
				t.Fatal(err)
			}
			var back struct {
				Status  Status   `json:"status"`
				Results []Result `json:"results"`
			}
			if err := json.Unmarshal(b, &back); err != nil || back.Status != tt.overall || len(back.Results) != len(rep.Results) {
				t.Errorf("JSON %s: read back %+v, %v", b, back, err)
			}
		})
	}
}

func TestDetectWhere(t *testing.T) {
	view := func(env map[string]string, files []string, ns map[string]string) sysView {
		return sysView{
			getenv: func(k string) (string, bool) { v, ok := env[k]; return v, ok },
			exists: func(p string) bool { return strings.Contains(strings.Join(files, " "), p) },
			readlink: func(p string) (string, error) {
				if v, ok := ns[p]; ok {
					return v, nil
				}
				return "", fs.ErrPermission
			},
		}
	}
	sameNS := map[string]string{"/proc/self/ns/mnt": "mnt:[4026531841]", "/proc/1/ns/mnt": "mnt:[4026531841]"}
	tests := []struct {
		name string
		v    sysView
		want bool
		why  string
	}{
		{"the node", view(nil, nil, sameNS), false, ""},
		{"the node, PID 1 not readable", view(nil, nil, nil), false, ""},
		{"a Kubernetes pod", view(map[string]string{"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, nil, sameNS), true, "Kubernetes pod"},
		{"podman", view(map[string]string{"container": "podman"}, nil, sameNS), true, "container=podman"},
		{"docker", view(nil, []string{"/.dockerenv"}, sameNS), true, "/.dockerenv exists"},
		{"the host's PID namespace, not its mounts", view(nil, nil, map[string]string{"/proc/self/ns/mnt": "mnt:[4026532301]", "/proc/1/ns/mnt": "mnt:[4026531841]"}), true, "mount namespace"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := detectWhere(tt.v)
			if w.Container != tt.want || !strings.Contains(w.Why, tt.why) {
				t.Errorf("got %+v, want container %v because %q", w, tt.want, tt.why)
			}
		})
	}
}
