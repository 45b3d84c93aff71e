package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/dnsstandby/dnsstandby/bench/lab"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

// The lab's addresses. Each topology has namespaces of its own, so the
// three setups of a scenario run side by side with the same addresses, as
// three nodes would.
const (
	clusterIP = "10.0.0.10" // kube-dns's ClusterIP
	podIP     = "10.244.0.2"
	nodePodIP = "10.244.0.1" // the node's end of the pod's veth
	localDNS  = "169.254.10.11"
)

// standbyPath is where the guest sees the dnsstandby binary.
const standbyPath = "/usr/local/bin/dnsstandby"

// Setups, names as in the output format.
const (
	setupShipped = "localdns-shipped" // LocalDNS with the shipped unit
	setupPR9439  = "localdns-pr9439"  // LocalDNS with AgentBaker PR 9439's restart budget
	setupStandby = "dnsstandby"       // LocalDNS pr9439 plus dnsstandby (steering auto: adopt here)
	// The same with a lower steering level forced, to show what each
	// level guarantees.
	setupStandbyOwn = "dnsstandby-own"
	setupStandbyOff = "dnsstandby-off"
	// dnsstandby beside LocalDNS with the shipped unit, whose start limit
	// a crash storm exhausts: dnsstandby then serves for good.
	setupStandbyShipped = "dnsstandby-shipped"
)

// defaultSetups run unless -setups says otherwise.
var defaultSetups = []string{setupShipped, setupPR9439, setupStandby}

var knownSetups = []string{setupShipped, setupPR9439, setupStandby, setupStandbyOwn, setupStandbyOff, setupStandbyShipped}

// isStandby reports whether a setup runs dnsstandby.
func isStandby(setup string) bool { return strings.HasPrefix(setup, setupStandby) }

// steeringOf is the --steering a dnsstandby setup runs with.
func steeringOf(setup string) string {
	switch setup {
	case setupStandbyOwn:
		return "own"
	case setupStandbyOff:
		return "off"
	}
	return "auto"
}

// topology is one node: a systemd guest running LocalDNS (and dnsstandby),
// a pod namespace whose resolv.conf points at 169.254.10.11, and a kube-dns
// namespace at 10.0.0.10.
type topology struct {
	setup   string
	guest   *lab.Guest
	node    *nstest.Namespace // the guest's network namespace
	pod     *nstest.Namespace
	kube    *nstest.Namespace
	kubeDNS *nstest.CoreDNS
	zones   *nstest.Zones

	closers []func() error // run in reverse by close
}

// binaries are the programs the lab runs.
type binaries struct {
	coredns, dnsstandby string
}

// buildTopology creates the namespaces, boots the guest, wires them and
// starts LocalDNS (and dnsstandby for the dnsstandby setup). On error it
// undoes what it did.
func buildTopology(ctx context.Context, id, setup string, bins binaries, zones *nstest.Zones) (t *topology, err error) {
	t = &topology{setup: setup, zones: zones}
	defer func() {
		if err != nil {
			err = errors.Join(fmt.Errorf("%s: %w", setup, err), t.close())
			t = nil
		}
	}()

	variant := "pr9439"
	if setup == setupShipped || setup == setupStandbyShipped {
		variant = "shipped"
	}
	// The binaries are bound into the guest at the paths a node has them:
	// the guest's /tmp and /run are its own, so host paths there (a clone
	// under /tmp) would not be visible.
	cfg := lab.GuestConfig{
		Name:  "lab-" + id,
		Units: map[string]string{"localdns.service": lab.LocalDNSUnit(variant)},
		Files: lab.LocalDNSFiles(lab.LocalDNSCoreDNSPath),
		Binds: map[string]string{lab.LocalDNSCoreDNSPath: bins.coredns},
	}
	if isStandby(setup) {
		// The unit from deploy/systemd, with the lab's options; the anchor
		// is a bridge: this machine has no dummy driver.
		cfg.Binds[standbyPath] = bins.dnsstandby
		cfg.Units["dnsstandby.service"] = lab.DnsstandbyUnit()
		opts, err := lab.DnsstandbyDefaults("--listen", localDNS+":53", "--upstream", clusterIP+":53",
			"--metrics-addr", "127.0.0.1:9355", "--anchor-kind", "bridge", "--steering", steeringOf(setup))
		if err != nil {
			return t, err
		}
		cfg.Files[lab.DnsstandbyDefaultsPath] = opts
	}
	t.guest, err = lab.BootGuest(ctx, cfg)
	if err != nil {
		return t, fmt.Errorf("boot node: %w", err)
	}
	t.closers = append(t.closers, t.guest.Close)
	t.node = t.guest.NetNS()

	var closePod, closeKube func() error
	if t.pod, closePod, err = nstest.Create(nstest.UniqueName("pod")); err != nil {
		return t, err
	}
	t.closers = append(t.closers, closePod)
	if t.kube, closeKube, err = nstest.Create(nstest.UniqueName("kubedns")); err != nil {
		return t, err
	}
	t.closers = append(t.closers, closeKube)

	steps := []func() error{
		func() error { return t.kube.AddLink("kubedns", "", clusterIP+"/32") },
		func() error {
			return nstest.AddVeth(
				nstest.End{NS: t.node, Name: "to-kubedns", Addrs: []string{"10.200.0.1/30"}},
				nstest.End{NS: t.kube, Name: "to-node", Addrs: []string{"10.200.0.2/30"}})
		},
		func() error { return t.node.AddRoute(nstest.Route{Dst: clusterIP + "/32", Via: "10.200.0.2"}) },
		func() error {
			return nstest.AddVeth(
				nstest.End{NS: t.node, Name: "to-pod", Addrs: []string{nodePodIP + "/24"}},
				nstest.End{NS: t.pod, Name: "eth0", Addrs: []string{podIP + "/24"}})
		},
		// As on a node: pods reach LocalDNS's link-local addresses via the node.
		func() error { return t.pod.AddRoute(nstest.Route{Dst: "169.254.10.0/24", Via: nodePodIP}) },
		func() error {
			return t.pod.SetResolvConf("nameserver " + localDNS + "\nsearch default.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n")
		},
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return t, err
		}
	}
	t.kubeDNS, err = nstest.LaunchCoreDNS(t.kube, nstest.CoreDNSConfig{
		Binary:   bins.coredns,
		Corefile: zones.Corefile(clusterIP),
		Files:    zones.Files,
		Probe:    clusterIP + ":53",
	})
	if err != nil {
		return t, fmt.Errorf("kube-dns: %w", err)
	}
	t.closers = append(t.closers, t.kubeDNS.Close)

	units := []string{"localdns.service"}
	if isStandby(setup) {
		units = append(units, "dnsstandby.service")
	}
	for _, u := range units {
		if out, err := t.guest.Systemctl(ctx, "start", u); err != nil {
			journal, _ := t.guest.Journal(ctx, u)
			return t, fmt.Errorf("start %s: %w\n%s\n%s", u, err, out, tail(journal, 20))
		}
	}
	return t, t.waitAnswering(ctx, 10*time.Second)
}

// waitAnswering waits until a query from the pod to 169.254.10.11 is
// answered, whoever answers it.
func (t *topology) waitAnswering(ctx context.Context, limit time.Duration) error {
	svc := t.zones.Services[0].FQDN
	deadline := time.Now().Add(limit)
	for {
		q := lab.LoadName{FQDN: svc, Type: 1}.Query()
		if r, err := t.pod.Exchange("udp", "", localDNS+":53", q, 500*time.Millisecond); err == nil && r.Rcode == 0 {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			journal, _ := t.guest.Journal(context.Background(), "localdns.service")
			return fmt.Errorf("169.254.10.11 not answering after %s; localdns journal:\n%s", limit, tail(journal, 30))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// close tears the topology down in reverse order of building.
func (t *topology) close() error {
	var errs []error
	for i := len(t.closers) - 1; i >= 0; i-- {
		errs = append(errs, t.closers[i]())
	}
	t.closers = nil
	return errors.Join(errs...)
}

// buildAll builds one topology per setup, in parallel.
func buildAll(ctx context.Context, scenario string, setups []string, bins binaries, zones *nstest.Zones) ([]*topology, error) {
	tops := make([]*topology, len(setups))
	errs := make([]error, len(setups))
	var wg sync.WaitGroup
	for i, s := range setups {
		wg.Go(func() {
			tops[i], errs[i] = buildTopology(ctx, fmt.Sprintf("%s-%d", shortName(scenario), i), s, bins, zones)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		closeAll(tops)
		return nil, err
	}
	return tops, nil
}

// closeAll tears the topologies down in parallel: stopping LocalDNS takes
// its cleanup's 5 s in each.
func closeAll(tops []*topology) error {
	errs := make([]error, len(tops))
	var wg sync.WaitGroup
	for i, t := range tops {
		if t != nil {
			wg.Go(func() { errs[i] = t.close() })
		}
	}
	wg.Wait()
	return errors.Join(errs...)
}

// shortName keeps guest names short: they become cgroup and netns names.
func shortName(s string) string {
	if len(s) > 12 {
		s = s[:12]
	}
	return strings.Trim(s, "-")
}

func tail(s string, lines int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}
