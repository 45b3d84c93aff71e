package main

import (
	"bytes"
	"flag"
	"regexp"
	"strings"
	"testing"

	"github.com/dnsstandby/dnsstandby/daemon"
)

// TestFlagErrorsNameFlags gives every flag of `dnsstandby run`, one at a
// time, values a setting may refuse, and checks that whatever refuses
// one (the flag's own parsing, or a part's Validate behind it) names the
// flag and no Go field. The flags come from the flag set, so a new flag
// is covered as soon as it is added: it must refuse one of these values,
// or be listed as taking any value.
func TestFlagErrorsNameFlags(t *testing.T) {
	candidates := []string{"x", "", "0", "-1", "0s", "-1s", "2h", "1025", "5000", "99999999", "0.0.0.0:53", strings.Repeat("n", 513), "/x"}
	// Flags every one of the candidates is a good value for (paths and
	// names are not checked until used), with why.
	anyValue := map[string]string{
		"localdns-corefile":    "a Corefile that cannot be read is refused into the fallback, exit 1, not an error of the flags",
		"localdns-coredns":     "a binary that cannot be run leaves the standard build",
		"fallback-resolv-conf": "a file that cannot be read gives no node resolvers",
		"admin-socket":         "a path, made at start",
		"lock-file":            "a path, made at start",
		"handover-from":        "a path, asked at start",
		"state-dir":            "a path, made at start",
	}
	cfg := daemon.DefaultConfig()
	fs, _ := runFlags(&cfg)
	names := newFlagNames(fs, &cfg)
	fs.VisitAll(func(f *flag.Flag) {
		t.Run(f.Name, func(t *testing.T) {
			named := regexp.MustCompile(`(^|[^a-z-])--?` + regexp.QuoteMeta(f.Name) + `([^a-z-]|$)`)
			refused := 0
			for _, v := range candidates {
				args := []string{"run", "--upstream", "10.0.0.10", "--state-dir", "", "--localdns-coredns", "", "--" + f.Name + "=" + v, "--validate"}
				var stdout, stderr bytes.Buffer
				if code := dispatch(args, &stdout, &stderr); code != exitConfig {
					continue
				}
				refused++
				msg := stderr.String()
				if !named.MatchString(msg) {
					t.Errorf("--%s=%.20q: error does not name the flag: %s", f.Name, v, msg)
				}
				for _, w := range regexp.MustCompile(`[A-Za-z][A-Za-z0-9]*`).FindAllString(msg, -1) {
					if names.fields[w] && w != strings.ToLower(w) {
						t.Errorf("--%s=%.20q: error names the Go field %s: %s", f.Name, v, w, msg)
					}
				}
				if strings.Count(strings.TrimSpace(msg), "\n") != 0 {
					t.Errorf("--%s=%.20q: error is not one line: %q", f.Name, v, msg)
				}
			}
			why, any := anyValue[f.Name]
			switch {
			case refused == 0 && !any:
				t.Errorf("--%s refuses none of %q: give the test a value it refuses, or list it as taking any", f.Name, candidates)
			case refused > 0 && any:
				t.Errorf("--%s refuses %d of the values, yet is listed as taking any (%s)", f.Name, refused, why)
			}
		})
	})
}

// TestFlagNames: the Go field names the parts' errors use, as written,
// become flags; names two flags share stay as they are.
func TestFlagNames(t *testing.T) {
	names := runFlagNames()
	tests := []struct{ in, want string }{
		{"daemon: Hedge: hedge: CacheMax must be 50ms to 1m0s, got 2m0s", "--hedge-cache-max must be 50ms to 1m0s, got 2m0s"},
		{"daemon: Responder: responder: Batch must be from 1 to 1024, got 5000", "--udp-batch must be from 1 to 1024, got 5000"},
		{"daemon: cache of zone . on 169.254.10.11:53: cache: MinTTL 2h0m0s is above MaxTTL 1h0m0s", "daemon: cache of zone . on 169.254.10.11:53: --cache-min-ttl 2h0m0s is above --cache-max-ttl 1h0m0s"},
		{"daemon: Takeover: takeover: Machine.HungAfter must be at least 1, got 0", "--hung-after must be at least 1, got 0"},
		{"daemon: Responder: responder: Listen[0] 0.0.0.0:53: want a specific address", "--listen 0.0.0.0:53: want a specific address"},
		{"daemon: Anchor: anchor: Kind \"/x\": not a kernel link kind", "--anchor-kind \"/x\": not a kernel link kind"},
		{"hedge: Rate must be above 0\nhedge: Burst must be 1 to 1e7", "--hedge-rate must be above 0; --hedge-rate must be 1 to 1e7"},
		// Kind alone: --anchor-kind's or --mirror's.
		{"Kind \"x\"", "Kind \"x\""},
		// No flag sets the HTTP limits.
		{"daemon: HTTP.MaxConns must be positive, got 0", "daemon: HTTP.MaxConns must be positive, got 0"},
		{"SERVFAIL and TC are not fields", "SERVFAIL and TC are not fields"},
		{"dnsstandby answers NSID with its own (Pipeline.NSID)", "dnsstandby answers NSID with its own (--nsid)"},
		// Words that are field names too, in prose and in paths.
		{"the Corefile is refused (open /nonexistent/Corefile: no such file)", "the Corefile is refused (open /nonexistent/Corefile: no such file)"},
		{"daemon: Mirror dnstap with 2 listen addresses", "--mirror dnstap with 2 listen addresses"},
		{"daemon: upstream for zone . on 169.254.10.11:53: upstream: Servers[1] 0.0.0.0:53: unspecified address", "daemon: upstream for zone . on 169.254.10.11:53: --upstream 0.0.0.0:53: unspecified address"},
		// The upstream's own timeout is set from --upstream-timeout, not
		// by --upstream.
		{"upstream: Timeout must be positive", "upstream: Timeout must be positive"},
	}
	for _, tt := range tests {
		if got := names.rename(tt.in); got != tt.want {
			t.Errorf("rename(%q)\n got %q\nwant %q", tt.in, got, tt.want)
		}
	}
}
