package corefile

import "github.com/coredns/caddy/caddyfile"

// whoami reads a block's whoami directive as CoreDNS's whoami setup does:
// the first `whoami` must have no arguments; CoreDNS looks at no other.
func (p *parser) whoami(toks []caddyfile.Token) (bool, error) {
	if len(toks) == 0 {
		return false, nil
	}
	d := p.directive("whoami", toks)
	d.Next()
	if d.NextArg() {
		return false, d.argErr()
	}
	return true, nil
}
