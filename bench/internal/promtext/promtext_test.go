package promtext

import (
	"strings"
	"testing"
)

const page = `# HELP dnsstandby_mirror_records_total Mirror records.
# TYPE dnsstandby_mirror_records_total counter
dnsstandby_mirror_records_total{source="tap",result="accepted",reason=""} 5000
dnsstandby_mirror_records_total{source="tap",result="rejected",reason="have_fresh"} 4.1e+06
dnsstandby_mirror_records_total{reason="duplicate",result="rejected",source="tap"} 7
dnsstandby_mode{mode="mirror"} 1
dnsstandby_mode{mode="takeover"} 0
odd{a="x\"y\\z,}",b="line\nbreak"} 3 1700000000000
dnsstandby_cache_entries 4999
`

func TestParse(t *testing.T) {
	s, err := Parse(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	if len(s) != 7 {
		t.Fatalf("%d samples, want 7", len(s))
	}
	rec := "dnsstandby_mirror_records_total"
	if got := s.Sum(rec, map[string]string{"result": "accepted"}); got != 5000 {
		t.Errorf("accepted %v", got)
	}
	by := s.By(rec, "reason", map[string]string{"result": "rejected"})
	if by["have_fresh"] != 4.1e6 || by["duplicate"] != 7 || len(by) != 2 {
		t.Errorf("rejected by reason %v", by)
	}
	if s.Sum("dnsstandby_mode", map[string]string{"mode": "mirror"}) != 1 || s.Sum("dnsstandby_cache_entries", nil) != 4999 {
		t.Error("gauges")
	}
	if s[5].Labels["a"] != `x"y\z,}` || s[5].Labels["b"] != "line\nbreak" || s[5].Value != 3 {
		t.Errorf("escapes: %+v", s[5])
	}
	if !s.Has("odd") || s.Has("nope") {
		t.Error("Has")
	}
}

func TestParseErrors(t *testing.T) {
	for _, bad := range []string{"x", `x{a="b} 1`, `x{a=b} 1`, "x 1 2 3", "x one"} {
		if _, err := Parse(strings.NewReader(bad + "\n")); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
