package testbed

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metrics are the samples of a /metrics page, as expfmt reads them:
// histograms and summaries come as their _bucket, _sum and _count samples.
type Metrics model.Vector

// ParseMetrics reads a page in the Prometheus text format.
func ParseMetrics(r io.Reader) (Metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("read metrics: %w", err)
	}
	out := Metrics{}
	for _, f := range families {
		v, err := expfmt.ExtractSamples(&expfmt.DecodeOptions{}, f)
		if err != nil {
			return nil, fmt.Errorf("read metrics: %w", err)
		}
		out = append(out, v...)
	}
	return out, nil
}

// Metrics fetches http://addr/metrics inside the namespace.
func (b *Bed) Metrics(ctx context.Context, addr string) (Metrics, error) {
	url := "http://" + addr + "/metrics"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := b.HTTP.Do(req)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metrics %s: %s", url, resp.Status)
	}
	return ParseMetrics(resp.Body)
}

// Sum adds the values of the samples called name whose labels include every
// pair of match (nil matches all); it is 0 when none does.
func (m Metrics) Sum(name string, match map[string]string) float64 {
	var sum float64
	for _, s := range m {
		if matches(s, name, match) {
			sum += float64(s.Value)
		}
	}
	return sum
}

// Has reports whether any sample is called name.
func (m Metrics) Has(name string) bool {
	for _, s := range m {
		if matches(s, name, nil) {
			return true
		}
	}
	return false
}

// By sums the samples called name whose labels include match, grouped by
// the value of label.
func (m Metrics) By(name, label string, match map[string]string) map[string]float64 {
	out := map[string]float64{}
	for _, s := range m {
		if matches(s, name, match) {
			out[string(s.Metric[model.LabelName(label)])] += float64(s.Value)
		}
	}
	return out
}

func matches(s *model.Sample, name string, match map[string]string) bool {
	if string(s.Metric[model.MetricNameLabel]) != name {
		return false
	}
	for k, v := range match {
		if string(s.Metric[model.LabelName(k)]) != v {
			return false
		}
	}
	return true
}
