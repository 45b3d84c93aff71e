package corefile

import (
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"
)

// forwardView is the forward part of a Zone.
type forwardView struct {
	Upstreams            []string
	Policy               string
	PreferUDP, ForceTCP  bool
	MaxConcurrent        int
	MaxFails             int
	HealthCheck, Expire  time.Duration
	HealthCheckNoRec     bool
	HealthCheckDomain    string
	FailfastAllUnhealthy bool
	Except               []string
	Line                 int
}

func viewForward(z *Zone) forwardView {
	v := forwardView{
		Policy: z.ForwardPolicy, PreferUDP: z.PreferUDP, ForceTCP: z.ForceTCP,
		MaxConcurrent: z.MaxConcurrent, MaxFails: z.MaxFails,
		HealthCheck: z.HealthCheck, Expire: z.Expire,
		HealthCheckNoRec: z.HealthCheckNoRec, HealthCheckDomain: z.HealthCheckDomain,
		FailfastAllUnhealthy: z.FailfastAllUnhealthy,
		Except:               z.ForwardExcept, Line: z.ForwardLine,
	}
	for _, u := range z.Upstreams {
		v.Upstreams = append(v.Upstreams, u.String())
	}
	return v
}

// defaultForward is CoreDNS 1.13.1's forward with nothing configured, on
// line 2 of the block.
func defaultForward(upstreams ...string) forwardView {
	return forwardView{
		Upstreams: upstreams, Policy: "random", MaxFails: 2,
		HealthCheck: 500 * time.Millisecond, Expire: 10 * time.Second, Line: 2,
	}
}

// TestForward checks forward parsing against CoreDNS 1.13.1's parseStanza.
func TestForward(t *testing.T) {
	tests := []struct {
		name  string
		zone  string // block key; "." when empty
		body  string // starts on line 2 of the block
		want  func(f *forwardView)
		notes []string
	}{
		{name: "one target, defaults", body: "forward . 10.0.0.10",
			want: func(f *forwardView) { *f = defaultForward("10.0.0.10:53") }},
		{name: "AgentBaker prefer_udp", body: "forward . 10.0.0.10 {\n  prefer_udp\n  policy sequential\n  max_concurrent 1000\n}",
			want: func(f *forwardView) {
				*f = defaultForward("10.0.0.10:53")
				f.PreferUDP, f.Policy, f.MaxConcurrent = true, "sequential", 1000
			}},
		{name: "AgentBaker force_tcp with health knobs", zone: "cluster.local",
			body: "forward . 10.0.0.10 {\n  force_tcp\n  policy round_robin\n  max_concurrent 1000\n  health_check 1s no_rec domain health.local.\n  failfast_all_unhealthy_upstreams\n}",
			want: func(f *forwardView) {
				*f = defaultForward("10.0.0.10:53")
				f.ForceTCP, f.Policy, f.MaxConcurrent = true, "round_robin", 1000
				f.HealthCheck, f.FailfastAllUnhealthy = time.Second, true
				f.HealthCheckNoRec, f.HealthCheckDomain = true, "health.local."
			}},
		{name: "health_check domain is normalized", body: "forward . 10.0.0.10 {\n  health_check 1s domain Health.Local\n}",
			want: func(f *forwardView) {
				*f = defaultForward("10.0.0.10:53")
				f.HealthCheck, f.HealthCheckDomain = time.Second, "health.local."
			}},
		{name: "health_check no_rec alone", body: "forward . 10.0.0.10 {\n  health_check 2s no_rec\n}",
			want: func(f *forwardView) {
				*f = defaultForward("10.0.0.10:53")
				f.HealthCheck, f.HealthCheckNoRec = 2*time.Second, true
			}},
		{name: "health_check domain before no_rec", body: "forward . 10.0.0.10 {\n  health_check 1s domain health.local no_rec\n}",
			want: func(f *forwardView) {
				*f = defaultForward("10.0.0.10:53")
				f.HealthCheck, f.HealthCheckNoRec, f.HealthCheckDomain = time.Second, true, "health.local."
			}},
		// CoreDNS sets its probe domain back to "." at each health_check,
		// and leaves no_rec as an earlier line set it.
		{name: "second health_check resets the domain, not no_rec", body: "forward . 10.0.0.10 {\n  health_check 1s no_rec domain health.local.\n  health_check 3s\n}",
			want: func(f *forwardView) {
				*f = defaultForward("10.0.0.10:53")
				f.HealthCheck, f.HealthCheckNoRec = 3*time.Second, true
			}},
		{name: "several targets keep their order", body: "forward . 10.224.0.5 10.224.0.4:5353 dns://10.0.0.10 dns://10.0.0.11:1053",
			want: func(f *forwardView) {
				*f = defaultForward("10.224.0.5:53", "10.224.0.4:5353", "10.0.0.10:53", "10.0.0.11:1053")
			}},
		{name: "IPv6 targets", body: "forward . fd00::10 [fd00::11]:5353 dns://fd00::12",
			want: func(f *forwardView) {
				*f = defaultForward("[fd00::10]:53", "[fd00::11]:5353", "[fd00::12]:53")
			}},
		{name: "IPv4-mapped target is unmapped", body: "forward . ::ffff:10.0.0.10",
			want: func(f *forwardView) { *f = defaultForward("10.0.0.10:53") }},
		{name: "TLS and file targets are skipped", body: "forward . tls://1.1.1.1 testdata/resolv.conf 10.0.0.10 {\n  tls_servername cloudflare-dns.com\n}",
			want: func(f *forwardView) { *f = defaultForward("10.0.0.10:53") },
			notes: []string{
				`test.corefile:2: forward: DNS-over-TLS target "tls://1.1.1.1" not used`,
				`test.corefile:2: forward: target "testdata/resolv.conf" is a resolv.conf file (2 servers); not used`,
			}},
		{name: "only a resolv.conf", body: "forward . testdata/resolv.conf",
			want: func(f *forwardView) { *f = defaultForward() },
			notes: []string{
				`test.corefile:2: forward: target "testdata/resolv.conf" is a resolv.conf file (2 servers); not used`,
			}},
		{name: "FROM equal to the zone", zone: "cluster.local", body: "forward cluster.local 10.0.0.10",
			want: func(f *forwardView) { *f = defaultForward("10.0.0.10:53") }},
		{name: "narrower FROM is not the zone's forward", body: "forward example.org 10.9.9.9\nforward . 10.0.0.10",
			want: func(f *forwardView) {
				*f = defaultForward("10.0.0.10:53")
				f.Line = 3
			},
			notes: []string{`test.corefile:2: forward example.org.: not used: it does not cover the whole zone`}},
		{name: "second whole-zone forward is not reached", body: "forward . 10.0.0.10\nforward . 10.0.0.11",
			want:  func(f *forwardView) { *f = defaultForward("10.0.0.10:53") },
			notes: []string{`test.corefile:3: forward .: not used: an earlier forward covers the zone`}},
		{name: "no forward", body: "whoami", want: func(f *forwardView) {}},
		{name: "except", body: "forward . 10.0.0.10 {\n  except internal.cloudapp.net Reddog.Microsoft.com\n}",
			want: func(f *forwardView) {
				*f = defaultForward("10.0.0.10:53")
				f.Except = []string{"internal.cloudapp.net.", "reddog.microsoft.com."}
			}},
		{name: "max_fails expire health_check", body: "forward . 10.0.0.10 {\n  max_fails 0\n  expire 30s\n  health_check 2s\n}",
			want: func(f *forwardView) {
				*f = defaultForward("10.0.0.10:53")
				f.MaxFails, f.Expire, f.HealthCheck = 0, 30*time.Second, 2*time.Second
			}},
		{name: "options that do not matter to dnsstandby are accepted", body: "forward . 10.0.0.10 {\n  next NXDOMAIN\n  failover SERVFAIL\n  tls cert key ca\n}",
			want: func(f *forwardView) { *f = defaultForward("10.0.0.10:53") }},
		{name: "an option's extra argument is read as the next option", body: "forward . 10.0.0.10 {\n  policy sequential prefer_udp\n}",
			want: func(f *forwardView) {
				*f = defaultForward("10.0.0.10:53")
				f.Policy, f.PreferUDP = "sequential", true
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := tt.zone
			if key == "" {
				key = "."
			}
			s := parseText(t, key+" {\n"+tt.body+"\n}\n")
			var want forwardView
			tt.want(&want)
			got := viewForward(&s.Zones[0])
			if !equalValue(got.Upstreams, want.Upstreams) || !equalValue(got.Except, want.Except) {
				t.Errorf("upstreams %v except %v, want %v %v", got.Upstreams, got.Except, want.Upstreams, want.Except)
			}
			got.Upstreams, got.Except, want.Upstreams, want.Except = nil, nil, nil, nil
			if !reflect.DeepEqual(got, want) {
				t.Errorf("forward:\n got %+v\nwant %+v", got, want)
			}
			var notes []string
			for _, n := range s.Notes {
				notes = append(notes, n.String())
			}
			if !slices.Equal(notes, tt.notes) {
				t.Errorf("notes = %q, want %q", notes, tt.notes)
			}
		})
	}
}

// TestForwardPerZone checks a block with several keys: each zone gets the
// first forward that covers all of it.
func TestForwardPerZone(t *testing.T) {
	s := parseText(t, ". example.org {\n  forward example.org 10.9.9.9\n  forward . 10.0.0.10\n}\n")
	if got := zone(t, s, "example.org.").Upstreams; len(got) != 1 || got[0].String() != "10.9.9.9:53" {
		t.Errorf("example.org. upstreams = %v", got)
	}
	if got := zone(t, s, ".").Upstreams; len(got) != 1 || got[0].String() != "10.0.0.10:53" {
		t.Errorf(". upstreams = %v", got)
	}
	if len(s.Notes) != 0 {
		t.Errorf("notes = %v", s.Notes)
	}
}

// TestForwardHealthKnobs reads AgentBaker's rendering of the forward
// health knobs: each listener's root zone keeps its health_check options
// and failfast_all_unhealthy_upstreams.
func TestForwardHealthKnobs(t *testing.T) {
	tests := []struct {
		listen netip.AddrPort
		want   func(f *forwardView)
	}{
		{nodeListener, func(f *forwardView) {
			*f = defaultForward("168.63.129.16:53")
			f.Policy, f.PreferUDP, f.MaxConcurrent, f.Line = "sequential", true, 1000, 33
			f.HealthCheck, f.HealthCheckNoRec, f.HealthCheckDomain = time.Second, true, "health.local."
			f.FailfastAllUnhealthy = true
		}},
		{podListener, func(f *forwardView) {
			*f = defaultForward("10.0.0.10:53")
			f.Policy, f.PreferUDP, f.MaxConcurrent, f.Line = "sequential", true, 1000, 63
			f.HealthCheck = 2 * time.Second
		}},
	}
	for _, tt := range tests {
		t.Run(tt.listen.String(), func(t *testing.T) {
			s, err := Load("testdata/agentbaker-health-check.corefile", []netip.AddrPort{tt.listen})
			if err != nil {
				t.Fatal(err)
			}
			got := viewForward(zone(t, s, "."))
			var want forwardView
			tt.want(&want)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("forward:\n got %+v\nwant %+v", got, want)
			}
		})
	}
}
