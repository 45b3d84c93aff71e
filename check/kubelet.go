package check

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// kubeletConfig is the part of kubelet's config file (KubeletConfiguration,
// YAML at /var/lib/kubelet/config.yaml, or JSON as AKS's
// /etc/default/kubeletconfig.json: YAML reads both) the audit uses.
type kubeletConfig struct {
	ClusterDNS    []string `yaml:"clusterDNS"`
	ClusterDomain string   `yaml:"clusterDomain"`
}

// parseKubeletConfig reads a kubelet config file.
func parseKubeletConfig(data []byte) (kubeletConfig, error) {
	var c kubeletConfig
	if err := yaml.Unmarshal(data, &c); err != nil {
		return c, fmt.Errorf("kubelet config: %w", err)
	}
	return c, nil
}

// kubeletFlags is what the audit reads from kubelet's flags file
// (/etc/default/kubelet on AKS: KUBELET_FLAGS="... --cluster-dns=10.0.0.10 ...").
type kubeletFlags struct {
	ClusterDNS    []string // --cluster-dns, comma-separated; nil if not given
	ClusterDomain string   // --cluster-domain
	Config        string   // --config: the config file kubelet reads
}

// parseKubeletFlags finds kubelet's flags in an environment file: every
// --flag=value or --flag value word on lines that are not comments,
// whatever variable holds them (KUBELET_FLAGS=--a=b --c=d). The last one
// wins, as in kubelet's own flag parsing.
func parseKubeletFlags(data []byte) kubeletFlags {
	var f kubeletFlags
	for line := range strings.Lines(string(data)) {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		// Quotes only group words for the shell; none of the values read
		// here holds a space.
		words := strings.Fields(strings.NewReplacer(`"`, " ", `'`, " ").Replace(line))
		for i, w := range words {
			if _, flag, ok := strings.Cut(w, "=--"); ok && !strings.HasPrefix(w, "-") {
				w = "--" + flag // the first flag, after the variable's name
			}
			if !strings.HasPrefix(w, "-") {
				continue
			}
			name, value, ok := strings.Cut(strings.TrimLeft(w, "-"), "=")
			if !ok {
				if i+1 == len(words) || strings.HasPrefix(words[i+1], "-") {
					continue // a boolean flag
				}
				value = words[i+1]
			}
			switch name {
			case "cluster-dns":
				f.ClusterDNS = splitList(value)
			case "cluster-domain":
				f.ClusterDomain = value
			case "config":
				f.Config = value
			}
		}
	}
	return f
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// kubeletFacts is what was read of kubelet's two files. A file that does
// not exist has its error set to one that is fs.ErrNotExist.
type kubeletFacts struct {
	ConfigPath string
	Config     kubeletConfig
	ConfigErr  error
	FlagsPath  string
	Flags      kubeletFlags
	FlagsErr   error
}

// clusterDomain is the cluster's DNS domain as kubelet has it, or "".
func (k kubeletFacts) clusterDomain() string {
	if k.FlagsErr == nil && k.Flags.ClusterDomain != "" {
		return k.Flags.ClusterDomain
	}
	if k.ConfigErr == nil {
		return k.Config.ClusterDomain
	}
	return ""
}

// clusterDNSResult judges the nameservers kubelet writes into ClusterFirst
// pods' resolv.conf: they must be LocalDNS's pod listener, which dnsstandby
// shares. In a container (w) kubelet's files are the node's, not there.
func clusterDNSResult(k kubeletFacts, listen []netip.AddrPort, w where) Result {
	const name = "cluster-dns"
	configMissing, flagsMissing := errors.Is(k.ConfigErr, fs.ErrNotExist), errors.Is(k.FlagsErr, fs.ErrNotExist)
	if configMissing && flagsMissing && w.Container {
		return Result{Name: name, Status: Skip, Found: w.notCheckable("kubelet's files are the node's"), Fix: onTheNode}
	}
	if configMissing && flagsMissing {
		return Result{Name: name, Status: Warn,
			Found: fmt.Sprintf("neither %s nor %s exists: not a kubelet node, or its files are elsewhere", k.ConfigPath, k.FlagsPath),
			Fix:   "give kubelet's files with --kubelet-config and --kubelet-flags"}
	}
	var unreadable []string
	for _, e := range []struct {
		path string
		err  error
		gone bool
	}{{k.ConfigPath, k.ConfigErr, configMissing}, {k.FlagsPath, k.FlagsErr, flagsMissing}} {
		if e.err != nil && !e.gone {
			unreadable = append(unreadable, fmt.Sprintf("%s unreadable (%v)", e.path, e.err))
		}
	}

	// A flag overrides the config file (kubelet's rule).
	var servers []string
	var from string
	switch {
	case k.FlagsErr == nil && k.Flags.ClusterDNS != nil:
		servers, from = k.Flags.ClusterDNS, k.FlagsPath+" --cluster-dns"
	case k.ConfigErr == nil && len(k.Config.ClusterDNS) > 0:
		servers, from = k.Config.ClusterDNS, k.ConfigPath+" clusterDNS"
	}
	if len(servers) == 0 {
		// Kubelet may get it from elsewhere (a systemd drop-in, kubeadm's
		// flags file): unknown, not wrong.
		return Result{Name: name, Status: Warn,
			Found: joinFound(fmt.Sprintf("no cluster DNS in %s or %s", k.ConfigPath, k.FlagsPath), strings.Join(unreadable, ", ")),
			Fix:   "find kubelet's --cluster-dns (ps -o args -C kubelet) and point --kubelet-config or --kubelet-flags at the file that sets it"}
	}
	found := fmt.Sprintf("%s = %s", from, strings.Join(servers, ","))
	at := -1
	for i, s := range servers {
		a, err := netip.ParseAddr(s)
		if err != nil {
			continue
		}
		if slices.ContainsFunc(listen, func(l netip.AddrPort) bool { return l.Addr().Unmap() == a.Unmap() }) {
			at = i
			break
		}
	}
	listenText := listenAddrs(listen)
	switch {
	case at < 0:
		return Result{Name: name, Status: Fail,
			Found: found + ": pods do not ask LocalDNS (" + listenText + ") at all, so neither it nor dnsstandby is in their path",
			Fix:   "set kubelet's cluster DNS to " + listenText + " (on AKS: enable LocalDNS), or run dnsstandby with --listen on the address pods use"}
	case at > 0:
		// Pods' resolvers ask the first nameserver first: the ones before
		// ours get every query while they answer.
		return Result{Name: name, Status: Warn,
			Found: found + ": " + servers[at] + " is not first, pods ask " + servers[0] + " first",
			Fix:   "put " + servers[at] + " first in kubelet's cluster DNS"}
	}
	var more []finding
	if len(unreadable) > 0 {
		// The file not read may say otherwise (a flag overrides the config).
		more = append(more, finding{Warn, "run dnsstandby check as root, so it can read kubelet's files"})
	}
	return verdict(name, joinFound(found, strings.Join(unreadable, ", ")), more...)
}

// listenAddrs lists the listen addresses without ports, for the report.
func listenAddrs(listen []netip.AddrPort) string {
	var out []string
	for _, l := range listen {
		if s := l.Addr().Unmap().String(); !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return strings.Join(out, ",")
}
