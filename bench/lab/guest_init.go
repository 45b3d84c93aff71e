package lab

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// guestPath is PATH for PID 1 and for commands run in the guest.
const guestPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// prepare writes the guest's state directory: the tree of files init.sh
// copies over the guest's root (units, the boot target, masks, cfg.Files),
// the mount points, and init.sh itself.
func (g *Guest) prepare(cfg GuestConfig) error {
	tree := filepath.Join(g.state, "tree")
	for _, d := range []string{"ovl", "root", "tree/etc/systemd/system"} {
		if err := os.MkdirAll(filepath.Join(g.state, d), 0o755); err != nil {
			return err
		}
	}
	units := filepath.Join(tree, "etc/systemd/system")
	for _, name := range slices.Sorted(maps.Keys(cfg.Units)) {
		if name == "" || strings.ContainsAny(name, "/\x00") {
			return fmt.Errorf("unit name %q", name)
		}
		if err := os.WriteFile(filepath.Join(units, name), []byte(cfg.Units[name]), 0o644); err != nil {
			return err
		}
	}
	target := fmt.Sprintf(`# Boot target of a dnsstandby lab guest: basic.target and the enabled units,
# none of the host's multi-user.target.
[Unit]
Description=dnsstandby lab guest
Requires=basic.target
After=basic.target
AllowIsolate=yes
%s`, guestWants(cfg.Enable))
	if err := os.WriteFile(filepath.Join(units, guestTarget), []byte(target), 0o644); err != nil {
		return err
	}
	for _, name := range append(slices.Clone(guestDefaultMasks), cfg.Mask...) {
		if name == "" || strings.ContainsAny(name, "/\x00") {
			return fmt.Errorf("masked unit name %q", name)
		}
		if _, ok := cfg.Units[name]; ok {
			return fmt.Errorf("unit %s is both given and masked", name)
		}
		if err := os.Symlink("/dev/null", filepath.Join(units, name)); err != nil {
			return err
		}
	}
	for _, p := range slices.Sorted(maps.Keys(cfg.Files)) {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
			return fmt.Errorf("guest file %q: want a clean absolute path", p)
		}
		dst := filepath.Join(tree, p)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		mode := cfg.Files[p].Mode
		if mode == 0 {
			mode = 0o644
		}
		if err := os.WriteFile(dst, []byte(cfg.Files[p].Data), mode.Perm()); err != nil {
			return err
		}
		// WriteFile's mode is cut by the umask; the guest gets the mode asked.
		if err := os.Chmod(dst, mode.Perm()); err != nil {
			return err
		}
	}
	binds, err := guestBinds(cfg.Binds)
	if err != nil {
		return err
	}
	script := strings.NewReplacer(
		"@STATE@", guestQuote(g.state),
		"@NAME@", guestQuote(g.name),
		"@TARGET@", guestTarget,
		"@SYSTEMD@", guestSystemd,
		"@PATH@", guestPath,
		"@BINDS@", binds,
	).Replace(guestInitScript)
	return os.WriteFile(filepath.Join(g.state, "init.sh"), []byte(script), 0o755)
}

func guestWants(units []string) string {
	var b strings.Builder
	for _, u := range units {
		fmt.Fprintf(&b, "Wants=%s\nAfter=%s\n", u, u)
	}
	return b.String()
}

// guestBinds renders the init script's bind mounts, read-only, in a stable
// order.
func guestBinds(binds map[string]string) (string, error) {
	var b strings.Builder
	for _, dst := range slices.Sorted(maps.Keys(binds)) {
		src := binds[dst]
		if !filepath.IsAbs(dst) || filepath.Clean(dst) != dst || dst == "/" {
			return "", fmt.Errorf("bind target %q: want a clean absolute path", dst)
		}
		st, err := os.Stat(src)
		if err != nil {
			return "", fmt.Errorf("bind %s: %w", dst, err)
		}
		d := `"$R"` + guestQuote(dst)
		if st.IsDir() {
			fmt.Fprintf(&b, "mkdir -p %s\n", d)
		} else {
			fmt.Fprintf(&b, "mkdir -p \"$(dirname %s)\" && touch %s\n", d, d)
		}
		fmt.Fprintf(&b, "mount --bind %s %s && mount -o remount,bind,ro %s\n", guestQuote(src), d, d)
	}
	return b.String(), nil
}

// guestQuote quotes s for the shell.
func guestQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// guestInitScript runs as PID 1 of the guest's PID namespace, in its own
// mount, UTS, IPC, network and (through unshare) cgroup namespaces, and ends
// by exec'ing systemd, the usual way to run systemd in a namespace,
// verified on this project's machines.
const guestInitScript = `#!/bin/bash
set -eux
S=@STATE@
R=$S/root
mount --make-rprivate /
# Writes land in a tmpfs in this mount namespace, never on the host's disk.
mount -t tmpfs -o mode=755 guest-ovl "$S/ovl"
mkdir -p "$S/ovl/upper" "$S/ovl/work"
mount -t overlay guest-root -o lowerdir=/,upperdir="$S/ovl/upper",workdir="$S/ovl/work" "$R"
mount -t proc -o nosuid,nodev,noexec proc "$R/proc"
# Kernel-wide knobs stay read-only (systemd-sysctl, PID 1's fs.file-max bump
# would change the host); the network namespace's own stay writable.
mount --bind "$R/proc/sys" "$R/proc/sys" && mount -o remount,bind,ro "$R/proc/sys"
mount --bind "$R/proc/sys/net" "$R/proc/sys/net" && mount -o remount,bind,rw "$R/proc/sys/net"
if [ -e "$R/proc/sysrq-trigger" ]; then mount --bind "$R/proc/sysrq-trigger" "$R/proc/sysrq-trigger" && mount -o remount,bind,ro "$R/proc/sysrq-trigger"; fi
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$R/sys"
mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 "$R/sys/fs/cgroup"
mount -t tmpfs -o mode=755,nosuid,strictatime guest-dev "$R/dev"
for d in null zero full random urandom tty; do touch "$R/dev/$d"; mount --bind "/dev/$d" "$R/dev/$d"; done
mkdir -p "$R/dev/pts" "$R/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620,gid=5 devpts "$R/dev/pts"
ln -s pts/ptmx "$R/dev/ptmx"
mount -t tmpfs -o mode=1777,nosuid,nodev guest-shm "$R/dev/shm"
touch "$R/dev/console"; mount --bind /dev/null "$R/dev/console"
ln -s /proc/self/fd "$R/dev/fd"
ln -s /proc/self/fd/0 "$R/dev/stdin"; ln -s /proc/self/fd/1 "$R/dev/stdout"; ln -s /proc/self/fd/2 "$R/dev/stderr"
mount -t tmpfs -o mode=755,nosuid,nodev guest-run "$R/run"
mount -t tmpfs -o mode=1777,nosuid,nodev guest-tmp "$R/tmp"
@BINDS@
# Units, the boot target, masks and files (into the overlay's upper layer).
cp -a "$S/tree/." "$R/"
echo @NAME@ > "$R/etc/hostname"
hostname @NAME@
cd "$R"
mkdir -p .oldroot
pivot_root . .oldroot
cd /
umount -l /.oldroot
rmdir /.oldroot
exec setpriv --bounding-set -sys_module,-sys_time,-sys_rawio env -i container=unshare PATH=@PATH@ \
  @SYSTEMD@ --unit=@TARGET@ --log-level=info --show-status=no
`
