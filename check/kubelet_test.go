package check

import (
	"github.com/dnsstandby/dnsstandby/status"

	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestParseKubeletConfig(t *testing.T) {
	tests := []struct {
		name       string
		in         string
		wantDNS    []string
		wantDomain string
		wantErr    bool
	}{
		{"kubeadm yaml", `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous:
    enabled: false
clusterDNS:
- 169.254.10.11
clusterDomain: cluster.local
`, []string{"169.254.10.11"}, "cluster.local", false},
		{"flow list, quoted", "clusterDNS: [\"10.0.0.10\", '10.0.0.11']\n", []string{"10.0.0.10", "10.0.0.11"}, "", false},
		{"indented list", "clusterDNS:\n  - 169.254.10.11\n  - 10.0.0.10 # fallback\n", []string{"169.254.10.11", "10.0.0.10"}, "", false},
		// AKS's /etc/default/kubeletconfig.json: JSON is YAML.
		{"aks json", `{"kind":"KubeletConfiguration","apiVersion":"kubelet.config.k8s.io/v1beta1","clusterDomain":"cluster.local","clusterDNS":["169.254.10.11"],"maxPods":110}`,
			[]string{"169.254.10.11"}, "cluster.local", false},
		{"no clusterDNS", "kind: KubeletConfiguration\nmaxPods: 110\n", nil, "", false},
		{"not yaml", "clusterDNS: [unclosed\n", nil, "", true},
		{"wrong type", "clusterDNS: {a: b}\n", nil, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseKubeletConfig([]byte(tt.in))
			if (err != nil) != tt.wantErr {
				t.Fatalf("error %v, want error %v", err, tt.wantErr)
			}
			if err == nil && (!slices.Equal(c.ClusterDNS, tt.wantDNS) || c.ClusterDomain != tt.wantDomain) {
				t.Fatalf("got %q, %q; want %q, %q", c.ClusterDNS, c.ClusterDomain, tt.wantDNS, tt.wantDomain)
			}
		})
	}
}

func TestParseKubeletFlags(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want kubeletFlags
	}{
		// /etc/default/kubelet as AgentBaker writes it (shortened).
		{"aks", `KUBELET_FLAGS=--address=0.0.0.0 --anonymous-auth=false --cgroups-per-qos=true --cluster-dns=169.254.10.11 --cluster-domain=cluster.local --enforce-node-allocatable=pods --max-pods=110
KUBELET_REGISTER_SCHEDULABLE=true
KUBELET_NODE_LABELS=kubernetes.azure.com/agentpool=nodepool1
`, kubeletFlags{ClusterDNS: []string{"169.254.10.11"}, ClusterDomain: "cluster.local"}},
		{"first flag after the name", "KUBELET_FLAGS=--cluster-dns=10.0.0.10\n", kubeletFlags{ClusterDNS: []string{"10.0.0.10"}}},
		{"quoted, space-separated values", `KUBELET_EXTRA_ARGS="--config /etc/default/kubeletconfig.json --cluster-dns 10.0.0.10,10.0.0.11 --rotate-certificates"`,
			kubeletFlags{ClusterDNS: []string{"10.0.0.10", "10.0.0.11"}, Config: "/etc/default/kubeletconfig.json"}},
		{"last wins", "A=--cluster-dns=10.0.0.10\nB=--cluster-dns=169.254.10.11\n", kubeletFlags{ClusterDNS: []string{"169.254.10.11"}}},
		{"comments skipped", "# KUBELET_FLAGS=--cluster-dns=10.0.0.10\nKUBELET_FLAGS=--v=2\n", kubeletFlags{}},
		{"boolean flag before a value flag", "X=--rotate-certificates --cluster-dns=169.254.10.11", kubeletFlags{ClusterDNS: []string{"169.254.10.11"}}},
		{"empty", "", kubeletFlags{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := parseKubeletFlags([]byte(tt.in))
			if !slices.Equal(got.ClusterDNS, tt.want.ClusterDNS) || got.ClusterDomain != tt.want.ClusterDomain || got.Config != tt.want.Config {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestClusterDNSResult(t *testing.T) {
	listen := []netip.AddrPort{status.DefaultListen}
	missing := &fs.PathError{Op: "open", Path: "x", Err: fs.ErrNotExist}
	denied := &fs.PathError{Op: "open", Path: "x", Err: fs.ErrPermission}
	facts := func(config []string, configErr error, flags []string, flagsErr error) kubeletFacts {
		return kubeletFacts{
			ConfigPath: "/var/lib/kubelet/config.yaml", Config: kubeletConfig{ClusterDNS: config}, ConfigErr: configErr,
			FlagsPath: "/etc/default/kubelet", Flags: kubeletFlags{ClusterDNS: flags}, FlagsErr: flagsErr,
		}
	}
	tests := []struct {
		name      string
		k         kubeletFacts
		want      Status
		wantFound string
		wantFix   string
	}{
		{"config lists .11", facts([]string{"169.254.10.11"}, nil, nil, missing), Pass, "clusterDNS = 169.254.10.11", ""},
		{"flags list .11", facts(nil, missing, []string{"169.254.10.11"}, nil), Pass, "--cluster-dns = 169.254.10.11", ""},
		{"kube-dns directly", facts([]string{"10.0.0.10"}, nil, nil, missing), Fail, "do not ask LocalDNS", "169.254.10.11"},
		// A flag overrides the config file, as in kubelet.
		{"flag overrides config", facts([]string{"169.254.10.11"}, nil, []string{"10.0.0.10"}, nil), Fail, "--cluster-dns = 10.0.0.10", ""},
		{"flag fixes config", facts([]string{"10.0.0.10"}, nil, []string{"169.254.10.11"}, nil), Pass, "--cluster-dns", ""},
		{".11 second", facts([]string{"10.0.0.10", "169.254.10.11"}, nil, nil, missing), Warn, "not first", "first"},
		{"neither file", facts(nil, missing, nil, missing), Warn, "neither", "--kubelet-config"},
		{"no setting", facts(nil, nil, nil, nil), Warn, "no cluster DNS", "--kubelet-flags"},
		{"flags unreadable", facts([]string{"169.254.10.11"}, nil, nil, denied), Warn, "unreadable", "as root"},
		{"not an address", facts([]string{"localdns"}, nil, nil, missing), Fail, "localdns", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := clusterDNSResult(tt.k, listen, where{})
			if r.Name != "cluster-dns" || r.Status != tt.want {
				t.Fatalf("%s %s, want %s: %s (fix: %s)", r.Name, r.Status, tt.want, r.Found, r.Fix)
			}
			checkRow(t, r, tt.wantFound, tt.wantFix)
		})
	}
}

// TestReadKubelet: the config file kubelet's flags name is read when none
// is given, and a missing file is reported as missing.
func TestReadKubelet(t *testing.T) {
	dir := t.TempDir()
	flags := filepath.Join(dir, "kubelet")
	config := filepath.Join(dir, "kubeletconfig.json")
	write(t, flags, "KUBELET_FLAGS=--v=2 --config="+config+"\n")
	write(t, config, `{"clusterDNS":["169.254.10.11"],"clusterDomain":"example.local"}`)

	k := readKubelet(Config{KubeletFlags: flags})
	if k.ConfigPath != config || k.ConfigErr != nil || k.clusterDomain() != "example.local" {
		t.Fatalf("read %s (%v), domain %q; want %s", k.ConfigPath, k.ConfigErr, k.clusterDomain(), config)
	}
	if r := clusterDNSResult(k, []netip.AddrPort{status.DefaultListen}, where{}); r.Status != Pass {
		t.Fatalf("%s: %s", r.Status, r.Found)
	}

	k = readKubelet(Config{KubeletFlags: filepath.Join(dir, "absent"), KubeletConfig: filepath.Join(dir, "absent.yaml")})
	if r := clusterDNSResult(k, []netip.AddrPort{status.DefaultListen}, where{}); r.Status != Warn || k.clusterDomain() != "" {
		t.Fatalf("%s: %s", r.Status, r.Found)
	}
}

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}
