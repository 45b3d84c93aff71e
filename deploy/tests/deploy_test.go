package tests

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/dnsstandby/dnsstandby/corefile"
)

// The Kubernetes files, relative to these tests (deploy/tests).
const (
	daemonSetFile = "../kubernetes/daemonset.yaml"
	alertsFile    = "../kubernetes/alerts.yaml"
	dashboardFile = "../kubernetes/dashboard.json"
)

// Where an AKS node keeps LocalDNS's Corefile, as the deploy files name
// it: the directory, and the --localdns-corefile value (the first that
// exists is read: what LocalDNS's CoreDNS runs, then what localdns.sh
// writes it from).
const (
	localdnsDir       = "/opt/azure/containers/localdns"
	localdnsCorefiles = localdnsDir + "/updated.localdns.corefile," + localdnsDir + "/localdns.corefile"
)

// LocalDNS's listeners, which the deploy files listen on, both.
var localdnsListeners = []string{"169.254.10.10:53", "169.254.10.11:53"}

// The parts of the Kubernetes API the manifest uses. Decoding is strict
// (KnownFields): a misspelled field, which the API server would drop or
// refuse, fails the test instead of being ignored.
type (
	kubeObject struct {
		APIVersion                   string         `yaml:"apiVersion"`
		Kind                         string         `yaml:"kind"`
		Metadata                     kubeMeta       `yaml:"metadata"`
		AutomountServiceAccountToken *bool          `yaml:"automountServiceAccountToken"`
		Spec                         *daemonSetSpec `yaml:"spec"`
	}
	kubeMeta struct {
		Name        string            `yaml:"name"`
		Namespace   string            `yaml:"namespace"`
		Labels      map[string]string `yaml:"labels"`
		Annotations map[string]string `yaml:"annotations"`
	}
	daemonSetSpec struct {
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		UpdateStrategy struct {
			Type          string `yaml:"type"`
			RollingUpdate *struct {
				MaxUnavailable *intOrString `yaml:"maxUnavailable"`
				MaxSurge       *intOrString `yaml:"maxSurge"`
			} `yaml:"rollingUpdate"`
		} `yaml:"updateStrategy"`
		MinReadySeconds int `yaml:"minReadySeconds"`
		Template        struct {
			Metadata kubeMeta `yaml:"metadata"`
			Spec     podSpec  `yaml:"spec"`
		} `yaml:"template"`
	}
	podSpec struct {
		ServiceAccountName            string            `yaml:"serviceAccountName"`
		AutomountServiceAccountToken  *bool             `yaml:"automountServiceAccountToken"`
		EnableServiceLinks            *bool             `yaml:"enableServiceLinks"`
		HostNetwork                   bool              `yaml:"hostNetwork"`
		HostPID                       bool              `yaml:"hostPID"`
		DNSPolicy                     string            `yaml:"dnsPolicy"`
		PriorityClassName             string            `yaml:"priorityClassName"`
		Tolerations                   []toleration      `yaml:"tolerations"`
		NodeSelector                  map[string]string `yaml:"nodeSelector"`
		TerminationGracePeriodSeconds *int              `yaml:"terminationGracePeriodSeconds"`
		Containers                    []container       `yaml:"containers"`
		Volumes                       []volume          `yaml:"volumes"`
	}
	toleration struct {
		Key      string `yaml:"key"`
		Operator string `yaml:"operator"`
		Value    string `yaml:"value"`
		Effect   string `yaml:"effect"`
	}
	container struct {
		Name            string   `yaml:"name"`
		Image           string   `yaml:"image"`
		ImagePullPolicy string   `yaml:"imagePullPolicy"`
		Command         []string `yaml:"command"`
		Args            []string `yaml:"args"`
		Env             []struct {
			Name      string `yaml:"name"`
			Value     string `yaml:"value"`
			ValueFrom *struct {
				FieldRef *struct {
					FieldPath string `yaml:"fieldPath"`
				} `yaml:"fieldRef"`
			} `yaml:"valueFrom"`
		} `yaml:"env"`
		Ports []struct {
			Name          string `yaml:"name"`
			ContainerPort int    `yaml:"containerPort"`
			Protocol      string `yaml:"protocol"`
		} `yaml:"ports"`
		LivenessProbe  *probe `yaml:"livenessProbe"`
		ReadinessProbe *probe `yaml:"readinessProbe"`
		Resources      struct {
			Requests map[string]string `yaml:"requests"`
			Limits   map[string]string `yaml:"limits"`
		} `yaml:"resources"`
		SecurityContext *struct {
			RunAsUser                *int64 `yaml:"runAsUser"`
			RunAsGroup               *int64 `yaml:"runAsGroup"`
			RunAsNonRoot             *bool  `yaml:"runAsNonRoot"`
			Privileged               *bool  `yaml:"privileged"`
			AllowPrivilegeEscalation *bool  `yaml:"allowPrivilegeEscalation"`
			ReadOnlyRootFilesystem   *bool  `yaml:"readOnlyRootFilesystem"`
			Capabilities             *struct {
				Add  []string `yaml:"add"`
				Drop []string `yaml:"drop"`
			} `yaml:"capabilities"`
			SeccompProfile *struct {
				Type string `yaml:"type"`
			} `yaml:"seccompProfile"`
			AppArmorProfile *struct {
				Type string `yaml:"type"`
			} `yaml:"appArmorProfile"`
		} `yaml:"securityContext"`
		VolumeMounts []struct {
			Name      string `yaml:"name"`
			MountPath string `yaml:"mountPath"`
			ReadOnly  bool   `yaml:"readOnly"`
		} `yaml:"volumeMounts"`
	}
	probe struct {
		HTTPGet *struct {
			Path   string      `yaml:"path"`
			Port   intOrString `yaml:"port"`
			Host   string      `yaml:"host"`
			Scheme string      `yaml:"scheme"`
		} `yaml:"httpGet"`
		InitialDelaySeconds int `yaml:"initialDelaySeconds"`
		PeriodSeconds       int `yaml:"periodSeconds"`
		TimeoutSeconds      int `yaml:"timeoutSeconds"`
		FailureThreshold    int `yaml:"failureThreshold"`
		SuccessThreshold    int `yaml:"successThreshold"`
	}
	volume struct {
		Name     string `yaml:"name"`
		HostPath *struct {
			Path string `yaml:"path"`
			Type string `yaml:"type"`
		} `yaml:"hostPath"`
	}
)

// intOrString is Kubernetes's IntOrString: a port number or name, a count
// or a percentage.
type intOrString struct {
	Int    int
	Str    string
	IsInt  bool
	IsZero bool // absent
}

func (v *intOrString) UnmarshalYAML(n *yaml.Node) error {
	if n.Tag == "!!int" {
		v.IsInt = true
		return n.Decode(&v.Int)
	}
	return n.Decode(&v.Str)
}

func (v intOrString) String() string {
	if v.IsInt {
		return strconv.Itoa(v.Int)
	}
	return v.Str
}

// manifest is daemonset.yaml, decoded.
type manifest struct {
	serviceAccount *kubeObject
	daemonSet      *kubeObject
	pod            *podSpec
	container      *container
}

// loadManifest decodes every document of daemonset.yaml strictly and picks
// the ServiceAccount and the DaemonSet; anything else is an error.
func loadManifest(t testing.TB, data []byte) *manifest {
	t.Helper()
	m, err := decodeManifest(data)
	if err != nil {
		t.Fatalf("%s: %v", daemonSetFile, err)
	}
	return m
}

func decodeManifest(data []byte) (*manifest, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	m := &manifest{}
	for i := 0; ; i++ {
		var obj kubeObject
		err := dec.Decode(&obj)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		switch obj.Kind {
		case "ServiceAccount":
			if m.serviceAccount != nil {
				return nil, errors.New("two ServiceAccounts")
			}
			m.serviceAccount = &obj
		case "DaemonSet":
			if m.daemonSet != nil {
				return nil, errors.New("two DaemonSets")
			}
			if obj.Spec == nil {
				return nil, errors.New("DaemonSet without spec")
			}
			m.daemonSet = &obj
		default:
			return nil, fmt.Errorf("document %d: unexpected kind %q", i, obj.Kind)
		}
	}
	if m.daemonSet == nil || m.serviceAccount == nil {
		return nil, errors.New("want one ServiceAccount and one DaemonSet")
	}
	m.pod = &m.daemonSet.Spec.Template.Spec
	if len(m.pod.Containers) != 1 {
		return nil, fmt.Errorf("%d containers, want 1", len(m.pod.Containers))
	}
	m.container = &m.pod.Containers[0]
	return m, nil
}

// args returns the container's flags after "run" as name -> values.
func (m *manifest) args() (map[string][]string, error) {
	a := m.container.Args
	if len(a) == 0 || a[0] != "run" {
		return nil, fmt.Errorf("args %q do not start with the run command", a)
	}
	out := map[string][]string{}
	for _, arg := range a[1:] {
		name, value, ok := strings.Cut(strings.TrimPrefix(arg, "--"), "=")
		if !strings.HasPrefix(arg, "--") || !ok {
			return nil, fmt.Errorf("arg %q: want --name=value", arg)
		}
		out[name] = append(out[name], value)
	}
	return out, nil
}

// flag returns the single value of --name, or "".
func (m *manifest) flag(name string) string {
	args, err := m.args()
	if err != nil || len(args[name]) != 1 {
		return ""
	}
	return args[name][0]
}

// env returns the container's environment variable name: its value, or
// "fieldRef:PATH".
func (m *manifest) env(name string) (string, bool) {
	for _, e := range m.container.Env {
		if e.Name != name {
			continue
		}
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			return "fieldRef:" + e.ValueFrom.FieldRef.FieldPath, true
		}
		return e.Value, true
	}
	return "", false
}

// metricsPort returns the port of --metrics-addr.
func (m *manifest) metricsPort() (int, bool) {
	_, p, err := net.SplitHostPort(m.flag("metrics-addr"))
	if err != nil {
		return 0, false
	}
	port, err := strconv.Atoi(p)
	return port, err == nil
}

// mountFor returns the hostPath volume mounted at or above path in the
// container, and the host path it maps to.
func (m *manifest) mountFor(path string) (string, bool) {
	for _, vm := range m.container.VolumeMounts {
		if path != vm.MountPath && !strings.HasPrefix(path, vm.MountPath+"/") {
			continue
		}
		if vm.ReadOnly {
			return "", false
		}
		for _, v := range m.pod.Volumes {
			if v.Name == vm.Name && v.HostPath != nil {
				return v.HostPath.Path + strings.TrimPrefix(path, vm.MountPath), true
			}
		}
	}
	return "", false
}

// hostPathFor returns, for the mount at or above path in the container, the
// node path it maps to, whether it is read-only, and the hostPath type.
func (m *manifest) hostPathFor(path string) (host string, readOnly bool, typ string, ok bool) {
	for _, vm := range m.container.VolumeMounts {
		if path != vm.MountPath && !strings.HasPrefix(path, vm.MountPath+"/") {
			continue
		}
		for _, v := range m.pod.Volumes {
			if v.Name == vm.Name && v.HostPath != nil {
				return v.HostPath.Path + strings.TrimPrefix(path, vm.MountPath), vm.ReadOnly, v.HostPath.Type, true
			}
		}
	}
	return "", false, "", false
}

// wantCapabilities is what --steering=adopt --mirror=tap needs, each added
// capability for the reason daemonset.yaml gives;
// TestDaemonSetCapabilities shows, by dropping each, that none is spare.
var wantCapabilities = []string{"BPF", "NET_ADMIN", "NET_BIND_SERVICE", "NET_RAW", "SYS_PTRACE"}

func readFile(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDaemonSet checks the settings of daemonset.yaml that dnsstandby's
// design depends on.
func TestDaemonSet(t *testing.T) {
	m := loadManifest(t, readFile(t, daemonSetFile))
	ds, pod, c := m.daemonSet, m.pod, m.container
	sc := c.SecurityContext
	port, portOK := m.metricsPort()
	metricsAddr := m.flag("metrics-addr")

	tests := []struct {
		name  string
		check func() error
	}{
		{"objects in one namespace", func() error {
			if ds.Metadata.Namespace == "" || m.serviceAccount.Metadata.Namespace != ds.Metadata.Namespace {
				return fmt.Errorf("DaemonSet in %q, ServiceAccount in %q", ds.Metadata.Namespace, m.serviceAccount.Metadata.Namespace)
			}
			return nil
		}},
		{"selector matches the pod labels", func() error {
			sel := ds.Spec.Selector.MatchLabels
			if len(sel) == 0 {
				return errors.New("empty selector")
			}
			for k, v := range sel {
				if ds.Spec.Template.Metadata.Labels[k] != v {
					return fmt.Errorf("selector %s=%s not on the pod template", k, v)
				}
			}
			return nil
		}},
		{"own service account, no API token", func() error {
			sa := m.serviceAccount
			if pod.ServiceAccountName != sa.Metadata.Name {
				return fmt.Errorf("serviceAccountName %q, ServiceAccount %q", pod.ServiceAccountName, sa.Metadata.Name)
			}
			if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken ||
				pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
				return errors.New("automountServiceAccountToken must be false on both: dnsstandby does not use the API")
			}
			return nil
		}},
		{"hostNetwork", func() error {
			if !pod.HostNetwork {
				return errors.New("hostNetwork must be true: LocalDNS's sockets are in the node's namespace")
			}
			return nil
		}},
		{"hostPID", func() error {
			if !pod.HostPID {
				return errors.New("hostPID must be true: adopt reaches LocalDNS's sockets through its PID (pidfd_getfd)")
			}
			return nil
		}},
		{"dnsPolicy Default", func() error {
			if pod.DNSPolicy != "Default" {
				return fmt.Errorf("dnsPolicy %q: must not resolve through 169.254.10.11, itself", pod.DNSPolicy)
			}
			return nil
		}},
		{"priority", func() error {
			if pod.PriorityClassName != "system-node-critical" {
				return fmt.Errorf("priorityClassName %q", pod.PriorityClassName)
			}
			return nil
		}},
		{"tolerates every taint", func() error {
			for _, tol := range pod.Tolerations {
				if tol.Operator == "Exists" && tol.Key == "" && tol.Effect == "" {
					return nil
				}
			}
			return fmt.Errorf("no toleration {operator: Exists} without key and effect: %+v", pod.Tolerations)
		}},
		{"rolling update with a surge handover", func() error {
			us := ds.Spec.UpdateStrategy
			if us.Type != "RollingUpdate" || us.RollingUpdate == nil || us.RollingUpdate.MaxSurge == nil || us.RollingUpdate.MaxUnavailable == nil {
				return fmt.Errorf("updateStrategy %+v: want RollingUpdate with maxSurge and maxUnavailable", us)
			}
			// A new pod beside the old on 10% of the nodes at a time, the
			// old one staying until the new one is ready: the new one takes
			// the old one's sockets and caches. A percentage, so that a
			// rollout's rounds do not grow with the cluster
			// (docs/install.md works out 1,000 nodes for 10%).
			if ms, mu := *us.RollingUpdate.MaxSurge, *us.RollingUpdate.MaxUnavailable; ms.IsInt || ms.String() != "10%" || mu.String() != "0" {
				return fmt.Errorf("maxSurge %s, maxUnavailable %s: want 10%% and 0", ms, mu)
			}
			admin, from := m.flag("admin-socket"), m.flag("handover-from")
			if from == "" || from != admin {
				return fmt.Errorf("--handover-from %q: want the --admin-socket %q, where the old pod serves", from, admin)
			}
			if _, ok := m.mountFor(filepath.Dir(admin)); !ok {
				return fmt.Errorf("--admin-socket %s: not on a hostPath, the old pod's is out of reach", admin)
			}
			// An old pod that exited after its handover would be
			// restarted, and ask the new one for it back.
			if v := m.flag("after-handover"); v != "wait" {
				return fmt.Errorf("--after-handover %q: want wait", v)
			}
			return nil
		}},
		{"no declared ports: a hostPort blocks the surge", func() error {
			if len(c.Ports) > 0 {
				return fmt.Errorf("ports %+v: with hostNetwork each is a hostPort, and the surge pod cannot be scheduled beside the old one (kubernetes/kubernetes#106417)", c.Ports)
			}
			return nil
		}},
		{"grace period covers the drain", func() error {
			drain := 5 * time.Second // --shutdown-timeout's default
			if v := m.flag("shutdown-timeout"); v != "" {
				d, err := time.ParseDuration(v)
				if err != nil {
					return err
				}
				drain = d
			}
			g := pod.TerminationGracePeriodSeconds
			if g == nil || time.Duration(*g)*time.Second < drain+10*time.Second {
				return fmt.Errorf("terminationGracePeriodSeconds %v: want the drain (%s) plus 10s for detaching and the snapshot", g, drain)
			}
			return nil
		}},
		{"image: the placeholder an overlay sets", func() error {
			// The pinned image is the overlay's (TestKustomizeOverlay).
			if c.Image != placeholderImage {
				return fmt.Errorf("image %q: want the placeholder %s, which a kustomize overlay replaces", c.Image, placeholderImage)
			}
			if c.ImagePullPolicy != "IfNotPresent" {
				return fmt.Errorf("imagePullPolicy %q: a restart on a node without LocalDNS must not need a pull", c.ImagePullPolicy)
			}
			if len(c.Command) > 0 && filepath.Base(c.Command[0]) != "dnsstandby" {
				return fmt.Errorf("command %q is not dnsstandby", c.Command)
			}
			return nil
		}},
		{"root, same UID as LocalDNS", func() error {
			if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 0 {
				return errors.New("securityContext.runAsUser must be 0: a reuseport group needs one UID, and LocalDNS runs as root")
			}
			if sc.RunAsNonRoot != nil && *sc.RunAsNonRoot {
				return errors.New("runAsNonRoot contradicts runAsUser 0")
			}
			return nil
		}},
		{"not privileged, no escalation, read-only root", func() error {
			if sc == nil || sc.Privileged != nil && *sc.Privileged {
				return errors.New("privileged must not be set: capabilities are listed one by one")
			}
			if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				return errors.New("allowPrivilegeEscalation must be false")
			}
			if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
				return errors.New("readOnlyRootFilesystem must be true")
			}
			return nil
		}},
		{"capabilities: drop ALL, add exactly the steering level's", func() error {
			if sc == nil || sc.Capabilities == nil {
				return errors.New("no capabilities")
			}
			if !slices.Equal(sc.Capabilities.Drop, []string{"ALL"}) {
				return fmt.Errorf("drop %q, want [ALL]", sc.Capabilities.Drop)
			}
			add := slices.Clone(sc.Capabilities.Add)
			slices.Sort(add)
			if !slices.Equal(add, wantCapabilities) {
				return fmt.Errorf("add %q, want %q", add, wantCapabilities)
			}
			return nil
		}},
		{"seccomp and AppArmor", func() error {
			if sc.SeccompProfile == nil || sc.SeccompProfile.Type != "RuntimeDefault" {
				return errors.New("seccompProfile must be RuntimeDefault")
			}
			if sc.AppArmorProfile == nil || sc.AppArmorProfile.Type != "Unconfined" {
				return errors.New("appArmorProfile must be Unconfined: the default profile denies ptrace of LocalDNS")
			}
			return nil
		}},
		{"metrics port served", func() error {
			if !portOK {
				return fmt.Errorf("--metrics-addr %q: no port", metricsAddr)
			}
			host, p, err := net.SplitHostPort(metricsAddr)
			if err != nil {
				return fmt.Errorf("--metrics-addr %q: %v", metricsAddr, err)
			}
			if p != strconv.Itoa(port) {
				return fmt.Errorf("--metrics-addr port %s, want %d", p, port)
			}
			// Probes of a hostNetwork pod go to the pod IP, the node's IP:
			// the listener must be on it, not on loopback.
			v, ok := m.env(strings.TrimSuffix(strings.TrimPrefix(host, "$("), ")"))
			if !strings.HasPrefix(host, "$(") || !ok || v != "fieldRef:status.hostIP" {
				return fmt.Errorf("--metrics-addr host %q: want $(VAR) with VAR from fieldRef status.hostIP", host)
			}
			if a := ds.Spec.Template.Metadata.Annotations["prometheus.io/port"]; a != "" && a != strconv.Itoa(port) {
				return fmt.Errorf("prometheus.io/port %s, metrics port %d", a, port)
			}
			return nil
		}},
		{"liveness on /healthz, readiness on /readyz, at the metrics port", func() error {
			for _, p := range []struct {
				name  string
				probe *probe
				path  string
			}{{"livenessProbe", c.LivenessProbe, "/healthz"}, {"readinessProbe", c.ReadinessProbe, "/readyz"}} {
				if p.probe == nil || p.probe.HTTPGet == nil {
					return fmt.Errorf("%s: no httpGet", p.name)
				}
				g := p.probe.HTTPGet
				if g.Path != p.path {
					return fmt.Errorf("%s path %q, want %q", p.name, g.Path, p.path)
				}
				if g.Port.String() != strconv.Itoa(port) {
					return fmt.Errorf("%s port %s, want the --metrics-addr port %d", p.name, g.Port, port)
				}
				if g.Host != "" || g.Scheme != "" && g.Scheme != "HTTP" {
					return fmt.Errorf("%s host %q scheme %q: the pod IP over HTTP", p.name, g.Host, g.Scheme)
				}
			}
			return nil
		}},
		{"resources of a small node daemon", func() error {
			r := c.Resources
			for _, k := range []string{"cpu", "memory"} {
				if r.Requests[k] == "" {
					return fmt.Errorf("no %s request", k)
				}
			}
			if r.Limits["memory"] == "" {
				return errors.New("no memory limit")
			}
			if r.Limits["cpu"] != "" {
				return errors.New("a CPU limit throttles dnsstandby just when LocalDNS's traffic lands on it")
			}
			return nil
		}},
		{"state and admin socket on host paths", func() error {
			for _, flag := range []string{"state-dir", "admin-socket"} {
				v := m.flag(flag)
				dir := v
				if flag == "admin-socket" {
					dir = filepath.Dir(v)
				}
				host, ok := m.mountFor(dir)
				if v == "" || !ok {
					return fmt.Errorf("--%s=%q is on no writable hostPath mount (the root filesystem is read-only)", flag, v)
				}
				if host != dir {
					return fmt.Errorf("--%s: %s is %s on the node; keep the paths the same so node tools find them", flag, dir, host)
				}
			}
			return nil
		}},
		{"steering adopt, mirror tap, on both of LocalDNS's listeners, from its Corefile", func() error {
			for flag, want := range map[string]string{"steering": "adopt", "mirror": "tap", "localdns-corefile": localdnsCorefiles} {
				if got := m.flag(flag); got != want {
					return fmt.Errorf("--%s=%q, want %q", flag, got, want)
				}
			}
			args, err := m.args()
			if err != nil {
				return err
			}
			if got := slices.Sorted(slices.Values(args["listen"])); !slices.Equal(got, localdnsListeners) {
				return fmt.Errorf("--listen %q, want %q", got, localdnsListeners)
			}
			// No ClusterIP written in: the Corefile has each zone's.
			if up := args["upstream"]; len(up) > 0 {
				return fmt.Errorf("--upstream=%q: the forward targets come from LocalDNS's Corefile; --upstream would replace them all", up)
			}
			return nil
		}},
		{"LocalDNS's Corefile and hosts file on read-only host mounts at the node's paths", func() error {
			// The hosts file is the one AgentBaker's Corefile names.
			s, err := corefile.Load(agentBakerCorefile, []netip.AddrPort{netip.MustParseAddrPort(localdnsListeners[1])})
			if err != nil {
				return err
			}
			z := s.ZoneFor(".")
			if z == nil || z.Hosts == nil {
				return fmt.Errorf("%s: no hosts plugin in the pods' root block", agentBakerCorefile)
			}
			paths := append(strings.Split(m.flag("localdns-corefile"), ","), z.Hosts.File)
			for _, path := range paths {
				host, readOnly, typ, ok := m.hostPathFor(path)
				switch {
				case !ok:
					return fmt.Errorf("%s is on no hostPath mount", path)
				case host != path:
					return fmt.Errorf("%s is %s on the node: the Corefile names the node's paths, so they must stay the same", path, host)
				case !readOnly:
					return fmt.Errorf("the mount holding %s is writable: dnsstandby only reads LocalDNS's files", path)
				case typ == "FileOrCreate" || typ == "File":
					return fmt.Errorf("%s is mounted as a file (%s): localdns.sh rewrites the Corefile, and a file mount keeps the old one", path, typ)
				}
			}
			return nil
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.check(); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestManifestDecodingIsStrict shows that a misspelled field fails.
func TestManifestDecodingIsStrict(t *testing.T) {
	data := readFile(t, daemonSetFile)
	for _, tt := range []struct{ from, to string }{
		{"hostPID: true", "hostPid: true"},
		{"readOnlyRootFilesystem: true", "readOnlyRootFileSystem: true"},
		{"readOnly: true", "readonly: true"},
		{"kind: DaemonSet", "kind: Deployment"},
	} {
		bad := bytes.Replace(data, []byte(tt.from), []byte(tt.to), 1)
		if bytes.Equal(bad, data) {
			t.Fatalf("%q not in %s", tt.from, daemonSetFile)
		}
		if _, err := decodeManifest(bad); err == nil {
			t.Errorf("%q instead of %q was accepted", tt.to, tt.from)
		}
	}
}

// buildDNSStandby builds cmd/dnsstandby into a test directory. It builds
// in the main module, so that the binary is the one `make build` makes,
// with the main module's dependency versions rather than this test
// module's.
func buildDNSStandby(t testing.TB) string {
	t.Helper()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		goCmd = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "dnsstandby")
	cmd := exec.Command(goCmd, "build", "-o", bin, "./cmd/dnsstandby")
	cmd.Dir = moduleRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build dnsstandby: %v\n%s", err, out)
	}
	return bin
}

// expandArgs does what the kubelet does to $(VAR) in args, with hostIP as
// the value of fieldRef status.hostIP.
// serviceEnv is the environment the kubelet gives a kube-system pod with
// enableServiceLinks for AKS's kube-dns Service.
var serviceEnv = map[string]string{"KUBE_DNS_SERVICE_HOST": "10.0.0.10", "KUBE_DNS_SERVICE_PORT": "53"}

func (m *manifest) expandArgs(hostIP string) ([]string, error) {
	var out []string
	ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	for _, a := range m.container.Args {
		var missing error
		a = ref.ReplaceAllStringFunc(a, func(s string) string {
			name := ref.FindStringSubmatch(s)[1]
			v, ok := m.env(name)
			if sv, isService := serviceEnv[name]; !ok && isService && m.pod.EnableServiceLinks != nil && *m.pod.EnableServiceLinks {
				v, ok = sv, true
			}
			switch {
			case !ok:
				missing = fmt.Errorf("%s: no environment variable %s (the kubelet would pass it unexpanded)", a, name)
			case v == "fieldRef:status.hostIP":
				return hostIP
			case strings.HasPrefix(v, "fieldRef:"):
				missing = fmt.Errorf("%s: %s is %s, not handled here", a, name, v)
			}
			return v
		})
		if missing != nil {
			return nil, missing
		}
		out = append(out, a)
	}
	return out, nil
}

// TestDaemonSetArgs runs the real binary: every flag in the container's
// args is one `dnsstandby run -h` lists, and `dnsstandby run ARGS
// --validate` accepts their values. The args read LocalDNS's Corefile from
// the node's /opt/azure/containers/localdns, which this machine lacks: the
// test writes AgentBaker's Corefile (corefile/testdata) into a directory
// of its own and gives that directory's paths instead, leaving every other
// arg as the manifest has it (validateWithCorefile).
func TestDaemonSetArgs(t *testing.T) {
	m := loadManifest(t, readFile(t, daemonSetFile))
	bin := buildDNSStandby(t)
	help, err := exec.Command(bin, "run", "-h").CombinedOutput()
	if err != nil {
		t.Fatalf("dnsstandby run -h: %v\n%s", err, help)
	}
	flags := map[string]bool{}
	for _, mt := range regexp.MustCompile(`(?m)^\s+-([a-z0-9][a-z0-9-]*)`).FindAllStringSubmatch(string(help), -1) {
		flags[mt[1]] = true
	}
	if len(flags) < 30 || !flags["listen"] || !flags["steering"] {
		t.Fatalf("only %d flags read from `dnsstandby run -h`: its format changed?\n%s", len(flags), help)
	}
	args, err := m.args()
	if err != nil {
		t.Fatal(err)
	}
	repeatable := map[string]bool{"listen": true, "upstream": true}
	for name, values := range args {
		if !flags[name] {
			t.Errorf("--%s is not a flag of dnsstandby run", name)
		}
		if len(values) > 1 && !repeatable[name] {
			t.Errorf("--%s given %d times: only the last counts", name, len(values))
		}
	}
	expanded, err := m.expandArgs("10.224.0.4")
	if err != nil {
		t.Fatal(err)
	}
	validateWithCorefile(t, bin, expanded)
	// The same check rejects bad values, typed or checked after parsing,
	// so it is not vacuous.
	withCorefile, dir := inLocalDNSDir(t, expanded)
	if err := os.WriteFile(filepath.Join(dir, "updated.localdns.corefile"), readFile(t, agentBakerCorefile), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, wrong := range []string{"--probe-interval=often", "--mirror=tapz", "--upstream=169.254.10.11:53"} {
		bad := append(slices.Clone(withCorefile), wrong, "--validate")
		cmd := exec.Command(bin, bad...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		if out, err := cmd.CombinedOutput(); err == nil {
			t.Errorf("%s was accepted:\n%s", wrong, out)
		}
	}
}

// alertRules is a Prometheus rule file.
type alertRules struct {
	Groups []struct {
		Name  string      `yaml:"name"`
		Rules []alertRule `yaml:"rules"`
	} `yaml:"groups"`
}

type alertRule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for,omitempty"`
	Labels      map[string]string `yaml:"labels,omitempty"`
	Annotations map[string]string `yaml:"annotations,omitempty"`
}

func loadAlerts(t testing.TB) *alertRules {
	t.Helper()
	dec := yaml.NewDecoder(bytes.NewReader(readFile(t, alertsFile)))
	dec.KnownFields(true)
	var r alertRules
	if err := dec.Decode(&r); err != nil {
		t.Fatalf("%s: %v", alertsFile, err)
	}
	return &r
}

func (r *alertRules) all() []alertRule {
	var out []alertRule
	for _, g := range r.Groups {
		out = append(out, g.Rules...)
	}
	return out
}

// TestAlertRules checks every alert's shape and that its expression uses
// only what dnsstandby exports.
func TestAlertRules(t *testing.T) {
	inv := loadInventory(t)
	rules := loadAlerts(t)
	all := rules.all()
	if len(all) == 0 {
		t.Fatal("no alerts")
	}
	seen := map[string]bool{}
	for _, r := range all {
		t.Run(r.Alert, func(t *testing.T) {
			if !regexp.MustCompile(`^[A-Z][A-Za-z0-9]+$`).MatchString(r.Alert) || seen[r.Alert] {
				t.Errorf("alert name %q: want unique CamelCase", r.Alert)
			}
			seen[r.Alert] = true
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("for: %v", err)
				}
			}
			if s := r.Labels["severity"]; s != "critical" && s != "warning" && s != "info" {
				t.Errorf("severity %q: want critical, warning or info", s)
			}
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("no %s annotation", a)
				}
			}
			for a := range r.Annotations {
				if !slices.Contains([]string{"summary", "description", "runbook_url"}, a) {
					t.Errorf("annotation %s: want summary, description and runbook_url only (the runbook is a page of its own)", a)
				}
			}
			for _, err := range inv.checkPromQL(r.Expr) {
				t.Error(err)
			}
		})
	}
	// What the alerts are for, by the metric each must watch.
	for _, want := range []struct{ alert, metric string }{
		{"DNSStandbyTakeoverLong", `dnsstandby_mode{mode="takeover"}`},
		{"LocalDNSFlapping", "dnsstandby_mode_transitions_total"},
		{"LocalDNSLeavesQueriesUnanswered", "dnsstandby_hedge_sent_total"},
		{"DNSStandbyMirrorFeedStalled", "dnsstandby_mirror_records_total"},
		{"DNSStandbySteeringBelowAdopt", "dnsstandby_steer_level"},
		{"DNSStandbyAnchorNotReady", "dnsstandby_anchor_ready"},
		{"DNSStandbyDown", "up"},
		{"DNSStandbyGone", "max_over_time(up{"},
		{"DNSStandbyAbsent", "absent(up{"},
	} {
		i := slices.IndexFunc(all, func(r alertRule) bool { return r.Alert == want.alert })
		if i < 0 {
			t.Errorf("no alert %s", want.alert)
		} else if !strings.Contains(all[i].Expr, want.metric) {
			t.Errorf("%s does not watch %s: %s", want.alert, want.metric, all[i].Expr)
		}
	}
}

// promtool returns promtool's path, or skips.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not on PATH (Debian package prometheus; .ci/run installs it): PromQL not parsed, rules not unit-tested")
	}
	return p
}

func runPromtool(t *testing.T, dir string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(promtool(t), args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestAlertRulesPromtool has promtool parse the rule file.
func TestAlertRulesPromtool(t *testing.T) {
	abs, err := filepath.Abs(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := runPromtool(t, "", "check", "rules", abs); err != nil {
		t.Fatalf("promtool check rules %s: %v\n%s", alertsFile, err, out)
	}
}

// promSeries is one input series of a promtool unit test.
type promSeries struct{ series, values string }

// alertCase is a promtool unit test of one alert: given these series,
// at this time the alert fires with these labels (nil: it does not).
type alertCase struct {
	alert  string
	name   string
	series []promSeries
	at     string
	fire   []map[string]string // labels of each firing alert, severity and alertname excluded
}

// node is the labels of one dnsstandby target in the unit tests.
const node = `instance="10.224.0.4:9355",job="kube-system/dnsstandby"`

func nodeLabels(more ...string) map[string]string {
	l := map[string]string{"instance": "10.224.0.4:9355", "job": "kube-system/dnsstandby"}
	for i := 0; i+1 < len(more); i += 2 {
		l[more[i]] = more[i+1]
	}
	return l
}

func instanceOnly() map[string]string { return map[string]string{"instance": "10.224.0.4:9355"} }

var alertCases = []alertCase{
	{"DNSStandbyTakeoverLong", "takeover for 11 minutes", []promSeries{{`dnsstandby_mode{` + node + `,mode="takeover"}`, "1x20"}}, "11m",
		[]map[string]string{nodeLabels("mode", "takeover")}},
	{"DNSStandbyTakeoverLong", "takeover for 9 minutes", []promSeries{{`dnsstandby_mode{` + node + `,mode="takeover"}`, "1x8 0x12"}}, "12m", nil},
	{"DNSStandbyHoldLong", "hold for 16 minutes", []promSeries{{`dnsstandby_mode{` + node + `,mode="hold"}`, "1x20"}}, "16m",
		[]map[string]string{nodeLabels("mode", "hold")}},
	{"DNSStandbyHoldLong", "hold for 10 minutes", []promSeries{{`dnsstandby_mode{` + node + `,mode="hold"}`, "1x10 0x10"}}, "16m", nil},
	{"LocalDNSFlapping", "four exits in eight minutes", []promSeries{
		{`dnsstandby_mode_transitions_total{` + node + `,from="mirror",to="takeover",reason="peer-exit"}`, "0 1 1 2 2 2 2 3 3"},
		{`dnsstandby_mode_transitions_total{` + node + `,from="hold",to="takeover",reason="peer-exit"}`, "0 0 0 0 1 1 1 1 1"},
		{`dnsstandby_mode_transitions_total{` + node + `,from="takeover",to="hold",reason="peer-restarted"}`, "0 1 1 2 3 3 3 4 4"},
	}, "8m", []map[string]string{instanceOnly()}},
	{"LocalDNSFlapping", "one exit, many restarts", []promSeries{
		{`dnsstandby_mode_transitions_total{` + node + `,from="mirror",to="takeover",reason="peer-exit"}`, "0 1 1 1 1 1 1 1 1"},
		{`dnsstandby_mode_transitions_total{` + node + `,from="takeover",to="hold",reason="peer-restarted"}`, "0 2 4 6 8 10 12 14 16"},
	}, "8m", nil},
	{"DNSStandbyMirrorFeedStalled", "tap reads nothing for 16 minutes", []promSeries{
		{`dnsstandby_mode{` + node + `,mode="mirror"}`, "1x40"},
		{`dnsstandby_mirror_tap_enabled{` + node + `}`, "1x40"},
		{`dnsstandby_mirror_records_total{` + node + `,source="tap",result="rejected",reason="no_soa"}`, "0+60x10 600x30"},
	}, "26m", []map[string]string{nodeLabels("mode", "mirror")}},
	{"DNSStandbyMirrorFeedStalled", "tap reads probe replies", []promSeries{
		{`dnsstandby_mode{` + node + `,mode="mirror"}`, "1x40"},
		{`dnsstandby_mirror_tap_enabled{` + node + `}`, "1x40"},
		{`dnsstandby_mirror_records_total{` + node + `,source="tap",result="rejected",reason="no_soa"}`, "0+60x40"},
	}, "30m", nil},
	{"DNSStandbyMirrorFeedStalled", "tap paused (level own)", []promSeries{
		{`dnsstandby_mode{` + node + `,mode="mirror"}`, "1x40"},
		{`dnsstandby_mirror_tap_enabled{` + node + `}`, "0x40"},
		{`dnsstandby_mirror_records_total{` + node + `,source="tap",result="rejected",reason="disabled"}`, "5x40"},
	}, "30m", nil},
	{"DNSStandbyMirrorFeedNotRunning", "no feed", []promSeries{{`dnsstandby_mode{` + node + `,mode="mirror"}`, "1x20"}}, "16m",
		[]map[string]string{nodeLabels("mode", "mirror")}},
	{"DNSStandbyMirrorFeedNotRunning", "tap running", []promSeries{
		{`dnsstandby_mode{` + node + `,mode="mirror"}`, "1x20"},
		{`dnsstandby_mirror_records_total{` + node + `,source="tap",result="accepted",reason=""}`, "0x20"},
	}, "16m", nil},
	{"DNSStandbyDnstapDisconnected", "no connection", []promSeries{
		{`dnsstandby_mode{` + node + `,mode="mirror"}`, "1x15"},
		{`dnsstandby_mirror_dnstap_connections{` + node + `}`, "0x15"},
	}, "11m", []map[string]string{nodeLabels("mode", "mirror")}},
	{"DNSStandbyDnstapDisconnected", "connected", []promSeries{
		{`dnsstandby_mode{` + node + `,mode="mirror"}`, "1x15"},
		{`dnsstandby_mirror_dnstap_connections{` + node + `}`, "1x15"},
	}, "11m", nil},
	{"DNSStandbyMirrorTapDrops", "drops", []promSeries{{`dnsstandby_mirror_tap_drops_total{` + node + `}`, "0 0 0 5 5 5"}}, "5m",
		[]map[string]string{instanceOnly()}},
	{"DNSStandbyMirrorTapDrops", "no drops", []promSeries{{`dnsstandby_mirror_tap_drops_total{` + node + `}`, "0x5"}}, "5m", nil},
	{"DNSStandbySteeringBelowAdopt", "own, adopt wanted", []promSeries{
		{`dnsstandby_steer_level{` + node + `,level="adopt"}`, "0x10"},
		{`dnsstandby_steer_level{` + node + `,level="own"}`, "1x10"},
		{`dnsstandby_steer_level_wanted{` + node + `,level="adopt"}`, "1x10"},
		{`dnsstandby_steer_level_wanted{` + node + `,level="own"}`, "0x10"},
	}, "6m", []map[string]string{nodeLabels("level", "adopt")}},
	{"DNSStandbySteeringBelowAdopt", "adopt", []promSeries{
		{`dnsstandby_steer_level{` + node + `,level="adopt"}`, "1x10"},
		{`dnsstandby_steer_level{` + node + `,level="own"}`, "0x10"},
		{`dnsstandby_steer_level_wanted{` + node + `,level="adopt"}`, "1x10"},
	}, "6m", nil},
	{"DNSStandbySteeringBelowAdopt", "own, own wanted", []promSeries{
		{`dnsstandby_steer_level{` + node + `,level="adopt"}`, "0x10"},
		{`dnsstandby_steer_level{` + node + `,level="own"}`, "1x10"},
		{`dnsstandby_steer_level_wanted{` + node + `,level="adopt"}`, "0x10"},
		{`dnsstandby_steer_level_wanted{` + node + `,level="own"}`, "1x10"},
	}, "6m", nil},
	{"DNSStandbyPeerNotAdopted", "no UDP peer", []promSeries{
		{`dnsstandby_mode{` + node + `,mode="mirror"}`, "1x10"},
		{`dnsstandby_steer_level{` + node + `,level="adopt"}`, "1x10"},
		{`dnsstandby_steer_peers{` + node + `,group="169.254.10.11:53/udp"}`, "0x10"},
		{`dnsstandby_steer_peers{` + node + `,group="169.254.10.11:53/tcp"}`, "0x10"},
	}, "6m", []map[string]string{nodeLabels("mode", "mirror")}},
	{"DNSStandbyPeerNotAdopted", "UDP adopted, TCP MPTCP", []promSeries{
		{`dnsstandby_mode{` + node + `,mode="mirror"}`, "1x10"},
		{`dnsstandby_steer_level{` + node + `,level="adopt"}`, "1x10"},
		{`dnsstandby_steer_peers{` + node + `,group="169.254.10.11:53/udp"}`, "1x10"},
		{`dnsstandby_steer_peers{` + node + `,group="169.254.10.11:53/tcp"}`, "0x10"},
	}, "6m", nil},
	{"DNSStandbyHeartbeatStale", "stale", []promSeries{{`dnsstandby_steer_heartbeat_age_seconds{` + node + `}`, "0.1 0.2 5 6 7 8"}}, "4m",
		[]map[string]string{nodeLabels()}},
	{"DNSStandbyHeartbeatStale", "fresh", []promSeries{{`dnsstandby_steer_heartbeat_age_seconds{` + node + `}`, "0.25x5"}}, "4m", nil},
	{"DNSStandbySteeringErrors", "map write failed", []promSeries{
		{`dnsstandby_steer_map_update_errors_total{` + node + `,map="config"}`, "0 0 1 1"},
		{`dnsstandby_steer_map_update_errors_total{` + node + `,map="sockarray"}`, "0x3"},
		{`dnsstandby_steer_heartbeat_errors_total{` + node + `}`, "0x3"},
	}, "3m", []map[string]string{instanceOnly()}},
	{"DNSStandbySteeringErrors", "none", []promSeries{
		{`dnsstandby_steer_map_update_errors_total{` + node + `,map="config"}`, "0x3"},
		{`dnsstandby_steer_heartbeat_errors_total{` + node + `}`, "0x3"},
	}, "3m", nil},
	{"DNSStandbyAnchorNotReady", "not ready", []promSeries{{`dnsstandby_anchor_ready{` + node + `}`, "0x5"}}, "3m",
		[]map[string]string{nodeLabels()}},
	{"DNSStandbyAnchorNotReady", "ready", []promSeries{{`dnsstandby_anchor_ready{` + node + `}`, "1x5"}}, "3m", nil},
	{"DNSStandbyCorefileRefused", "last known good", []promSeries{
		{`dnsstandby_config_source{` + node + `,source="last-good"}`, "1x10"},
		{`dnsstandby_config_source{` + node + `,source="file"}`, "0x10"},
	}, "6m", []map[string]string{nodeLabels("source", "last-good")}},
	{"DNSStandbyCorefileRefused", "from the file", []promSeries{
		{`dnsstandby_config_source{` + node + `,source="last-good"}`, "0x10"},
		{`dnsstandby_config_source{` + node + `,source="file"}`, "1x10"},
	}, "6m", nil},
	{"DNSStandbyCorefileRefused", "refused for a moment", []promSeries{
		{`dnsstandby_config_source{` + node + `,source="fallback"}`, "1 1 0 0 0 0 0 0 0 0"},
	}, "6m", nil},
	{"DNSStandbyDown", "down", []promSeries{{`up{` + node + `}`, "0x10"}}, "6m", []map[string]string{nodeLabels()}},
	{"DNSStandbyDown", "another job down", []promSeries{{`up{instance="10.224.0.4:10250",job="kubelet"}`, "0x10"}}, "6m", nil},
	{"DNSStandbyGone", "pod deleted, the node's kubelet still answers", []promSeries{
		{`up{` + node + `}`, "1x10 stale"},
		{`up{instance="10.224.0.4:10250",job="kubelet"}`, "1x40"},
	}, "30m", []map[string]string{{"instance": "10.224.0.4:9355", "node_address": "10.224.0.4"}}},
	{"DNSStandbyGone", "node removed: its kubelet went too", []promSeries{
		{`up{` + node + `}`, "1x10 stale"},
		{`up{instance="10.224.0.4:10250",job="kubelet"}`, "1x10 stale"},
	}, "30m", nil},
	{"DNSStandbyGone", "pod replaced within minutes", []promSeries{
		{`up{` + node + `}`, "1x10 stale _x3 1x20"},
		{`up{instance="10.224.0.4:10250",job="kubelet"}`, "1x40"},
	}, "30m", nil},
	{"DNSStandbyGone", "another node's dnsstandby still there", []promSeries{
		{`up{instance="10.224.0.5:9355",job="kube-system/dnsstandby"}`, "1x40"},
		{`up{instance="10.224.0.4:10250",job="kubelet"}`, "1x40"},
	}, "30m", nil},
	{"DNSStandbyAbsent", "no dnsstandby target", []promSeries{
		{`up{instance="10.224.0.4:10250",job="kubelet"}`, "1x30"},
	}, "20m", []map[string]string{{}}},
	{"DNSStandbyAbsent", "one target", []promSeries{
		{`up{` + node + `}`, "0x30"},
		{`up{instance="10.224.0.4:10250",job="kubelet"}`, "1x30"},
	}, "20m", nil},
	{"DNSStandbyUpstreamDown", "down", []promSeries{{`dnsstandby_upstream_healthy{` + node + `,server="10.0.0.10:53",zone="."}`, "0x10"}}, "6m",
		[]map[string]string{nodeLabels("server", "10.0.0.10:53", "zone", ".")}},
	{"DNSStandbyUpstreamDown", "up", []promSeries{{`dnsstandby_upstream_healthy{` + node + `,server="10.0.0.10:53",zone="."}`, "1x10"}}, "6m", nil},
	{"DNSStandbyServfailHigh", "9% SERVFAIL", []promSeries{
		{`dnsstandby_queries_total{` + node + `,source="servfail"}`, "0+60x20"},
		{`dnsstandby_queries_total{` + node + `,source="upstream"}`, "0+600x20"},
	}, "12m", []map[string]string{instanceOnly()}},
	{"DNSStandbyServfailHigh", "1% SERVFAIL", []promSeries{
		{`dnsstandby_queries_total{` + node + `,source="servfail"}`, "0+60x20"},
		{`dnsstandby_queries_total{` + node + `,source="cache"}`, "0+6000x20"},
	}, "12m", nil},
	{"DNSStandbyServfailHigh", "all SERVFAIL but under 1 qps", []promSeries{
		{`dnsstandby_queries_total{` + node + `,source="servfail"}`, "0+30x20"},
	}, "12m", nil},
	{"LocalDNSLeavesQueriesUnanswered", "2% hedged for 20 minutes", []promSeries{
		{`dnsstandby_hedge_sent_total{` + node + `,listener="169.254.10.11:53",source="cache"}`, "0+120x30"},
		{`dnsstandby_mirror_tap_queries_total{` + node + `,listener="169.254.10.11:53",result="observed"}`, "0+6000x30"},
	}, "25m", []map[string]string{instanceOnly()}},
	{"LocalDNSLeavesQueriesUnanswered", "0.5% hedged", []promSeries{
		{`dnsstandby_hedge_sent_total{` + node + `,listener="169.254.10.11:53",source="cache"}`, "0+30x30"},
		{`dnsstandby_mirror_tap_queries_total{` + node + `,listener="169.254.10.11:53",result="observed"}`, "0+6000x30"},
	}, "25m", nil},
	{"LocalDNSSlow", "half the replies over 50 ms", []promSeries{
		{`dnsstandby_localdns_reply_duration_seconds_bucket{` + node + `,listener="169.254.10.11:53",le="0.05"}`, "0+50x30"},
		{`dnsstandby_localdns_reply_duration_seconds_bucket{` + node + `,listener="169.254.10.11:53",le="0.25"}`, "0+100x30"},
		{`dnsstandby_localdns_reply_duration_seconds_bucket{` + node + `,listener="169.254.10.11:53",le="+Inf"}`, "0+100x30"},
	}, "25m", []map[string]string{instanceOnly()}},
	{"LocalDNSSlow", "every reply within 50 ms", []promSeries{
		{`dnsstandby_localdns_reply_duration_seconds_bucket{` + node + `,listener="169.254.10.11:53",le="0.05"}`, "0+100x30"},
		{`dnsstandby_localdns_reply_duration_seconds_bucket{` + node + `,listener="169.254.10.11:53",le="0.25"}`, "0+100x30"},
		{`dnsstandby_localdns_reply_duration_seconds_bucket{` + node + `,listener="169.254.10.11:53",le="+Inf"}`, "0+100x30"},
	}, "25m", nil},
	{"DNSStandbyHedgesCapped", "hedges refused at the cap", []promSeries{
		{`dnsstandby_hedge_skipped_total{` + node + `,listener="169.254.10.11:53",reason="rate"}`, "0+10x10"},
	}, "5m", []map[string]string{instanceOnly()}},
	{"DNSStandbyHedgesCapped", "none refused", []promSeries{
		{`dnsstandby_hedge_skipped_total{` + node + `,listener="169.254.10.11:53",reason="rate"}`, "0x10"},
		{`dnsstandby_hedge_skipped_total{` + node + `,listener="169.254.10.11:53",reason="answered"}`, "0+10x10"},
	}, "5m", nil},
}

// TestAlertRulesUnit runs promtool's rule unit tests on alertCases: each
// alert fires when it should and stays quiet when it should. Annotations
// are left out of the copy of the rules promtool reads (promtool compares
// them whole; `promtool check rules` already parsed their templates).
func TestAlertRulesUnit(t *testing.T) {
	promtool(t)
	rules := loadAlerts(t)
	severity := map[string]string{}
	for gi := range rules.Groups {
		for ri := range rules.Groups[gi].Rules {
			r := &rules.Groups[gi].Rules[ri]
			severity[r.Alert] = r.Labels["severity"]
			r.Annotations = nil
		}
	}
	// Every alert has a case that fires and one that does not.
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, c := range alertCases {
		if _, ok := severity[c.alert]; !ok {
			t.Errorf("case %q: no alert %s", c.name, c.alert)
		}
		if c.fire != nil {
			fires[c.alert] = true
		} else {
			quiet[c.alert] = true
		}
	}
	for a := range severity {
		if !fires[a] || !quiet[a] {
			t.Errorf("alert %s needs a case where it fires and one where it does not", a)
		}
	}

	dir := t.TempDir()
	rulesYAML, err := yaml.Marshal(rules)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts.yaml"), rulesYAML, 0o644); err != nil {
		t.Fatal(err)
	}
	type expAlert struct {
		ExpLabels map[string]string `yaml:"exp_labels"`
	}
	type ruleTest struct {
		EvalTime  string     `yaml:"eval_time"`
		AlertName string     `yaml:"alertname"`
		ExpAlerts []expAlert `yaml:"exp_alerts"`
	}
	type inputSeries struct {
		Series string `yaml:"series"`
		Values string `yaml:"values"`
	}
	type unitTest struct {
		Name          string        `yaml:"name"`
		Interval      string        `yaml:"interval"`
		InputSeries   []inputSeries `yaml:"input_series"`
		AlertRuleTest []ruleTest    `yaml:"alert_rule_test"`
	}
	var tests []unitTest
	for _, c := range alertCases {
		ut := unitTest{Name: c.alert + ": " + c.name, Interval: "1m"}
		for _, s := range c.series {
			ut.InputSeries = append(ut.InputSeries, inputSeries{s.series, s.values})
		}
		rt := ruleTest{EvalTime: c.at, AlertName: c.alert, ExpAlerts: []expAlert{}}
		for _, l := range c.fire {
			labels := map[string]string{"severity": severity[c.alert]}
			for k, v := range l {
				labels[k] = v
			}
			rt.ExpAlerts = append(rt.ExpAlerts, expAlert{labels})
		}
		ut.AlertRuleTest = []ruleTest{rt}
		tests = append(tests, ut)
	}
	testYAML, err := yaml.Marshal(map[string]any{
		"rule_files":          []string{"alerts.yaml"},
		"evaluation_interval": "1m",
		"tests":               tests,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), testYAML, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := runPromtool(t, dir, "test", "rules", "alerts_test.yaml"); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}

// grafanaDashboard is the part of a dashboard the test reads.
type grafanaDashboard struct {
	SchemaVersion int    `json:"schemaVersion"`
	Title         string `json:"title"`
	UID           string `json:"uid"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Datasource *grafanaDS      `json:"datasource"`
			Definition string          `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
	Annotations struct {
		List []struct {
			Name       string     `json:"name"`
			Expr       string     `json:"expr"`
			Datasource *grafanaDS `json:"datasource"`
		} `json:"list"`
	} `json:"annotations"`
	Panels []grafanaPanel `json:"panels"`
}

type grafanaDS struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type grafanaPanel struct {
	ID         int        `json:"id"`
	Type       string     `json:"type"`
	Title      string     `json:"title"`
	Datasource *grafanaDS `json:"datasource"`
	GridPos    struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		Expr       string     `json:"expr"`
		RefID      string     `json:"refId"`
		Datasource *grafanaDS `json:"datasource"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"` // a collapsed row's
}

func loadDashboard(t testing.TB) *grafanaDashboard {
	t.Helper()
	var d grafanaDashboard
	if err := json.Unmarshal(readFile(t, dashboardFile), &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return &d
}

// dashboardExprs returns every PromQL expression of the dashboard: panel
// targets, the node variable's query, annotations.
func (d *grafanaDashboard) exprs() map[string]string {
	out := map[string]string{}
	var walk func([]grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				out[fmt.Sprintf("panel %d %q target %s", p.ID, p.Title, tg.RefID)] = tg.Expr
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, a := range d.Annotations.List {
		if a.Expr != "" {
			out["annotation "+a.Name] = a.Expr
		}
	}
	return out
}

// TestDashboard checks dashboard.json: valid JSON of the right schema, a
// datasource and a node variable, panels that use them, and only metrics
// dnsstandby exports.
func TestDashboard(t *testing.T) {
	inv := loadInventory(t)
	d := loadDashboard(t)
	if d.SchemaVersion < 36 || d.SchemaVersion > 41 {
		t.Errorf("schemaVersion %d, want about 39", d.SchemaVersion)
	}
	if d.Title == "" || d.UID == "" {
		t.Errorf("title %q uid %q", d.Title, d.UID)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
		if v.Name == "node" {
			// label_values(METRIC, instance) over a dnsstandby metric.
			mt := regexp.MustCompile(`^label_values\((\w+),\s*instance\)$`).FindStringSubmatch(v.Definition)
			if mt == nil {
				t.Errorf("node variable: definition %q, want label_values(METRIC, instance)", v.Definition)
			} else if _, _, err := inv.series(mt[1]); err != nil {
				t.Errorf("node variable: %v", err)
			}
			if v.Datasource == nil || v.Datasource.UID != "${datasource}" {
				t.Errorf("node variable: datasource %+v, want ${datasource}", v.Datasource)
			}
		}
	}
	if vars["datasource"] != "datasource" || vars["node"] != "query" {
		t.Errorf("variables %v: want datasource (type datasource) and node (type query)", vars)
	}

	ids := map[int]bool{}
	var count int
	var walk func([]grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("panel id %d used twice", p.ID)
			}
			ids[p.ID] = true
			if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
				t.Errorf("panel %q: gridPos %+v", p.Title, p.GridPos)
			}
			if p.Type != "row" {
				count++
				if len(p.Targets) == 0 {
					t.Errorf("panel %q has no query", p.Title)
				}
				if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
					t.Errorf("panel %q: datasource %+v, want ${datasource}", p.Title, p.Datasource)
				}
				for _, tg := range p.Targets {
					if !strings.Contains(tg.Expr, `instance=~"$node"`) {
						t.Errorf("panel %q target %s ignores the node variable: %s", p.Title, tg.RefID, tg.Expr)
					}
				}
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	if count < 10 {
		t.Errorf("%d panels", count)
	}
	for where, expr := range d.exprs() {
		for _, err := range inv.checkPromQL(expr) {
			t.Errorf("%s: %v", where, err)
		}
	}
	// The subjects the dashboard is for.
	all := ""
	for _, e := range d.exprs() {
		all += e + "\n"
	}
	for _, m := range []string{
		"dnsstandby_mode{", "dnsstandby_mode_transitions_total", "dnsstandby_mode_duration_seconds_bucket",
		"dnsstandby_queries_total", "dnsstandby_cache_entries", "dnsstandby_cache_hits_total",
		`dnsstandby_mirror_records_total`, "dnsstandby_steer_level", "dnsstandby_peer_probes_total",
		"dnsstandby_upstream_speculative_total",
	} {
		if !strings.Contains(all, m) {
			t.Errorf("no panel shows %s", m)
		}
	}
}

// TestDashboardPromtool has promtool parse every dashboard expression, the
// Grafana variables replaced by values, as recording rules.
func TestDashboardPromtool(t *testing.T) {
	promtool(t)
	d := loadDashboard(t)
	type rec struct {
		Record string `yaml:"record"`
		Expr   string `yaml:"expr"`
	}
	var recs []rec
	for _, expr := range d.exprs() {
		expr = strings.ReplaceAll(grafanaIntervals.Replace(expr), "$node", ".*")
		recs = append(recs, rec{fmt.Sprintf("dashboard:expr%d", len(recs)), expr})
	}
	b, err := yaml.Marshal(map[string]any{"groups": []map[string]any{{"name": "dashboard", "rules": recs}}})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dashboard.rules.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := runPromtool(t, dir, "check", "rules", "dashboard.rules.yaml"); err != nil {
		t.Fatalf("promtool check rules (the dashboard's expressions): %v\n%s", err, out)
	}
}
