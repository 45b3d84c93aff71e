package anchor

import (
	"context"
	"errors"
	"testing"
)

// TestRemove: Remove deletes a link an anchor made and left, leaves
// someone else's link of that name alone, and reports a missing one.
func TestRemove(t *testing.T) {
	tests := []struct {
		name        string
		prepare     func(t *testing.T, f *fixture)
		wantRemoved bool
		wantErr     error
	}{
		{"left by an anchor", func(t *testing.T, f *fixture) {
			cfg := testConfig(t, addr11)
			cfg.Netns = f.ns.Path()
			a, err := Start(context.Background(), cfg)
			must(t, err)
			must(t, a.Close()) // no Cleanup: the link stays
		}, true, nil},
		{"someone else's", func(t *testing.T, f *fixture) {
			must(t, f.ns.AddLink(DefaultLink, testKind, "169.254.10.11/32"))
		}, false, ErrNotOurs},
		{"none", func(*testing.T, *fixture) {}, false, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, "remove")
			tt.prepare(t, f)
			before, _ := f.state(t, DefaultLink)
			removed, err := Remove(DefaultLink, f.ns.Path())
			if removed != tt.wantRemoved || !errors.Is(err, tt.wantErr) {
				t.Fatalf("Remove = %v, %v; want %v, %v", removed, err, tt.wantRemoved, tt.wantErr)
			}
			after, exists := f.state(t, DefaultLink)
			switch {
			case tt.wantRemoved && exists:
				t.Errorf("the link is still there: %+v", after)
			case tt.wantErr != nil && after.index != before.index:
				t.Errorf("someone else's link was touched: before %+v, after %+v", before, after)
			}
		})
	}
}
