// Package procstat reads what the benchmarks measure about a process from
// /proc (its CPU time, its sockets' drop counters) and pins processes to
// CPUs.
package procstat

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// UserHZ is the unit of the CPU times in /proc/PID/stat and /proc/stat
// (USER_HZ): 100 on every Linux architecture Go supports, whatever the
// kernel's own tick rate.
const UserHZ = 100

// UsPerTick converts USER_HZ ticks to microseconds.
const UsPerTick = 1e6 / UserHZ

// CPUTicks returns utime+stime of process pid, all its threads
// together (fields 14 and 15 of /proc/PID/stat).
func CPUTicks(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("cpu time of %d: %w", pid, err)
	}
	return parseStatCPU(string(b))
}

// parseStatCPU reads utime+stime from a /proc/PID/stat line. The command
// name (field 2) may hold spaces and parentheses, so fields are counted from
// the last ')'.
func parseStatCPU(stat string) (uint64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("parse /proc/PID/stat: no ')' after the command name")
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state), so utime (14) and stime (15) are f[11], f[12].
	if len(f) < 13 {
		return 0, fmt.Errorf("parse /proc/PID/stat: %d fields after the name, want at least 13", len(f))
	}
	utime, err := strconv.ParseUint(f[11], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse /proc/PID/stat utime: %w", err)
	}
	stime, err := strconv.ParseUint(f[12], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse /proc/PID/stat stime: %w", err)
	}
	return utime + stime, nil
}

// UDPRcvbufErrors returns the namespace-wide count of UDP datagrams
// dropped because a socket's receive buffer was full (Udp RcvbufErrors in
// /proc/PID/net/snmp, for process pid's network namespace).
func UDPRcvbufErrors(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/snmp", pid))
	if err != nil {
		return 0, fmt.Errorf("udp receive buffer errors: %w", err)
	}
	return parseSNMP(string(b), "Udp", "RcvbufErrors")
}

// parseSNMP reads one counter from /proc/net/snmp, where each protocol has
// a line of names followed by a line of values.
func parseSNMP(snmp, proto, name string) (uint64, error) {
	var header []string
	for line := range strings.Lines(snmp) {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != proto+":" {
			continue
		}
		if header == nil {
			header = f
			continue
		}
		for i, h := range header {
			if h == name && i < len(f) {
				return strconv.ParseUint(f[i], 10, 64)
			}
		}
		break
	}
	return 0, fmt.Errorf("parse /proc/net/snmp: no %s %s", proto, name)
}

// UDPDrops sums the receive-queue drop counters of the UDP sockets bound to
// local (e.g. 127.0.0.11:53) in process pid's network namespace: queries the
// kernel discarded because the server did not read fast enough. dnsperf
// counts those as lost too, together with the queries still in flight when
// its time limit ends; this separates the two.
func UDPDrops(pid int, local string) (uint64, error) {
	want, err := procNetAddr(local)
	if err != nil {
		return 0, err
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/udp", pid))
	if err != nil {
		return 0, fmt.Errorf("udp drops of %s: %w", local, err)
	}
	return parseUDPDrops(string(b), want)
}

func parseUDPDrops(procNetUDP, want string) (uint64, error) {
	var sum uint64
	found := false
	for line := range strings.Lines(procNetUDP) {
		f := strings.Fields(line)
		// sl local_address rem_address st ... drops (last)
		if len(f) < 13 || f[1] != want {
			continue
		}
		v, err := strconv.ParseUint(f[len(f)-1], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parse /proc/net/udp drops of %s: %w", want, err)
		}
		sum += v
		found = true
	}
	if !found {
		return 0, fmt.Errorf("no UDP socket bound to %s in /proc/net/udp", want)
	}
	return sum, nil
}

// procNetAddr spells an IPv4 "ADDR:PORT" as /proc/net/udp does: the address
// as a little-endian hex word (on the little-endian machines this runs on),
// the port in big-endian hex.
func procNetAddr(hostport string) (string, error) {
	ap, err := netip.ParseAddrPort(hostport)
	if err != nil {
		return "", fmt.Errorf("address %q: %w", hostport, err)
	}
	if !ap.Addr().Is4() {
		return "", fmt.Errorf("%s: only IPv4 listen addresses are supported", hostport)
	}
	a := ap.Addr().As4()
	return fmt.Sprintf("%02X%02X%02X%02X:%04X", a[3], a[2], a[1], a[0], ap.Port()), nil
}

// Pin binds every thread of process pid to cpu. A thread inherits
// its creator's affinity, so once all threads are pinned new ones are too;
// the loop repeats until a pass finds no thread it has not pinned, which
// catches threads created while it ran.
func Pin(pid, cpu int) error {
	var set unix.CPUSet
	set.Set(cpu)
	pinned := map[int]bool{}
	for pass := 0; ; pass++ {
		tids, err := threads(pid)
		if err != nil {
			return fmt.Errorf("pin %d to cpu %d: %w", pid, cpu, err)
		}
		fresh := 0
		for _, tid := range tids {
			if pinned[tid] {
				continue
			}
			if err := unix.SchedSetaffinity(tid, &set); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("pin thread %d of %d to cpu %d: %w", tid, pid, cpu, err)
			}
			pinned[tid] = true
			fresh++
		}
		if fresh == 0 {
			return nil
		}
		if pass == 100 {
			return fmt.Errorf("pin %d to cpu %d: threads keep appearing", pid, cpu)
		}
	}
}

// CheckPinned verifies that every thread of pid may run on cpu only: a
// measurement where the server spread over both CPUs would be worthless.
func CheckPinned(pid, cpu int) error {
	tids, err := threads(pid)
	if err != nil {
		return fmt.Errorf("check affinity of %d: %w", pid, err)
	}
	for _, tid := range tids {
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(tid, &set); err != nil {
			if errors.Is(err, unix.ESRCH) {
				continue // exited meanwhile
			}
			return fmt.Errorf("check affinity of thread %d of %d: %w", tid, pid, err)
		}
		if set.Count() != 1 || !set.IsSet(cpu) {
			return fmt.Errorf("thread %d of %d may run on %d CPUs, not just cpu %d", tid, pid, set.Count(), cpu)
		}
	}
	return nil
}

// threads lists the thread ids of pid.
func threads(pid int) ([]int, error) {
	dirs, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	if err != nil {
		return nil, err
	}
	if len(dirs) == 0 {
		return nil, fmt.Errorf("process %d has no threads (exited?)", pid)
	}
	tids := make([]int, 0, len(dirs))
	for _, d := range dirs {
		tid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		tids = append(tids, tid)
	}
	return tids, nil
}
