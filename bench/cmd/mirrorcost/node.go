package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/dnsstandby/dnsstandby/bench/internal/testbed"
)

// Addresses inside the node's namespace. Queries come from dnsperf in the
// same namespace, so LocalDNS's replies leave on lo, where the tap sees each
// once (as PACKET_OUTGOING). The upstream, the kube-dns stand-in, is
// testbed's, on the namespace's loopback.
const (
	// listenAddr is LocalDNS's pod-facing address, shared by dnsstandby.
	listenAddr = "169.254.10.11:53"
	// anchorLink holds 169.254.10.11/32 (a bridge: this machine has no
	// dummy driver), as localdns.sh's `localdns` link does on a node.
	anchorLink = "localdns"
	// LocalDNS's prometheus (AKS: :9253) and ready (AKS: .11:8181).
	localDNSMetrics = "127.0.0.1:9253"
	localDNSReady   = "169.254.10.11:8181"
	// dnsstandby's metrics, on its default port.
	standbyMetrics = "127.0.0.1:9355"
)

// node is the test bed (namespace, upstream, query file) with the address
// link; LocalDNS and dnsstandby come and go per mirror feed.
type node struct {
	*testbed.Bed
	o *options
}

// newNode creates the test bed and the link with 169.254.10.11. Its Close
// undoes all of it; on error nothing is left.
func newNode(o *options) (*node, error) {
	cfg := testbed.DefaultConfig()
	cfg.Name, cfg.CoreDNS, cfg.Names, cfg.UpstreamCPU = "mirrorcost", o.coredns, o.names, o.clientCPU
	bed, err := testbed.New(cfg)
	if err != nil {
		return nil, err
	}
	host, _, _ := strings.Cut(listenAddr, ":")
	if err := bed.NS.AddLink(anchorLink, "bridge", host+"/32"); err != nil {
		return nil, errors.Join(fmt.Errorf("anchor link: %w", err), bed.Close())
	}
	return &node{Bed: bed, o: o}, nil
}

// pins maps dnsstandby's and LocalDNS's processes to the CPU each is
// pinned to.
func (n *node) pins(standbyPid, localDNSPid int) map[int]int {
	return map[int]int{standbyPid: n.o.standbyCPU, localDNSPid: n.o.serverCPU}
}
