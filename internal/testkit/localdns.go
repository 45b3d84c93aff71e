package testkit

import (
	"fmt"
	"strings"
)

// LocalDNS listener addresses: the node's (kubelet, hostNetwork and
// dnsPolicy:Default pods) and the pods' (dnsPolicy:ClusterFirst).
const (
	NodeListener = "169.254.10.10"
	PodListener  = "169.254.10.11"
)

// Corefile describes a LocalDNS Corefile shaped like the one AgentBaker
// renders (pkg/agent/baker.go, localDNSCoreFileTemplateString, default
// LocalDNS profile): the whoami health-check block on both listeners, the
// node listener's root block forwarding to the VNet's DNS, and the pods'
// listener's root block forwarding to the kube-dns ClusterIP, each with
// AKS's forward, cache, nsid and template settings. The per-zone override
// blocks and the hosts plugin are left out: corefile/testdata has whole
// renderings with them.
type Corefile struct {
	// KubeDNS is the pod root block's forward target (the kube-dns
	// ClusterIP). Empty: the block forwards nowhere, and Extra must answer.
	KubeDNS string
	// VnetDNS is the node root block's forward target (168.63.129.16 on
	// AKS). Empty: no node root block.
	VnetDNS string
	// MaxConcurrent is the forward stanzas' max_concurrent; 0 means 1000,
	// AgentBaker's value.
	MaxConcurrent int
	// ServeStale is the cache's serve_stale arguments; empty means
	// "3600s verify", AgentBaker's default.
	ServeStale string
	// Ready and Prometheus are the listen addresses of those plugins;
	// empty means AgentBaker's (LISTENER:8181 and :9253).
	Ready, Prometheus string
	// Extra is added, line by line, to the pod root block (a dnstap line,
	// a template standing in for the forward).
	Extra string
}

// String renders the Corefile.
func (c Corefile) String() string {
	var b strings.Builder
	b.WriteString("# whoami (used for health check of DNS)\n")
	b.WriteString("health-check.localdns.local:53 {\n    bind " + NodeListener + " " + PodListener + "\n    whoami\n}\n")
	if c.VnetDNS != "" {
		b.WriteString("# VnetDNS: kubelet and dnsPolicy:Default pods.\n")
		c.rootBlock(&b, NodeListener, c.VnetDNS, "localdns", "")
	}
	b.WriteString("# KubeDNS: dnsPolicy:ClusterFirst pods.\n")
	c.rootBlock(&b, PodListener, c.KubeDNS, "localdns-pod", c.Extra)
	return b.String()
}

func (c Corefile) rootBlock(b *strings.Builder, listener, upstream, nsid, extra string) {
	maxConc := c.MaxConcurrent
	if maxConc == 0 {
		maxConc = 1000
	}
	stale := c.ServeStale
	if stale == "" {
		stale = "3600s verify"
	}
	ready := c.Ready
	if ready == "" {
		ready = listener + ":8181"
	}
	prom := c.Prometheus
	if prom == "" {
		prom = ":9253"
	}
	fmt.Fprintf(b, ".:53 {\n    errors\n    bind %s\n", listener)
	if upstream != "" {
		fmt.Fprintf(b, "    forward . %s {\n        prefer_udp\n        policy sequential\n        max_concurrent %d\n    }\n", upstream, maxConc)
	}
	fmt.Fprintf(b, "    ready %s\n", ready)
	fmt.Fprintf(b, "    cache 3600 {\n        success 9984\n        denial 9984\n        serve_stale %s\n        servfail 0\n    }\n", stale)
	fmt.Fprintf(b, "    loop\n    nsid %s\n    prometheus %s\n", nsid, prom)
	b.WriteString(`    template ANY ANY internal.cloudapp.net {
        match "^(?:[^.]+\.){4,}internal\.cloudapp\.net\.$"
        rcode NXDOMAIN
        fallthrough
    }
    template ANY ANY reddog.microsoft.com {
        rcode NXDOMAIN
    }
`)
	for line := range strings.SplitSeq(strings.TrimSpace(extra), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			b.WriteString("    " + line + "\n")
		}
	}
	b.WriteString("}\n")
}
