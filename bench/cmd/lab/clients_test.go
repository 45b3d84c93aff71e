package main

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/bench/lab"
	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

// TestNodeNameMix: every name the node asks expects the rcode LocalDNS
// gives it through the block that serves it on 169.254.10.10, and every
// kind of name is there.
func TestNodeNameMix(t *testing.T) {
	zones := nstest.KubeDNSZones(nstest.ZoneOptions{Services: 200, Namespaces: []string{"default", "shop"}})
	hosts := lab.LocalDNSHostNames()
	kinds := map[string]int{}
	for _, n := range nodeNameMix(zones) {
		kind := ""
		switch {
		case slices.Contains(hosts, n.FQDN):
			kind = "hosts"
			if n.Rcode != dns.RcodeSuccess || (n.Type != dns.TypeA && n.Type != dns.TypeAAAA) {
				t.Errorf("hosts name %v: want A or AAAA, NOERROR", n)
			}
		case strings.HasSuffix(n.FQDN, "."+vnetSearch+".") || strings.HasSuffix(n.FQDN, ".reddog.microsoft.com."):
			kind = "template"
			if n.Rcode != dns.RcodeNameError {
				t.Errorf("template name %v: want NXDOMAIN", n)
			}
			// The internal.cloudapp.net template answers only names of at
			// least four labels before its zone; the others go upstream.
			if before, ok := strings.CutSuffix(n.FQDN, ".internal.cloudapp.net."); ok && strings.Count(before, ".") < 3 {
				t.Errorf("template name %v: fewer than four labels before internal.cloudapp.net", n)
			}
		default:
			c, ok := zones.Case(n.FQDN, n.Type)
			if !ok {
				t.Errorf("%v: no case in the zones", n)
				continue
			}
			kind = "external"
			if inCluster(n.FQDN) {
				kind = "cluster"
			}
			if c.Rcode != n.Rcode || c.Large || c.Rcode == dns.RcodeRefused {
				t.Errorf("%v: the zones answer %s (large %v)", n, dns.RcodeToString[c.Rcode], c.Large)
			}
		}
		kinds[kind]++
	}
	for _, kind := range []string{"hosts", "template", "external", "cluster"} {
		if kinds[kind] == 0 {
			t.Errorf("no %s names in the node's mix: %v", kind, kinds)
		}
	}
	if !slices.Contains(hosts, kubeletProbeName) {
		t.Errorf("the node's glibc probe asks %s, which is not in the hosts file %v", kubeletProbeName, hosts)
	}
}

func TestClients(t *testing.T) {
	top := &topology{zones: nstest.KubeDNSZones(nstest.ZoneOptions{Services: 3})}
	mixes := nameMixes{pod: []lab.LoadName{{FQDN: "a."}}, node: []lab.LoadName{{FQDN: "b."}}}
	tests := []struct {
		nodeQPS int
		want    []string // name@listener/qps
	}{
		{1000, []string{"pod@169.254.10.11/2000", "node@169.254.10.10/1000"}},
		{0, []string{"pod@169.254.10.11/2000"}},
	}
	for _, tc := range tests {
		o := &options{qps: 2000, nodeQPS: tc.nodeQPS}
		var got []string
		for _, c := range top.clients(o, mixes) {
			got = append(got, c.name+"@"+c.listener+"/"+strconv.Itoa(c.qps))
			want := mixes.pod
			if c.name == clientNode {
				want = mixes.node
			}
			if !slices.Equal(c.names, want) || c.probeName == "" {
				t.Errorf("%s: names %v, probe %q", c.name, c.names, c.probeName)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("node-qps %d: clients %v, want %v", tc.nodeQPS, got, tc.want)
		}
		if names := clientNames(o); len(names) != len(tc.want) {
			t.Errorf("node-qps %d: clientNames %v", tc.nodeQPS, names)
		}
	}
}

// TestWithFresh: the fresh names are added to a mix, evenly spaced, and
// nothing of the mix is lost or reordered; the mixes without them (every
// other scenario's) stay as they were.
func TestWithFresh(t *testing.T) {
	zones := nstest.KubeDNSZones(nstest.ZoneOptions{Services: 300, Namespaces: []string{"default", "shop"}})
	plain := nameMixes{pod: nameMix(zones), node: nodeNameMix(zones)}
	podBefore, nodeBefore := slices.Clone(plain.pod), slices.Clone(plain.node)
	fresh := plain.withFresh()
	for _, tc := range []struct {
		client      string
		plain, with []lab.LoadName
		every       int
	}{
		{clientPod, plain.pod, fresh.pod, freshEveryPod},
		{clientNode, plain.node, fresh.node, freshEveryNode},
	} {
		var rest []lab.LoadName
		last := -1
		for i, n := range tc.with {
			if !n.Fresh {
				rest = append(rest, n)
				continue
			}
			if n.FQDN != lab.FreshZone || n.Type != dns.TypeA || n.Rcode != dns.RcodeSuccess {
				t.Errorf("%s: fresh entry %+v, want A under %s, NOERROR", tc.client, n, lab.FreshZone)
			}
			if i-last != tc.every+1 {
				t.Errorf("%s: fresh entry at %d, the previous at %d: want one after every %d", tc.client, i, last, tc.every)
			}
			last = i
		}
		if !slices.Equal(rest, tc.plain) {
			t.Errorf("%s: the mix without its fresh entries is not the plain mix", tc.client)
		}
		if got, want := len(tc.with)-len(tc.plain), len(tc.plain)/tc.every; got != want || got == 0 {
			t.Errorf("%s: %d fresh entries in a mix of %d, want %d", tc.client, got, len(tc.plain), want)
		}
	}
	if !slices.Equal(plain.pod, podBefore) || !slices.Equal(plain.node, nodeBefore) ||
		slices.ContainsFunc(plain.pod, func(n lab.LoadName) bool { return n.Fresh }) {
		t.Error("withFresh changed the plain mixes")
	}
}
