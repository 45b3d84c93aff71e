package dnsperf

import (
	"os"
	"path/filepath"
	"testing"
)

func TestQueryFile(t *testing.T) {
	dir, err := ScratchDir("dnsperf-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path, err := WriteQueryFile(dir, []string{"a.example.", "b.example."})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || string(b) != "a.example. A\nb.example. A\n" || filepath.Dir(path) != dir {
		t.Errorf("%s: %q, %v", path, b, err)
	}
}
