package lab

import (
	_ "embed"
	"fmt"
	"strings"
)

// AKS LocalDNS's own fallback for pod DNS (169.254.10.11), for a guest:
// the units and scripts written for the lab after the description of
// AgentBaker PR 9486 (open), not copied. localdns.service gains
// OnFailure=localdns-fallback.service and
// ExecStartPre=-systemctl stop localdns-fallback.service (a drop-in); a
// timer runs a probe every 5 s, and 3 misses in a row start the fallback
// too; the fallback declines while localdns.service is between restart
// attempts. The designs are the PR's three.
const (
	// FallbackCoreDNS (the PR's v1) is a second CoreDNS, LocalDNS's own
	// binary, with a minimal Corefile: bind .11, forward to the kube-dns
	// ClusterIP.
	FallbackCoreDNS = "coredns"
	// FallbackKubelet (v2) is v1 with LocalDNS's own .11 server blocks,
	// plus kubelet's --cluster-dns rewritten to the ClusterIP and kubelet
	// restarted; localdns.service's ExecStartPost reverts it.
	FallbackKubelet = "kubelet"
	// FallbackNAT (v3) has no listener: an iptables nat chain
	// LOCALDNS-FALLBACK, first in PREROUTING and OUTPUT, sends .11 to
	// kube-proxy's kube-dns service chain and .10 to the VNet DNS server.
	FallbackNAT = "nat"
)

// FallbackDesigns are the designs, in the PR's order.
var FallbackDesigns = []string{FallbackCoreDNS, FallbackKubelet, FallbackNAT}

// Names and paths of the fallback on a node.
const (
	FallbackUnitName     = "localdns-fallback.service"
	FallbackProbeService = "localdns-fallback-probe.service"
	FallbackProbeTimer   = "localdns-fallback-probe.timer"
	FallbackScript       = "/opt/azure/containers/localdns/localdns-fallback.sh"
	FallbackProbeScript  = "/opt/azure/containers/localdns/localdns-fallback-probe.sh"
	FallbackChain        = "LOCALDNS-FALLBACK"
	fallbackDropInPath   = "/etc/systemd/system/localdns.service.d/50-fallback.conf"
	kubeletUnitName      = "kubelet.service"
	kubeletDefaultsPath  = "/etc/default/kubelet"
	FallbackTakeoverLog  = "localdns-fallback: taking over"
	FallbackDeclineLog   = "between restart attempts; not taking over"
	fallbackMark         = "# Written for the lab after the description of AgentBaker PR 9486 (open), not copied.\n"
)

// KubeDNSServiceChains are the chains kube-proxy (iptables mode) gives the
// kube-dns Service's dns (udp) and dns-tcp ports (KubeProxyRules), the
// names the fallback's nat design finds by their comments.
var KubeDNSServiceChains = map[string]string{"udp": "KUBE-SVC-TCOU7JCQXEZGVUNU", "tcp": "KUBE-SVC-ERIFXISQEP7F7OF4"}

//go:embed units/localdns-fallback.sh
var fallbackScript string

//go:embed units/localdns-fallback-probe.sh
var fallbackProbeScript string

// FallbackUnits are the fallback's units for design, by name, for
// GuestConfig.Units; it panics on an unknown design (a programming error).
func FallbackUnits(design string) map[string]string {
	var service string
	switch design {
	case FallbackCoreDNS, FallbackKubelet:
		// CoreDNS is the service's process: stopping the unit stops it.
		service = "Type=simple\nExecStart=" + FallbackScript + " start " + design + "\n"
	case FallbackNAT:
		service = "Type=oneshot\nRemainAfterExit=yes\nExecStart=" + FallbackScript + " start nat\nExecStop=" + FallbackScript + " stop nat\n"
	default:
		panic(fmt.Sprintf("lab.FallbackUnits: unknown design %q (want one of %v)", design, FallbackDesigns))
	}
	units := map[string]string{
		FallbackUnitName: "# localdns-fallback.service, design " + design + ", for the dnsstandby lab.\n" + fallbackMark +
			`[Unit]
Description=LocalDNS pod-DNS (169.254.10.11) fallback
After=network.target
[Service]
EnvironmentFile=-` + LocalDNSEnvironmentPath + `
# Declines (the unit is skipped, not failed) while localdns.service is
# between restart attempts: OnFailure= fires at each failure, not only the
# last.
ExecCondition=` + FallbackScript + ` guard
` + service,
		FallbackProbeService: "# localdns-fallback-probe.service for the dnsstandby lab.\n" + fallbackMark +
			`[Unit]
Description=LocalDNS pod-DNS probe (3 misses start localdns-fallback.service)
[Service]
Type=oneshot
ExecStart=` + FallbackProbeScript + `
`,
		FallbackProbeTimer: "# localdns-fallback-probe.timer for the dnsstandby lab.\n" + fallbackMark +
			`[Unit]
Description=LocalDNS pod-DNS probe every 5 s
[Timer]
OnActiveSec=5s
OnUnitActiveSec=5s
AccuracySec=100ms
`,
	}
	if design == FallbackKubelet {
		units[kubeletUnitName] = `# kubelet stand-in for the dnsstandby lab: it reads /etc/default/kubelet
# as kubelet's unit does and says which --cluster-dns it runs with. The
# lab's pod keeps its resolv.conf (as running pods do on a node): only pods
# created after a restart would get the new --cluster-dns.
[Unit]
Description=kubelet (lab stand-in)
[Service]
EnvironmentFile=-` + kubeletDefaultsPath + `
ExecStart=/bin/sh -c 'echo "kubelet stand-in: $KUBELET_FLAGS"; exec sleep infinity'
`
	}
	return units
}

// FallbackFiles are the fallback's files for design, for GuestConfig.Files:
// its scripts, localdns.service's drop-in (the PR edits the unit itself;
// a drop-in adds the same settings) and, for the kubelet design,
// /etc/default/kubelet.
func FallbackFiles(design string) map[string]GuestFile {
	dropIn := "# localdns.service's fallback settings for the dnsstandby lab.\n" + fallbackMark +
		"[Unit]\nOnFailure=" + FallbackUnitName + "\n[Service]\nExecStartPre=-/usr/bin/systemctl stop " + FallbackUnitName + "\n"
	files := map[string]GuestFile{
		FallbackScript:      {Data: fallbackScript, Mode: 0o755},
		FallbackProbeScript: {Data: fallbackProbeScript, Mode: 0o755},
		fallbackDropInPath:  {Data: dropIn, Mode: 0o644},
	}
	if design == FallbackKubelet {
		// v2's revert: kubelet back on .11 once LocalDNS is up.
		f := files[fallbackDropInPath]
		f.Data += "ExecStartPost=" + FallbackScript + " revert-kubelet\n"
		files[fallbackDropInPath] = f
		files[kubeletDefaultsPath] = GuestFile{Data: "KUBELET_FLAGS=--cluster-dns=" + LocalDNSPodIP + " --cluster-domain=cluster.local\n"}
	}
	return files
}

// FallbackTakeovers counts the fallback's takeovers in a journal.
func FallbackTakeovers(journal string) int { return strings.Count(journal, FallbackTakeoverLog) }

// FallbackDeclines counts the times the fallback declined in a journal.
func FallbackDeclines(journal string) int { return strings.Count(journal, FallbackDeclineLog) }
