package lab

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/dnsstandby/dnsstandby/bench/internal/testbed"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

// kube-dns as a cluster runs it: several CoreDNS pods behind the ClusterIP,
// which kube-proxy's nat rules spread over them a flow at a time. The lab's
// plain kube-dns (Upstreams.Kube) is one CoreDNS on the ClusterIP itself;
// ClusterIP is the form the scenarios that lose one pod use.

// KubeDNSPodIPs are the kube-dns pods' addresses behind the ClusterIP,
// in the order ClusterIP.Pods holds them.
var KubeDNSPodIPs = []string{"10.244.1.2", "10.244.1.3", "10.244.1.4"}

// KubeDNSMetricsPort is where kube-dns's CoreDNS serves its prometheus
// metrics, on its own address (9153, as kube-dns's pods do).
const KubeDNSMetricsPort = 9153

// LocalDNSVnetDNS2 is the second VNet DNS server of a custom VNet with two
// (upstream-blackhole): localdns.sh writes both, in resolv.conf's order,
// where the rendering has 168.63.129.16.
const LocalDNSVnetDNS2 = "10.224.0.5"

// WithPrometheus is corefile with `prometheus addr:KubeDNSMetricsPort`
// after every bind line (every block of the lab's upstreams has one), so
// that every query the server gets is counted in coredns_dns_requests_total.
func WithPrometheus(corefile, addr string) string {
	var b strings.Builder
	for l := range strings.SplitAfterSeq(corefile, "\n") {
		b.WriteString(l)
		if t := strings.TrimSpace(l); strings.HasPrefix(t, "bind ") {
			indent := l[:len(l)-len(strings.TrimLeft(l, " \t"))]
			fmt.Fprintf(&b, "%sprometheus %s:%d\n", indent, addr, KubeDNSMetricsPort)
		}
	}
	return b.String()
}

// kubeDNSCorefile is kube-dns's Corefile bound to addr: every zone of the
// lab and FreshZone, with its queries counted.
func kubeDNSCorefile(zones *nstest.Zones, addr string) string {
	return WithPrometheus(zones.Corefile(addr)+freshBlock(addr), addr)
}

// StartVnetDNS2 starts the second VNet DNS server, LocalDNSVnetDNS2: the
// same Corefile as the first (VnetDNSCorefile) bound to its own address,
// in a namespace of its own joined to node as the first is. Close stops it.
func StartVnetDNS2(node *nstest.Namespace, coredns string, zones *nstest.Zones) (*Upstream, error) {
	corefile, err := VnetDNSCorefile(zones)
	if err != nil {
		return nil, err
	}
	up, err := startUpstream(node, coredns, zones, upstreamSpec{
		role: "vnetdns2", addr: LocalDNSVnetDNS2, link: "to-vnetdns2", nodeEnd: "10.200.1.5", gateway: "10.200.1.6",
		corefile: strings.ReplaceAll(corefile, LocalDNSVnetDNS, LocalDNSVnetDNS2),
	})
	if err != nil {
		return nil, fmt.Errorf("second VNet DNS: %w", err)
	}
	return up, nil
}

// Blackhole makes the upstream drop every packet it gets from the node
// from now on, without a reply or an ICMP error: a server that went
// silent (a dead VM, a firewall that drops). Its CoreDNS keeps running
// behind the rule, and its metrics can still be read from inside its
// namespace (Requests).
func (u *Upstream) Blackhole(ctx context.Context) error {
	if _, err := u.NS.Run(ctx, "iptables", "-w", "-I", "INPUT", "-i", upstreamNodeLink, "-j", "DROP"); err != nil {
		return fmt.Errorf("blackhole: %w", err)
	}
	return nil
}

// Requests is how many queries the upstream's CoreDNS has received, from
// its prometheus metrics at addr (the sum of coredns_dns_requests_total
// over its series); its Corefile must have WithPrometheus's lines.
func (u *Upstream) Requests(ctx context.Context, addr string) (float64, error) {
	page, err := u.NS.Run(ctx, "curl", "-sSf", "--max-time", "5", fmt.Sprintf("http://%s:%d/metrics", addr, KubeDNSMetricsPort))
	if err != nil {
		return 0, fmt.Errorf("CoreDNS metrics: %w", err)
	}
	m, err := testbed.ParseMetrics(strings.NewReader(page))
	if err != nil {
		return 0, fmt.Errorf("CoreDNS metrics at %s: %w", addr, err)
	}
	return m.Sum("coredns_dns_requests_total", nil), nil
}

// ClusterIP is kube-dns as several pods behind the ClusterIP
// (LocalDNSKubeDNS): a CoreDNS per pod, each in a namespace of its own
// joined to the node, and the node's nat rules as kube-proxy's iptables
// mode writes them for the service.
type ClusterIP struct {
	Pods    []*Upstream // in KubeDNSPodIPs' order
	node    *nstest.Namespace
	closers []func() error
}

// StartClusterIP starts len(KubeDNSPodIPs) kube-dns pods serving zones and
// puts kube-proxy's rules for the ClusterIP in node's nat table (node
// needs a route to the ClusterIP, whichever: it picks the flows' source
// address, and the nat rules their destination); it must
// run before anything in node sends to the ClusterIP, since a flow's
// backend is chosen on its first packet (conntrack) and a flow begun
// before the rules would keep going where it went. On error it undoes
// what it did; otherwise Close does.
func StartClusterIP(ctx context.Context, node *nstest.Namespace, coredns string, zones *nstest.Zones) (c *ClusterIP, err error) {
	c = &ClusterIP{node: node}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Close())
			c = nil
		}
	}()
	for i, ip := range KubeDNSPodIPs {
		nodeEnd := fmt.Sprintf("10.200.%d.1", 10+i)
		pod, err := startUpstream(node, coredns, zones, upstreamSpec{
			role: fmt.Sprintf("kdnspod%d", i), addr: ip, link: fmt.Sprintf("to-kdnspod%d", i),
			nodeEnd: nodeEnd, gateway: fmt.Sprintf("10.200.%d.2", 10+i),
			corefile: kubeDNSCorefile(zones, ip),
		})
		if err != nil {
			return c, fmt.Errorf("kube-dns pod %s: %w", ip, err)
		}
		c.Pods = append(c.Pods, pod)
		c.closers = append(c.closers, pod.Close)
		// The node's flows to the ClusterIP leave from the address of the
		// link its route to the ClusterIP takes, not this one's: the
		// replies go back by the pod's default route, as a pod's do.
		if err := pod.NS.AddRoute(nstest.Route{Dst: "default", Via: nodeEnd}); err != nil {
			return c, fmt.Errorf("kube-dns pod %s: %w", ip, err)
		}
	}
	for _, rule := range KubeProxyRules(LocalDNSKubeDNS, 53, KubeDNSPodIPs) {
		if _, err := node.Run(ctx, "iptables", append([]string{"-w", "-t", "nat"}, rule...)...); err != nil {
			return c, fmt.Errorf("kube-proxy rules: %w", err)
		}
	}
	// The node's namespace goes with the guest; the rules are taken out
	// anyway, so that a node kept for another use has its plain kube-dns.
	c.closers = append(c.closers, func() error {
		_, err := node.Run(context.Background(), "iptables", "-w", "-t", "nat", "-D", "OUTPUT", "-j", kubeServices)
		return err
	})
	return c, nil
}

// StopPod makes pod i silent as a pod on a dead node is: every packet to
// it dropped, no reply, no ICMP error; the nat rules are left as they are,
// as kube-proxy leaves them until the EndpointSlice changes.
func (c *ClusterIP) StopPod(ctx context.Context, i int) error {
	if i < 0 || i >= len(c.Pods) {
		return fmt.Errorf("kube-dns pod %d: have %d", i, len(c.Pods))
	}
	return c.Pods[i].Blackhole(ctx)
}

// Requests is how many queries the pods have received between them.
func (c *ClusterIP) Requests(ctx context.Context) (float64, error) {
	var sum float64
	for i, p := range c.Pods {
		n, err := p.Requests(ctx, KubeDNSPodIPs[i])
		if err != nil {
			return 0, err
		}
		sum += n
	}
	return sum, nil
}

// Close stops the pods and removes the rules.
func (c *ClusterIP) Close() error {
	var errs []error
	for i := len(c.closers) - 1; i >= 0; i-- {
		errs = append(errs, c.closers[i]())
	}
	c.closers = nil
	return errors.Join(errs...)
}

// kubeServices is the chain every packet the node sends goes through, as
// kube-proxy's KUBE-SERVICES (hooked into OUTPUT for the node's own
// traffic and PREROUTING for its pods').
const kubeServices = "KUBE-SERVICES"

// KubeProxyRules are the nat table's rules (iptables arguments after
// `-t nat`) that kube-proxy's iptables mode writes for the kube-dns
// service at clusterIP:port, UDP and TCP, with the given endpoints: per
// protocol a KUBE-SERVICES rule with kube-proxy's comment jumping to the
// service's chain (KubeDNSServiceChains), whose rule i jumps, with
// probability 1/(n-i), to the endpoint's KUBE-SEP chain (the last
// unconditionally), so that each new flow picks an endpoint at random
// with equal chances, and the KUBE-SEP chain DNATs to it. Chains come
// before the rules that jump to them; the node's own traffic goes through
// KUBE-SERVICES.
func KubeProxyRules(clusterIP string, port int, endpoints []string) [][]string {
	var chains, rules [][]string
	chains = append(chains, []string{"-N", kubeServices})
	for _, proto := range []string{"udp", "tcp"} {
		svc := KubeDNSServiceChains[proto]
		portName := map[string]string{"udp": "dns", "tcp": "dns-tcp"}[proto]
		chains = append(chains, []string{"-N", svc})
		rules = append(rules, []string{"-A", kubeServices, "-d", clusterIP + "/32", "-p", proto, "-m", proto,
			"--dport", fmt.Sprint(port), "-m", "comment", "--comment", "kube-system/kube-dns:" + portName + " cluster IP", "-j", svc})
		for i, ep := range endpoints {
			sep := fmt.Sprintf("KUBE-SEP-DNS-%s-%d", strings.ToUpper(proto), i)
			chains = append(chains, []string{"-N", sep})
			rules = append(rules, []string{"-A", sep, "-p", proto, "-m", proto, "-j", "DNAT",
				"--to-destination", fmt.Sprintf("%s:%d", ep, port)})
			pick := []string{"-A", svc}
			if left := len(endpoints) - i; left > 1 {
				// kube-proxy's own formatting of 1/left.
				pick = append(pick, "-m", "statistic", "--mode", "random", "--probability", fmt.Sprintf("%0.11f", 1/float64(left)))
			}
			rules = append(rules, append(pick, "-j", sep))
		}
	}
	rules = append(rules, []string{"-A", "OUTPUT", "-j", kubeServices})
	return append(chains, rules...)
}
