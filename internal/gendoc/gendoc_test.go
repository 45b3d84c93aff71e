package gendoc

import (
	"strings"
	"testing"
)

func TestReplace(t *testing.T) {
	doc := "# T\n" + begin("x") + "old\n" + end("x") + "tail\n"
	tests := []struct {
		name, doc, part, body, want, old, err string
	}{
		{"replaced", doc, "x", "new", "# T\n" + begin("x") + "new\n" + end("x") + "tail\n", "old\n", ""},
		{"emptied", doc, "x", "", "# T\n" + begin("x") + end("x") + "tail\n", "old\n", ""},
		{"no start", doc, "y", "new", "", "", `generated part "y": no line`},
		{"no end", "# T\n" + begin("x") + "old\n", "x", "new", "", "", `generated part "x": no line "<!-- end generated x -->" after its start`},
		{"twice", doc + doc, "x", "new", "", "", `generated part "x": marked twice`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, old, err := Replace([]byte(tc.doc), tc.part, tc.body)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(out) != tc.want || old != tc.old {
				t.Errorf("got %q (old %q), want %q (old %q)", out, old, tc.want, tc.old)
			}
		})
	}
}
