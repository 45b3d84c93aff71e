package corefile

import (
	"fmt"
	"net"
	"regexp"
	"strconv"
	"time"

	"github.com/coredns/caddy/caddyfile"
)

// This file checks the arguments of the plugins dnsstandby does not
// imitate, as CoreDNS 1.13.1's setup of each reads them, token by token:
// a plugin that takes its first line only ignores later ones, one that
// reads an option's first argument leaves the rest to be read as the next
// option, and so on. CoreDNS refuses the whole Corefile when one setup
// fails, in any block; so does Check.

// shapes are the checks of the plugins that are not read elsewhere in
// this package. A directive in Directives with neither a reader nor a
// shape is not checked (unchecked lists them).
var shapes = map[string]func(d *directive) error{
	"log":         shapeLog,
	"errors":      shapeErrors,
	"ready":       shapeReady,
	"health":      shapeHealth,
	"prometheus":  shapePrometheus,
	"loop":        shapeNoArgsOnce,
	"reload":      shapeReload,
	"debug":       shapeDebug,
	"minimal":     shapeFirstNoArgs,
	"any":         shapeAnything,
	"local":       shapeAnything,
	"cancel":      shapeCancel,
	"bufsize":     shapeBufsize,
	"timeouts":    shapeTimeouts,
	"multisocket": shapeMultisocket,
	"chaos":       shapeAnything, // every shape of arguments is accepted
	"erratic":     shapeErratic,
	"view":        shapeView,
}

// read are the directives other files of this package read, with
// CoreDNS's checks.
var read = []string{"bind", "forward", "cache", "nsid", "whoami", "hosts", "template", "root"}

// checkShape checks the tokens of directive name in one block.
func (p *parser) checkShape(name string, toks []caddyfile.Token) error {
	shape := shapes[name]
	if shape == nil || len(toks) == 0 {
		return nil
	}
	return shape(p.directive(name, toks))
}

// unchecked reports whether dnsstandby cannot tell whether CoreDNS
// accepts the arguments of directive name.
func unchecked(name string) bool {
	if _, ok := shapes[name]; ok {
		return false
	}
	for _, r := range read {
		if r == name {
			return false
		}
	}
	return true
}

// shapeAnything is a setup that reads no token: anything goes.
func shapeAnything(*directive) error { return nil }

// shapeNoArgsOnce: once per block, no arguments (loop).
func shapeNoArgsOnce(d *directive) error {
	return d.once(func() error {
		if d.NextArg() {
			return d.argErr()
		}
		return nil
	})
}

// shapeFirstNoArgs: the first line has no arguments; the rest is not read
// (minimal).
func shapeFirstNoArgs(d *directive) error {
	d.Next()
	if d.NextArg() {
		return d.argErr()
	}
	return nil
}

// shapeDebug: no arguments, on every line.
func shapeDebug(d *directive) error {
	for d.Next() {
		if d.NextArg() {
			return d.argErr()
		}
	}
	return nil
}

// shapeLog: `log [NAMES...] [FORMAT] { class CLASSES... }`, many times.
func shapeLog(d *directive) error {
	for d.Next() {
		d.RemainingArgs()
		for d.NextBlock() {
			if d.Val() != "class" {
				return d.argErr()
			}
			classes := d.RemainingArgs()
			if len(classes) == 0 {
				return d.argErr()
			}
			for _, c := range classes {
				switch c {
				case "all", "success", "denial", "error":
				default:
					return d.errf("invalid Class: %s", c)
				}
			}
		}
	}
	return nil
}

// shapeErrors: once, `errors [stdout] { stacktrace; consolidate ... }`.
func shapeErrors(d *directive) error {
	return d.once(func() error {
		switch args := d.RemainingArgs(); len(args) {
		case 0:
		case 1:
			if args[0] != "stdout" {
				return d.errf("invalid log file: %s", args[0])
			}
		default:
			return d.argErr()
		}
		for d.NextBlock() {
			switch d.Val() {
			case "stacktrace":
			case "consolidate":
				if err := d.consolidate(); err != nil {
					return err
				}
			default:
				return d.errf("unknown field %s", d.Val())
			}
		}
		return nil
	})
}

// consolidate is `consolidate DURATION REGEXP [LEVEL]` of errors.
func (d *directive) consolidate() error {
	args := d.RemainingArgs()
	if len(args) < 2 || len(args) > 3 {
		return d.argErr()
	}
	if _, err := time.ParseDuration(args[0]); err != nil {
		return d.errf("%v", err)
	}
	if _, err := regexp.Compile(args[1]); err != nil {
		return d.errf("%v", err)
	}
	if len(args) == 3 {
		switch args[2] {
		case "warning", "error", "info", "debug":
		default:
			return d.errf("unknown log level argument in consolidate: %s", args[2])
		}
	}
	return nil
}

// optionalAddr reads the optional HOST:PORT of ready, health and
// prometheus, the rest of the line.
func (d *directive) optionalAddr() error {
	switch args := d.RemainingArgs(); len(args) {
	case 0:
		return nil
	case 1:
		if _, _, err := net.SplitHostPort(args[0]); err != nil {
			return d.errf("%v", err)
		}
		return nil
	}
	return d.argErr()
}

// shapeReady: once, `ready [ADDRESS] { monitor until-ready|continuously }`.
func shapeReady(d *directive) error {
	return d.once(func() error {
		if err := d.optionalAddr(); err != nil {
			return err
		}
		for d.NextBlock() {
			// Other options are read as nothing, as CoreDNS does.
			if d.Val() != "monitor" {
				continue
			}
			args := d.RemainingArgs()
			if len(args) != 1 {
				return d.argErr()
			}
			if args[0] != "until-ready" && args[0] != "continuously" {
				return d.errf("monitor type '%s' not supported", args[0])
			}
		}
		return nil
	})
}

// shapeHealth: `health [ADDRESS] { lameduck DURATION }`, many times.
func shapeHealth(d *directive) error {
	for d.Next() {
		if err := d.optionalAddr(); err != nil {
			return err
		}
		for d.NextBlock() {
			if d.Val() != "lameduck" {
				return d.argErr()
			}
			args := d.RemainingArgs()
			if len(args) != 1 {
				return d.argErr()
			}
			if _, err := time.ParseDuration(args[0]); err != nil {
				return d.errf("unable to parse lameduck duration value: '%v' : %v", args[0], err)
			}
		}
	}
	return nil
}

// shapePrometheus: once, `prometheus [ADDRESS]`, no block: its braces
// would be read as a second occurrence.
func shapePrometheus(d *directive) error { return d.once(d.optionalAddr) }

// shapeReload: the first line, `reload [INTERVAL [JITTER]]`, interval at
// least 2 s and jitter at least 1 s.
func shapeReload(d *directive) error {
	d.Next()
	args := d.RemainingArgs()
	if len(args) > 2 {
		return d.argErr()
	}
	for i, least := range []time.Duration{2 * time.Second, time.Second} {
		if i >= len(args) {
			break
		}
		v, err := time.ParseDuration(args[i])
		if err != nil {
			return d.errf("%v", err)
		}
		if v < least {
			what := [...]string{"interval", "jitter"}[i]
			return d.errf("%s value must be greater or equal to %v", what, least)
		}
	}
	return nil
}

// shapeCancel: `cancel [DURATION]`, a positive duration, many times.
func shapeCancel(d *directive) error {
	for d.Next() {
		switch args := d.RemainingArgs(); len(args) {
		case 0:
		case 1:
			v, err := time.ParseDuration(args[0])
			if err != nil {
				return d.errf("invalid duration: %q", args[0])
			}
			if v <= 0 {
				return d.errf("invalid negative duration: %q", args[0])
			}
		default:
			return d.argErr()
		}
	}
	return nil
}

// shapeBufsize: the first line, `bufsize [SIZE]`, 512 to 4096.
func shapeBufsize(d *directive) error {
	d.Next()
	switch args := d.RemainingArgs(); len(args) {
	case 0:
		return nil
	case 1:
		if n, err := strconv.Atoi(args[0]); err == nil && n >= 512 && n <= 4096 {
			return nil
		}
	}
	return d.argErr()
}

// shapeTimeouts: `timeouts { read|write|idle DURATION }`, at least one,
// each 1 s to 24 h.
func shapeTimeouts(d *directive) error {
	for d.Next() {
		if len(d.RemainingArgs()) > 0 {
			return d.argErr()
		}
		n := 0
		for d.NextBlock() {
			opt := d.Val()
			args := d.RemainingArgs()
			if len(args) != 1 {
				return d.argErr()
			}
			v, err := timeoutDuration(args[0])
			if err != nil {
				return d.errf("%v", err)
			}
			if v < time.Second || v > 24*time.Hour {
				return d.errf("timeout provided '%s' needs to be between 1 second and 24 hours", v)
			}
			if opt != "read" && opt != "write" && opt != "idle" {
				return d.errf("unknown option: '%s'", opt)
			}
			n++
		}
		if n == 0 {
			return d.errf("timeouts block with no timeouts specified")
		}
	}
	return nil
}

// timeoutDuration is CoreDNS's durations.NewDurationFromArg: a Go
// duration, or a number of seconds.
func timeoutDuration(arg string) (time.Duration, error) {
	if n, err := strconv.Atoi(arg); err == nil {
		return time.Duration(n) * time.Second, nil
	}
	v, err := time.ParseDuration(arg)
	if err != nil {
		return 0, fmt.Errorf("failed to parse duration %q: %w", arg, err)
	}
	return v, nil
}

// shapeMultisocket: `multisocket [N]` once, N at least 1.
func shapeMultisocket(d *directive) error {
	d.Next()
	args := d.RemainingArgs()
	if len(args) > 1 || d.Next() {
		return d.argErr()
	}
	if len(args) == 1 {
		n, err := strconv.Atoi(args[0])
		if err != nil {
			return d.errf("invalid num sockets: %v", err)
		}
		if n < 1 {
			return d.errf("num sockets can not be zero or negative: %d", n)
		}
	}
	return nil
}

// shapeErratic: `erratic { drop [N]; delay [N [DURATION]]; truncate [N]; large }`.
func shapeErratic(d *directive) error {
	for d.Next() {
		for d.NextBlock() {
			most := 1
			switch opt := d.Val(); opt {
			case "large":
				continue // reads no argument
			case "drop", "truncate":
			case "delay":
				most = 2
			default:
				return d.errf("unknown property '%s'", opt)
			}
			args := d.RemainingArgs()
			if len(args) > most {
				return d.argErr()
			}
			if len(args) > 0 {
				n, err := strconv.ParseInt(args[0], 10, 32)
				if err != nil {
					return d.errf("%v", err)
				}
				if n < 0 {
					return d.errf("illegal amount value given %q", args[0])
				}
			}
			if len(args) > 1 {
				if _, err := time.ParseDuration(args[1]); err != nil {
					return d.errf("%v", err)
				}
			}
		}
	}
	return nil
}

// shapeView: once, `view NAME { expr EXPRESSION }`. The expressions are
// not compiled: dnsstandby does not model views.
func shapeView(d *directive) error {
	return d.once(func() error {
		if len(d.RemainingArgs()) != 1 {
			return d.argErr()
		}
		for d.NextBlock() {
			if d.Val() != "expr" {
				return d.errf("unknown property '%s'", d.Val())
			}
			d.RemainingArgs()
		}
		return nil
	})
}
