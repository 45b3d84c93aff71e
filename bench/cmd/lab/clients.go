package main

import (
	"strings"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/bench/lab"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

// Who asks on a node: names as in the output (LabRun.Client).
const (
	clientPod  = "pod"  // dnsPolicy:ClusterFirst pods, through 169.254.10.11
	clientNode = "node" // kubelet, hostNetwork and dnsPolicy:Default pods, through 169.254.10.10
)

// kubeletProbeName is what the node's glibc probe looks up: the registry
// kubelet pulls images from, which LocalDNS answers from its hosts file.
const kubeletProbeName = "mcr.microsoft.com."

// client is one source of queries on a node, with its own load and glibc
// probe: the node's pods through LocalDNS's pod listener, or the node
// itself through its node listener.
type client struct {
	name      string            // clientPod, clientNode
	listener  string            // the address it asks, on port 53
	ns        *nstest.Namespace // where its sockets and getent run
	qps       int
	names     []lab.LoadName
	probeName string // what getent looks up
}

// nameMixes are the clients' name mixes.
type nameMixes struct {
	pod, node []lab.LoadName
}

// Fresh names' shares of the mixes (withFresh): 1 in 51 of the pods'
// queries (about 20 a second at the default 1,000 qps) and 1 in 26 of the
// node's (about 10 at 250).
const freshEveryPod, freshEveryNode = 50, 25

// withFresh is the mixes with their fresh names' shares.
func (m nameMixes) withFresh() nameMixes {
	return nameMixes{pod: withFresh(m.pod, freshEveryPod), node: withFresh(m.node, freshEveryNode)}
}

// clients are the node's clients: the pods, and, unless o.nodeQPS is 0,
// the node itself.
func (t *topology) clients(o *options, mixes nameMixes) []client {
	out := []client{{name: clientPod, listener: listenerOf(clientPod), ns: t.pod, qps: o.qps, names: mixes.pod, probeName: t.zones.Services[1].FQDN}}
	if o.nodeQPS > 0 {
		out = append(out, client{name: clientNode, listener: listenerOf(clientNode), ns: t.node, qps: o.nodeQPS, names: mixes.node, probeName: kubeletProbeName})
	}
	return out
}

// clientNames are the clients each node has with these options.
func clientNames(o *options) []string {
	if o.nodeQPS > 0 {
		return []string{clientPod, clientNode}
	}
	return []string{clientPod}
}

// nodeNameMix is what the node itself asks through 169.254.10.10, as
// kubelet and hostNetwork pods do, each through the block LocalDNS has for
// it there:
//   - the hosts file's names, A and AAAA (image pulls, AAD tokens), which
//     LocalDNS answers itself;
//   - names outside the cluster, through the VNet DNS: every case of the
//     zones outside cluster.local but the large answer and the refused
//     name;
//   - search-path expansions under the VNet's domain and under
//     reddog.microsoft.com, which the templates answer NXDOMAIN;
//   - some cluster services and the system ones (hostNetwork pods,
//     kube-dns's own pods), through the cluster.local block, over TCP to
//     kube-dns.
//
// Weights make the local and external names about as frequent as the
// cluster ones.
func nodeNameMix(z *nstest.Zones) []lab.LoadName {
	var mix []lab.LoadName
	add := func(weight int, n lab.LoadName) {
		for range weight {
			mix = append(mix, n)
		}
	}
	for _, name := range lab.LocalDNSHostNames() {
		add(10, lab.LoadName{FQDN: name, Type: dns.TypeA, Rcode: dns.RcodeSuccess})
		add(2, lab.LoadName{FQDN: name, Type: dns.TypeAAAA, Rcode: dns.RcodeSuccess})
	}
	var external []nstest.Case
	for _, c := range z.Cases {
		// The dangling CNAME is left out as from the pods' mix (nameMix).
		if !inCluster(c.Name) && !c.Large && c.Rcode != dns.RcodeRefused && c.Name != nstest.DanglingName {
			external = append(external, c)
		}
	}
	for _, c := range external {
		add(5, lab.LoadName{FQDN: c.Name, Type: c.Type, Rcode: c.Rcode})
	}
	for _, name := range []string{"www.example.com.", "login.microsoftonline.com."} {
		add(5, lab.LoadName{FQDN: name + vnetSearch + ".", Type: dns.TypeA, Rcode: dns.RcodeNameError})
		add(5, lab.LoadName{FQDN: name + "reddog.microsoft.com.", Type: dns.TypeA, Rcode: dns.RcodeNameError})
	}
	for i, s := range z.Services {
		if i%50 == 0 {
			mix = append(mix, lab.LoadName{FQDN: s.FQDN, Type: dns.TypeA, Rcode: dns.RcodeSuccess})
		}
	}
	for _, name := range []string{"kubernetes.default.svc.cluster.local.", "kube-dns.kube-system.svc.cluster.local."} {
		add(10, lab.LoadName{FQDN: name, Type: dns.TypeA, Rcode: dns.RcodeSuccess})
	}
	return mix
}

// withFresh is mix with a name never asked before (lab.LoadName.Fresh,
// under lab.FreshZone, which kube-dns and the VNet DNS both answer) after
// every `every` entries: a workload asking new names all the time, whose
// queries no cache can answer. Only scenarios that ask for it get it, so
// the other scenarios' loads stay as they were.
func withFresh(mix []lab.LoadName, every int) []lab.LoadName {
	fresh := lab.LoadName{FQDN: lab.FreshZone, Type: dns.TypeA, Rcode: dns.RcodeSuccess, Fresh: true}
	out := make([]lab.LoadName, 0, len(mix)+len(mix)/every+1)
	for i, n := range mix {
		out = append(out, n)
		if (i+1)%every == 0 {
			out = append(out, fresh)
		}
	}
	return out
}

// inCluster reports whether name is in cluster.local.
func inCluster(name string) bool {
	name = strings.ToLower(name)
	return name == "cluster.local." || strings.HasSuffix(name, ".cluster.local.")
}
