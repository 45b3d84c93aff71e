package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"text/tabwriter"

	"github.com/dnsstandby/dnsstandby/check"
	"github.com/dnsstandby/dnsstandby/status"
)

// checkCommand runs `dnsstandby check`: the read-only node audit. Its exit
// code is the report's: 0 none warned or failed (rows skipped or with
// advice included), 1 some warned, 2 any failed: dnsstandby cannot do its
// job (also 2 for a usage error, as for every command).
func checkCommand(args []string, stdout, stderr io.Writer) int {
	cfg := check.DefaultConfig()
	var listen, upstreams []netip.AddrPort
	fs, asJSON := checkFlags(&cfg, &listen, &upstreams)
	if err := parseWithEnv(fs, args, os.LookupEnv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stdout)
			fmt.Fprintln(stdout, checkUsage)
			fs.PrintDefaults()
			return exitOK
		}
		fmt.Fprintf(stderr, "dnsstandby check: %v\n", err)
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "dnsstandby check: unexpected arguments %q\n", fs.Args())
		return exitUsage
	}
	if cfg.LocalDNSCorefile == "" {
		fmt.Fprintln(stderr, "dnsstandby check: --localdns-corefile must name a file")
		return exitUsage
	}
	if cfg.Timeout <= 0 || cfg.MirrorWindow < 0 {
		fmt.Fprintln(stderr, "dnsstandby check: --timeout must be positive and --mirror-window not negative")
		return exitUsage
	}
	cfg.Listen, cfg.Upstreams = listen, upstreams

	rep, err := check.Run(context.Background(), cfg)
	if err != nil {
		fmt.Fprintf(stderr, "dnsstandby check: %v\n", err)
		return int(check.Fail)
	}
	if *asJSON {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			fmt.Fprintf(stderr, "dnsstandby check: %v\n", err)
			return int(check.Fail)
		}
		fmt.Fprintf(stdout, "%s\n", b)
	} else {
		printReport(stdout, rep)
	}
	return rep.ExitCode()
}

const checkUsage = `usage: dnsstandby check [flags]

A read-only audit of this node for dnsstandby, one row per check:
  PASS  as it should be
  SKIP  not checkable from here (a container): run on the node
  INFO  advice about LocalDNS's own setup, which dnsstandby covers for
  WARN  dnsstandby works, with a risk (or the audit cannot tell)
  FAIL  dnsstandby cannot do its job: pods' DNS is, or can become, unanswered
Exit code: 0 no WARN or FAIL, 1 some WARN, 2 any FAIL.`

// checkFlags binds the flags of `dnsstandby check` to cfg and the lists.
func checkFlags(cfg *check.Config, listen, upstreams *[]netip.AddrPort) (*flag.FlagSet, *bool) {
	fs := flag.NewFlagSet("dnsstandby check", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&cfg.LocalDNSUnit, "localdns-unit", cfg.LocalDNSUnit, "LocalDNS's systemd `UNIT`")
	fs.StringVar(&cfg.FallbackUnit, "localdns-fallback-unit", cfg.FallbackUnit, "AKS's LocalDNS fallback's systemd `UNIT`, reported (INFO) when installed or running")
	fs.StringVar(&cfg.LocalDNSCorefile, "localdns-corefile", cfg.LocalDNSCorefile, "LocalDNS's Corefile `PATH`, or several separated by commas of which the first that exists is read: the listeners LocalDNS serves, each of which dnsstandby should listen on too")
	fs.StringVar(&cfg.KubeletConfig, "kubelet-config", "", "kubelet's config `FILE` (YAML or JSON) (default: the --config the kubelet flags name, else "+check.DefaultKubeletConfig+")")
	fs.StringVar(&cfg.KubeletFlags, "kubelet-flags", cfg.KubeletFlags, "the environment `FILE` holding kubelet's flags")
	fs.Var(&addrList{p: listen}, "listen", "`ADDR:PORT` pods ask, repeatable (default: the daemon's --listen, else "+status.DefaultListen.String()+")")
	fs.Var(&addrList{p: upstreams}, "upstream", "`ADDR:PORT` to test besides the daemon's upstreams, repeatable")
	fs.StringVar(&cfg.AdminSocket, "admin-socket", cfg.AdminSocket, "the daemon's control socket")
	fs.StringVar(&cfg.ClusterDomain, "cluster-domain", "", "domain whose SOA the upstreams are asked for (default: kubelet's, else "+check.DefaultClusterDomain+")")
	fs.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "bound on each DNS query and admin request")
	fs.DurationVar(&cfg.MirrorWindow, "mirror-window", cfg.MirrorWindow, "how long to watch the mirror feed's counters (0: read once)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	return fs, asJSON
}

// printReport writes the report as a table: status, check, what was
// found, and under a row that did not pass, its fix (or, for SKIP and
// INFO, its advice).
func printReport(w io.Writer, rep check.Report) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STATUS\tCHECK\tFOUND")
	count := map[check.Status]int{}
	for _, r := range rep.Results {
		count[r.Status]++
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r.Status, r.Name, r.Found)
		if r.Fix == "" {
			continue
		}
		label := "fix"
		if r.Status < check.Warn {
			label = "advice"
		}
		fmt.Fprintf(tw, "\t\t%s: %s\n", label, r.Fix)
	}
	tw.Flush()
	fmt.Fprintf(w, "\n%s: %d PASS, %d SKIP, %d INFO, %d WARN, %d FAIL\n", rep.Overall(),
		count[check.Pass], count[check.Skip], count[check.Info], count[check.Warn], count[check.Fail])
}
