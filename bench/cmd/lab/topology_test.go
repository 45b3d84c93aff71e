package main

import (
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
			opts := standbyOptions(tc.setup)
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
		})
	}
}
