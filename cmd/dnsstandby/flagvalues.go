package main

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// Flag values that bind straight onto a field and check what they are
// given, so that a bad value is reported with the flag's name by the flag
// package itself: `invalid value "0" for flag -max-inflight: must be
// positive`.

// bounded binds an int or a duration that must be positive, or (with
// zeroOK) not negative.
type bounded[T int | time.Duration] struct {
	p      *T
	zeroOK bool
}

func positive[T int | time.Duration](p *T) bounded[T]    { return bounded[T]{p: p} }
func notNegative[T int | time.Duration](p *T) bounded[T] { return bounded[T]{p: p, zeroOK: true} }

func (b bounded[T]) String() string {
	if b.p == nil {
		return ""
	}
	return fmt.Sprint(*b.p)
}

func (b bounded[T]) Set(s string) error {
	var v T
	switch p := any(&v).(type) {
	case *int:
		n, err := strconv.Atoi(s)
		if err != nil {
			return errors.New("not a whole number")
		}
		*p = n
	case *time.Duration:
		d, err := time.ParseDuration(s)
		if err != nil {
			return errors.New("not a duration such as 500ms, 5s or 1h")
		}
		*p = d
	}
	switch {
	case b.zeroOK && v < 0:
		return errors.New("must not be negative")
	case !b.zeroOK && v <= 0:
		return errors.New("must be positive")
	}
	*b.p = v
	return nil
}

// optional is a positive flag whose zero value means "not given": it
// prints as "" while zero, so that -h shows no default for it (flag shows
// a default unless it prints as the zero value's does), where 0 would be
// one the flag refuses.
type optional[T int | time.Duration] struct{ bounded[T] }

func positiveOrUnset[T int | time.Duration](p *T) optional[T] { return optional[T]{positive(p)} }

func (o optional[T]) String() string {
	if o.p == nil || *o.p == 0 {
		return ""
	}
	return o.bounded.String()
}

// parsed binds a field of any type through a parse function.
type parsed[T any] struct {
	p      *T
	parse  func(string) (T, error)
	format func(T) string
}

func (f parsed[T]) String() string {
	if f.p == nil {
		return ""
	}
	return f.format(*f.p)
}

func (f parsed[T]) Set(s string) error {
	v, err := f.parse(s)
	if err != nil {
		return err
	}
	*f.p = v
	return nil
}

// addrList is a repeatable ADDR:PORT flag; one value may also hold a
// comma- or space-separated list (convenient in the environment). The
// first value given replaces the default; later ones add to it.
type addrList struct {
	p   *[]netip.AddrPort
	set bool
}

func (a *addrList) String() string {
	if a == nil || a.p == nil {
		return ""
	}
	parts := make([]string, len(*a.p))
	for i, ap := range *a.p {
		parts[i] = ap.String()
	}
	return strings.Join(parts, ",")
}

func (a *addrList) Set(v string) error {
	aps, err := parseAddrPorts(v)
	if err != nil {
		return err
	}
	if !a.set {
		*a.p, a.set = nil, true
	}
	*a.p = append(*a.p, aps...)
	return nil
}

// parseAddrPorts splits a comma- or space-separated list of ADDR:PORT.
func parseAddrPorts(v string) ([]netip.AddrPort, error) {
	var out []netip.AddrPort
	for _, s := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' }) {
		ap, err := parseAddrPort(s)
		if err != nil {
			return nil, err
		}
		out = append(out, ap)
	}
	return out, nil
}

// parseAddrPort accepts ADDR:PORT, [V6]:PORT, or a bare address for port 53.
func parseAddrPort(s string) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap, nil
	}
	if ip, err := netip.ParseAddr(strings.Trim(s, "[]")); err == nil {
		return netip.AddrPortFrom(ip, 53), nil
	}
	if strings.Contains(s, "$(") {
		// A Kubernetes $(VAR) the kubelet left as it was: it expands only
		// variables the container has.
		return netip.AddrPort{}, fmt.Errorf("%q is not an IP address with optional :port: a Kubernetes variable that was not expanded (for $(KUBE_DNS_SERVICE_HOST), the pod needs enableServiceLinks and the kube-dns Service in its namespace)", s)
	}
	return netip.AddrPort{}, fmt.Errorf("%q is not an IP address with optional :port", s)
}

// sizeUnits are the suffixes a size may have: binary as Kubernetes
// writes them (Ki, Mi, Gi) and as IEC does (KiB, MiB, GiB), decimal
// (K, M, G). Longest first, so that "Mi" is not read as "M".
var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30},
	{"K", 1e3}, {"M", 1e6}, {"G", 1e9},
}

// parseSize reads a positive byte count with an optional unit.
func parseSize(v string) (int64, error) {
	num, mult := strings.TrimSpace(v), int64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(num, u.suffix) {
			num, mult = strings.TrimSpace(strings.TrimSuffix(num, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%q is not a positive size (bytes, or with Ki, Mi, Gi, KiB, MiB, GiB, K, M, G)", v)
	}
	if n > math.MaxInt64/mult {
		return 0, fmt.Errorf("%q is too large", v)
	}
	return n * mult, nil
}

// formatSize writes a size in the largest binary unit that divides it.
func formatSize(n int64) string {
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n > 0 && n%u.mult == 0 {
			return strconv.FormatInt(n/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}
