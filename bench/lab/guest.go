package lab

// A guest is a real systemd booted as PID 1 in namespaces of its own (pid,
// mount, UTS, IPC, network, cgroup), the way the recipe
// the usual systemd-in-a-namespace recipe does it: an overlay of / whose writes
// land in a tmpfs, a private cgroup2 subtree, /proc/sys read-only except
// /proc/sys/net, a private /dev, pivot_root, and `--unit=` a minimal target
// so that none of the host's enabled services start. Its network namespace is
// the lab's node: LocalDNS runs in it as localdns.service under systemd's own
// restart logic (Restart=, RestartSec=, start limits, WatchdogSec=), which is
// what the crash-storm scenarios exercise.
//
// Host side, a guest named NAME owns:
//   - guestStateDir/NAME: the owner file (pid and start time of the process
//     that booted it), the init script, the tree of files copied into the
//     guest, and the empty mount points of the overlay and of the guest root
//     (the mounts themselves exist only in the guest's mount namespace and
//     vanish with it);
//   - a cgroup2 directory guestCgroupBase/NAME, the root of the guest's
//     cgroup namespace, holding every process of the guest;
//   - the named network namespace NAME (/run/netns/NAME).
//
// Close removes all three. When the process that booted a guest dies without
// closing it, PID 1 gets SIGKILL from the kernel (PDEATHSIG), which ends the
// whole PID namespace; the next BootGuest in any process finds the owner dead
// and removes what is left (guestReapStale).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

// GuestConfig says what a guest boots with.
type GuestConfig struct {
	// Name names the guest's cgroup, state directory and network namespace
	// (`ip netns exec NAME` works), and is its hostname. Unique among the
	// guests alive on the machine; letters, digits, '.', '_', '-'.
	Name string
	// Units are unit files by name ("localdns.service"), installed in the
	// guest's /etc/systemd/system.
	Units map[string]string
	// Files are written into the guest at their absolute paths (scripts,
	// Corefiles, environment files).
	Files map[string]GuestFile
	// Binds are host paths bind-mounted read-only into the guest, by guest
	// path. The guest's / is an overlay of the host's root file system only,
	// so a binary on another file system, or under /run or /tmp (which the
	// guest mounts afresh), must be bound to be seen.
	Binds map[string]string
	// Enable lists units the boot target wants: they start during boot, and
	// BootGuest returns once they are up (or reports them failed).
	Enable []string
	// Mask lists units masked in the guest besides guestDefaultMasks.
	Mask []string
}

// GuestFile is a file to write into a guest.
type GuestFile struct {
	Data string
	Mode os.FileMode // 0 means 0644
}

// Guest is a booted systemd guest. Its methods may be called from any
// goroutine; Close ends it.
type Guest struct {
	name   string
	pid    int    // PID 1 of the guest as the host sees it
	state  string // guestStateDir/NAME
	cgroup string // CGROUP2/guestCgroupName/NAME: root of the guest's cgroup namespace
	netns  *nstest.Namespace
	cmd    *exec.Cmd
	output *guestTail    // PID 1's stdout and stderr: the init script's trace, then systemd's own log
	exited chan struct{} // closed once PID 1 has exited and been reaped

	closeOnce sync.Once
	closeErr  error
}

const (
	// guestStateDir holds one directory per guest (see the file comment).
	guestStateDir = "/run/dnsstandby-guest"
	// guestLockFile serializes guest bookkeeping across processes.
	guestLockFile = "/run/lock/dnsstandby-guest.lock"
	// guestCgroupName is the directory under the cgroup2 mount that holds
	// one cgroup per guest.
	guestCgroupName = "dnsstandby-guest"
	// guestTarget is the unit PID 1 boots into: basic.target and the
	// enabled units, nothing of the host's multi-user.target.
	guestTarget = "dnsstandby-lab.target"
	// guestSystemd is systemd's binary; Debian and Ubuntu keep it here.
	guestSystemd = "/lib/systemd/systemd"

	// guestBootTimeout bounds the boot until `systemctl
	// is-system-running --wait` answers. The recipe measured 0.3 s for
	// the bare boot; a Type=notify unit that never gets ready holds the
	// boot for its TimeoutStartSec (90 s by default), which this cuts.
	guestBootTimeout = 60 * time.Second
	// guestExecTimeout bounds a command run in the guest when the caller's
	// context has no deadline: systemctl and friends answer in
	// milliseconds; one that hangs must not hang the lab.
	guestExecTimeout = 30 * time.Second
	// guestExitTimeout bounds the clean shutdown (`systemctl exit`): units
	// stop in parallel, each within its TimeoutStopSec; past this, PID 1
	// gets SIGKILL, which ends every process of the guest at once.
	guestExitTimeout = 20 * time.Second
	// guestReapTimeout bounds the wait for the kernel to reap SIGKILLed
	// processes; it takes milliseconds, so reaching it means a process
	// stuck in the kernel (D state), worth an error.
	guestReapTimeout = 10 * time.Second
	// guestOutputLimit is how much of PID 1's output is kept (the tail).
	guestOutputLimit = 64 << 10
)

// guestDefaultMasks are masked in every guest: timers.target would start the
// host's timers (apt-daily, fstrim, man-db, e2scrub_all, ...) inside the
// guest, where they have nothing to do but could run at boot when the host
// missed them (Persistent=true).
var guestDefaultMasks = []string{"timers.target"}

var guestNameRegex = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)

// guestMu serializes boots and reaping within this process; guestLock adds
// a file lock for other processes.
var guestMu sync.Mutex

// BootGuest boots a guest and returns once `systemctl is-system-running
// --wait` says "running". A failed boot (a unit of the boot failed, systemd
// never came up, the timeout passed) is an error that includes the tail of
// the guest's journal and of PID 1's output; nothing of the guest is left
// behind. Guests left by dead processes are removed first.
func BootGuest(ctx context.Context, cfg GuestConfig) (g *Guest, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("boot guest: needs root (namespaces, cgroups, mounts)")
	}
	if !guestNameRegex.MatchString(cfg.Name) {
		return nil, fmt.Errorf("boot guest: name %q: want 1 to 63 letters, digits, '.', '_', '-'", cfg.Name)
	}
	for _, tool := range []string{guestSystemd, "/usr/bin/nsenter", "/usr/bin/unshare", "/usr/bin/setpriv"} {
		if _, err := os.Stat(tool); err != nil {
			return nil, fmt.Errorf("boot guest %s: %w", cfg.Name, err)
		}
	}
	cgroupRoot, err := guestCgroupRoot()
	if err != nil {
		return nil, fmt.Errorf("boot guest %s: %w", cfg.Name, err)
	}
	g = &Guest{
		name:   cfg.Name,
		state:  filepath.Join(guestStateDir, cfg.Name),
		cgroup: filepath.Join(cgroupRoot, guestCgroupName, cfg.Name),
		output: &guestTail{limit: guestOutputLimit},
		exited: make(chan struct{}),
	}
	if err := g.claim(); err != nil {
		return nil, fmt.Errorf("boot guest %s: %w", cfg.Name, err)
	}
	// From here on every failure undoes everything through Close.
	defer func() {
		if err != nil {
			err = errors.Join(fmt.Errorf("boot guest %s: %w", cfg.Name, err), g.Close())
			g = nil
		}
	}()
	start := time.Now()
	if err := g.prepare(cfg); err != nil {
		return g, err
	}
	if err := g.start(); err != nil {
		return g, err
	}
	if err := g.waitBoot(ctx, start); err != nil {
		return g, err
	}
	return g, nil
}

// claim reaps stale guests and creates the state and cgroup directories,
// which mark the name as taken.
func (g *Guest) claim() error {
	guestMu.Lock()
	defer guestMu.Unlock()
	unlock, err := guestLock()
	if err != nil {
		return err
	}
	defer unlock()
	if err := os.MkdirAll(guestStateDir, 0o755); err != nil {
		return err
	}
	if err := guestReapStale(g.name); err != nil {
		return err
	}
	if err := os.Mkdir(g.state, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("a guest named %s is alive (owner in %s)", g.name, filepath.Join(g.state, "owner"))
		}
		return err
	}
	owner, err := guestOwnerID(os.Getpid())
	if err != nil {
		os.RemoveAll(g.state)
		return err
	}
	if err := os.WriteFile(filepath.Join(g.state, "owner"), []byte(owner+"\n"), 0o644); err != nil {
		os.RemoveAll(g.state)
		return err
	}
	if err := os.MkdirAll(g.cgroup, 0o755); err != nil {
		os.RemoveAll(g.state)
		return fmt.Errorf("create cgroup: %w", err)
	}
	return nil
}

// start launches PID 1: the init script, in fresh pid, mount, UTS, IPC and
// network namespaces, placed into the guest's cgroup at clone time; the
// script unshares the cgroup namespace there (so that cgroup becomes the
// guest's root) before it execs systemd.
func (g *Guest) start() error {
	cg, err := unix.Open(g.cgroup, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open cgroup: %w", err)
	}
	defer unix.Close(cg)
	// unshare without --fork execs the script in its own place, so PID 1
	// stays the process started here and the host knows its PID.
	g.cmd = exec.Command("/usr/bin/unshare", "--cgroup", "/bin/bash", filepath.Join(g.state, "init.sh"))
	g.cmd.Dir = "/"
	g.cmd.Env = []string{"PATH=" + guestPath}
	g.cmd.Stdout, g.cmd.Stderr = g.output, g.output
	g.cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS |
			syscall.CLONE_NEWIPC | syscall.CLONE_NEWNET,
		UseCgroupFD: true,
		CgroupFD:    cg,
		Setsid:      true,
		// If the process that booted the guest dies, PID 1 gets SIGKILL,
		// and with it every process in the guest. (The kernel ties this
		// to the thread that forked; the Go runtime ends threads only
		// for goroutines that exit locked to them, so do not boot from
		// such a goroutine.)
		Pdeathsig: syscall.SIGKILL,
	}
	g.cmd.WaitDelay = time.Second
	if err := g.cmd.Start(); err != nil {
		return fmt.Errorf("start PID 1: %w", err)
	}
	g.pid = g.cmd.Process.Pid
	go func() {
		g.cmd.Wait()
		close(g.exited)
	}()
	// Name the network namespace at once: it exists from the clone on, and
	// the name must be there for Close to find whatever happens next.
	g.netns, err = nstest.Attach(g.name, g.pid)
	if err != nil {
		return err
	}
	return nil
}

// waitBoot waits until systemd listens on its private socket, then until
// the boot is finished.
func (g *Guest) waitBoot(ctx context.Context, start time.Time) error {
	ctx, cancel := context.WithTimeout(ctx, guestBootTimeout)
	defer cancel()
	private := fmt.Sprintf("/proc/%d/root/run/systemd/private", g.pid)
	for {
		if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", g.pid)); strings.HasSuffix(exe, "/systemd") {
			if _, err := os.Stat(private); err == nil {
				break
			}
		}
		select {
		case <-g.exited:
			return fmt.Errorf("PID 1 exited during boot (%v)%s", g.cmd.ProcessState, g.diagnostics())
		case <-ctx.Done():
			return fmt.Errorf("systemd not up after %v: %w%s", time.Since(start).Round(time.Millisecond), ctx.Err(), g.diagnostics())
		case <-time.After(10 * time.Millisecond):
		}
	}
	out, err := g.Systemctl(ctx, "is-system-running", "--wait")
	state := strings.TrimSpace(out)
	if err != nil || state != "running" {
		failed, _ := g.Systemctl(context.Background(), "--failed", "--no-legend", "--plain")
		return fmt.Errorf("boot ended %q after %v (%v); failed units:\n%s%s",
			state, time.Since(start).Round(time.Millisecond), err, failed, g.diagnostics())
	}
	return nil
}

// diagnostics is the tail of the guest's journal, when systemd got that far,
// and of PID 1's output, for boot errors.
func (g *Guest) diagnostics() string {
	var b strings.Builder
	select {
	case <-g.exited:
	default:
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if j, err := g.Exec(ctx, "journalctl", "-b", "-q", "--no-pager", "-n", "60", "-o", "short-precise"); err == nil {
			fmt.Fprintf(&b, "\n--- guest journal (tail) ---\n%s", j)
		}
	}
	fmt.Fprintf(&b, "\n--- PID 1 output (tail) ---\n%s", guestLastLines(g.output.String(), 60))
	return b.String()
}

// Name is the guest's name, also its network namespace's and hostname.
func (g *Guest) Name() string { return g.name }

// PID is PID 1 of the guest as the host sees it (for nsenter -t).
func (g *Guest) PID() int { return g.pid }

// NetNS is the guest's network namespace, named like the guest: the lab's
// node. Put a veth end into it with nstest.AddVeth(nstest.End{NS:
// g.NetNS(), ...}, ...); start host-side processes in it with its Start.
// It stays usable until Close.
func (g *Guest) NetNS() *nstest.Namespace { return g.netns }

// Output is the tail of PID 1's output: the init script's trace (mounts,
// pivot_root), for boot failures before systemd runs; systemd itself logs
// to the guest's journal (Journal).
func (g *Guest) Output() string { return g.output.String() }

// Close shuts the guest down: `systemctl exit` (units stop as on a node
// shutdown), SIGKILL of PID 1 if that takes longer than guestExitTimeout;
// then it waits until the guest's cgroup is empty, removes the cgroup
// directories, the named network namespace and the state directory. Safe to
// call more than once, and on a guest whose PID 1 is already gone.
func (g *Guest) Close() error {
	g.closeOnce.Do(func() { g.closeErr = g.shutdown() })
	return g.closeErr
}

func (g *Guest) shutdown() error {
	var errs []error
	if g.cmd != nil && g.cmd.Process != nil {
		select {
		case <-g.exited:
		default:
			ctx, cancel := context.WithTimeout(context.Background(), guestExitTimeout)
			// systemctl exit returns once the exit job is queued, or
			// when PID 1 closes its connection.
			g.Systemctl(ctx, "exit", "0")
			select {
			case <-g.exited:
			case <-ctx.Done():
				g.cmd.Process.Signal(syscall.SIGKILL)
			}
			cancel()
			select {
			case <-g.exited:
			case <-time.After(guestReapTimeout):
				errs = append(errs, fmt.Errorf("PID 1 (%d) not reaped %v after SIGKILL", g.pid, guestReapTimeout))
			}
		}
	}
	if err := guestRemoveCgroup(g.cgroup, false); err != nil {
		errs = append(errs, err)
	}
	// A failed Attach leaves no name behind, and a name that is there but
	// not ours (Attach found it taken) must stay.
	if g.netns != nil {
		if err := g.netns.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		// Keep the state (owner file) while anything else is left, so
		// that a later guestReapStale still finds it.
		if err := os.RemoveAll(g.state); err != nil {
			errs = append(errs, err)
		}
		guestRemoveBases()
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close guest %s: %w", g.name, err)
	}
	return nil
}

// guestCgroupRoot finds the cgroup2 hierarchy: /sys/fs/cgroup/unified on a
// hybrid host (this project's machines), /sys/fs/cgroup on a unified one.
func guestCgroupRoot() (string, error) {
	for _, p := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		var st unix.Statfs_t
		if err := unix.Statfs(p, &st); err == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			return p, nil
		}
	}
	return "", errors.New("no cgroup2 hierarchy at /sys/fs/cgroup/unified or /sys/fs/cgroup")
}

// guestRemoveCgroup waits until no process is left in dir's subtree,
// killing them (cgroup.kill) at once if killNow, else if they are still
// there after guestReapTimeout, and removes the subtree. A dir that is gone
// is no error.
func guestRemoveCgroup(dir string, killNow bool) error {
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	wait := guestReapTimeout
	if killNow {
		wait = 0
	}
	if !guestWaitEmpty(dir, wait) {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("kill cgroup %s: %w", dir, err)
		}
		if !guestWaitEmpty(dir, guestReapTimeout) {
			return fmt.Errorf("cgroup %s still populated %v after cgroup.kill", dir, guestReapTimeout)
		}
	}
	// Depth first: a cgroup directory can only go once its children have.
	var dirs []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	var errs []error
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := unix.Rmdir(dirs[i]); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dirs[i], err))
		}
	}
	return errors.Join(errs...)
}

// guestWaitEmpty waits until dir's cgroup.events says "populated 0".
func guestWaitEmpty(dir string, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for {
		ev, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
		if err != nil || bytes.Contains(ev, []byte("populated 0")) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// guestLock takes an exclusive lock on guestLockFile, serializing boots,
// reaping and the removal of the base directories across processes. The
// lock is a file of its own so that the directories can go when empty.
func guestLock() (unlock func(), err error) {
	if err := os.MkdirAll(filepath.Dir(guestLockFile), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(guestLockFile, os.O_RDONLY|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", guestLockFile, err)
	}
	return func() { f.Close() }, nil
}

// guestRemoveBases removes guestStateDir and the guests' cgroup directory
// when no guest is left in them.
func guestRemoveBases() {
	guestMu.Lock()
	defer guestMu.Unlock()
	unlock, err := guestLock()
	if err != nil {
		return
	}
	defer unlock()
	unix.Rmdir(guestStateDir) // fails while a guest exists; that is fine
	if root, err := guestCgroupRoot(); err == nil {
		unix.Rmdir(filepath.Join(root, guestCgroupName))
	}
}

// guestOwnerID identifies a process across PID reuse: its PID and its start
// time in clock ticks since boot (field 22 of /proc/PID/stat).
func guestOwnerID(pid int) (string, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	// The command name, in parentheses, may hold spaces; fields after it
	// start with field 3 (state).
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return "", fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	fields := strings.Fields(string(stat[i+1:]))
	if len(fields) < 20 {
		return "", fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	return fmt.Sprintf("%d %s", pid, fields[19]), nil
}

// guestOwnerAlive reports whether the process named in an owner file still
// runs.
func guestOwnerAlive(owner string) bool {
	pidText, _, _ := strings.Cut(strings.TrimSpace(owner), " ")
	pid, err := strconv.Atoi(pidText)
	if err != nil || pid <= 0 {
		return false
	}
	now, err := guestOwnerID(pid)
	return err == nil && now == strings.TrimSpace(owner)
}

// guestReapStale removes the guests whose owner died without closing them:
// processes left in their cgroup (normally none: PID 1 died of PDEATHSIG),
// the cgroup, the network namespace name and the state directory. It reports
// an error only for the guest named name, which is about to be booted; the
// others are tried again on the next boot. Call with guestLock held.
func guestReapStale(name string) error {
	entries, err := os.ReadDir(guestStateDir)
	if err != nil {
		return err
	}
	cgroupRoot, err := guestCgroupRoot()
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		state := filepath.Join(guestStateDir, e.Name())
		owner, err := os.ReadFile(filepath.Join(state, "owner"))
		if err == nil && guestOwnerAlive(string(owner)) {
			continue
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			continue
		}
		// No owner file: a claim that died between its Mkdir and its
		// WriteFile, under the lock we hold now; stale all the same.
		err = errors.Join(
			guestRemoveCgroup(filepath.Join(cgroupRoot, guestCgroupName, e.Name()), true),
			nstest.Detach(e.Name()),
		)
		if err == nil {
			err = os.RemoveAll(state)
		}
		if err != nil && e.Name() == name {
			return fmt.Errorf("remove what a dead run left of guest %s: %w", name, err)
		}
	}
	return nil
}

// guestTail keeps the last limit bytes written to it.
type guestTail struct {
	limit int

	mu  sync.Mutex // guards following
	buf []byte
}

func (b *guestTail) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.limit; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *guestTail) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// guestLastLines returns the last n lines of s.
func guestLastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n") + "\n"
}
