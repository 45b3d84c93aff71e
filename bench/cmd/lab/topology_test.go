package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/dnsstandby/dnsstandby/bench/lab"
)

// TestStandbyOptions: every dnsstandby setup serves both listeners from
// the Corefile LocalDNS runs, with no --upstream (which would replace the
// Corefile's forwards), at its own steering level; and the options fit
// /etc/default/dnsstandby.
func TestStandbyOptions(t *testing.T) {
	tests := []struct {
		setup, steering string
	}{
		{setupStandby, "auto"},
		{setupStandbyShipped, "auto"},
		{setupStandbyOwn, "own"},
		{setupStandbyOff, "off"},
	}
	for _, tc := range tests {
		t.Run(tc.setup, func(t *testing.T) {
			opts := standbyOptions(tc.setup, false)
			var listens []string
			for i, o := range opts {
				if o == "--listen" && i+1 < len(opts) {
					listens = append(listens, opts[i+1])
				}
			}
			if want := []string{nodeDNS + ":53", localDNS + ":53"}; !slices.Equal(listens, want) {
				t.Errorf("listens %v, want %v", listens, want)
			}
			joined := strings.Join(opts, " ")
			for _, want := range []string{"--localdns-corefile " + lab.LocalDNSCorefilePath, "--steering " + tc.steering} {
				if !strings.Contains(joined, want) {
					t.Errorf("options %q lack %q", joined, want)
				}
			}
			if slices.Contains(opts, "--upstream") {
				t.Errorf("options %q give --upstream: it would replace the Corefile's forwards", joined)
			}
			if _, err := lab.DnsstandbyDefaults(opts...); err != nil {
				t.Error(err)
			}
			if slices.Contains(opts, fallbackFlag) {
				t.Errorf("options %q give %s unasked", joined, fallbackFlag)
			}
			// With the fallback: kube-dns's ClusterIP, the rest the same.
			with := standbyOptions(tc.setup, true)
			if want := append(slices.Clone(opts), fallbackFlag, clusterIP+":53"); !slices.Equal(with, want) {
				t.Errorf("with the fallback: %q, want %q", with, want)
			}
			if _, err := lab.DnsstandbyDefaults(with...); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestKnowsFlag: whether a dnsstandby build has an option is read from
// its `run -h`, a flag's whole name (bool flags have no type after it).
func TestKnowsFlag(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "dnsstandby")
	help := "usage: dnsstandby run [flags]\n  -anchor-cleanup\n    \tdelete the anchor link\n  -fallback-upstream-x ADDR:PORT\n  -listen ADDR:PORT\n"
	script := "#!/bin/sh\n[ \"$1 $2\" = \"run -h\" ] || exit 2\nprintf '" + help + "'\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	for flag, want := range map[string]bool{"--listen": true, "--anchor-cleanup": true, "--fallback-upstream": false, "--anchor": false} {
		got, err := knowsFlag(t.Context(), bin, flag)
		if err != nil || got != want {
			t.Errorf("knowsFlag(%s) = %v, %v; want %v", flag, got, err, want)
		}
	}
	if _, err := knowsFlag(t.Context(), filepath.Join(dir, "none"), "--listen"); err == nil {
		t.Error("a missing binary: no error")
	}
	if _, err := useFallback(t.Context(), "sometimes", bin); err == nil {
		t.Error("-standby-fallback sometimes: no error")
	}
	for mode, want := range map[string]bool{"auto": false, "on": true, "off": false} {
		if use, err := useFallback(t.Context(), mode, bin); err != nil || use != want {
			t.Errorf("-standby-fallback %s with a build without %s: %v, %v; want %v", mode, fallbackFlag, use, err, want)
		}
	}
}
