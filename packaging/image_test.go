package packaging_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	"go.yaml.in/yaml/v3"
	"golang.org/x/sys/unix"
)

// The parts of the OCI image layout the tests read
// (github.com/opencontainers/image-spec).
type (
	ociDescriptor struct {
		MediaType   string            `json:"mediaType"`
		Digest      string            `json:"digest"`
		Size        int64             `json:"size"`
		Annotations map[string]string `json:"annotations"`
		Platform    *struct {
			OS           string `json:"os"`
			Architecture string `json:"architecture"`
		} `json:"platform"`
	}
	ociIndex struct {
		MediaType string          `json:"mediaType"`
		Manifests []ociDescriptor `json:"manifests"`
	}
	ociManifest struct {
		MediaType string          `json:"mediaType"`
		Config    ociDescriptor   `json:"config"`
		Layers    []ociDescriptor `json:"layers"`
	}
	ociConfig struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
		Config       struct {
			User       string            `json:"User"`
			Env        []string          `json:"Env"`
			Entrypoint []string          `json:"Entrypoint"`
			Cmd        []string          `json:"Cmd"`
			WorkingDir string            `json:"WorkingDir"`
			Labels     map[string]string `json:"Labels"`
		} `json:"config"`
	}
)

// ociImage is one architecture's image of the archive.
type ociImage struct {
	config ociConfig
	layers [][]byte // gzip'd tars, base first
}

// ociArchive is an OCI archive (`make image`'s): its top index and, by
// architecture, the images its image index lists.
type ociArchive struct {
	top    ociIndex
	images map[string]ociImage
}

// readOCIArchive reads an OCI archive and checks every blob it reads
// against its digest.
func readOCIArchive(t *testing.T, path string) ociArchive {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if files[h.Name], err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
	if layout := string(files["oci-layout"]); !strings.Contains(layout, `"imageLayoutVersion"`) {
		t.Fatalf("%s: oci-layout %q", path, layout)
	}
	blob := func(d ociDescriptor, v any) []byte {
		t.Helper()
		algo, hexDigest, _ := strings.Cut(d.Digest, ":")
		b, ok := files["blobs/"+algo+"/"+hexDigest]
		if !ok || algo != "sha256" || sha256Hex(b) != hexDigest || int64(len(b)) != d.Size {
			t.Fatalf("%s: blob %s missing or not matching its descriptor", path, d.Digest)
		}
		if v != nil {
			if err := json.Unmarshal(b, v); err != nil {
				t.Fatalf("%s: blob %s: %v", path, d.Digest, err)
			}
		}
		return b
	}
	var a ociArchive
	if err := json.Unmarshal(files["index.json"], &a.top); err != nil {
		t.Fatalf("%s: index.json: %v", path, err)
	}
	if len(a.top.Manifests) != 1 || a.top.Manifests[0].MediaType != "application/vnd.oci.image.index.v1+json" {
		t.Fatalf("%s: index.json lists %+v, want one image index", path, a.top.Manifests)
	}
	var index ociIndex
	blob(a.top.Manifests[0], &index)
	a.images = map[string]ociImage{}
	for _, d := range index.Manifests {
		if d.Platform == nil || d.Platform.OS != "linux" {
			t.Fatalf("%s: image %s: platform %+v, want linux/ARCH", path, d.Digest, d.Platform)
		}
		var m ociManifest
		blob(d, &m)
		var img ociImage
		blob(m.Config, &img.config)
		for _, l := range m.Layers {
			img.layers = append(img.layers, blob(l, nil))
		}
		a.images[d.Platform.Architecture] = img
	}
	return a
}

// layerFile is a file of an image's file system.
type layerFile struct {
	typ      byte
	mode     int64
	uid, gid int
	data     []byte
}

// rootfs reads an image's layers into one file system, by path ("usr/...").
func (img ociImage) rootfs(t *testing.T) map[string]layerFile {
	t.Helper()
	fs := map[string]layerFile{}
	for _, l := range img.layers {
		zr, err := gzip.NewReader(bytes.NewReader(l))
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(zr)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(h.Name, ".wh.") {
				t.Fatalf("whiteout %s: an image built on nothing deletes nothing", h.Name)
			}
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			fs[strings.Trim(strings.TrimPrefix(h.Name, "./"), "/")] = layerFile{h.Typeflag, h.Mode & 0o7777, h.Uid, h.Gid, data}
		}
	}
	return fs
}

// daemonSetCommand is the container command of deploy/kubernetes's
// DaemonSet.
func daemonSetCommand(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "deploy/kubernetes/daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var obj struct {
			Kind string `yaml:"kind"`
			Spec struct {
				Template struct {
					Spec struct {
						Containers []struct {
							Command []string `yaml:"command"`
						} `yaml:"containers"`
					} `yaml:"spec"`
				} `yaml:"template"`
			} `yaml:"spec"`
		}
		if err := dec.Decode(&obj); err != nil {
			t.Fatalf("daemonset.yaml: no DaemonSet with one container (%v)", err)
		}
		if c := obj.Spec.Template.Spec.Containers; obj.Kind == "DaemonSet" && len(c) == 1 {
			return c[0].Command
		}
	}
}

// needRoot skips a test of the image: buildah's storage and podman need
// root here.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: `make image` runs buildah, the run test podman and chroot; run the tests as root")
	}
}

func imagePath() string { return filepath.Join(dist, "dnsstandby-image.oci.tar") }

// TestImageConfig: `make image` writes an OCI archive holding one image per
// architecture, each the release binary for it and the license on an
// empty base (no shell, nothing else), run as a non-root user, with the
// DaemonSet's command as entrypoint, labelled with the version and commit.
func TestImageConfig(t *testing.T) {
	needRoot(t)
	mustMake(t, "image")
	b := thisBuild(t)
	a := readOCIArchive(t, imagePath())
	if ref, want := a.top.Manifests[0].Annotations["org.opencontainers.image.ref.name"], "dnsstandby:"+strings.ReplaceAll(b.version, "+", "-"); ref != want {
		t.Errorf("ref.name %q, want %q", ref, want)
	}
	if got, want := slices.Sorted(func(yield func(string) bool) {
		for arch := range a.images {
			if !yield(arch) {
				return
			}
		}
	}), slices.Sorted(slices.Values(testArches())); !slices.Equal(got, want) {
		t.Errorf("images for %v, want %v", got, want)
	}
	entrypoint := []string{"/usr/local/bin/dnsstandby"}
	if cmd := daemonSetCommand(t); !slices.Equal(cmd, entrypoint) {
		t.Errorf("the DaemonSet's command %q is not the image's entrypoint %q", cmd, entrypoint)
	}
	license, err := os.ReadFile(filepath.Join(repoRoot, "LICENSE"))
	if err != nil {
		t.Fatal(err)
	}
	for _, arch := range testArches() {
		img, ok := a.images[arch]
		if !ok {
			continue
		}
		binary, err := os.ReadFile(filepath.Join(dist, "dnsstandby-linux-"+arch))
		if err != nil {
			t.Fatal(err)
		}
		c := img.config
		tests := []struct {
			what      string
			got, want any
		}{
			{"os/architecture", c.OS + "/" + c.Architecture, "linux/" + arch},
			{"Entrypoint", c.Config.Entrypoint, entrypoint},
			{"Cmd", c.Config.Cmd, []string{"version"}},
			{"User", c.Config.User, "65532:65532"},
			{"label version", c.Config.Labels["org.opencontainers.image.version"], b.version},
			{"label revision", c.Config.Labels["org.opencontainers.image.revision"], b.revision},
			{"label created", c.Config.Labels["org.opencontainers.image.created"], b.time},
			{"label licenses", c.Config.Labels["org.opencontainers.image.licenses"], "Apache-2.0"},
			{"label source", c.Config.Labels["org.opencontainers.image.source"], "https://github.com/dnsstandby/dnsstandby"},
			{"layers", len(img.layers), 1},
		}
		for _, tc := range tests {
			if fmt.Sprint(tc.got) != fmt.Sprint(tc.want) {
				t.Errorf("%s: %s %v, want %v", arch, tc.what, tc.got, tc.want)
			}
		}
		fs := img.rootfs(t)
		files := []struct {
			path string
			mode int64
			data []byte
		}{
			{"usr/local/bin/dnsstandby", 0o755, binary},
			{"usr/share/doc/dnsstandby/LICENSE", 0o644, license},
		}
		var want []string
		for _, f := range files {
			want = append(want, f.path)
			got, ok := fs[f.path]
			if !ok {
				t.Errorf("%s: no /%s in the image", arch, f.path)
				continue
			}
			if got.typ != tar.TypeReg || got.mode != f.mode || got.uid != 0 || got.gid != 0 || !bytes.Equal(got.data, f.data) {
				t.Errorf("%s: /%s: type %c mode %o owner %d:%d, %d bytes; want the tree's, mode %o, owned by root",
					arch, f.path, got.typ, got.mode, got.uid, got.gid, len(got.data), f.mode)
			}
		}
		// Nothing but those two: no shell, no libraries, no passwd.
		var got []string
		for p, f := range fs {
			if f.typ != tar.TypeDir {
				got = append(got, p)
			}
		}
		if slices.Sort(got); !slices.Equal(got, want) {
			t.Errorf("%s: the image holds %v, want exactly %v", arch, got, want)
		}
	}
}

// qemuUser is the user-mode emulator qemu-user-static has for each
// architecture released (scripts/release-check uses the same).
var qemuUser = map[string]string{"arm64": "qemu-aarch64-static", "amd64": "qemu-x86_64-static"}

// TestImageRuns runs the image of this machine's architecture as it is
// configured (entrypoint, command, user, environment), two ways: with
// podman from the OCI archive, and with the archive's file system unpacked
// and the entrypoint run in a chroot of it as the image's user, which shows
// that it needs nothing the image does not hold; the second also for each
// other architecture built, under qemu. Each must print what the release
// binary prints for `version`.
func TestImageRuns(t *testing.T) {
	needRoot(t)
	mustMake(t, "image")
	if !slices.Contains(testArches(), runtime.GOARCH) {
		t.Skipf("no %s image built (DNSSTANDBY_TEST_ARCHES=%q)", runtime.GOARCH, os.Getenv("DNSSTANDBY_TEST_ARCHES"))
	}
	want, err := exec.Command(filepath.Join(dist, "dnsstandby-linux-"+runtime.GOARCH), "version").Output()
	if err != nil {
		t.Fatal(err)
	}

	t.Run("podman", func(t *testing.T) {
		for _, tool := range []struct{ cmd, pkg string }{{"podman", "podman"}, {"runc", "runc"}} {
			if _, err := exec.LookPath(tool.cmd); err != nil {
				t.Fatalf("needs %s (Debian package %s; scripts/install-test-deps installs it)", tool.cmd, tool.pkg)
			}
		}
		store := t.TempDir()
		// A store of the test's own (vfs: no mounts left behind). runc and
		// cgroupfs: crun refuses this project's hybrid cgroup hierarchy.
		// Limits no higher than the test's own: the container runtime
		// cannot raise them without CAP_SYS_RESOURCE, which this
		// machine's root lacks.
		podman := []string{"--root", filepath.Join(store, "root"), "--runroot", filepath.Join(store, "run"),
			"--storage-driver", "vfs", "--runtime", "runc", "--cgroup-manager", "cgroupfs"}
		var nofile, nproc syscall.Rlimit
		syscall.Getrlimit(syscall.RLIMIT_NOFILE, &nofile)
		syscall.Getrlimit(unix.RLIMIT_NPROC, &nproc)
		run := append(podman, "run", "--rm", "--network", "none", "--pull", "always",
			"--ulimit", fmt.Sprintf("nofile=%d:%d", min(nofile.Cur, 1024), min(nofile.Cur, 1024)),
			"--ulimit", fmt.Sprintf("nproc=%d:%d", min(nproc.Cur, 1024), min(nproc.Cur, 1024)),
			"oci-archive:"+imagePath())
		cmd := exec.Command("podman", run...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("podman %s: %v\n%s", strings.Join(run, " "), err, stderr.String())
		}
		if string(out) != string(want) {
			t.Errorf("podman run: %q, want %q", out, want)
		}
		exec.Command("podman", append(podman, "system", "reset", "--force")...).Run()
	})

	// Every architecture's, this machine's directly, the others under
	// qemu-user-static's emulator copied into the file system (static: it
	// needs nothing there either).
	images := readOCIArchive(t, imagePath()).images
	for _, arch := range testArches() {
		t.Run("rootfs/"+arch, func(t *testing.T) {
			img := images[arch]
			var emulator string
			if arch != runtime.GOARCH {
				var err error
				if emulator, err = exec.LookPath(qemuUser[arch]); err != nil {
					t.Fatalf("needs %s (Debian package qemu-user-static; make release-check installs it)", qemuUser[arch])
				}
			}
			root := t.TempDir()
			for p, f := range img.rootfs(t) {
				dst := filepath.Join(root, p)
				switch f.typ {
				case tar.TypeDir:
					if err := os.MkdirAll(dst, 0o755); err != nil {
						t.Fatal(err)
					}
				case tar.TypeReg:
					if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(dst, f.data, os.FileMode(f.mode)); err != nil {
						t.Fatal(err)
					}
				default:
					t.Fatalf("/%s: type %c", p, f.typ)
				}
			}
			if err := os.Chmod(root, 0o755); err != nil { // TempDir's is 0700: the user must reach its files
				t.Fatal(err)
			}
			c := img.config.Config
			var uid, gid uint32
			if _, err := fmt.Sscanf(c.User, "%d:%d", &uid, &gid); err != nil {
				t.Fatalf("User %q: want UID:GID", c.User)
			}
			argv := append(slices.Clone(c.Entrypoint), c.Cmd...)
			if emulator != "" {
				b, err := os.ReadFile(emulator)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(root, "qemu-user-static"), b, 0o755); err != nil {
					t.Fatal(err)
				}
				argv = append([]string{"/qemu-user-static"}, argv...)
			}
			cmd := exec.Command(argv[0], argv[1:]...)
			cmd.Env = c.Env
			cmd.Dir = "/"
			cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root, Credential: &syscall.Credential{Uid: uid, Gid: gid}}
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%q chrooted in the image's file system as %s: %v\n%s", argv, c.User, err, out)
			}
			if string(out) != string(want) {
				t.Errorf("%q in the image's file system: %q, want %q", argv, out, want)
			}
		})
	}
}
