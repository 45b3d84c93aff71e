package main

import (
	"strings"
	"testing"

	"github.com/dnsstandby/dnsstandby/bench/lab"
)

// TestFallbackChecks: beside AKS's fallback, the crash storm must not start
// it, and in aks-fallback-* dnsstandby must have logged it seen and gone
// once per start; a node without the fallback gets no such check, one
// whose journal was not read fails it.
func TestFallbackChecks(t *testing.T) {
	clean := &lab.AfterFault{AtMs: 10000, Sent: 1000, GlibcOK: 10}
	run := func(scenario string, f *lab.FallbackCounts) lab.LabRun {
		return lab.LabRun{Scenario: scenario, Setup: setupStandby, Client: clientPod, Listener: localDNS, AfterFault: clean, Fallback: f}
	}
	for _, tc := range []struct {
		name     string
		scenario string
		f        *lab.FallbackCounts
		want     string // "" for no fallback check
		pass     bool
	}{
		{"storm, none started", "crash-storm", &lab.FallbackCounts{Design: "coredns", Declines: 2}, "0 starts (2 declined", true},
		{"storm, one started", "crash-storm", &lab.FallbackCounts{Design: "coredns", Starts: 1}, "1 starts", false},
		{"storm, journal not read", "crash-storm", &lab.FallbackCounts{Design: "coredns", Starts: -1}, "could not be read", false},
		{"storm, no fallback on the node", "crash-storm", nil, "", false},
		{"reported", "aks-fallback-nat", &lab.FallbackCounts{Design: "nat", Starts: 1, Seen: 1, Gone: 1}, "seen 1, gone 1", true},
		{"not reported (a daemon without it)", "aks-fallback-coredns", &lab.FallbackCounts{Design: "coredns", Starts: 1}, "seen 0, gone 0", false},
		{"never gone", "aks-fallback-kubelet", &lab.FallbackCounts{Design: "kubelet", Starts: 1, Seen: 1}, "gone 0", false},
		{"never started", "aks-fallback-nat", &lab.FallbackCounts{Design: "nat"}, "started 0 times", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checks := checkRuns(tc.scenario, []string{setupStandby}, []string{clientPod}, []lab.LabRun{run(tc.scenario, tc.f)}, false)
			var found []lab.Check
			for _, c := range checks {
				if strings.Contains(c.Require, "fallback") {
					found = append(found, c)
				}
			}
			if tc.want == "" {
				if len(found) != 0 {
					t.Fatalf("fallback checks %v, want none", found)
				}
				return
			}
			if len(found) != 1 || found[0].Pass != tc.pass || !strings.Contains(found[0].Found, tc.want) {
				t.Fatalf("fallback checks %v, want one, pass %v, found containing %q", found, tc.pass, tc.want)
			}
		})
	}
}

// TestAKSFallbackScenarios: one per design, on the two setups with PR
// 9439's unit, each node with the design; crash-storm gives only the
// dnsstandby node the fallback.
func TestAKSFallbackScenarios(t *testing.T) {
	for _, d := range lab.FallbackDesigns {
		sc, ok := findScenario("aks-fallback-" + d)
		if !ok {
			t.Fatalf("no aks-fallback-%s", d)
		}
		for _, s := range []string{setupPR9439, setupStandby} {
			if got := sc.spec(s).fallback; got != d {
				t.Errorf("%s on %s: fallback %q, want %q", sc.name, s, got, d)
			}
		}
		if len(sc.setups) != 2 {
			t.Errorf("%s: setups %v", sc.name, sc.setups)
		}
	}
	storm, _ := findScenario("crash-storm")
	if storm.spec(setupStandby).fallback == "" || storm.spec(setupPR9439).fallback != "" || storm.spec(setupShipped).fallback != "" {
		t.Errorf("crash-storm: the fallback on %q/%q/%q, want on dnsstandby only",
			storm.spec(setupStandby).fallback, storm.spec(setupPR9439).fallback, storm.spec(setupShipped).fallback)
	}
}

func TestChainPackets(t *testing.T) {
	listing := `Chain LOCALDNS-FALLBACK (2 references)
    pkts      bytes target     prot opt in     out     source               destination
     120     9000 KUBE-SVC-TCOU7JCQXEZGVUNU  17   --  *      *       0.0.0.0/0            169.254.10.11        udp dpt:53
       3      180 DNAT       6    --  *      *       0.0.0.0/0            169.254.10.10        tcp dpt:53 to:10.224.0.4:53
`
	if got := chainPackets(listing); got != 123 {
		t.Errorf("chainPackets = %d, want 123", got)
	}
}

func TestNatEvidenceParsers(t *testing.T) {
	table := `ipv4     2 udp      17 29 src=10.244.0.7 dst=169.254.10.11 sport=40000 dport=53 src=10.0.0.10 dst=10.244.0.7 sport=53 dport=40000 mark=0 zone=0 use=2
ipv4     2 udp      17 25 src=169.254.10.11 dst=10.244.0.7 sport=53 dport=40001 src=10.244.0.7 dst=169.254.10.11 sport=40001 dport=53 mark=0 zone=0 use=2
ipv4     2 udp      17 25 src=169.254.10.10 dst=10.224.0.4 sport=53 dport=40002 src=10.224.0.4 dst=169.254.10.10 sport=40002 dport=1031 mark=0 zone=0 use=2
ipv4     2 tcp      6 431999 ESTABLISHED src=10.224.0.4 dst=10.224.0.5 sport=5000 dport=443 src=10.224.0.5 dst=10.224.0.4 sport=443 dport=5000 [ASSURED] mark=0 zone=0 use=2
ipv4     2 udp      17 3 src=10.224.0.4 dst=168.63.129.16 sport=5353 dport=53 src=168.63.129.16 dst=10.224.0.4 sport=53 dport=5353 mark=0 zone=0 use=2
`
	if entries, rewritten := conntrackDNS(table); entries != 3 || rewritten != 1 {
		t.Errorf("conntrackDNS = %d entries, %d rewritten; want 3 (a query DNATed, two replies), 1 (the reply expecting port 1031)", entries, rewritten)
	}
	snmp := "Ip: Forwarding DefaultTTL\nIp: 1 64\nUdp: InDatagrams NoPorts InErrors OutDatagrams\nUdp: 100 7 2 99\nUdpLite: InDatagrams NoPorts\nUdpLite: 0 0\n"
	if got, want := udpCounters(snmp, "NoPorts", "InErrors"), "NoPorts 7, InErrors 2"; got != want {
		t.Errorf("udpCounters = %q, want %q", got, want)
	}
}
