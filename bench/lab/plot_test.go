package lab

import (
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestPlotTimeline(t *testing.T) {
	runs := reportTestRuns()
	runs[1].Timeline.GlibcFail[12] = 1
	runs[2].Timeline.GlibcOK[3] = 1
	path := filepath.Join(t.TempDir(), "out", "timeline-crash-storm.svg")
	if err := PlotTimeline(path, "crash-storm", runs); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Valid XML whose root is an svg element.
	dec := xml.NewDecoder(strings.NewReader(string(b)))
	var root string
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not valid XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && root == "" {
			root = se.Name.Local
		}
	}
	if root != "svg" {
		t.Fatalf("root element %q, want svg", root)
	}
	svg := string(b)
	for _, want := range []string{
		// One panel per run, named by setup and listener.
		"crash-storm — localdns-shipped", "crash-storm — dnsstandby — pod → 169.254.10.11", "crash-storm — dnsstandby — node → 169.254.10.10",
		"seconds since start", "lost (no answer)", "answered first try", "answered after retry",
		"LocalDNS down", "kill ×8", "glibc lookup failed", "glibc lookup ok",
	} {
		if !strings.Contains(svg, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
	if strings.Contains(svg, "healthy") {
		t.Errorf("SVG shows another scenario's run")
	}
	// The lost area is drawn in red.
	if !strings.Contains(svg, "rgb(214,39,40)") && !strings.Contains(strings.ToLower(svg), "#d62728") {
		t.Errorf("no red fill for lost queries")
	}

	if err := PlotTimeline(filepath.Join(t.TempDir(), "x.svg"), "no-such-scenario", runs); err == nil {
		t.Errorf("plotting a scenario without runs: no error")
	}

	dir := t.TempDir()
	paths, err := PlotTimelines(dir, runs)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(dir, "timeline-healthy.svg"), filepath.Join(dir, "timeline-crash-storm.svg")}
	if !reflect.DeepEqual(paths, want) {
		t.Errorf("PlotTimelines wrote %v, want %v", paths, want)
	}
	for _, p := range want {
		if _, err := os.Stat(p); err != nil {
			t.Error(err)
		}
	}
}
