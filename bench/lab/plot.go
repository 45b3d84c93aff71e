package lab

import (
	"bytes"
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"strconv"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

const (
	plotPanelWidth  = 11 * vg.Inch
	plotPanelHeight = 2.8 * vg.Inch
	plotLegendWidth = 2.6 * vg.Inch
	// plotEventGroup merges a burst of same-label events (the crash
	// storm's 8 kills 300 ms apart) into one label, "kill ×8".
	plotEventGroup = 2 * time.Second
)

var (
	plotColorFirstTry   = color.RGBA{R: 0x4c, G: 0xa8, B: 0x5a, A: 0xff}  // green
	plotColorAfterRetry = color.RGBA{R: 0xf2, G: 0xa1, B: 0x2c, A: 0xff}  // orange
	plotColorLost       = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}  // red
	plotColorDown       = color.NRGBA{R: 0x20, G: 0x20, B: 0x20, A: 0x40} // translucent dark grey, over the data
	plotColorEvent      = color.RGBA{R: 0x3b, G: 0x3b, B: 0xb0, A: 0xff}  // blue
	plotColorGlibcOK    = color.RGBA{R: 0x2b, G: 0x6e, B: 0x35, A: 0xff}
	plotColorGlibcFail  = color.RGBA{R: 0x9b, G: 0x00, B: 0x00, A: 0xff}
)

// PlotTimeline draws the runs of one scenario as an SVG, one panel per
// run (setup and listener) in the order the runs come: queries per bin by send time, stacked
// (answered on the first try, answered after the retry, lost in red on
// top), LocalDNS's down intervals shaded, events as vertical lines, and the
// glibc lookups as marks along the top. Every panel has the same axes, so
// setups compare at a glance. The lab writes bench/out/timeline-SCENARIO.svg.
func PlotTimeline(path, scenario string, runs []LabRun) error {
	var sel []LabRun
	for _, r := range runs {
		if r.Scenario == scenario {
			sel = append(sel, r)
		}
	}
	if len(sel) == 0 {
		return fmt.Errorf("plot %s: no runs of scenario %q", path, scenario)
	}
	c := vgsvg.New(plotPanelWidth, plotPanelHeight*vg.Length(len(sel)))
	if err := plotDraw(draw.New(c), sel); err != nil {
		return fmt.Errorf("plot %s: %w", path, err)
	}
	var buf bytes.Buffer
	if _, err := c.WriteTo(&buf); err != nil {
		return fmt.Errorf("plot %s: %w", path, err)
	}
	return reportWriteFile(path, buf.Bytes())
}

// PlotTimelines draws every scenario of the runs with PlotTimeline into
// dir/timeline-SCENARIO.svg and returns the paths written.
func PlotTimelines(dir string, runs []LabRun) ([]string, error) {
	var paths []string
	for _, scenario := range reportScenarios(runs) {
		path := filepath.Join(dir, "timeline-"+scenario+".svg")
		if err := PlotTimeline(path, scenario, runs); err != nil {
			return paths, err
		}
		paths = append(paths, path)
	}
	return paths, nil
}

// plotDraw draws the runs on dc, one panel each, stacked.
func plotDraw(dc draw.Canvas, sel []LabRun) error {
	// Shared axes: the longest run, the busiest bin.
	var xmax, ymax float64
	for _, r := range sel {
		xmax = max(xmax, plotSeconds(time.Duration(len(r.Timeline.Sent))*r.Timeline.Step))
		for _, iv := range r.Down {
			xmax = max(xmax, plotSeconds(iv.To))
		}
		for _, e := range r.Events {
			xmax = max(xmax, plotSeconds(e.At))
		}
		for _, n := range r.Timeline.Sent {
			ymax = max(ymax, float64(n))
		}
	}
	xmax = max(xmax, 1)
	ymax = max(ymax, 1) * 1.15 // headroom for the glibc marks and event labels

	plots := make([][]*plot.Plot, len(sel))
	legends := make([]plot.Legend, len(sel))
	for i, r := range sel {
		p, legend, err := plotPanel(r, xmax, ymax)
		if err != nil {
			return fmt.Errorf("%s: %w", r.Setup, err)
		}
		plots[i] = []*plot.Plot{p}
		legends[i] = legend
	}

	area := draw.Crop(dc, 0, -plotLegendWidth, 0, 0)
	tiles := draw.Tiles{
		Rows: len(sel), Cols: 1,
		PadX: vg.Millimeter, PadY: 4 * vg.Millimeter,
		PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter,
		PadLeft: 2 * vg.Millimeter, PadRight: 2 * vg.Millimeter,
	}
	canvases := plot.Align(plots, tiles, area)
	for i := range sel {
		plots[i][0].Draw(canvases[i][0])
		lc := draw.Canvas{Canvas: dc, Rectangle: vg.Rectangle{
			Min: vg.Point{X: area.Max.X + 2*vg.Millimeter, Y: canvases[i][0].Min.Y},
			Max: vg.Point{X: dc.Max.X, Y: canvases[i][0].Max.Y - 8*vg.Millimeter},
		}}
		legends[i].Draw(lc)
	}
	return nil
}

// plotPanel draws one run; its legend is returned apart, to be drawn beside
// the panel rather than over the data.
func plotPanel(r LabRun, xmax, ymax float64) (*plot.Plot, plot.Legend, error) {
	p := plot.New()
	p.Title.Text = r.Scenario + " — " + r.Setup
	if l := r.ListenerName(); l != "" {
		p.Title.Text += " — " + l
	}
	p.X.Label.Text = "seconds since start"
	p.Y.Label.Text = fmt.Sprintf("queries per %v", r.Timeline.Step)
	p.X.Min, p.X.Max = 0, xmax
	p.X.Tick.Marker = plotSecondTicks{}
	p.Y.Min, p.Y.Max = 0, ymax
	p.Add(plotter.NewGrid())
	legend := plot.NewLegend()
	legend.Top, legend.Left = true, true

	// Stacked areas, the highest first so the lower ones paint over it.
	tl := r.Timeline
	stack := []struct {
		name  string
		color color.Color
		parts [][]int
	}{
		{"lost (no answer)", plotColorLost, [][]int{tl.FirstTry, tl.AfterRetry, tl.Lost}},
		{"answered after retry", plotColorAfterRetry, [][]int{tl.FirstTry, tl.AfterRetry}},
		{"answered first try", plotColorFirstTry, [][]int{tl.FirstTry}},
	}
	var entries []plot.Thumbnailer
	for _, s := range stack {
		line, err := plotter.NewLine(plotSteps(tl.Step, s.parts...))
		if err != nil {
			return nil, legend, err
		}
		line.StepStyle = plotter.PostStep
		line.FillColor = s.color
		line.LineStyle.Width = 0
		p.Add(line)
		entries = append(entries, line)
	}
	for i := len(stack) - 1; i >= 0; i-- {
		legend.Add(stack[i].name, entries[i])
	}

	// Down intervals, shaded over the areas so both stay visible.
	var downShown bool
	for _, iv := range r.Down {
		x0, x1 := plotSeconds(iv.From), plotSeconds(iv.To)
		poly, err := plotter.NewPolygon(plotter.XYs{{X: x0, Y: 0}, {X: x1, Y: 0}, {X: x1, Y: ymax}, {X: x0, Y: ymax}})
		if err != nil {
			return nil, legend, err
		}
		poly.Color = plotColorDown
		poly.LineStyle.Width = 0
		p.Add(poly)
		if !downShown {
			name := "LocalDNS down"
			if iv.Label != "" {
				name = iv.Label
			}
			legend.Add(name, poly)
			downShown = true
		}
	}

	// Events: a vertical line each, one label per burst.
	var eventShown bool
	for _, e := range r.Events {
		x := plotSeconds(e.At)
		line, err := plotter.NewLine(plotter.XYs{{X: x, Y: 0}, {X: x, Y: ymax}})
		if err != nil {
			return nil, legend, err
		}
		line.LineStyle = draw.LineStyle{Color: plotColorEvent, Width: vg.Points(0.8), Dashes: []vg.Length{vg.Points(3), vg.Points(2)}}
		p.Add(line)
		if !eventShown {
			legend.Add("event", line)
			eventShown = true
		}
	}
	if labels := plotEventLabels(r.Events, ymax); len(labels.XYs) > 0 {
		l, err := plotter.NewLabels(labels)
		if err != nil {
			return nil, legend, err
		}
		for i := range l.TextStyle {
			l.TextStyle[i].Color = plotColorEvent
			l.TextStyle[i].Font.Size = vg.Points(9)
			l.TextStyle[i].YAlign = draw.YTop
			l.TextStyle[i].XAlign = draw.XLeft
		}
		l.Offset = vg.Point{X: vg.Points(2)}
		p.Add(l)
	}

	// glibc lookups, by start bin, in a row along the top.
	if tl.Step > 0 {
		y := ymax * 0.93
		var ok, fail plotter.XYs
		for b := range tl.GlibcOK {
			x := plotSeconds(time.Duration(b)*tl.Step + tl.Step/2)
			if tl.GlibcOK[b] > 0 {
				ok = append(ok, plotter.XY{X: x, Y: y})
			}
			if b < len(tl.GlibcFail) && tl.GlibcFail[b] > 0 {
				fail = append(fail, plotter.XY{X: x, Y: y})
			}
		}
		for _, m := range []struct {
			name  string
			pts   plotter.XYs
			color color.Color
			shape draw.GlyphDrawer
		}{
			{"glibc lookup ok", ok, plotColorGlibcOK, draw.CircleGlyph{}},
			{"glibc lookup failed", fail, plotColorGlibcFail, draw.CrossGlyph{}},
		} {
			if len(m.pts) == 0 {
				continue
			}
			sc, err := plotter.NewScatter(m.pts)
			if err != nil {
				return nil, legend, err
			}
			sc.GlyphStyle = draw.GlyphStyle{Color: m.color, Radius: vg.Points(2.2), Shape: m.shape}
			p.Add(sc)
			legend.Add(m.name, sc)
		}
	}
	return p, legend, nil
}

// plotSteps is the sum of parts per bin as step-plot points at each bin's
// start, with one more point closing the last bin.
func plotSteps(step time.Duration, parts ...[]int) plotter.XYs {
	n := 0
	for _, p := range parts {
		n = max(n, len(p))
	}
	pts := make(plotter.XYs, n+1)
	for b := range n {
		var y int
		for _, p := range parts {
			if b < len(p) {
				y += p[b]
			}
		}
		pts[b] = plotter.XY{X: plotSeconds(time.Duration(b) * step), Y: float64(y)}
	}
	pts[n] = plotter.XY{X: plotSeconds(time.Duration(n) * step)}
	if n > 0 {
		pts[n].Y = pts[n-1].Y
	}
	return pts
}

// plotEventLabels puts one label at the first event of each burst of
// same-label events, "kill ×8" for a burst of eight.
func plotEventLabels(events []Event, ymax float64) plotter.XYLabels {
	var out plotter.XYLabels
	for i := 0; i < len(events); {
		j := i + 1
		for j < len(events) && events[j].Label == events[i].Label && events[j].At-events[j-1].At <= plotEventGroup {
			j++
		}
		label := events[i].Label
		if j-i > 1 {
			label = fmt.Sprintf("%s ×%d", label, j-i)
		}
		out.XYs = append(out.XYs, plotter.XY{X: plotSeconds(events[i].At), Y: ymax * 0.99})
		out.Labels = append(out.Labels, label)
		i = j
	}
	return out
}

func plotSeconds(d time.Duration) float64 { return d.Seconds() }

// plotSecondTicks labels the time axis in whole seconds, about ten labels
// whatever the run's length (gonum's default gives two or three).
type plotSecondTicks struct{}

func (plotSecondTicks) Ticks(min, max float64) []plot.Tick {
	span := max - min
	major := 1.0
	for _, s := range []float64{1, 2, 5, 10, 15, 30, 60, 120, 300} {
		major = s
		if span/s <= 12 {
			break
		}
	}
	minor := major / 5
	if major == 15 {
		minor = 5
	}
	var ticks []plot.Tick
	for i := math.Ceil(min / minor); i*minor <= max+1e-9; i++ {
		v := i * minor
		t := plot.Tick{Value: v}
		if r := math.Mod(v, major); math.Abs(r) < 1e-9 || math.Abs(r-major) < 1e-9 {
			t.Label = strconv.FormatFloat(v, 'f', -1, 64)
		}
		ticks = append(ticks, t)
	}
	return ticks
}
