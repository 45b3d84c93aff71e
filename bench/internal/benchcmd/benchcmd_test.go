package benchcmd

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestCheckSplit(t *testing.T) {
	tests := []struct {
		name           string
		duration       time.Duration
		server, client int
		wantErr        bool
	}{
		{"ok", 10 * time.Second, 0, 1, false},
		{"fraction of a second", 1500 * time.Millisecond, 0, 1, true},
		{"under a second", 0, 0, 1, true},
		{"same CPU", time.Second, 1, 1, true},
	}
	for _, tt := range tests {
		if err := CheckSplit(tt.duration, tt.server, tt.client); (err != nil) != tt.wantErr {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
}

func TestWriteJSON(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out", "x.json")
	if err := WriteJSON(path, []map[string]int{{"a": 1}}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got []map[string]int
	if err := json.Unmarshal(b, &got); err != nil || len(got) != 1 || got[0]["a"] != 1 || b[len(b)-1] != '\n' {
		t.Errorf("wrote %q (%v)", b, err)
	}
}
