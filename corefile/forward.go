package corefile

import (
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/coredns/caddy/caddyfile"
	"github.com/miekg/dns"
)

// Forward defaults of CoreDNS 1.13.1 (plugin/forward/forward.go New).
const (
	defaultPolicy      = "random"
	defaultMaxFails    = 2
	defaultHealthCheck = 500 * time.Millisecond
	defaultExpire      = 10 * time.Second

	// maxUpstreams is CoreDNS's limit of TO addresses per forward.
	maxUpstreams = 15
)

// forwardStanza is one `forward FROM TO... { ... }`.
type forwardStanza struct {
	from       string // fully qualified, lower case
	file       string
	line       int
	upstreams  []netip.AddrPort
	policy     string
	preferUDP  bool
	forceTCP   bool
	maxConc    int
	maxFails   int
	hcInterval time.Duration
	hcNoRec    bool
	hcDomain   string // "" : CoreDNS's "."
	expire     time.Duration
	failfast   bool
	except     []string
}

func (f *forwardStanza) apply(z *Zone) {
	z.Upstreams = append([]netip.AddrPort(nil), f.upstreams...)
	z.ForwardPolicy = f.policy
	z.PreferUDP = f.preferUDP
	z.ForceTCP = f.forceTCP
	z.MaxConcurrent = f.maxConc
	z.MaxFails = f.maxFails
	z.HealthCheck = f.hcInterval
	z.HealthCheckNoRec = f.hcNoRec
	z.HealthCheckDomain = f.hcDomain
	z.Expire = f.expire
	z.FailfastAllUnhealthy = f.failfast
	z.ForwardExcept = append([]string(nil), f.except...)
	z.ForwardLine = f.line
}

// forwards reads every forward stanza of a block, in order.
func (p *parser) forwards(toks []caddyfile.Token) ([]forwardStanza, error) {
	if len(toks) == 0 {
		return nil, nil
	}
	d := p.directive("forward", toks)
	var fs []forwardStanza
	for {
		ok, err := d.next()
		if err != nil {
			return nil, err
		}
		if !ok {
			return fs, nil
		}
		f, err := d.forwardStanza()
		if err != nil {
			return nil, err
		}
		fs = append(fs, f)
	}
}

// forwardStanza reads one stanza as CoreDNS's parseStanza does. Targets
// dnsstandby cannot use (DNS-over-TLS, resolv.conf files) are noted and
// left out.
func (d *directive) forwardStanza() (forwardStanza, error) {
	f := forwardStanza{
		file:       d.File(),
		line:       d.Line(),
		policy:     defaultPolicy,
		maxFails:   defaultMaxFails,
		hcInterval: defaultHealthCheck,
		expire:     defaultExpire,
	}
	if !d.NextArg() {
		return f, d.argErr()
	}
	from := d.Val()
	zones, err := zoneArg(from)
	if err != nil || len(zones) == 0 {
		return f, d.errf("unable to normalize %q", from)
	}
	f.from = zones[0]

	to := d.RemainingArgs()
	if len(to) == 0 {
		return f, d.argErr()
	}
	if len(to) > maxUpstreams {
		return f, d.errf("more than %d TOs configured: %d", maxUpstreams, len(to))
	}
	for _, t := range to {
		ap, ok, err := d.forwardTarget(t)
		if err != nil {
			return f, err
		}
		if ok {
			f.upstreams = append(f.upstreams, ap)
		}
	}

	for d.NextBlock() {
		opt := d.Val()
		switch opt {
		case "force_tcp", "prefer_udp", "failfast_all_unhealthy_upstreams":
			if len(d.RemainingArgs()) != 0 {
				return f, d.errf("%s: takes no arguments", opt)
			}
			switch opt {
			case "force_tcp":
				f.forceTCP = true
			case "prefer_udp":
				f.preferUDP = true
			default:
				f.failfast = true
			}
		case "policy":
			v, err := d.oneArg(opt)
			if err != nil {
				return f, err
			}
			switch v {
			case "random", "round_robin", "sequential":
				f.policy = v
			default:
				return f, d.errf("policy: unknown policy %q", v)
			}
		case "max_concurrent":
			v, err := d.oneArg(opt)
			if err != nil {
				return f, err
			}
			n, err := strconv.Atoi(v)
			if err != nil {
				return f, d.errf("max_concurrent: invalid number %q", v)
			}
			if n < 0 {
				return f, d.errf("max_concurrent: can't be negative: %d", n)
			}
			f.maxConc = n
		case "max_fails":
			v, err := d.oneArg(opt)
			if err != nil {
				return f, err
			}
			n, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				return f, d.errf("max_fails: invalid number %q", v)
			}
			f.maxFails = int(n)
		case "expire":
			v, err := d.oneArg(opt)
			if err != nil {
				return f, err
			}
			if f.expire, err = d.duration(opt, v); err != nil {
				return f, err
			}
		case "health_check":
			if err := d.healthCheck(&f); err != nil {
				return f, err
			}
		case "except":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return f, d.errf("except: at least one zone is expected")
			}
			for _, a := range args {
				zs, err := zoneArg(a)
				if err != nil {
					// CoreDNS drops what it cannot normalize.
					d.notef("except %q ignored: %v", a, err)
					continue
				}
				f.except = append(f.except, zs...)
			}
		case "tls", "tls_servername", "next", "failover":
			// Only matter for targets or answers dnsstandby does not use.
			d.RemainingArgs()
		default:
			d.skipOption()
		}
	}
	return f, nil
}

// forwardTarget reads one TO as CoreDNS's parse.HostPortOrFile does.
// ok is false for a target that is left out (and noted).
func (d *directive) forwardTarget(t string) (ap netip.AddrPort, ok bool, err error) {
	trans, host := splitTransport(t)
	if host == "" {
		return ap, false, d.errf("invalid address: %q", t)
	}
	if trans != transportDNS && trans != transportTLS {
		return ap, false, d.errf("%q is not supported as a destination protocol: %s", trans, t)
	}
	addr, port := host, defaultPorts[trans]
	if h, ps, err := net.SplitHostPort(host); err == nil {
		n, err := strconv.ParseUint(ps, 10, 16)
		if err != nil {
			return ap, false, d.errf("invalid port in %q", t)
		}
		addr, port = h, int(n)
	}
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		d.notef("target %q is not an IP address (CoreDNS reads it as a resolv.conf file); not used", t)
		return ap, false, nil
	}
	if trans == transportTLS {
		d.notef("DNS-over-TLS target %q not used", t)
		return ap, false, nil
	}
	return netip.AddrPortFrom(ip.Unmap(), uint16(port)), true, nil
}

// healthCheck reads `health_check DURATION [no_rec] [domain NAME]` as
// CoreDNS does: each health_check line sets the domain back to "." (here
// ""), while no_rec, once given, stays.
func (d *directive) healthCheck(f *forwardStanza) error {
	if !d.NextArg() {
		return d.argErr()
	}
	dur, err := d.duration("health_check", d.Val())
	if err != nil {
		return err
	}
	f.hcInterval = dur
	f.hcDomain = ""
	for d.NextArg() {
		switch o := d.Val(); o {
		case "no_rec":
			f.hcNoRec = true
		case "domain":
			if !d.NextArg() {
				return d.argErr()
			}
			if _, ok := dns.IsDomainName(d.Val()); !ok {
				return d.errf("health_check: invalid domain name %q", d.Val())
			}
			// CoreDNS's plugin.Name(...).Normalize().
			f.hcDomain = strings.ToLower(dns.Fqdn(d.Val()))
		default:
			return d.errf("health_check: unknown option %q", o)
		}
	}
	return nil
}

// oneArg reads the single argument of option opt.
func (d *directive) oneArg(opt string) (string, error) {
	args := d.RemainingArgs()
	if len(args) != 1 {
		return "", d.errf("%s: expects one argument, got %d", opt, len(args))
	}
	return args[0], nil
}

// duration parses a non-negative Go duration for option opt.
func (d *directive) duration(opt, v string) (time.Duration, error) {
	dur, err := time.ParseDuration(v)
	if err != nil {
		return 0, d.errf("%s: invalid duration %q", opt, v)
	}
	if dur < 0 {
		return 0, d.errf("%s: negative duration %q", opt, v)
	}
	return dur, nil
}
