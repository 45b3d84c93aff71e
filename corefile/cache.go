package corefile

import (
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/coredns/caddy/caddyfile"
)

// Cache defaults of CoreDNS 1.13.1 (plugin/cache/cache.go, setup.go).
const (
	defaultMaxTTL      = 3600 * time.Second // dnsutil.MaximumDefaulTTL
	defaultMaxNegTTL   = 1800 * time.Second // half of it
	defaultMinTTL      = 5 * time.Second    // dnsutil.MinimalDefaultTTL
	defaultServfailTTL = 5 * time.Second    // minNTTL
	defaultCapacity    = 10000              // 9984 after sharding
	defaultServeStale  = time.Hour          // serve_stale without a duration
	maxServfailTTL     = 5 * time.Minute    // RFC 2308 forbids caching SERVFAIL longer

	cacheShards    = 256 // plugin/pkg/cache shardSize
	minShardSize   = 4   // plugin/pkg/cache New: max(size/shardSize, 4)
	maxTTLSeconds  = math.MaxInt32
	maxPrefetchPct = 90
	minPrefetchPct = 10
)

// capacity is the number of entries CoreDNS's cache really holds when
// configured for n.
func capacity(n int) int { return max(n/cacheShards, minShardSize) * cacheShards }

// cache reads a block's cache directive as CoreDNS's cacheParse does.
func (p *parser) cache(toks []caddyfile.Token) (*Cache, error) {
	if len(toks) == 0 {
		return nil, nil
	}
	c := &Cache{
		MaxTTL:          defaultMaxTTL,
		MaxNegTTL:       defaultMaxNegTTL,
		MinTTL:          defaultMinTTL,
		MinNegTTL:       defaultMinTTL,
		SuccessCapacity: capacity(defaultCapacity),
		DenialCapacity:  capacity(defaultCapacity),
		ServfailTTL:     defaultServfailTTL,
	}
	d := p.directive("cache", toks)
	err := d.once(func() error {
		c.Line = d.Line()

		// cache [TTL] [ZONES...]: a number first is the TTL.
		args := d.RemainingArgs()
		if len(args) > 0 {
			if ttl, err := strconv.Atoi(args[0]); err == nil {
				dur, err := d.ttl("", ttl, 1)
				if err != nil {
					return err
				}
				c.MaxTTL, c.MaxNegTTL = dur, dur
				args = args[1:]
			}
		}
		c.Zones = d.zones(args)

		for d.NextBlock() {
			if err := d.cacheOption(c); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// cacheOption reads one line of the cache block.
func (d *directive) cacheOption(c *Cache) error {
	opt := d.Val()
	switch opt {
	case "success", "denial":
		capTo, maxTo, minTo := &c.SuccessCapacity, &c.MaxTTL, &c.MinTTL
		if opt == "denial" {
			capTo, maxTo, minTo = &c.DenialCapacity, &c.MaxNegTTL, &c.MinNegTTL
		}
		args := d.RemainingArgs()
		if len(args) == 0 {
			// More than three are not an error: CoreDNS reads three.
			return d.errf("%s: expects CAPACITY [TTL [MINTTL]], got %d arguments", opt, len(args))
		}
		n, err := strconv.Atoi(args[0])
		if err != nil {
			return d.errf("%s: invalid capacity %q", opt, args[0])
		}
		*capTo = capacity(n)
		if len(args) > 1 {
			if *maxTo, err = d.ttlArg(opt, args[1], 1); err != nil {
				return err
			}
		}
		if len(args) > 2 {
			if *minTo, err = d.ttlArg(opt, args[2], 0); err != nil {
				return err
			}
		}
	case "prefetch":
		args := d.RemainingArgs()
		if len(args) == 0 || len(args) > 3 {
			return d.errf("prefetch: expects AMOUNT [DURATION [PERCENTAGE%%]], got %d arguments", len(args))
		}
		n, err := strconv.Atoi(args[0])
		if err != nil || n < 0 {
			return d.errf("prefetch: invalid amount %q", args[0])
		}
		if len(args) > 1 {
			if _, err := time.ParseDuration(args[1]); err != nil {
				return d.errf("prefetch: invalid duration %q", args[1])
			}
		}
		if len(args) > 2 {
			pct, ok := strings.CutSuffix(args[2], "%")
			v, err := strconv.Atoi(pct)
			if !ok || err != nil || v < minPrefetchPct || v > maxPrefetchPct {
				return d.errf("prefetch: percentage must be %d%%..%d%%, got %q", minPrefetchPct, maxPrefetchPct, args[2])
			}
		}
		c.Prefetch = n
	case "serve_stale":
		args := d.RemainingArgs()
		if len(args) > 2 {
			return d.errf("serve_stale: expects [DURATION [REFRESH_MODE]], got %d arguments", len(args))
		}
		c.ServeStale, c.StaleVerify = defaultServeStale, false
		if len(args) > 0 {
			dur, err := d.duration(opt, args[0])
			if err != nil {
				return err
			}
			c.ServeStale = dur
		}
		if len(args) > 1 {
			switch mode := strings.ToLower(args[1]); mode {
			case "immediate", "verify":
				c.StaleVerify = mode == "verify"
			default:
				return d.errf("serve_stale: invalid refresh mode %q (want immediate or verify)", args[1])
			}
		}
	case "servfail":
		v, err := d.oneArg(opt)
		if err != nil {
			return err
		}
		dur, err := d.duration(opt, v)
		if err != nil {
			return err
		}
		if dur > maxServfailTTL {
			return d.errf("servfail: caching SERVFAIL responses over %s is not permitted", maxServfailTTL)
		}
		c.ServfailTTL = dur
	case "disable":
		args := d.RemainingArgs()
		if len(args) == 0 {
			return d.errf("disable: expects success|denial [ZONES...]")
		}
		zones := d.zones(args[1:])
		if len(args) == 1 {
			zones = []string{"."}
		}
		switch args[0] {
		case "success":
			c.DisabledSuccess = zones
		case "denial":
			c.DisabledDenial = zones
		default:
			return d.errf("disable: cache type must be \"success\" or \"denial\", got %q", args[0])
		}
	case "keepttl":
		if len(d.RemainingArgs()) != 0 {
			return d.errf("keepttl: takes no arguments")
		}
		c.KeepTTL = true
	default:
		return d.unknownOption()
	}
	return nil
}

// ttlArg parses a TTL in seconds of option opt, at least lowest.
func (d *directive) ttlArg(opt, v string, lowest int) (time.Duration, error) {
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, d.errf("%s: invalid TTL %q", opt, v)
	}
	return d.ttl(opt, n, lowest)
}

// ttl turns seconds into a duration. CoreDNS reserves 0 for maximum TTLs
// (lowest 1); minimum TTLs may be 0. Above 2^31-1 a TTL means nothing
// (RFC 2181) and would overflow a time.Duration.
func (d *directive) ttl(opt string, n, lowest int) (time.Duration, error) {
	prefix := ""
	if opt != "" {
		prefix = opt + ": "
	}
	if n < lowest {
		if lowest > 0 {
			return 0, d.errf("%sTTL can not be zero or negative: %d", prefix, n)
		}
		return 0, d.errf("%sminimum TTL can not be negative: %d", prefix, n)
	}
	if n > maxTTLSeconds {
		return 0, d.errf("%sTTL too large: %d", prefix, n)
	}
	return time.Duration(n) * time.Second, nil
}

// zones normalizes zone arguments. CoreDNS silently drops those it cannot
// normalize; they are noted here.
func (d *directive) zones(args []string) []string {
	var out []string
	for _, a := range args {
		zs, err := zoneArg(a)
		if err != nil {
			d.notef("zone %q ignored: %v", a, err)
			continue
		}
		out = append(out, zs...)
	}
	return out
}
