package lastgood

import (
	"bytes"
	"errors"
	"net/netip"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/dnsstandby/dnsstandby/corefile"
)

func read(t *testing.T) *corefile.Source {
	t.Helper()
	src, err := corefile.Read("../corefile/testdata/agentbaker.corefile")
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// TestSaveLoad checks that a saved record loads as it was and gives the
// same Settings as the Corefile it was read from.
func TestSaveLoad(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(dir, corefile.Build{}); !errors.Is(err, ErrNone) || !errors.Is(err, ErrNone) {
		t.Fatalf("Load of an empty directory: %v, want ErrNone", err)
	}
	src := read(t)
	at := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	if err := Save(dir, New(src, at)); err != nil {
		t.Fatal(err)
	}
	r, err := Load(dir, corefile.Build{})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Applied.Equal(at) || r.Source.File != src.File || r.Source.SHA256 != src.SHA256 {
		t.Errorf("loaded %v %s %s, saved %v %s %s", r.Applied, r.Source.File, r.Source.SHA256, at, src.File, src.SHA256)
	}
	listen := []netip.AddrPort{netip.MustParseAddrPort("169.254.10.10:53"), netip.MustParseAddrPort("169.254.10.11:53")}
	want, _ := src.Settings(listen)
	got, err := r.Source.Settings(listen)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("Settings of the loaded record differ: %v", err)
	}
	if fi, err := os.Stat(Path(dir)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("record file: %v %v", fi, err)
	}
}

// TestDecodeRefuses checks that a record that is damaged, of another
// format or holds a Corefile CoreDNS would refuse is never used.
func TestDecodeRefuses(t *testing.T) {
	var good bytes.Buffer
	if err := Encode(&good, New(read(t), time.Now())); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		edit func(string) string
		want string
	}{
		{"truncated", func(s string) string { return s[:len(s)/2] }, "decode"},
		{"other format", func(s string) string { return strings.Replace(s, `"format": 1`, `"format": 2`, 1) }, "format 2"},
		{"no source", func(s string) string { return `{"format": 1, "applied": "2026-12-03T10:00:00Z"}` }, "no Corefile"},
		{"no time", func(s string) string { return strings.Replace(s, `"applied"`, `"appliedx"`, 1) }, "unknown field"},
		{"refused Corefile", func(s string) string { return strings.Replace(s, `"forward": [`, `"froward": [`, 1) }, "unknown directive"},
		{"tokens not of their directive", func(s string) string { return strings.Replace(s, `"text": "forward"`, `"text": "froward"`, 1) }, "do not start with it"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decode(strings.NewReader(tt.edit(good.String())), corefile.Build{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Decode: %v, want an error with %q", err, tt.want)
			}
		})
	}
	if _, err := Decode(&good, corefile.Build{}); err != nil {
		t.Errorf("Decode of the record as written: %v", err)
	}
}
