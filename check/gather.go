package check

import (
	"github.com/dnsstandby/dnsstandby/status"

	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"

	"github.com/dnsstandby/dnsstandby/admin"
	"github.com/dnsstandby/dnsstandby/takeover/peer"
)

// systemctlTimeout bounds `systemctl show`: it answers from systemd's
// memory in milliseconds; a systemd that does not answer in this long is
// itself worth reporting.
const systemctlTimeout = 10 * time.Second

// Run audits the node as cfg says (zero fields take DefaultConfig's) and
// returns one row per check. Checks that cannot look report WARN with
// what stopped them, or SKIP when the audit runs in a container that
// cannot see what they look at; only ctx ending stops the audit early.
func Run(ctx context.Context, cfg Config) (Report, error) {
	cfg = withDefaults(cfg)
	for _, l := range cfg.Listen {
		if !l.IsValid() {
			return Report{}, fmt.Errorf("check: invalid listen address %v", l)
		}
	}

	at := detectWhere(hostView())
	daemon := readStatus(ctx, cfg.AdminSocket, cfg.Timeout)
	if len(cfg.Listen) == 0 {
		cfg.Listen = daemonListen(daemon.Status)
	}
	unitOut, unitErr := systemctlShow(ctx, cfg.LocalDNSUnit)
	fallback := readFallback(ctx, cfg.LocalDNSUnit, cfg.FallbackUnit)
	localdns := readLocalDNSCorefile(cfg.LocalDNSCorefile)
	kube := readKubelet(cfg)
	addrs := listAddrs()
	groups := make([]groupFacts, 0, len(cfg.Listen))
	for _, l := range distinctAddrPorts(cfg.Listen) {
		groups = append(groups, listGroup(l))
	}

	domain := cmp.Or(cfg.ClusterDomain, kube.clusterDomain(), DefaultClusterDomain)
	targets := upstreamTargets(daemon.Status, cfg.Upstreams, domain)
	var (
		probes []upstreamProbe
		wg     sync.WaitGroup
	)
	wg.Go(func() { probes = probeUpstreams(ctx, targets, cfg.Timeout) })
	if st := daemon.Status; st != nil && st.Mirror != nil && st.Mirror.Running && cfg.MirrorWindow > 0 {
		// Watch the feed while the upstreams are probed: what it
		// accepted in the meantime says it is feeding now.
		wg.Go(func() {
			select {
			case <-ctx.Done():
				return
			case <-time.After(cfg.MirrorWindow):
			}
			if later := readStatus(ctx, cfg.AdminSocket, cfg.Timeout); later.Err == nil {
				daemon.Later, daemon.Window = later.Status, cfg.MirrorWindow
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return Report{}, fmt.Errorf("check: %w", err)
	}

	daemonPID := 0
	if daemon.Status != nil {
		daemonPID = daemon.Status.PID
	}
	var r Report
	add := func(res Result) { r.Results = append(r.Results, res) }
	// Rows that need the daemon's status are left out when it has none:
	// the dnsstandby row says why.
	addIf := func(res Result, ok bool) {
		if ok {
			add(res)
		}
	}
	add(localdnsUnitResult(cfg.LocalDNSUnit, unitOut, unitErr, at))
	add(clusterDNSResult(kube, cfg.Listen, at))
	for _, a := range distinctAddrs(cfg.Listen) {
		add(addressResult(a, addrs))
	}
	for _, g := range groups {
		add(groupResult(g, daemonPID))
	}
	add(daemonResult(daemon, groups))
	add(localdnsListenersResult(localdns, daemon))
	add(fallbackResult(fallback, daemon))
	addIf(configResult(daemon))
	addIf(steeringResult(daemon))
	add(upstreamResult(probes, daemon.Status != nil && daemon.Status.Upstreams != nil))
	addIf(mirrorResult(daemon))
	addIf(cacheResult(daemon))
	return r, nil
}

// withDefaults fills cfg's zero fields from DefaultConfig.
func withDefaults(cfg Config) Config {
	d := DefaultConfig()
	cfg.LocalDNSUnit = cmp.Or(cfg.LocalDNSUnit, d.LocalDNSUnit)
	cfg.FallbackUnit = cmp.Or(cfg.FallbackUnit, d.FallbackUnit)
	cfg.LocalDNSCorefile = cmp.Or(cfg.LocalDNSCorefile, d.LocalDNSCorefile)
	cfg.KubeletFlags = cmp.Or(cfg.KubeletFlags, d.KubeletFlags)
	cfg.AdminSocket = cmp.Or(cfg.AdminSocket, d.AdminSocket)
	cfg.Timeout = cmp.Or(cfg.Timeout, d.Timeout)
	return cfg
}

// daemonListen is the daemon's --listen when it reports one (the audit
// then looks where it actually serves), else status.DefaultListen.
func daemonListen(st *status.Daemon) []netip.AddrPort {
	var out []netip.AddrPort
	if st != nil && st.Config != nil {
		for _, s := range st.Config.Listen {
			if ap, err := netip.ParseAddrPort(s); err == nil {
				out = append(out, ap)
			}
		}
	}
	if len(out) == 0 {
		out = []netip.AddrPort{status.DefaultListen}
	}
	return out
}

func distinctAddrPorts(listen []netip.AddrPort) []netip.AddrPort {
	var out []netip.AddrPort
	seen := map[netip.AddrPort]bool{}
	for _, l := range listen {
		l = netip.AddrPortFrom(l.Addr().Unmap(), l.Port())
		if !seen[l] {
			seen[l] = true
			out = append(out, l)
		}
	}
	return out
}

// systemctlShow runs `systemctl show UNIT --property=...`.
func systemctlShow(ctx context.Context, unit string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, systemctlTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "systemctl", "show", "--no-pager", unit, "--property="+strings.Join(unitProperties, ","))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			err = fmt.Errorf("%w: %s", err, strings.ReplaceAll(msg, "\n", "; "))
		}
		return "", fmt.Errorf("systemctl show %s: %w", unit, err)
	}
	return stdout.String(), nil
}

// readKubelet reads kubelet's flags file, then its config file: the one
// given, else the one the flags name (--config), else the default path.
func readKubelet(cfg Config) kubeletFacts {
	k := kubeletFacts{FlagsPath: cfg.KubeletFlags}
	var data []byte
	if data, k.FlagsErr = os.ReadFile(cfg.KubeletFlags); k.FlagsErr == nil {
		k.Flags = parseKubeletFlags(data)
	}
	k.ConfigPath = cmp.Or(cfg.KubeletConfig, k.Flags.Config, DefaultKubeletConfig)
	if data, k.ConfigErr = os.ReadFile(k.ConfigPath); k.ConfigErr == nil {
		k.Config, k.ConfigErr = parseKubeletConfig(data)
	}
	return k
}

// readLocalDNSCorefile reads the first of the comma-separated paths that
// exists, and the listeners its blocks serve.
func readLocalDNSCorefile(paths string) corefileFacts {
	f := corefileFacts{Tried: strings.Split(paths, ",")}
	for _, p := range f.Tried {
		data, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		f.Path = p
		if err != nil {
			f.Err = err
			return f
		}
		f.Listeners, f.Err = corefileListeners(p, data)
		return f
	}
	return f
}

// listAddrs maps every address of the network namespace to the links
// holding it.
func listAddrs() addrFacts {
	links, err := netlink.LinkList()
	if err != nil {
		return addrFacts{Err: fmt.Errorf("list links: %w", err)}
	}
	names := map[int]string{}
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	list, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return addrFacts{Err: fmt.Errorf("list addresses: %w", err)}
	}
	f := addrFacts{Links: map[netip.Addr][]string{}}
	for _, a := range list {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		name := cmp.Or(names[a.LinkIndex], fmt.Sprintf("link %d", a.LinkIndex))
		f.Links[ip] = append(f.Links[ip], name)
	}
	return f
}

// listGroup lists the members of addr's UDP and TCP reuseport groups,
// dnsstandby's included (no exclude set): the audit wants both sides.
func listGroup(addr netip.AddrPort) groupFacts {
	g := groupFacts{Addr: addr}
	g.UDP, g.UDPErr = peer.FindSockets(addr, peer.UDP, nil)
	g.TCP, g.TCPErr = peer.FindSockets(addr, peer.TCP, nil)
	return g
}

// readStatus asks the daemon for its status.
func readStatus(ctx context.Context, path string, timeout time.Duration) daemonFacts {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := admin.Do(ctx, path, admin.Request{Cmd: "status"})
	if err != nil {
		return daemonFacts{Err: err}
	}
	var st status.Daemon
	if err := json.Unmarshal(resp.Status, &st); err != nil {
		return daemonFacts{Err: fmt.Errorf("admin socket %s: unreadable status: %w", path, err)}
	}
	return daemonFacts{Status: &st}
}

// probeUpstreams asks each target for its question's SOA, all at once.
func probeUpstreams(ctx context.Context, targets []upstreamTarget, timeout time.Duration) []upstreamProbe {
	out := make([]upstreamProbe, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Go(func() { out[i] = probeUpstream(ctx, t, timeout) })
	}
	wg.Wait()
	return out
}

// probeUpstream sends one SOA query over UDP, with RD set as LocalDNS and
// dnsstandby forward (a recursive upstream then answers for any zone).
func probeUpstream(ctx context.Context, t upstreamTarget, timeout time.Duration) upstreamProbe {
	p := upstreamProbe{upstreamTarget: t}
	ap, err := netip.ParseAddrPort(t.Server)
	if err != nil {
		p.Err = fmt.Errorf("bad address: %w", err)
		return p
	}
	m := new(dns.Msg)
	m.SetQuestion(t.Question, dns.TypeSOA)
	c := &dns.Client{Net: "udp", Timeout: timeout}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	r, rtt, err := c.ExchangeContext(ctx, m, ap.String())
	switch {
	case err != nil:
		var ne interface{ Timeout() bool }
		if errors.As(err, &ne) && ne.Timeout() {
			err = fmt.Errorf("timed out after %s", timeout)
		}
		p.Err = err
	case r == nil:
		p.Err = errors.New("empty reply")
	default:
		p.Rcode, p.RTT = r.Rcode, rtt
	}
	return p
}
