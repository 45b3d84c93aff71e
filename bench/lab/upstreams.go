package lab

import (
	"errors"
	"fmt"
	"strings"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

// The servers LocalDNS forwards to, each a CoreDNS in a network namespace
// of its own, reached from the node over a veth: a scenario cuts one off
// by taking the node's end down (the route through it goes with it).
const (
	// KubeDNSLink is the node's end of the veth to kube-dns; the node
	// routes LocalDNSKubeDNS via KubeDNSGateway.
	KubeDNSLink    = "to-kubedns"
	KubeDNSGateway = "10.200.0.2"
	// VnetDNSLink is the node's end of the veth to the VNet's DNS; the
	// node routes LocalDNSVnetDNS via VnetDNSGateway.
	VnetDNSLink    = "to-vnetdns"
	VnetDNSGateway = "10.200.1.2"
)

// FreshZone is a zone both upstreams answer every A name under, each with
// FreshAddr, through CoreDNS's template plugin: a load's fresh names
// (LoadName.Fresh) go there, names no cache can hold, so only a server
// that reaches an upstream answers them. On a node these are the names a
// workload asks for the first time (a new storage account, a new
// endpoint), which kube-dns forwards and the VNet DNS resolves.
const (
	FreshZone = "fresh.example.com."
	FreshAddr = "192.0.2.53"
)

// freshBlock is the server block for FreshZone, bound to addr.
func freshBlock(addr string) string {
	return fmt.Sprintf("%s:53 {\n    bind %s\n    errors\n    template IN A %s {\n        answer \"{{ .Name }} 60 IN A %s\"\n    }\n}\n",
		FreshZone, addr, FreshZone, FreshAddr)
}

// upstreamNodeLink is an upstream's end of its veth to the node.
const upstreamNodeLink = "to-node"

// upstreamSpec is where one upstream sits and how the node reaches it.
type upstreamSpec struct {
	role     string // namespace role: "kubedns", "vnetdns"
	addr     string // the service address, on a link of its own in its namespace
	link     string // the node's end of the veth
	nodeEnd  string // the node's end's address, /30
	gateway  string // the far end's address, /30
	corefile string
}

// Upstream is one upstream server: its namespace and its CoreDNS.
type Upstream struct {
	NS      *nstest.Namespace
	CoreDNS *nstest.CoreDNS
	closers []func() error // run in reverse by Close
}

// Upstreams are the lab node's two upstreams: kube-dns at the ClusterIP
// (LocalDNSKubeDNS: the pods' root block and the node's cluster.local
// block forward there) serving every zone of the lab, its queries counted
// (WithPrometheus), and the VNet's DNS
// (LocalDNSVnetDNS: the node's root block forwards there) serving the
// zones outside the cluster and NXDOMAIN for every other name, cluster.local
// included, as a VNet's resolver knows nothing of the cluster. Both answer
// the names under FreshZone.
type Upstreams struct {
	Kube, Vnet *Upstream
}

// StartUpstreams creates both upstreams' namespaces, joins each to node by
// a veth with a route to its address, and starts their CoreDNS (coredns,
// the binary) serving zones. On error it undoes what it did; otherwise
// Close does.
func StartUpstreams(node *nstest.Namespace, coredns string, zones *nstest.Zones) (*Upstreams, error) {
	u := &Upstreams{}
	var err error
	u.Kube, err = startUpstream(node, coredns, zones, upstreamSpec{
		role: "kubedns", addr: LocalDNSKubeDNS, link: KubeDNSLink, nodeEnd: "10.200.0.1", gateway: KubeDNSGateway,
		corefile: kubeDNSCorefile(zones, LocalDNSKubeDNS),
	})
	if err != nil {
		return nil, fmt.Errorf("kube-dns: %w", err)
	}
	vnet, err := VnetDNSCorefile(zones)
	if err == nil {
		u.Vnet, err = startUpstream(node, coredns, zones, upstreamSpec{
			role: "vnetdns", addr: LocalDNSVnetDNS, link: VnetDNSLink, nodeEnd: "10.200.1.1", gateway: VnetDNSGateway,
			corefile: vnet,
		})
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("VNet DNS: %w", err), u.Close())
	}
	return u, nil
}

// Close stops both upstreams and removes their namespaces.
func (u *Upstreams) Close() error {
	var errs []error
	for _, up := range []*Upstream{u.Vnet, u.Kube} {
		if up != nil {
			errs = append(errs, up.Close())
		}
	}
	return errors.Join(errs...)
}

// startUpstream builds one upstream as spec says.
func startUpstream(node *nstest.Namespace, coredns string, zones *nstest.Zones, spec upstreamSpec) (up *Upstream, err error) {
	up = &Upstream{}
	defer func() {
		if err != nil {
			err = errors.Join(err, up.Close())
			up = nil
		}
	}()
	ns, closeNS, err := nstest.Create(nstest.UniqueName(spec.role))
	if err != nil {
		return up, err
	}
	up.NS = ns
	up.closers = append(up.closers, closeNS)
	steps := []func() error{
		func() error { return ns.AddLink(spec.role, "", spec.addr+"/32") },
		func() error {
			return nstest.AddVeth(
				nstest.End{NS: node, Name: spec.link, Addrs: []string{spec.nodeEnd + "/30"}},
				nstest.End{NS: ns, Name: upstreamNodeLink, Addrs: []string{spec.gateway + "/30"}})
		},
		func() error { return node.AddRoute(nstest.Route{Dst: spec.addr + "/32", Via: spec.gateway}) },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return up, err
		}
	}
	up.CoreDNS, err = nstest.LaunchCoreDNS(ns, nstest.CoreDNSConfig{
		Binary:   coredns,
		Corefile: spec.corefile,
		Files:    zones.Files,
		Probe:    spec.addr + ":53",
	})
	if err != nil {
		return up, err
	}
	up.closers = append(up.closers, up.CoreDNS.Close)
	return up, nil
}

// hostsBlock is a server block bound to addr that answers the names of
// LocalDNS's hosts file with its addresses.
func hostsBlock(addr string) string {
	var zones []string
	for _, n := range LocalDNSHostNames() {
		zones = append(zones, n+":53")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s {\n    bind %s\n    errors\n    hosts {\n", strings.Join(zones, " "), addr)
	for _, h := range localdnsHostEntries() {
		fmt.Fprintf(&b, "        %s %s\n", h.addr, h.name)
	}
	b.WriteString("    }\n}\n")
	return b.String()
}

// Close stops the CoreDNS and removes the namespace (and with it the veth).
func (u *Upstream) Close() error {
	var errs []error
	for i := len(u.closers) - 1; i >= 0; i-- {
		errs = append(errs, u.closers[i]())
	}
	u.closers = nil
	return errors.Join(errs...)
}

// VnetDNSCorefile is the VNet DNS's Corefile: the zones' blocks
// (zones.Corefile, one per zone) bound to LocalDNSVnetDNS, but for
// cluster.local, which only kube-dns serves; FreshZone's; the public
// names LocalDNS's hosts file holds (LocalDNSHostNames), which a VNet's
// resolver answers too (a node that reaches it past LocalDNS, as AKS's
// nat fallback sends it, still resolves mcr.microsoft.com); and a root
// block that answers every other name NXDOMAIN, as a VNet's resolver
// answers a name that does not exist. A cluster name that reaches the VNet DNS gets NXDOMAIN, as a
// misrouted one would on a node.
func VnetDNSCorefile(zones *nstest.Zones) (string, error) {
	var b strings.Builder
	dropped := false
	for block := range strings.SplitAfterSeq(zones.Corefile(LocalDNSVnetDNS), "}\n") {
		if strings.HasPrefix(block, "cluster.local.:") {
			dropped = true
			continue
		}
		b.WriteString(block)
	}
	if !dropped {
		return "", errors.New("VNet DNS Corefile: the zones' Corefile has no cluster.local block to leave out")
	}
	b.WriteString(freshBlock(LocalDNSVnetDNS))
	b.WriteString(hostsBlock(LocalDNSVnetDNS))
	fmt.Fprintf(&b, ".:53 {\n    bind %s\n    errors\n    template ANY ANY {\n        rcode NXDOMAIN\n    }\n}\n", LocalDNSVnetDNS)
	return b.String(), nil
}
