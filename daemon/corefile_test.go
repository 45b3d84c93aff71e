package daemon

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/dnsstandby/dnsstandby/cache"
	"github.com/dnsstandby/dnsstandby/corefile"
)

// TestApplyCorefile reads the Corefile AgentBaker renders, for each
// listener, and holds what the daemon takes from it and what it says it
// does not imitate.
func TestApplyCorefile(t *testing.T) {
	pod := []string{
		"169.254.10.11:53 health-check.localdns.local. [] tcp=false conc=0",
		"169.254.10.11:53 cluster.local. [10.0.0.10:53] tcp=true conc=1000",
		"169.254.10.11:53 testdomain567.com. [168.63.129.16:53] tcp=false conc=1000",
		"169.254.10.11:53 . [10.0.0.10:53] tcp=false conc=1000",
	}
	node := []string{
		"169.254.10.10:53 health-check.localdns.local. [] tcp=false conc=0",
		"169.254.10.10:53 cluster.local. [10.0.0.10:53] tcp=true conc=1000",
		"169.254.10.10:53 testdomain456.com. [10.0.0.10:53] tcp=false conc=1000",
		"169.254.10.10:53 . [168.63.129.16:53] tcp=false conc=1000",
	}
	tests := []struct {
		listen      string   // comma-separated
		wantRoutes  []string // listener zone servers tcp max_concurrent
		wantIgnored []string // substrings, each in some line of Ignored
	}{
		{"169.254.10.11:53",
			pod,
			[]string{
				`nsid "localdns-pod"`,
				"cache capacity success 9984 denial 9984: dnsstandby bounds the two together, at most 19968 entries",
				"zone cluster.local.: cache without serve_stale: LocalDNS answers SERVFAIL when the upstreams fail"}},
		{"169.254.10.10:53",
			node,
			[]string{`nsid "localdns"`}},
		// Both listeners: each zone's block on its own address, the
		// blocks the Corefile orders (most specific zone first).
		{"169.254.10.10:53,169.254.10.11:53",
			[]string{node[0], pod[0], node[1], node[2], pod[1], pod[2], node[3], pod[3]},
			[]string{`nsid "localdns"`, `nsid "localdns-pod"`}},
	}
	for _, tt := range tests {
		t.Run(tt.listen, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Listen = nil
			for _, l := range strings.Split(tt.listen, ",") {
				cfg.Listen = append(cfg.Listen, netip.MustParseAddrPort(l))
			}
			s, err := corefile.Load("../corefile/testdata/agentbaker.corefile", cfg.Listen)
			if err != nil {
				t.Fatal(err)
			}
			ApplyCorefile(&cfg, s)
			var routes []string
			for _, r := range cfg.Routes {
				u := r.Upstream
				routes = append(routes, fmt.Sprintf("%s %s %v tcp=%v conc=%d", r.Listen, r.Zone, u.Servers, u.ForceTCP, u.MaxConcurrent))
				// The forward defaults AgentBaker leaves alone, as CoreDNS has them.
				if len(u.Servers) > 0 && u.MaxFails != 2 || u.HealthCheck != 500*time.Millisecond || u.ExpireTCP != 10*time.Second {
					t.Errorf("%s: max_fails %d health_check %s expire %s, want CoreDNS's 2, 500ms, 10s", r.Zone, u.MaxFails, u.HealthCheck, u.ExpireTCP)
				}
			}
			// The root blocks make answers of their own: AgentBaker's two
			// templates and its hosts file; the other blocks none.
			for _, r := range cfg.Routes {
				if r.Zone == "." {
					if len(r.Templates) != 2 || r.Hosts == nil || r.Hosts.File != "/etc/localdns/hosts" || r.Hosts.TTL != 5 {
						t.Errorf("%s .: %d templates, hosts %+v; want AgentBaker's 2 and /etc/localdns/hosts with ttl 5", r.Listen, len(r.Templates), r.Hosts)
					}
				} else if r.Zone == "health-check.localdns.local." {
					if !r.Whoami || len(r.Upstream.Servers) != 0 {
						t.Errorf("%s health check: whoami %v servers %v; want whoami alone", r.Listen, r.Whoami, r.Upstream.Servers)
					}
				} else if r.local() {
					t.Errorf("%s %s: answers of its own, want none", r.Listen, r.Zone)
				}
			}
			for _, imitated := range []string{"plugin hosts", "plugin template", "plugin whoami"} {
				if strings.Contains(strings.Join(cfg.Ignored, "\n"), imitated) {
					t.Errorf("Ignored lists %s, which is imitated", imitated)
				}
			}
			if strings.Join(routes, "\n") != strings.Join(tt.wantRoutes, "\n") {
				t.Errorf("routes\n%s\nwant\n%s", strings.Join(routes, "\n"), strings.Join(tt.wantRoutes, "\n"))
			}
			// Each block's own cache: AgentBaker's `cache 3600` with
			// success and denial 9984 and servfail 0 everywhere;
			// serve_stale 3600s verify in the root blocks, none in
			// cluster.local's; whoami's block has no cache.
			for _, r := range cfg.Routes {
				c := r.Cache
				if r.Whoami {
					if c != nil {
						t.Errorf("%s %s: whoami route with a cache", r.Listen, r.Zone)
					}
					continue
				}
				if c == nil {
					t.Errorf("%s %s: no cache policy", r.Listen, r.Zone)
					continue
				}
				if c.MaxEntries != 2*9984 || c.MaxTTL != time.Hour || c.MaxNegTTL != time.Hour || c.ServfailTTL != 0 {
					t.Errorf("%s %s: cache entries %d max ttl %s neg %s servfail %s; want 19968, 1h, 1h, 0", r.Listen, r.Zone, c.MaxEntries, c.MaxTTL, c.MaxNegTTL, c.ServfailTTL)
				}
				// cluster.local's block has no serve_stale: the daemon's
				// stale window, in verify mode, as a last resort.
				wantStale := DefaultConfig().Cache.MaxStale
				switch r.Zone {
				case ".":
					wantStale = time.Hour
				case "cluster.local.":
				default: // the custom zones: AgentBaker's test sets serve_stale on them
					continue
				}
				if c.MaxStale != wantStale || c.StaleMode != cache.StaleVerify && wantStale > 0 {
					t.Errorf("%s %s: serve stale %s %s, want %s verify", r.Listen, r.Zone, c.MaxStale, c.StaleMode, wantStale)
				}
			}
			all := strings.Join(cfg.Ignored, "\n")
			for _, want := range tt.wantIgnored {
				if !strings.Contains(all, want) {
					t.Errorf("Ignored lacks %q:\n%s", want, all)
				}
			}
			for _, quiet := range []string{"forward policy", "forward prefer_udp", "forward without prefer_udp", "forward failfast", "plugin errors", "plugin log", "plugin ready", "plugin prometheus", "plugin loop", "plugin forward", "plugin cache", "plugin bind"} {
				if strings.Contains(all, quiet) {
					t.Errorf("Ignored lists %q, which changes no answer or is imitated", quiet)
				}
			}
			for _, line := range cfg.Ignored {
				if !strings.Contains(line, "agentbaker.corefile:") {
					t.Errorf("line without its place in the Corefile: %s", line)
				}
			}
			if err := cfg.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
		})
	}
}

// TestApplyCorefileZeroDurations: CoreDNS accepts health_check 0 and
// expire 0; an upstream group cannot run with either, so the defaults
// stay and the difference is listed.
func TestApplyCorefileZeroDurations(t *testing.T) {
	const text = ".:53 {\n    bind 169.254.10.11\n    forward . 10.0.0.10 {\n        health_check 0s\n        expire 0s\n        max_fails 0\n    }\n}\n"
	s, err := corefile.Parse("zero", strings.NewReader(text), []netip.AddrPort{netip.MustParseAddrPort("169.254.10.11:53")})
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	ApplyCorefile(&cfg, s)
	def := NewRoute(".").Upstream
	u := cfg.Routes[0].Upstream
	if u.HealthCheck != def.HealthCheck || u.ExpireTCP != def.ExpireTCP || u.MaxFails != 0 {
		t.Errorf("health_check %s expire %s max_fails %d; want the defaults %s %s and max_fails 0 (never down)", u.HealthCheck, u.ExpireTCP, u.MaxFails, def.HealthCheck, def.ExpireTCP)
	}
	all := strings.Join(cfg.Ignored, "\n")
	for _, want := range []string{"zero:3: zone .: forward health_check 0", "zero:3: zone .: forward expire 0"} {
		if !strings.Contains(all, want) {
			t.Errorf("Ignored lacks %q:\n%s", want, all)
		}
	}
}

// TestApplyCorefileForwardKnobs: each route's upstream gets its block's
// policy, failfast_all_unhealthy_upstreams and health_check options.
func TestApplyCorefileForwardKnobs(t *testing.T) {
	tests := []struct {
		file, listen string
		want         map[string]string // zone: policy failfast health_check domain no_rec
	}{
		{"agentbaker.corefile", "169.254.10.11:53", map[string]string{
			"cluster.local.":     "round_robin false 500ms . false",
			"testdomain567.com.": "random false 500ms . false",
			".":                  "sequential false 500ms . false",
		}},
		{"agentbaker-health-check.corefile", "169.254.10.10:53", map[string]string{
			".": "sequential true 1s health.local. true",
		}},
		{"agentbaker-health-check.corefile", "169.254.10.11:53", map[string]string{
			".": "sequential false 2s . false",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.file+"/"+tt.listen, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Listen = []netip.AddrPort{netip.MustParseAddrPort(tt.listen)}
			s, err := corefile.Load("../corefile/testdata/"+tt.file, cfg.Listen)
			if err != nil {
				t.Fatal(err)
			}
			ApplyCorefile(&cfg, s)
			got := map[string]string{}
			for _, r := range cfg.Routes {
				if u := r.Upstream; len(u.Servers) > 0 {
					got[r.Zone] = fmt.Sprintf("%s %v %s %s %v", u.Policy, u.FailFast, u.HealthCheck, u.HealthCheckDomain, u.HealthCheckNoRec)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("routes' forward knobs\n got %v\nwant %v", got, tt.want)
			}
			for _, l := range cfg.Ignored {
				if strings.Contains(l, "forward policy") || strings.Contains(l, "failfast") || strings.Contains(l, "health_check") {
					t.Errorf("Ignored lists what is imitated: %s", l)
				}
			}
		})
	}
}
