package corefile

import (
	"os"
	"strings"

	"github.com/coredns/caddy/caddyfile"
)

// hostname is what a bare `nsid` answers with, as in CoreDNS. A variable
// so that tests do not depend on the machine.
var hostname = func() string {
	h, err := os.Hostname()
	if err != nil {
		return "localhost"
	}
	return h
}

// nsid reads a block's nsid directive as CoreDNS's nsidParse does.
func (p *parser) nsid(toks []caddyfile.Token) (string, error) {
	if len(toks) == 0 {
		return "", nil
	}
	d := p.directive("nsid", toks)
	data := ""
	err := d.once(func() error {
		data = hostname()
		if args := d.RemainingArgs(); len(args) > 0 {
			data = strings.Join(args, " ")
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return data, nil
}
