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

// forwardStanza reads one stanza as CoreDNS's parseStanza does, token by
// token: an option that takes one argument reads one, and what follows on
// its line is read as the next option. Targets dnsstandby cannot use
// (DNS-over-TLS, resolv.conf files) are noted and left out.
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
	targets := 0
	for _, t := range to {
		aps, n, err := d.forwardTarget(t)
		if err != nil {
			return f, err
		}
		f.upstreams = append(f.upstreams, aps...)
		targets += n
	}
	if targets == 0 {
		return f, d.errf("no nameservers found")
	}
	if targets > maxUpstreams {
		return f, d.errf("more than %d TOs configured: %d", maxUpstreams, targets)
	}
	for d.NextBlock() {
		if err := d.forwardOption(&f); err != nil {
			return f, err
		}
	}
	return f, nil
}

// forwardOption reads one option of a forward block as CoreDNS's
// parseBlock does.
func (d *directive) forwardOption(f *forwardStanza) error {
	opt := d.Val()
	switch opt {
	case "force_tcp", "prefer_udp":
		if d.NextArg() {
			return d.errf("%s: takes no arguments", opt)
		}
		if opt == "force_tcp" {
			f.forceTCP = true
		} else {
			f.preferUDP = true
		}
	case "failfast_all_unhealthy_upstreams":
		if len(d.RemainingArgs()) != 0 {
			return d.errf("%s: takes no arguments", opt)
		}
		f.failfast = true
	case "policy":
		v, err := d.arg(opt)
		if err != nil {
			return err
		}
		switch v {
		case "random", "round_robin", "sequential":
			f.policy = v
		default:
			return d.errf("policy: unknown policy %q", v)
		}
	case "max_concurrent":
		v, err := d.arg(opt)
		if err != nil {
			return err
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			return d.errf("max_concurrent: invalid number %q", v)
		}
		if n < 0 {
			return d.errf("max_concurrent: can't be negative: %d", n)
		}
		f.maxConc = n
	case "max_fails":
		v, err := d.arg(opt)
		if err != nil {
			return err
		}
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return d.errf("max_fails: invalid number %q", v)
		}
		f.maxFails = int(n)
	case "expire":
		v, err := d.arg(opt)
		if err != nil {
			return err
		}
		if f.expire, err = d.duration(opt, v); err != nil {
			return err
		}
	case "health_check":
		return d.healthCheck(f)
	case "except":
		args := d.RemainingArgs()
		if len(args) == 0 {
			return d.errf("except: at least one zone is expected")
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
	case "tls":
		// Certificates for TLS targets, which dnsstandby does not use;
		// CoreDNS loads them, which this package does not model.
		if len(d.RemainingArgs()) > 3 {
			return d.argErr()
		}
	case "tls_servername":
		if _, err := d.arg(opt); err != nil {
			return err
		}
	case "next", "failover":
		// Only matter for answers dnsstandby does not imitate: it
		// never passes an upstream's answer on to another plugin.
		args := d.RemainingArgs()
		if len(args) == 0 {
			return d.argErr()
		}
		for _, rc := range args {
			// CoreDNS's refusal of failover NOERROR is never reached: it
			// accepts every rcode name.
			if _, ok := dns.StringToRcode[strings.ToUpper(rc)]; !ok {
				return d.errf("%s: %s is not a valid rcode", opt, rc)
			}
		}
	default:
		return d.errf("unknown property '%s'", opt)
	}
	return nil
}

// forwardTarget reads one TO as CoreDNS's parse.HostPortOrFile does: an
// address, with a port or not, or else a resolv.conf file, whose servers
// count towards the 15 TOs. It returns the addresses dnsstandby uses (none
// for a TLS target or a file, which are noted) and how many TOs the
// argument is.
func (d *directive) forwardTarget(t string) (aps []netip.AddrPort, n int, err error) {
	trans, host := splitTransport(t)
	if host == "" {
		return nil, 0, d.errf("invalid address: %q", t)
	}
	if trans != transportDNS && trans != transportTLS {
		return nil, 0, d.errf("%q is not supported as a destination protocol: %s", trans, t)
	}
	addr, port := host, defaultPorts[trans]
	if h, ps, err := net.SplitHostPort(host); err == nil {
		n, err := strconv.ParseUint(ps, 10, 16)
		if err != nil {
			return nil, 0, d.errf("invalid port in %q", t)
		}
		addr, port = h, int(n)
	}
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		servers, err := resolvConfServers(host)
		if err != nil {
			return nil, 0, d.errf("not an IP address or file: %q", host)
		}
		d.notef("target %q is a resolv.conf file (%d servers); not used", t, servers)
		return nil, servers, nil
	}
	if trans == transportTLS {
		d.notef("DNS-over-TLS target %q not used", t)
		return nil, 1, nil
	}
	return []netip.AddrPort{netip.AddrPortFrom(ip.Unmap(), uint16(port))}, 1, nil
}

// resolvConfServers counts the nameservers of a resolv.conf file, as
// CoreDNS reads a forward target that is not an address.
func resolvConfServers(path string) (int, error) {
	c, err := dns.ClientConfigFromFile(path)
	if err != nil {
		return 0, err
	}
	return len(c.Servers), nil
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

// arg reads the one argument of option opt, as CoreDNS's c.NextArg does:
// what follows it on the line is the next option.
func (d *directive) arg(opt string) (string, error) {
	if !d.NextArg() {
		return "", d.errf("%s: expects an argument", opt)
	}
	return d.Val(), nil
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
