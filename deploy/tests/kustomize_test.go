package tests

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

const (
	// kustomizeBase is deploy/kubernetes, a kustomize base.
	kustomizeBase     = "../kubernetes"
	kustomizationFile = kustomizeBase + "/kustomization.yaml"
	// placeholderImage is daemonset.yaml's image: no registry serves it,
	// so the DaemonSet cannot start until an overlay sets a real one.
	placeholderImage = "dnsstandby:set-in-overlay"
	// placeholderName is the name an overlay's images entry matches.
	placeholderName = "dnsstandby"
)

// kustomization is the part of kustomize's Kustomization
// (sigs.k8s.io/kustomize/api/types) a base or overlay of dnsstandby's uses;
// decoded strictly, like the manifest.
type kustomization struct {
	APIVersion string   `yaml:"apiVersion"`
	Kind       string   `yaml:"kind"`
	Namespace  string   `yaml:"namespace"`
	Resources  []string `yaml:"resources"`
	Images     []struct {
		Name    string `yaml:"name"`
		NewName string `yaml:"newName"`
		NewTag  string `yaml:"newTag"`
		Digest  string `yaml:"digest"`
	} `yaml:"images"`
	Patches []struct {
		Path   string `yaml:"path"`
		Patch  string `yaml:"patch"`
		Target *struct {
			Kind string `yaml:"kind"`
			Name string `yaml:"name"`
		} `yaml:"target"`
	} `yaml:"patches"`
}

func decodeKustomization(data []byte) (*kustomization, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var k kustomization
	if err := dec.Decode(&k); err != nil {
		return nil, err
	}
	return &k, nil
}

// kustomizeBuild renders the kustomization in dir as `kubectl apply -k`
// would (kustomize's own krusty, the library kubectl embeds).
func kustomizeBuild(t *testing.T, dir string) []byte {
	t.Helper()
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out, err := res.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestKustomization: deploy/kubernetes/kustomization.yaml, decoded strictly,
// is a base of daemonset.yaml alone that leaves the image to overlays, and
// renders to exactly daemonset.yaml's objects.
func TestKustomization(t *testing.T) {
	k, err := decodeKustomization(readFile(t, kustomizationFile))
	if err != nil {
		t.Fatalf("%s: %v", kustomizationFile, err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		t.Errorf("apiVersion %q kind %q", k.APIVersion, k.Kind)
	}
	if !reflect.DeepEqual(k.Resources, []string{"daemonset.yaml"}) {
		t.Errorf("resources %q, want daemonset.yaml alone (alerts.yaml and dashboard.json are not Kubernetes objects)", k.Resources)
	}
	if len(k.Images) > 0 || k.Namespace != "" || len(k.Patches) > 0 {
		t.Errorf("the base sets images %+v, namespace %q, patches %+v: they are the overlay's", k.Images, k.Namespace, k.Patches)
	}
	want := loadManifest(t, readFile(t, daemonSetFile))
	got, err := decodeManifest(kustomizeBuild(t, kustomizeBase))
	if err != nil {
		t.Fatalf("kustomize build %s, decoded strictly: %v", kustomizeBase, err)
	}
	if !reflect.DeepEqual(got.serviceAccount, want.serviceAccount) || !reflect.DeepEqual(got.daemonSet, want.daemonSet) {
		t.Errorf("kustomize build of the base differs from daemonset.yaml:\n%+v\n%+v", got.daemonSet, want.daemonSet)
	}
	// The comment's overlay names the image as the manifest does.
	if !strings.Contains(string(readFile(t, kustomizationFile)), "    - name: "+placeholderName+"\n") {
		t.Errorf("%s: the example overlay does not name the image %s", kustomizationFile, placeholderName)
	}
	if name, _, _ := strings.Cut(placeholderImage, ":"); name != placeholderName {
		t.Fatalf("placeholder %s is not named %s", placeholderImage, placeholderName)
	}
	// Strict: a misspelled field fails, as kustomize refuses it.
	for _, tt := range []struct{ from, to string }{
		{"\nresources:", "\nresource:"},
		{"\nkind: Kustomization", "\nkind: Kustomization\nimage: x"},
	} {
		bad := strings.Replace(string(readFile(t, kustomizationFile)), tt.from, tt.to, 1)
		if _, err := decodeKustomization([]byte(bad)); err == nil {
			t.Errorf("%q instead of %q was accepted", tt.to, tt.from)
		}
	}
}

// TestKustomizeOverlay renders overlays of deploy/kubernetes as
// docs/install.md has users write them: the image set by tag or by digest,
// the namespace changed, --upstream in place of LocalDNS's Corefile. Each renders to a ServiceAccount and a DaemonSet
// that decode strictly, pass TestDaemonSet's image rules for a pinned
// image, and differ from daemonset.yaml in nothing but what the overlay
// set.
func TestKustomizeOverlay(t *testing.T) {
	base, err := filepath.Abs(kustomizeBase)
	if err != nil {
		t.Fatal(err)
	}
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	tests := []struct {
		name      string
		overlay   string
		image     string
		namespace string
		upstream  string // the --upstream override, "" for none
	}{
		{"tag", `images:
  - name: dnsstandby
    newName: registry.example.com/dnsstandby
    newTag: v0.1.0
`, "registry.example.com/dnsstandby:v0.1.0", "kube-system", ""},
		{"digest", `images:
  - name: dnsstandby
    newName: registry.example.com/platform/dnsstandby
    digest: ` + digest + `
`, "registry.example.com/platform/dnsstandby@" + digest, "kube-system", ""},
		{"digest and namespace", `namespace: dns-system
images:
  - name: dnsstandby
    newName: myregistry.azurecr.io/dnsstandby
    digest: ` + digest + `
`, "myregistry.azurecr.io/dnsstandby@" + digest, "dns-system", ""},
		// docs/install.md's override for nodes without LocalDNS's
		// Corefile: the kube-dns ClusterIP instead, and no Corefile mount
		// (its type: Directory would keep the pod from starting there).
		// The test ops make the patch fail, not misapply, should the base's
		// order change.
		{"upstream override", `images:
  - name: dnsstandby
    newName: registry.example.com/dnsstandby
    newTag: v0.1.0
patches:
  - target:
      kind: DaemonSet
      name: dnsstandby
    patch: |-
      - op: test
        path: /spec/template/spec/containers/0/args/3
        value: --localdns-corefile=/opt/azure/containers/localdns/updated.localdns.corefile,/opt/azure/containers/localdns/localdns.corefile
      - op: replace
        path: /spec/template/spec/containers/0/args/3
        value: --upstream=10.0.0.10:53
      - op: test
        path: /spec/template/spec/containers/0/volumeMounts/2/name
        value: localdns-corefile
      - op: remove
        path: /spec/template/spec/containers/0/volumeMounts/2
      - op: test
        path: /spec/template/spec/volumes/2/name
        value: localdns-corefile
      - op: remove
        path: /spec/template/spec/volumes/2
`, "registry.example.com/dnsstandby:v0.1.0", "kube-system", "10.0.0.10:53"},
	}
	pinned := regexp.MustCompile(`^[a-z0-9.-]+(:[0-9]+)?/[a-z0-9./_-]+(:[A-Za-z0-9_.-]+|@sha256:[0-9a-f]{64})$`)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			// A base is named by a relative path (or a git URL).
			rel, err := filepath.Rel(dir, base)
			if err != nil {
				t.Fatal(err)
			}
			text := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - %s\n%s", rel, tc.overlay)
			if _, err := decodeKustomization([]byte(text)); err != nil {
				t.Fatalf("the overlay does not decode strictly: %v", err)
			}
			if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := decodeManifest(kustomizeBuild(t, dir))
			if err != nil {
				t.Fatalf("rendered overlay, decoded strictly: %v", err)
			}
			c := got.container
			if c.Image != tc.image || !pinned.MatchString(c.Image) || strings.HasSuffix(c.Image, ":latest") {
				t.Errorf("image %q, want %q, pinned by tag or digest", c.Image, tc.image)
			}
			if got.daemonSet.Metadata.Namespace != tc.namespace || got.serviceAccount.Metadata.Namespace != tc.namespace {
				t.Errorf("namespaces %q and %q, want %q", got.daemonSet.Metadata.Namespace, got.serviceAccount.Metadata.Namespace, tc.namespace)
			}
			want := loadManifest(t, readFile(t, daemonSetFile))
			if tc.upstream != "" {
				args, err := got.args()
				if err != nil {
					t.Fatal(err)
				}
				if len(args["localdns-corefile"]) > 0 || !reflect.DeepEqual(args["upstream"], []string{tc.upstream}) {
					t.Errorf("args %q: want --upstream=%s and no --localdns-corefile", c.Args, tc.upstream)
				}
				if _, _, _, ok := got.hostPathFor(localdnsDir); ok {
					t.Errorf("%s still mounted", localdnsDir)
				}
				if len(got.pod.Volumes) != len(want.pod.Volumes)-1 || len(c.VolumeMounts) != len(want.container.VolumeMounts)-1 {
					t.Errorf("%d volumes, %d mounts: want one fewer than the base's", len(got.pod.Volumes), len(c.VolumeMounts))
				}
				c.Args, c.VolumeMounts, got.pod.Volumes = want.container.Args, want.container.VolumeMounts, want.pod.Volumes
			}
			// Undo what the overlay set: the rest is daemonset.yaml.
			c.Image = placeholderImage
			got.daemonSet.Metadata.Namespace, got.serviceAccount.Metadata.Namespace = want.daemonSet.Metadata.Namespace, want.serviceAccount.Metadata.Namespace
			if !reflect.DeepEqual(got.serviceAccount, want.serviceAccount) || !reflect.DeepEqual(got.daemonSet, want.daemonSet) {
				t.Errorf("the overlay changed more than the image and namespace:\n%+v\nwant\n%+v", got.daemonSet, want.daemonSet)
			}
		})
	}
}

// reducedOverlay is the reduced-privilege overlay (docs/privileges.md).
const reducedOverlay = "../kubernetes-reduced"

// TestKustomizeReducedOverlay renders deploy/kubernetes-reduced: it decodes
// strictly, and differs from the base in exactly what docs/privileges.md
// says: no host PID namespace, no SYS_PTRACE, --steering=own, the
// runtime's default AppArmor profile. TestPrivilegeLevels runs its
// capabilities without the host's PIDs and sees level own.
func TestKustomizeReducedOverlay(t *testing.T) {
	k, err := decodeKustomization(readFile(t, reducedOverlay+"/kustomization.yaml"))
	if err != nil {
		t.Fatalf("%s: %v", reducedOverlay, err)
	}
	if !reflect.DeepEqual(k.Resources, []string{"../kubernetes"}) || len(k.Images) > 0 || k.Namespace != "" {
		t.Errorf("resources %q images %+v namespace %q: want the base alone, the image left to the user's overlay", k.Resources, k.Images, k.Namespace)
	}
	got, err := decodeManifest(kustomizeBuild(t, reducedOverlay))
	if err != nil {
		t.Fatalf("kustomize build %s, decoded strictly: %v", reducedOverlay, err)
	}
	want := loadManifest(t, readFile(t, daemonSetFile))
	args, err := got.args()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(args["steering"], []string{"own"}) {
		t.Errorf("--steering %q, want own", args["steering"])
	}
	if got.pod.HostPID {
		t.Error("hostPID: want false")
	}
	sc := got.container.SecurityContext
	if reduced := reducedCapabilities(); sc == nil || sc.Capabilities == nil || !reflect.DeepEqual(sortedCopy(sc.Capabilities.Add), reduced) {
		t.Errorf("capabilities %+v, want %q", sc, reduced)
	}
	if sc == nil || sc.AppArmorProfile == nil || sc.AppArmorProfile.Type != "RuntimeDefault" {
		t.Errorf("AppArmor %+v, want RuntimeDefault", sc)
	}
	// Undo what the overlay set: the rest is daemonset.yaml.
	got.container.Args = want.container.Args
	got.pod.HostPID = want.pod.HostPID
	sc.Capabilities.Add = want.container.SecurityContext.Capabilities.Add
	sc.AppArmorProfile.Type = want.container.SecurityContext.AppArmorProfile.Type
	if !reflect.DeepEqual(got.serviceAccount, want.serviceAccount) || !reflect.DeepEqual(got.daemonSet, want.daemonSet) {
		t.Errorf("the overlay changed more than privileges:\n%+v\nwant\n%+v", got.daemonSet, want.daemonSet)
	}
}

// reducedCapabilities is wantCapabilities without SYS_PTRACE, sorted.
func reducedCapabilities() []string {
	var out []string
	for _, c := range wantCapabilities {
		if c != "SYS_PTRACE" {
			out = append(out, c)
		}
	}
	return sortedCopy(out)
}

func sortedCopy(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}
