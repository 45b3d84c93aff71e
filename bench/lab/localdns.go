package lab

import (
	_ "embed"
	"fmt"
	"slices"
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
	// LocalDNSKubeDNS is the kube-dns ClusterIP: the pods' root block and
	// the node's cluster.local block forward to it.
	LocalDNSKubeDNS = "10.0.0.10"
	// LocalDNSVnetDNS stands for the VNet's DNS server, where the node's
	// root block forwards (168.63.129.16 on a node, or the VNet's custom
	// servers): an address inside the lab, as a custom VNet DNS server
	// would be (10.224.0.0/16 is AKS's default node subnet).
	LocalDNSVnetDNS = "10.224.0.4"
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
	// (5 starts in 720 s, RestartSec=2) and PR 9360's ExecStopPost cleanup
	// (9439 is stacked on 9360).
	LocalDNSPR9439 = "pr9439"
)

//go:embed units/localdns.sh
var localdnsScript string

// LocalDNSCorefile is the Corefile LocalDNS runs in the lab: the one
// AgentBaker's aks-node-controller renders with the hosts plugin
// (aks-node-controller/parser/templates/localdns.toml.gtpl, expected output
// expectedlocalDNSCorefile in aks-node-controller/parser/helper_test.go at
// commit 06836ee2301e), as localdns.sh leaves it in
// updated.localdns.corefile on a node whose VNet has a custom DNS server:
// 168.63.129.16 replaced by that server (replace_azurednsip_in_corefile),
// here LocalDNSVnetDNS, a CoreDNS inside the lab. Both listeners' blocks:
//   - 169.254.10.10 (kubelet, hostNetwork and dnsPolicy:Default pods): the
//     root block (hosts, forward to the VNet DNS, serve_stale 3600s
//     immediate, the templates) and cluster.local (force_tcp to kube-dns,
//     no serve_stale);
//   - 169.254.10.11 (dnsPolicy:ClusterFirst pods): the root block (hosts,
//     forward to kube-dns with max_concurrent 2000, serve_stale 72000s
//     verify, the templates).
//
// Two differences from the rendering: the node root block logs errors only
// (`errors` for `log`: at the lab's rates, a journal line per query would
// cost the two-core machine more than LocalDNS itself), and the test's
// override zone testdomain456.com, which nothing in the lab asks, is left
// out.
func LocalDNSCorefile() string {
	return strings.NewReplacer("@VNETDNS@", LocalDNSVnetDNS, "@KUBEDNS@", LocalDNSKubeDNS,
		"@HOSTS@", LocalDNSHostsPath).Replace(localdnsCorefileTemplate)
}

const localdnsCorefileTemplate = `# LocalDNS Corefile for the dnsstandby lab: AgentBaker's aks-node-controller
# rendering (hosts plugin included), VNet DNS @VNETDNS@ written in by
# localdns.sh; the node root block logs errors only; no testdomain456.com.
# whoami (used for health check of DNS)
health-check.localdns.local:53 {
    bind 169.254.10.10 169.254.10.11
    whoami
}
# VnetDNS overrides apply to DNS traffic from pods with dnsPolicy:default or kubelet (referred to as VnetDNS traffic).
.:53 {
    errors
    bind 169.254.10.10
    # Check /etc/localdns/hosts first for critical AKS FQDNs (mcr.microsoft.com, packages.aks.azure.com, etc.)
    hosts @HOSTS@ {
        ttl 5
        reload 5s
        fallthrough
    }
    forward . @VNETDNS@ {
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
    template ANY ANY internal.cloudapp.net {
        match "^(?:[^.]+\.){4,}internal\.cloudapp\.net\.$"
        rcode NXDOMAIN
        fallthrough
    }
    template ANY ANY reddog.microsoft.com {
        rcode NXDOMAIN
    }
}
cluster.local:53 {
    errors
    bind 169.254.10.10
    forward . @KUBEDNS@ {
        force_tcp
        policy sequential
        max_concurrent 1000
    }
    ready 169.254.10.10:8181
    cache 3600 {
        success 9984
        denial 9984
        servfail 0
    }
    loop
    nsid localdns
    prometheus :9253
}
# KubeDNS overrides apply to DNS traffic from pods with dnsPolicy:ClusterFirst (referred to as KubeDNS traffic).
.:53 {
    errors
    bind 169.254.10.11
    # Check /etc/localdns/hosts first for critical AKS FQDNs (mcr.microsoft.com, packages.aks.azure.com, etc.)
    hosts @HOSTS@ {
        ttl 5
        reload 5s
        fallthrough
    }
    forward . @KUBEDNS@ {
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

// LocalDNSRefusedCorefile is corefile as a typo leaves it: `forward`
// misspelt `froward` in the pods' root block (the block bound to
// LocalDNSPodIP alone), which CoreDNS refuses: 1.13.1 exits at once with
// "Unknown directive 'froward'", before it binds a socket or writes its
// pidfile. Every other line is kept, so that the file is the rendering a
// node would have but for the one word.
func LocalDNSRefusedCorefile(corefile string) (string, error) {
	return LocalDNSRefusedCorefileOn(corefile, LocalDNSPodIP)
}

// LocalDNSRefusedCorefileOn is LocalDNSRefusedCorefile with the typo in the
// first block bound to listener alone with a forward: on LocalDNSNodeIP,
// the node's root block, so that LocalDNS's own .11 blocks stay good (the
// fallback's kubelet design runs them).
func LocalDNSRefusedCorefileOn(corefile, listener string) (string, error) {
	lines := strings.SplitAfter(corefile, "\n")
	// The blocks are the lines from one that ends with "{" at the top
	// level to the "}" that closes it.
	start, depth, misspelt := -1, 0, 0
	for i, l := range lines {
		t := strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(t, "#"):
		case strings.HasSuffix(t, "{"):
			if depth == 0 {
				start = i
			}
			depth++
		case t == "}":
			depth--
			// Only the first such block: the node listener has two
			// (its root block and cluster.local), the first its root.
			if depth == 0 && misspelt == 0 && slices.ContainsFunc(lines[start:i], func(b string) bool {
				return strings.TrimSpace(b) == "bind "+listener
			}) {
				for j := start + 1; j < i; j++ {
					if strings.HasPrefix(strings.TrimSpace(lines[j]), "forward ") {
						lines[j] = strings.Replace(lines[j], "forward ", "froward ", 1)
						misspelt++
						break
					}
				}
			}
		}
	}
	if misspelt != 1 {
		return "", fmt.Errorf("refused Corefile: no block bound to %s alone with a forward", listener)
	}
	return strings.Join(lines, ""), nil
}

// LocalDNSHostsPath is the hosts file the Corefile's hosts plugin reads,
// which AKS fills with the addresses of the names nodes cannot do without
// (image pulls, AAD tokens, packages) while VNet DNS works, so that they
// keep resolving when it does not.
const LocalDNSHostsPath = "/etc/localdns/hosts"

// LocalDNSHosts is the lab's hosts file: AKS's critical names with
// documentation addresses (RFC 5737, RFC 3849), in the format AKS writes.
func LocalDNSHosts() string {
	var b strings.Builder
	b.WriteString("# AKS critical FQDN addresses (dnsstandby lab: documentation addresses)\n")
	for _, h := range localdnsHostEntries() {
		fmt.Fprintf(&b, "%s %s\n", h.addr, h.name)
	}
	return b.String()
}

// LocalDNSHostNames are the names LocalDNSHosts holds, as FQDNs, each once.
func LocalDNSHostNames() []string {
	var names []string
	for _, h := range localdnsHostEntries() {
		if fqdn := h.name + "."; !slices.Contains(names, fqdn) {
			names = append(names, fqdn)
		}
	}
	return names
}

// localdnsHostEntries are the hosts file's lines, address and name.
func localdnsHostEntries() []struct{ addr, name string } {
	return []struct{ addr, name string }{
		{"203.0.113.71", "mcr.microsoft.com"},
		{"2001:db8:71::1", "mcr.microsoft.com"},
		{"203.0.113.72", "login.microsoftonline.com"},
		{"203.0.113.73", "packages.aks.azure.com"},
		{"203.0.113.74", "management.azure.com"},
	}
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
// GuestConfig.Files: the supervisor script, the Corefile, the hosts file it
// reads, localdns.slice and the environment file, which points the script at coredns (a path in the
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
		LocalDNSHostsPath:       {Data: LocalDNSHosts(), Mode: 0o644},
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
		unit = `# AgentBaker PR 9439 "fix: bound LocalDNS restart budget so failures
# terminate deterministically", as it renders now (its thread, 2026-09;
# PR 9503 observed StartLimitIntervalUSec=12min, StartLimitBurst=5,
# RestartUSec=2s): 5 starts in 720 s, so every failure that cannot heal
# ends in failed (where OnFailure= can act) within about 11 min, however
# slow its cycle; the unit's own start counts among the 5.
StartLimitIntervalSec=720
StartLimitBurst=5
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
