package lab

import (
	_ "embed"
	"fmt"
	"strings"

	"github.com/dnsstandby/dnsstandby/deploy"
)

// LocalDNS as it runs on an AKS node, for a guest: its Corefile, its
// supervisor script (units/localdns.sh, a stand-in for AKS's localdns.sh),
// and localdns.service in two variants. Paths are the node's.
const (
	// LocalDNSUnitName is the unit's name on a node.
	LocalDNSUnitName = "localdns.service"
	// LocalDNSScript is the supervisor's path on a node (ExecStart=).
	LocalDNSScript = "/opt/azure/containers/localdns/localdns.sh"
	// LocalDNSCorefilePath is the Corefile CoreDNS runs on a node
	// (localdns.sh's UPDATED_LOCALDNS_CORE_FILE).
	LocalDNSCorefilePath = "/opt/azure/containers/localdns/updated.localdns.corefile"
	// LocalDNSEnvironmentPath is read by the unit (EnvironmentFile=-, as on
	// a node): here it tells the script where CoreDNS is and which link
	// kind to create.
	LocalDNSEnvironmentPath = "/etc/localdns/environment"
	// LocalDNSSlicePath is the slice the unit runs in (Slice=), written as
	// cse_config.sh writes it. The guest's cgroup tree has no memory or cpu
	// controller, so its limits are accepted but not enforced.
	LocalDNSSlicePath = "/etc/systemd/system/localdns.slice"
	// LocalDNSPidFile is CoreDNS's -pidfile.
	LocalDNSPidFile = "/run/localdns.pid"
	// LocalDNSCoreDNSPath is CoreDNS's path on a node (from the VHD).
	LocalDNSCoreDNSPath = "/opt/azure/containers/localdns/binary/coredns"

	// LocalDNSNodeIP and LocalDNSPodIP are the node and pod listeners.
	LocalDNSNodeIP = "169.254.10.10"
	LocalDNSPodIP  = "169.254.10.11"
	// LocalDNSKubeDNS is the kube-dns ClusterIP both blocks forward to.
	LocalDNSKubeDNS = "10.0.0.10"
	// LocalDNSLinkKind is the kind of the localdns link in the lab: this
	// project's machines have no dummy driver (nodes create a dummy).
	LocalDNSLinkKind = "bridge"
)

// The LocalDNS unit variants.
const (
	// LocalDNSShipped is localdns.service as AKS ships it: systemd's default
	// restart delay and start limit, no ExecStopPost.
	LocalDNSShipped = "shipped"
	// LocalDNSPR9439 adds AgentBaker PR 9439's restart budget and backoff
	// and PR 9360's ExecStopPost cleanup (9439 is stacked on 9360).
	LocalDNSPR9439 = "pr9439"
)

//go:embed units/localdns.sh
var localdnsScript string

// LocalDNSCorefile is a LocalDNS Corefile shaped like the one AgentBaker
// generates with the default LocalDNS profile (pkg/agent/baker.go
// GenerateLocalDNSCoreFile; expected output in pkg/agent/baker_test.go at
// commit 06836ee2301e): the whoami health-check block on both listeners,
// the node listener's (169.254.10.10) root block, and the pods' listener's
// (169.254.10.11) root block. Both forward to the kube-dns ClusterIP:
// on a node the .10 block forwards to Azure DNS (168.63.129.16), which the
// lab does not have. Left out: the hosts plugin (/etc/localdns/hosts, which
// the lab has no use for) and the per-zone override blocks; the .10 block
// logs errors only (AKS's default logs every query there).
func LocalDNSCorefile() string {
	return `# LocalDNS Corefile for the dnsstandby lab, shaped like AgentBaker's
# (pkg/agent/baker.go, default LocalDNS profile).
# whoami (used for health check of DNS)
health-check.localdns.local:53 {
    bind 169.254.10.10 169.254.10.11
    whoami
}
# VnetDNS: node listener (kubelet, dnsPolicy:Default pods). AKS forwards to
# 168.63.129.16 here.
.:53 {
    errors
    bind 169.254.10.10
    forward . 10.0.0.10 {
        prefer_udp
        policy sequential
        max_concurrent 1000
    }
    ready 169.254.10.10:8181
    cache 3600 {
        success 9984
        denial 9984
        serve_stale 3600s immediate
        servfail 0
    }
    loop
    nsid localdns
    prometheus :9253
}
# KubeDNS: pod listener (dnsPolicy:ClusterFirst pods, kubelet --cluster-dns).
.:53 {
    errors
    bind 169.254.10.11
    forward . 10.0.0.10 {
        prefer_udp
        policy sequential
        max_concurrent 2000
    }
    ready 169.254.10.11:8181
    cache 3600 {
        success 9984
        denial 9984
        serve_stale 72000s verify
        servfail 0
    }
    loop
    nsid localdns-pod
    prometheus :9253
    template ANY ANY internal.cloudapp.net {
        match "^(?:[^.]+\.){4,}internal\.cloudapp\.net\.$"
        rcode NXDOMAIN
        fallthrough
    }
    template ANY ANY reddog.microsoft.com {
        rcode NXDOMAIN
    }
}
`
}

// localdnsSlice is localdns.slice as cse_config.sh (enableLocalDNS) writes
// it, with AKS's default limits (128M, 200% CPU).
const localdnsSlice = `[Unit]
Description=localdns Slice
DefaultDependencies=no
Before=slices.target
Requires=system.slice
After=system.slice
[Slice]
MemoryMax=128M
CPUQuota=200%
`

// LocalDNSFiles are the files LocalDNS needs in a guest, for
// GuestConfig.Files: the supervisor script, the Corefile, localdns.slice and
// the environment file, which points the script at coredns (a path in the
// guest; "" means LocalDNSCoreDNSPath) and sets the link kind to
// LocalDNSLinkKind. The guest's / is an overlay of the host's root file
// system, so a binary there (bin/coredns) is seen at its host path; one
// under /tmp or /run, or on another file system, must be bound in with
// GuestConfig.Binds.
func LocalDNSFiles(coredns string) map[string]GuestFile {
	if coredns == "" {
		coredns = LocalDNSCoreDNSPath
	}
	env := fmt.Sprintf("# Read by localdns.service (EnvironmentFile=-%s).\nCOREDNS_BINARY_PATH=%s\nUPDATED_LOCALDNS_CORE_FILE=%s\nLINK_KIND=%s\n",
		LocalDNSEnvironmentPath, coredns, LocalDNSCorefilePath, LocalDNSLinkKind)
	return map[string]GuestFile{
		LocalDNSScript:          {Data: localdnsScript, Mode: 0o755},
		LocalDNSCorefilePath:    {Data: LocalDNSCorefile(), Mode: 0o644},
		LocalDNSEnvironmentPath: {Data: env, Mode: 0o644},
		LocalDNSSlicePath:       {Data: localdnsSlice, Mode: 0o644},
	}
}

// LocalDNSUnit returns localdns.service in the given variant, LocalDNSShipped
// or LocalDNSPR9439; it panics on any other (a programming error).
func LocalDNSUnit(variant string) string {
	var unit, service string
	switch variant {
	case LocalDNSShipped:
		unit = `# No StartLimitIntervalSec=/StartLimitBurst=: systemd's defaults, 5 starts
# in 10 s (DefaultStartLimitIntervalSec=10s, DefaultStartLimitBurst=5 in
# systemd-system.conf(5)); the sixth start in 10 s is refused and the unit
# stays failed ("Start request repeated too quickly").
`
		service = `# No RestartSec=: systemd's default, 100 ms.
# No ExecStopPost=: the shipped VHD lacked it (PR 9439's reproduction:
# "ExecStopPost: absent"), so a supervisor killed with SIGKILL leaves the
# localdns link and its addresses behind.
`
	case LocalDNSPR9439:
		unit = `# AgentBaker PR 9439 "fix: recover LocalDNS after repeated unexpected exits":
# a restart budget of 30 starts in 300 s.
StartLimitIntervalSec=300
StartLimitBurst=30
`
		service = `# PR 9439: back off 2 s between restarts, so a crash loop cannot spend the
# budget in a few seconds.
RestartSec=2
# PR 9439 states the default explicitly; with KillMode=mixed only the main
# process gets it, the rest of the cgroup gets SIGKILL afterwards.
KillSignal=SIGTERM
# AgentBaker PR 9360 (9439 is stacked on it): revert node DNS even when the
# supervisor exits unexpectedly; deletes the localdns link.
ExecStopPost=` + LocalDNSScript + ` cleanup
`
	default:
		panic(fmt.Sprintf("lab.LocalDNSUnit: unknown variant %q (want %q or %q)", variant, LocalDNSShipped, LocalDNSPR9439))
	}
	return strings.NewReplacer("@UNIT@", unit, "@SERVICE@", service, "@SCRIPT@", LocalDNSScript,
		"@ENV@", LocalDNSEnvironmentPath, "@VARIANT@", variant).Replace(localdnsUnitTemplate)
}

// localdnsUnitTemplate is localdns.service as AKS ships it,
// Azure/AgentBaker parts/linux/cloud-init/artifacts/localdns.service at
// commit 06836ee2301e (2026-08-21; unchanged since #7604), with the
// variant's settings added.
const localdnsUnitTemplate = `# localdns.service, variant @VARIANT@, for the dnsstandby lab.
# From Azure/AgentBaker parts/linux/cloud-init/artifacts/localdns.service
# (commit 06836ee2301e, 2026-08-21).
[Unit]
Description=Localdns service
Wants=network.target
After=network.target
# (On a node also: After=cloud-config.service, Before=kubelet.service
# containerd.service, ConditionKernelVersion=>=5.15.)
@UNIT@
[Service]
# localdns.sh sends READY=1 and WATCHDOG=1 through systemd-notify, a child
# process of the main one, hence NotifyAccess=all (as AKS has it).
Type=notify
NotifyAccess=all
# The watchdog loop pings every WatchdogSec/5 = 12 s while CoreDNS answers;
# past 60 s without a ping systemd sends SIGABRT and restarts the unit.
WatchdogSec=60
Restart=on-failure
# On stop, SIGTERM goes to localdns.sh only (its EXIT trap runs the cleanup:
# 5 s, SIGINT to CoreDNS, link deleted); what is left of the cgroup gets
# SIGKILL after ExecStopPost. When localdns.sh dies on its own, the rest of
# the cgroup (CoreDNS) gets SIGKILL at once, before ExecStopPost.
KillMode=mixed
TimeoutStopSec=30
Slice=localdns.slice
EnvironmentFile=-@ENV@
ExecStart=@SCRIPT@
@SERVICE@
[Install]
WantedBy=multi-user.target
`

// DnsstandbyUnit is the unit operators install (deploy/systemd): the lab
// runs dnsstandby exactly as a node would.
func DnsstandbyUnit() string { return deploy.SystemdUnit }

// DnsstandbyDefaultsPath is where the unit reads its options from.
const DnsstandbyDefaultsPath = "/etc/default/dnsstandby"

// DnsstandbyDefaults returns /etc/default/dnsstandby running
// `dnsstandby run` with args. systemd splits $DNSSTANDBY_OPTS on white
// space and takes quotes literally, so no arg may hold either.
func DnsstandbyDefaults(args ...string) (GuestFile, error) {
	for _, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\n\"'\\$%") {
			return GuestFile{}, fmt.Errorf("dnsstandby option %q: /etc/default/dnsstandby cannot carry it (empty, white space, quotes, $ or %%)", a)
		}
	}
	return GuestFile{Data: "# dnsstandby lab node\nDNSSTANDBY_OPTS=\"" + strings.Join(args, " ") + "\"\n"}, nil
}
