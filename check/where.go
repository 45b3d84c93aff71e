package check

import (
	"os"
)

// where is where the audit runs: on the node itself, or in a container
// (the DaemonSet's, through kubectl exec) that shares the node's network
// and PID namespaces but not its files or its systemd.
type where struct {
	Container bool
	Why       string // what told: "KUBERNETES_SERVICE_HOST is set", ...
}

// notCheckable is the found text of a row the container cannot see.
func (w where) notCheckable(what string) string {
	return "not checkable from the container (" + w.Why + "): " + what
}

// onTheNode is the advice of a row the container cannot see.
const onTheNode = "run dnsstandby check on the node itself (as root) for this row"

// sysView is what detectWhere reads, so that tests give their own.
type sysView struct {
	getenv   func(string) (string, bool)
	exists   func(string) bool
	readlink func(string) (string, error)
}

func hostView() sysView {
	return sysView{
		getenv:   os.LookupEnv,
		exists:   func(p string) bool { _, err := os.Lstat(p); return err == nil },
		readlink: os.Readlink,
	}
}

// detectWhere tells a container from the node, by the first sign of one:
// the variable systemd and podman set (container=), the one Kubernetes
// sets in every pod, the files Docker and podman leave, or a mount
// namespace that is not PID 1's (a container sharing the host's PID
// namespace, as the DaemonSet's does, sees the node's systemd as PID 1 but
// not its files).
func detectWhere(v sysView) where {
	if c, ok := v.getenv("container"); ok && c != "" {
		return where{true, "container=" + c}
	}
	if _, ok := v.getenv("KUBERNETES_SERVICE_HOST"); ok {
		return where{true, "KUBERNETES_SERVICE_HOST is set: a Kubernetes pod"}
	}
	for _, f := range []string{"/.dockerenv", "/run/.containerenv"} {
		if v.exists(f) {
			return where{true, f + " exists"}
		}
	}
	self, err1 := v.readlink("/proc/self/ns/mnt")
	init, err2 := v.readlink("/proc/1/ns/mnt")
	if err1 == nil && err2 == nil && self != init {
		return where{true, "not in PID 1's mount namespace"}
	}
	return where{}
}
