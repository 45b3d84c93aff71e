package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os/exec"
	"path/filepath"
	"regexp"
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
	clusterIP = lab.LocalDNSKubeDNS // kube-dns's ClusterIP
	podIP     = "10.244.0.2"
	nodePodIP = "10.244.0.1"        // the node's end of the pod's veth
	localDNS  = lab.LocalDNSPodIP   // the pods' listener
	nodeDNS   = lab.LocalDNSNodeIP  // the node's listener (kubelet, hostNetwork pods)
	vnetDNS   = lab.LocalDNSVnetDNS // where the node's root block forwards
	// vnetSearch is the search domain a VNet's DHCP gives a node (Azure's
	// <hash>.<region code>.internal.cloudapp.net).
	vnetSearch = "x4ffd0a2bbrfuj2wh.bx.internal.cloudapp.net"
)

// kubeDNSNodeEnd is the node's end of its veth to kube-dns
// (lab.StartUpstreams).
const kubeDNSNodeEnd = "10.200.0.1"

// standbyPath is where the guest sees the dnsstandby binary.
const standbyPath = "/usr/local/bin/dnsstandby"

// nextPath is where the guest sees the build standby-upgrade installs:
// the package's payload, before it is unpacked to standbyPath.
const nextPath = "/var/lib/lab/dnsstandby-next"

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

// standbyOptions are dnsstandby's options in a setup: both of LocalDNS's
// listeners, each served from LocalDNS's own blocks for it (the same
// Corefile file LocalDNS runs, as deploy/systemd's defaults read it), no
// --upstream; the anchor is a bridge, as this machine has no dummy driver.
// With fallback, kube-dns's ClusterIP is the fallback upstream, for a
// node that never saw a Corefile dnsstandby could apply (a build without
// --fallback-upstream refuses to start with it: see fallbackFlag).
func standbyOptions(setup string, fallback bool) []string {
	opts := []string{"--listen", nodeDNS + ":53", "--listen", localDNS + ":53",
		"--localdns-corefile", lab.LocalDNSCorefilePath,
		"--metrics-addr", "127.0.0.1:9355", "--anchor-kind", "bridge", "--steering", steeringOf(setup)}
	if fallback {
		opts = append(opts, fallbackFlag, clusterIP+":53")
	}
	return opts
}

// fallbackFlag is dnsstandby's option for the upstreams it uses when no
// Corefile it could apply is known.
const fallbackFlag = "--fallback-upstream"

// knowsFlag reports whether the dnsstandby binary bin has the option flag
// (`dnsstandby run -h` lists it).
func knowsFlag(ctx context.Context, bin, flag string) (bool, error) {
	out, err := exec.CommandContext(ctx, bin, "run", "-h").CombinedOutput()
	if err != nil {
		return false, fmt.Errorf("%s run -h: %w: %s", bin, err, out)
	}
	listed := regexp.MustCompile(`(?m)^  -` + regexp.QuoteMeta(strings.TrimLeft(flag, "-")) + `(\s|$)`)
	return listed.Match(out), nil
}

// topology is one node: a systemd guest running LocalDNS (and dnsstandby)
// whose own resolv.conf points at 169.254.10.10, a pod namespace whose
// resolv.conf points at 169.254.10.11, and the upstreams: kube-dns at
// 10.0.0.10 and the VNet's DNS.
type topology struct {
	setup string
	guest *lab.Guest
	node  *nstest.Namespace // the guest's network namespace
	pod   *nstest.Namespace
	up    *lab.Upstreams
	zones *nstest.Zones
	bins  binaries
	extra nodeExtras // what the scenario added (upstream_faults.go)
	// fallback is the design of AKS's LocalDNS fallback on the node, ""
	// for none.
	fallback string

	closers []func() error // run in reverse by close
}

// binaries are the programs the lab runs.
type binaries struct {
	coredns, dnsstandby string
	// next is the build standby-upgrade installs in place of dnsstandby,
	// "" when no scenario that runs needs it; nextVersion and version are
	// what `dnsstandby version` prints for it and for dnsstandby.
	next, nextVersion, version string
	// fallback gives dnsstandby its fallback upstream (standbyOptions).
	fallback bool
}

// readNext makes next absolute and reads both builds' versions: an
// upgrade to a build that says the same as the running one would prove
// nothing.
func (b *binaries) readNext(ctx context.Context) error {
	abs, err := filepath.Abs(b.next)
	if err != nil {
		return fmt.Errorf("next build: %w", err)
	}
	b.next = abs
	if b.nextVersion, err = buildVersion(ctx, b.next); err != nil {
		return fmt.Errorf("next build: %w", err)
	}
	if b.version, err = buildVersion(ctx, b.dnsstandby); err != nil {
		return err
	}
	if b.version == b.nextVersion {
		return fmt.Errorf("next build %s says %q, as %s does: stamp it with another version (make lab's LAB_NEXT_VERSION)",
			b.next, b.nextVersion, b.dnsstandby)
	}
	return nil
}

// buildVersion is the line `bin version` prints.
func buildVersion(ctx context.Context, bin string) (string, error) {
	out, err := exec.CommandContext(ctx, bin, "version").Output()
	if err != nil {
		return "", fmt.Errorf("%s version: %w", bin, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// nodeSpec is what a scenario asks of its nodes beyond the setup.
type nodeSpec struct {
	// corefile, if not nil, rewrites LocalDNS's Corefile first (a
	// scenario's fault that must be in place from LocalDNS's start).
	corefile func(string) string
	// upstreams, if not nil, adds to the node's upstreams before LocalDNS
	// starts.
	upstreams func(context.Context, *topology) error
	// fallback is the design of AKS's LocalDNS fallback the node gets
	// (lab.FallbackDesigns), "" for none.
	fallback string
}

// buildTopology creates the namespaces, boots the guest, wires them and
// starts LocalDNS (and dnsstandby for the dnsstandby setup), as spec asks.
// On error it undoes what it did.
func buildTopology(ctx context.Context, id, setup string, bins binaries, zones *nstest.Zones, spec nodeSpec) (t *topology, err error) {
	t = &topology{setup: setup, zones: zones, bins: bins, fallback: spec.fallback}
	corefile, upstreams := spec.corefile, spec.upstreams
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
	if corefile != nil {
		f := cfg.Files[lab.LocalDNSCorefilePath]
		f.Data = corefile(f.Data)
		cfg.Files[lab.LocalDNSCorefilePath] = f
	}
	if spec.fallback != "" {
		maps.Copy(cfg.Units, lab.FallbackUnits(spec.fallback))
		maps.Copy(cfg.Files, lab.FallbackFiles(spec.fallback))
	}
	if isStandby(setup) {
		cfg.Binds[standbyPath] = bins.dnsstandby
		if bins.next != "" {
			cfg.Binds[nextPath] = bins.next
		}
		cfg.Units["dnsstandby.service"] = lab.DnsstandbyUnit()
		opts, err := lab.DnsstandbyDefaults(standbyOptions(setup, bins.fallback)...)
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

	var closePod func() error
	if t.pod, closePod, err = nstest.Create(nstest.UniqueName("pod")); err != nil {
		return t, err
	}
	t.closers = append(t.closers, closePod)
	if t.up, err = lab.StartUpstreams(t.node, bins.coredns, zones); err != nil {
		return t, err
	}
	t.closers = append(t.closers, t.up.Close)
	if upstreams != nil {
		if err := upstreams(ctx, t); err != nil {
			return t, err
		}
	}

	steps := []func() error{
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
		// The node's own resolver (kubelet, hostNetwork and
		// dnsPolicy:Default pods): LocalDNS's node listener, as AKS's
		// networkd drop-in makes it, with the VNet's search domain.
		func() error { return t.node.SetResolvConf("nameserver " + nodeDNS + "\nsearch " + vnetSearch + "\n") },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return t, err
		}
	}

	if spec.fallback != "" {
		if err := t.fallbackNode(ctx); err != nil {
			return t, err
		}
	}
	units := []string{"localdns.service"}
	if isStandby(setup) {
		units = append(units, "dnsstandby.service")
	}
	if spec.fallback == lab.FallbackKubelet {
		units = append(units, "kubelet.service")
	}
	if spec.fallback != "" {
		// The guest masks timers.target: the timer is started by name.
		units = append(units, lab.FallbackProbeTimer)
	}
	for _, u := range units {
		if out, err := t.guest.Systemctl(ctx, "start", u); err != nil {
			journal, _ := t.guest.Journal(ctx, u)
			return t, fmt.Errorf("start %s: %w\n%s\n%s", u, err, out, tail(journal, 20))
		}
	}
	return t, t.waitAnswering(ctx, 10*time.Second)
}

// fallbackNode gives the node what AKS's fallback reads or reaches beyond
// its units: systemd-resolved's upstream resolv.conf (the VNet DNS), and
// for the nat design kube-proxy's kube-dns chains and what a node's
// network gives a DNATed query: forwarding, and routes back from the
// upstreams to the pod and to the node's end (a node's default route
// covers 169.254.10.0/24: with LocalDNS's link gone, the node's own
// queries leave by it, to be DNATed to the VNet DNS or dropped there).
func (t *topology) fallbackNode(ctx context.Context) error {
	if out, err := t.guest.Exec(ctx, "sh", "-c", `mkdir -p /run/systemd/resolve && printf 'nameserver %s\n' "$1" >/run/systemd/resolve/resolv.conf`, "sh", vnetDNS); err != nil {
		return fmt.Errorf("resolved's resolv.conf: %w: %s", err, out)
	}
	if t.fallback != lab.FallbackNAT {
		return nil
	}
	for _, args := range lab.KubeProxyRules(lab.LocalDNSKubeDNS, 53, []string{lab.LocalDNSKubeDNS}) {
		args = append([]string{"-w", "-t", "nat"}, args...)
		if out, err := t.guest.Exec(ctx, "/usr/sbin/iptables", args...); err != nil {
			return fmt.Errorf("kube-proxy stand-in: iptables %s: %w: %s", strings.Join(args, " "), err, out)
		}
	}
	steps := []func() error{
		func() error {
			_, err := t.node.Run(ctx, "sysctl", "-qw", "net.ipv4.ip_forward=1")
			return err
		},
		func() error {
			return t.up.Kube.NS.AddRoute(nstest.Route{Dst: "10.244.0.0/24", Via: kubeDNSNodeEnd})
		},
		// The node's address on its way to the VNet DNS (where its own
		// queries leave once LocalDNS's link is gone): kube-dns must reach
		// it too, as any node address. 169.254.10.0/24 stays unrouted: a
		// reply to a link-local source does not come back across a network.
		func() error {
			return t.up.Kube.NS.AddRoute(nstest.Route{Dst: "10.200.1.0/30", Via: kubeDNSNodeEnd})
		},
		func() error {
			return t.node.AddRoute(nstest.Route{Dst: "169.254.10.0/24", Via: lab.VnetDNSGateway})
		},
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return fmt.Errorf("nat fallback's network: %w", err)
		}
	}
	return nil
}

// waitAnswering waits until both listeners answer, whoever answers: a
// query from the pod to 169.254.10.11 and one from the node to
// 169.254.10.10.
func (t *topology) waitAnswering(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for _, c := range []struct {
		ns     *nstest.Namespace
		server string
	}{{t.pod, localDNS}, {t.node, nodeDNS}} {
		q := lab.LoadName{FQDN: t.zones.Services[0].FQDN, Type: 1}.Query()
		for {
			r, err := c.ns.Exchange("udp", "", c.server+":53", q, 500*time.Millisecond)
			if err == nil && r.Rcode == 0 {
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				journal, _ := t.guest.Journal(context.Background(), "localdns.service")
				return fmt.Errorf("%s not answering after %s (last: %v); localdns journal:\n%s", c.server, limit, err, tail(journal, 30))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
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

// buildAll builds one topology per setup, in parallel, each as spec asks
// for its setup.
func buildAll(ctx context.Context, scenario string, setups []string, bins binaries, zones *nstest.Zones, spec func(setup string) nodeSpec) ([]*topology, error) {
	tops := make([]*topology, len(setups))
	errs := make([]error, len(setups))
	var wg sync.WaitGroup
	for i, s := range setups {
		wg.Go(func() {
			tops[i], errs[i] = buildTopology(ctx, fmt.Sprintf("%s-%d", shortName(scenario), i), s, bins, zones, spec(s))
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
