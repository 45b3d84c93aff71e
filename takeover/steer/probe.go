package steer

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
	"golang.org/x/sys/unix"
)

// probes are the checks that decide the level, one per requirement; each
// returns nil or an error that says what is missing. decide takes them as
// functions so its logic is tested without a kernel.
type probes struct {
	bpf    func() error // create the maps and load the program, as AddGroup will
	pidfd  func() error // pidfd_open + pidfd_getfd on our own process
	ptrace func() error // may we use pidfd_getfd on another root process
}

// decide returns the best level no higher than max that the probes allow,
// and why: the level, and what ruled out each better one.
func decide(max Level, auto bool, p probes) (Level, string) {
	if max == Off {
		return Off, "off: requested"
	}
	if err := p.bpf(); err != nil {
		return Off, "off: own and adopt not possible: " + err.Error()
	}
	if max == Own {
		return Own, "own: requested; adopt not tried"
	}
	if err := p.pidfd(); err != nil {
		return Own, "own: adopt not possible: " + err.Error()
	}
	if err := p.ptrace(); err != nil {
		return Own, "own: adopt not possible: " + err.Error()
	}
	how := "adopt: requested"
	if auto {
		how = "adopt: best available"
	}
	return Adopt, how + "; sk_reuseport program loads, pidfd_getfd works, CAP_SYS_PTRACE held"
}

// explainBPF turns a failure to create the maps or load the program into
// the reason own and adopt are not possible, with a hint at the fix.
func explainBPF(err error) error {
	switch {
	case errors.Is(features.HaveProgramType(ebpf.SkReuseport), ebpf.ErrNotSupported):
		return fmt.Errorf("BPF_PROG_TYPE_SK_REUSEPORT not supported (Linux 4.19+): %w", err)
	case errors.Is(features.HaveMapType(ebpf.ReusePortSockArray), ebpf.ErrNotSupported):
		return fmt.Errorf("BPF_MAP_TYPE_REUSEPORT_SOCKARRAY not supported (Linux 4.19+): %w", err)
	case errors.Is(err, ebpf.ErrNotSupported):
		return fmt.Errorf("eBPF not supported here: %w", err)
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return fmt.Errorf("no CAP_BPF/CAP_SYS_ADMIN (an sk_reuseport program needs CAP_BPF and CAP_NET_ADMIN, or CAP_SYS_ADMIN; kernels before 5.11 also a large RLIMIT_MEMLOCK): %w", err)
	}
	var verr *ebpf.VerifierError
	if errors.As(err, &verr) {
		return fmt.Errorf("the kernel's verifier rejected the steering program: %w", err)
	}
	return err
}

// probePidfd checks that pidfd_open and pidfd_getfd work, on our own
// process: duplicating our own pidfd needs no ptrace rights, so it tests
// only the kernel (5.6+) and any seccomp filter.
func probePidfd() error {
	pidfd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		if errors.Is(err, unix.ENOSYS) {
			return fmt.Errorf("pidfd_open unsupported (Linux 5.3+): %w", err)
		}
		return fmt.Errorf("pidfd_open: %w", err)
	}
	defer unix.Close(pidfd)
	fd, err := unix.PidfdGetfd(pidfd, pidfd, 0)
	if err != nil {
		if errors.Is(err, unix.ENOSYS) {
			return fmt.Errorf("pidfd_getfd unsupported (Linux 5.6+): %w", err)
		}
		return fmt.Errorf("pidfd_getfd unusable: %w", err)
	}
	unix.Close(fd)
	return nil
}

// capSysPtrace is CAP_SYS_PTRACE's bit (include/uapi/linux/capability.h).
const capSysPtrace = 19

// probePtrace checks what pidfd_getfd needs to take a socket from
// LocalDNS, another process running as root: ptrace access, which needs
// CAP_SYS_PTRACE (LocalDNS is not our descendant and holds capabilities we
// may lack) and a Yama ptrace_scope below 3.
func probePtrace() error {
	if scope, err := yamaScope(); err == nil && scope >= 3 {
		return fmt.Errorf("kernel.yama.ptrace_scope=%d forbids ptrace access to other processes, which pidfd_getfd needs", scope)
	}
	ok, err := haveCap(capSysPtrace)
	if err != nil {
		return fmt.Errorf("read capabilities: %w", err)
	}
	if !ok {
		return errors.New("no CAP_SYS_PTRACE: pidfd_getfd on LocalDNS (a root process) needs ptrace access")
	}
	return nil
}

// yamaScope reads kernel.yama.ptrace_scope; without Yama there is none.
func yamaScope() (int, error) {
	b, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope")
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// haveCap reports whether capability c is in our effective set.
func haveCap(c uint) (bool, error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false, err
	}
	return data[c/32].Effective&(1<<(c%32)) != 0, nil
}
