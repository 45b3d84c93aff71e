// Package promtext reads the Prometheus text exposition format, as far as
// the benchmarks need it: the samples of a /metrics page, summed by name and
// label values. Histograms and summaries come through as their plain
// _bucket, _sum and _count samples.
package promtext

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/dnsstandby/dnsstandby/internal/nstest"
)

// Sample is one line of a /metrics page.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Samples are a page's samples in page order.
type Samples []Sample

// Sum adds the values of the samples called name whose labels include every
// pair of match (nil matches all); it is 0 when none does.
func (s Samples) Sum(name string, match map[string]string) float64 {
	var sum float64
	for _, x := range s {
		if x.Name == name && x.matches(match) {
			sum += x.Value
		}
	}
	return sum
}

// Has reports whether any sample is called name.
func (s Samples) Has(name string) bool {
	for _, x := range s {
		if x.Name == name {
			return true
		}
	}
	return false
}

// By sums the samples called name whose labels include match, grouped by the
// value of label.
func (s Samples) By(name, label string, match map[string]string) map[string]float64 {
	out := map[string]float64{}
	for _, x := range s {
		if x.Name == name && x.matches(match) {
			out[x.Labels[label]] += x.Value
		}
	}
	return out
}

func (x Sample) matches(match map[string]string) bool {
	for k, v := range match {
		if x.Labels[k] != v {
			return false
		}
	}
	return true
}

// Parse reads a page in the text format (version 0.0.4).
func Parse(r io.Reader) (Samples, error) {
	var out Samples
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; s.Scan(); n++ {
		line := strings.TrimSpace(s.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		x, err := parseLine(line)
		if err != nil {
			return nil, fmt.Errorf("metrics line %d %q: %w", n, line, err)
		}
		out = append(out, x)
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("read metrics: %w", err)
	}
	return out, nil
}

// parseLine reads `name{label="value",...} value [timestamp]`.
func parseLine(line string) (Sample, error) {
	x := Sample{Labels: map[string]string{}}
	i := strings.IndexAny(line, "{ \t")
	if i <= 0 {
		return x, errors.New("no value")
	}
	x.Name, line = line[:i], line[i:]
	if line[0] == '{' {
		rest, err := parseLabels(line[1:], x.Labels)
		if err != nil {
			return x, err
		}
		line = rest
	}
	f := strings.Fields(line)
	if len(f) < 1 || len(f) > 2 {
		return x, errors.New("want a value and at most a timestamp after the name")
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return x, fmt.Errorf("value: %w", err)
	}
	x.Value = v
	return x, nil
}

// parseLabels reads `a="x",b="y"}` (the opening brace already taken) into
// into and returns what follows the closing brace.
func parseLabels(s string, into map[string]string) (string, error) {
	for {
		s = strings.TrimLeft(s, " \t")
		if strings.HasPrefix(s, "}") {
			return s[1:], nil
		}
		eq := strings.IndexByte(s, '=')
		if eq <= 0 || len(s) < eq+2 || s[eq+1] != '"' {
			return "", errors.New(`bad label: want name="value"`)
		}
		name := strings.TrimSpace(s[:eq])
		s = s[eq+2:]
		var v strings.Builder
		closed := false
		for i := 0; i < len(s); i++ {
			c := s[i]
			if c == '\\' && i+1 < len(s) {
				i++
				switch s[i] {
				case 'n':
					v.WriteByte('\n')
				default: // \\ and \"
					v.WriteByte(s[i])
				}
				continue
			}
			if c == '"' {
				s, closed = s[i+1:], true
				break
			}
			v.WriteByte(c)
		}
		if !closed {
			return "", errors.New("unterminated label value")
		}
		into[name] = v.String()
		s = strings.TrimLeft(s, " \t")
		if strings.HasPrefix(s, ",") {
			s = s[1:]
		}
	}
}

// Client is an HTTP client whose connections are dialled from inside ns,
// so that it reaches addresses (127.0.0.1 included) of that namespace.
func Client(ns *nstest.Namespace) *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return ns.Dial(network, "", addr, 5*time.Second)
		},
	}}
}

// Fetch reads and parses url (http://ADDR:PORT/metrics).
func Fetch(ctx context.Context, c *http.Client, url string) (Samples, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metrics %s: %s", url, resp.Status)
	}
	return Parse(resp.Body)
}
