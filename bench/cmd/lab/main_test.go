package main

import (
	"context"
	"testing"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

// TestLabSmoke runs the healthy scenario for a few seconds, so that every
// `make test` drives the lab's real parts: systemd guests running LocalDNS
// (CoreDNS 1.13.1), kube-dns, pods, the load and the glibc probe.
func TestLabSmoke(t *testing.T) {
	bins := testBinaries(t)
	sc, _ := findScenario("healthy")
	o := &options{qps: 500, scale: 0.1, bins: bins}
	zones := nstest.KubeDNSZones(nstest.ZoneOptions{Services: 20})
	runs, err := runScenario(context.Background(), sc, defaultSetups, o, zones, nameMix(zones))
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != len(defaultSetups) {
		t.Fatalf("%d runs, want %d", len(runs), len(defaultSetups))
	}
	for _, r := range runs {
		s := r.Summary
		if s.Sent < 1000 || s.AnsweredFirstTry != s.Sent || s.GlibcOK == 0 || s.GlibcFail != 0 {
			t.Errorf("%s: sent %d, first try %d, glibc ok %d fail %d: a healthy node answers everything at once",
				r.Setup, s.Sent, s.AnsweredFirstTry, s.GlibcOK, s.GlibcFail)
		}
		// With full steering a healthy LocalDNS answers everything, also
		// beside dnsstandby (the takeover issue asks for at most 0.1% from
		// dnsstandby).
		if s.AnsweredBy.Standby*1000 > s.Sent || s.AnsweredBy.LocalDNS+s.AnsweredBy.Standby != s.Sent {
			t.Errorf("%s: answered by localdns-pod %d, dnsstandby %d of %d", r.Setup, s.AnsweredBy.LocalDNS, s.AnsweredBy.Standby, s.Sent)
		}
	}
}
