package nstest

import (
	"strings"
	"testing"
)

// TestLookTool: a tool missing from PATH is an error naming its Debian
// package, before anything runs.
func TestLookTool(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	tests := []struct {
		tool, want string
	}{
		{"dig", "dig is not installed: install the Debian package dnsutils"},
		{"kdig", "install the Debian package knot-dnsutils"},
		{"dnsperf", "install the Debian package dnsperf"},
		{"no-such-tool", "no-such-tool is not installed"},
	}
	for _, tt := range tests {
		err := lookTool(tt.tool)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("lookTool(%s) = %v, want an error containing %q", tt.tool, err, tt.want)
		}
	}
	if err := lookTool("/bin/true"); err != nil {
		t.Errorf("a path is not looked up: %v", err)
	}
}
