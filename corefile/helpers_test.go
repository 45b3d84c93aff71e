package corefile

import (
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The LocalDNS listeners (AgentBaker localdns.sh).
var (
	podListener  = netip.MustParseAddrPort("169.254.10.11:53")
	nodeListener = netip.MustParseAddrPort("169.254.10.10:53")
	podAddr      = podListener.Addr()
	nodeAddr     = nodeListener.Addr()
)

// parseText parses a literal Corefile named "test.corefile".
func parseText(t *testing.T, text string, listen ...netip.AddrPort) Settings {
	t.Helper()
	if len(listen) == 0 {
		listen = []netip.AddrPort{podListener}
	}
	s, err := Parse("test.corefile", strings.NewReader(text), listen)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return s
}

// zone returns the zone named name on port 53, failing the test if absent.
func zone(t *testing.T, s Settings, name string) *Zone {
	t.Helper()
	for i := range s.Zones {
		if s.Zones[i].Name == name {
			return &s.Zones[i]
		}
	}
	t.Fatalf("no zone %q in %v", name, zoneNames(s))
	return nil
}

func zoneNames(s Settings) []string {
	var names []string
	for _, z := range s.Zones {
		names = append(names, z.Name)
	}
	return names
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func addrPorts(ss ...string) []netip.AddrPort {
	var out []netip.AddrPort
	for _, s := range ss {
		out = append(out, netip.MustParseAddrPort(s))
	}
	return out
}

// defaultCache is CoreDNS 1.13.1's cache with nothing configured.
func defaultCache(line int) *Cache {
	return &Cache{
		MaxTTL: 3600 * time.Second, MaxNegTTL: 1800 * time.Second,
		MinTTL: 5 * time.Second, MinNegTTL: 5 * time.Second,
		SuccessCapacity: 9984, DenialCapacity: 9984,
		ServfailTTL: 5 * time.Second,
		Line:        line,
	}
}

// aksCache is the cache block AgentBaker writes, with serve_stale given
// as stale (0: none) and verify.
func aksCache(line int, stale time.Duration, verify bool) *Cache {
	return &Cache{
		MaxTTL: time.Hour, MaxNegTTL: time.Hour,
		MinTTL: 5 * time.Second, MinNegTTL: 5 * time.Second,
		SuccessCapacity: 9984, DenialCapacity: 9984,
		ServeStale: stale, StaleVerify: verify,
		Line: line,
	}
}

// withHostname makes a bare nsid answer name for the test's duration.
func withHostname(t *testing.T, name string) {
	t.Helper()
	old := hostname
	hostname = func() string { return name }
	t.Cleanup(func() { hostname = old })
}

// withInterfaces replaces the interface list for the test's duration.
func withInterfaces(t *testing.T, ifaces map[string][]netip.Addr) {
	t.Helper()
	old, oldHost := interfaceAddrs, hostAddrs
	interfaceAddrs = func(name string) ([]netip.Addr, bool) {
		a, ok := ifaces[name]
		return a, ok
	}
	hostAddrs = func() []netip.Addr {
		var all []netip.Addr
		for _, as := range ifaces {
			all = append(all, as...)
		}
		return all
	}
	t.Cleanup(func() { interfaceAddrs, hostAddrs = old, oldHost })
}

// equalZones compares zones field by field so a failure says which.
func equalZones(t *testing.T, got, want []Zone) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d zones %v, want %d", len(got), zoneNames(Settings{Zones: got}), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		gv, wv := reflect.ValueOf(g), reflect.ValueOf(w)
		for f := range gv.NumField() {
			name := gv.Type().Field(f).Name
			a, b := gv.Field(f).Interface(), wv.Field(f).Interface()
			if name == "Templates" {
				if gs, ws := templateSummary(g.Templates), templateSummary(w.Templates); gs != ws {
					t.Errorf("zone %d (%s) Templates:\n got %s\nwant %s", i, w.Name, gs, ws)
				}
				continue
			}
			if name == "Cache" {
				if (g.Cache == nil) != (w.Cache == nil) || g.Cache != nil && !reflect.DeepEqual(*g.Cache, *w.Cache) {
					t.Errorf("zone %d (%s) Cache:\n got %+v\nwant %+v", i, w.Name, deref(g.Cache), deref(w.Cache))
				}
				continue
			}
			if !equalValue(a, b) {
				t.Errorf("zone %d (%s) %s = %v, want %v", i, w.Name, name, a, b)
			}
		}
	}
}

// equalValue is reflect.DeepEqual with nil and empty slices equal.
func equalValue(a, b any) bool {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	if va.Kind() == reflect.Slice && va.Len() == 0 && vb.Len() == 0 {
		return true
	}
	return reflect.DeepEqual(a, b)
}

func deref(c *Cache) any {
	if c == nil {
		return nil
	}
	return *c
}

// templateSummary writes what a test can state of template stanzas: the
// zones, the rcode, the fallthrough zones and the line of each.
func templateSummary(ts []Template) string {
	var b strings.Builder
	for _, t := range ts {
		fmt.Fprintf(&b, "{zones %v rcode %d fallthrough %v line %d} ", t.Zones, t.Rcode, t.Fallthrough, t.Line)
	}
	return b.String()
}
