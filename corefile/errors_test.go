package corefile

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// TestErrors checks that every error names the file and line, and the
// plugin when there is one.
func TestErrors(t *testing.T) {
	withInterfaces(t, nil)
	const (
		head = "# LocalDNS\n.:53 {\n  bind 169.254.10.11\n" // the block starts on line 2
		tail = "\n}\n"
	)
	tests := []struct {
		name string
		text string
		want string
	}{
		// Syntax, from the caddyfile parser.
		{"unclosed block", head + "  cache {\n    success 1", "localdns.corefile:5: Unexpected EOF"},
		{"unmatched close", head + "  forward . 10.0.0.10 }" + tail, "localdns.corefile:4: Unexpected '}' because no matching opening brace"},
		{"trailing comma", "cluster.local,\n", "localdns.corefile:1: Unexpected EOF"},
		{"snippet without braces", "(common)\n  bind 169.254.10.11\n", "localdns.corefile:2: syntax error: Unexpected token 'bind', expecting '{'"},
		{"missing import", head + "  import nothere.conf" + tail, "localdns.corefile:4: File to import not found: nothere.conf"},

		// Keys.
		{"key without port after colon", "cluster.local: {\n}\n", `localdns.corefile:1: server block key "cluster.local:": expecting data after last colon: "cluster.local:"`},
		{"key port out of range", "\n.:70000 {\n}\n", `localdns.corefile:2: server block key ".:70000": port 70000 out of range`},
		{"key not a domain", "a..b {\n}\n", `localdns.corefile:1: server block key "a..b": zone is not a valid domain name: "a..b"`},
		{"key too long", strings.Repeat("a", 256) + " {\n}\n", `localdns.corefile:1: server block key "` + strings.Repeat("a", 256) + `": zone is too long: 256 > 255`},

		// bind.
		{"bind without address", ".:53 {\n  bind\n}\n", "localdns.corefile:2: bind: at least one address or interface name is expected"},
		{"bind neither address nor interface", ".:53 {\n  bind dnsgone\n}\n", `localdns.corefile:2: bind: not a valid IP address or interface name: "dnsgone"`},
		{"bind an address of no interface", ".:53 {\n  bind 192.0.2.99\n}\n", "localdns.corefile:2: bind: 192.0.2.99 is not an address of this node: CoreDNS cannot listen on it"},
		{"bind bad option", ".:53 {\n  bind 169.254.10.11 {\n    only 1.2.3.4\n  }\n}\n", `localdns.corefile:3: bind: invalid option "only"`},
		{"bind empty except", ".:53 {\n  bind 169.254.10.11 {\n    except\n  }\n}\n", "localdns.corefile:3: bind: at least one address or interface must be given to except subdirective"},

		// cache.
		{"cache zero TTL", head + "  cache 0" + tail, "localdns.corefile:4: cache: TTL can not be zero or negative: 0"},
		{"cache huge TTL", head + "  cache 99999999999" + tail, "localdns.corefile:4: cache: TTL too large: 99999999999"},
		{"cache twice", head + "  cache 30\n  cache 60" + tail, "localdns.corefile:5: cache: can only be used once per server block"},
		{"serve_stale bad duration", head + "  cache 3600 {\n    serve_stale x\n  }" + tail, `localdns.corefile:5: cache: serve_stale: invalid duration "x"`},
		{"serve_stale negative", head + "  cache {\n    serve_stale -1s\n  }" + tail, `localdns.corefile:5: cache: serve_stale: negative duration "-1s"`},
		{"serve_stale bad mode", head + "  cache {\n    serve_stale 1h lazy\n  }" + tail, `localdns.corefile:5: cache: serve_stale: invalid refresh mode "lazy" (want immediate or verify)`},
		{"serve_stale too many", head + "  cache {\n    serve_stale 1h verify now\n  }" + tail, "localdns.corefile:5: cache: serve_stale: expects [DURATION [REFRESH_MODE]], got 3 arguments"},
		{"success bad capacity", head + "  cache {\n    success many\n  }" + tail, `localdns.corefile:5: cache: success: invalid capacity "many"`},
		{"success no capacity", head + "  cache {\n    success\n  }" + tail, "localdns.corefile:5: cache: success: expects CAPACITY [TTL [MINTTL]], got 0 arguments"},
		{"denial zero TTL", head + "  cache {\n    denial 9984 0\n  }" + tail, "localdns.corefile:5: cache: denial: TTL can not be zero or negative: 0"},
		{"denial negative min TTL", head + "  cache {\n    denial 9984 60 -1\n  }" + tail, "localdns.corefile:5: cache: denial: minimum TTL can not be negative: -1"},
		{"success bad TTL", head + "  cache {\n    success 9984 1h\n  }" + tail, `localdns.corefile:5: cache: success: invalid TTL "1h"`},
		{"servfail over 5m", head + "  cache {\n    servfail 6m\n  }" + tail, "localdns.corefile:5: cache: servfail: caching SERVFAIL responses over 5m0s is not permitted"},
		{"servfail no argument", head + "  cache {\n    servfail\n  }" + tail, "localdns.corefile:5: cache: servfail: expects one argument, got 0"},
		{"prefetch percentage", head + "  cache {\n    prefetch 2 1m 95%\n  }" + tail, `localdns.corefile:5: cache: prefetch: percentage must be 10%..90%, got "95%"`},
		{"disable what", head + "  cache {\n    disable everything\n  }" + tail, `localdns.corefile:5: cache: disable: cache type must be "success" or "denial", got "everything"`},
		{"cache unknown option", head + "  cache {\n    frobnicate 1 2\n  }" + tail, "localdns.corefile:5: cache: unknown property 'frobnicate'"},
		{"template unknown option", head + "  template IN A {\n    frobnicate 1 2\n  }" + tail, "localdns.corefile:5: template: unknown property 'frobnicate'"},
		{"keepttl argument", head + "  cache {\n    keepttl yes\n  }" + tail, "localdns.corefile:5: cache: keepttl: takes no arguments"},

		// forward.
		{"forward no target", head + "  forward ." + tail, `localdns.corefile:4: forward: wrong argument count or unexpected line ending after "."`},
		{"forward nothing", head + "  forward" + tail, `localdns.corefile:4: forward: wrong argument count or unexpected line ending after "forward"`},
		{"forward bad FROM", head + "  forward a..b 10.0.0.10" + tail, `localdns.corefile:4: forward: unable to normalize "a..b"`},
		{"forward bad policy", head + "  forward . 10.0.0.10 {\n    policy fastest\n  }" + tail, `localdns.corefile:5: forward: policy: unknown policy "fastest"`},
		{"forward policy no argument", head + "  forward . 10.0.0.10 {\n    policy\n  }" + tail, "localdns.corefile:5: forward: policy: expects an argument"},
		{"forward bad max_concurrent", head + "  forward . 10.0.0.10 {\n    max_concurrent lots\n  }" + tail, `localdns.corefile:5: forward: max_concurrent: invalid number "lots"`},
		{"forward negative max_concurrent", head + "  forward . 10.0.0.10 {\n    max_concurrent -1\n  }" + tail, "localdns.corefile:5: forward: max_concurrent: can't be negative: -1"},
		{"forward bad max_fails", head + "  forward . 10.0.0.10 {\n    max_fails -1\n  }" + tail, `localdns.corefile:5: forward: max_fails: invalid number "-1"`},
		{"forward bad expire", head + "  forward . 10.0.0.10 {\n    expire soon\n  }" + tail, `localdns.corefile:5: forward: expire: invalid duration "soon"`},
		{"forward bad health_check option", head + "  forward . 10.0.0.10 {\n    health_check 1s often\n  }" + tail, `localdns.corefile:5: forward: health_check: unknown option "often"`},
		{"forward force_tcp argument", head + "  forward . 10.0.0.10 {\n    force_tcp yes\n  }" + tail, "localdns.corefile:5: forward: force_tcp: takes no arguments"},
		{"forward bad protocol", head + "  forward . https://1.1.1.1" + tail, `localdns.corefile:4: forward: "https" is not supported as a destination protocol: https://1.1.1.1`},
		{"forward bad port", head + "  forward . 10.0.0.10:dns" + tail, `localdns.corefile:4: forward: invalid port in "10.0.0.10:dns"`},
		{"forward empty target", head + "  forward . dns://" + tail, `localdns.corefile:4: forward: invalid address: "dns://"`},
		{"forward unknown option", head + "  forward . 10.0.0.10 {\n    warp_speed 9\n  }" + tail, "localdns.corefile:5: forward: unknown property 'warp_speed'"},
		{"forward extra argument", head + "  forward . 10.0.0.10 {\n    policy sequential now\n  }" + tail, "localdns.corefile:5: forward: unknown property 'now'"},
		{"forward not an address", head + "  forward . 10.0.0.300" + tail, `localdns.corefile:4: forward: not an IP address or file: "10.0.0.300"`},
		{"forward to its own listener, with loop", ".:53 {\n  bind 169.254.10.10\n  forward . 169.254.10.10\n  loop\n}\n", "localdns.corefile:3: forward: target 169.254.10.10:53 is this block's own listener: CoreDNS's loop plugin detects the loop and stops CoreDNS"},
		{"forward to its own listener through a wildcard", ".:53 {\n  bind 0.0.0.0\n  forward . 127.0.0.1\n  loop\n}\n", "localdns.corefile:3: forward: target 127.0.0.1:53 is this block's own listener: CoreDNS's loop plugin detects the loop and stops CoreDNS"},
		{"forward too many targets", head + "  forward ." + strings.Repeat(" 10.0.0.1", 16) + tail, "localdns.corefile:4: forward: more than 15 TOs configured: 16"},

		// nsid.
		{"nsid twice", head + "  nsid a\n  nsid b" + tail, "localdns.corefile:5: nsid: can only be used once per server block"},
		{"nsid with a block", head + "  nsid a {\n  }" + tail, `localdns.corefile:4: nsid: unexpected "{"`},

		// Two blocks for one zone on one address, which CoreDNS refuses.
		{"duplicate zone", ".:53 {\n}\n.:53 {\n  bind 169.254.10.11\n}\n", "localdns.corefile:3: zone . on 169.254.10.11:53 is already served by the block at localdns.corefile:1"},
		{"duplicate key", "cluster.local cluster.local:53 {\n}\n", "localdns.corefile:1: zone cluster.local. on port 53 is already served by the block at localdns.corefile:1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("localdns.corefile", strings.NewReader(tt.text), []netip.AddrPort{podListener})
			if err == nil {
				t.Fatalf("no error, want %q", tt.want)
			}
			if err.Error() != tt.want {
				t.Errorf("error:\n got %q\nwant %q", err, tt.want)
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Errorf("error %T is not an *Error", err)
			}
		})
	}
}
