package corefile_test

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/dnsstandby/dnsstandby/corefile"
)

// Read the pod listener's settings from a LocalDNS Corefile and pick the
// zone for a query.
func Example() {
	const localdns = `
.:53 {
    errors
    bind 169.254.10.11
    forward . 10.0.0.10 {
        prefer_udp
        policy sequential
        max_concurrent 1000
    }
    cache 3600 {
        success 9984
        denial 9984
        serve_stale 72000s verify
        servfail 0
    }
    nsid localdns-pod
}
cluster.local:53 {
    bind 169.254.10.11
    forward . 10.0.0.10 {
        force_tcp
    }
    cache 3600
}
`
	pods := netip.MustParseAddrPort("169.254.10.11:53")
	s, err := corefile.Parse("localdns.corefile", strings.NewReader(localdns), []netip.AddrPort{pods})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, qname := range []string{"kubernetes.default.svc.cluster.local.", "mcr.microsoft.com."} {
		z := s.ZoneForAddr(pods, qname)
		fmt.Printf("%s -> zone %s line %d: upstreams %v force_tcp=%v\n", qname, z.Name, z.Line, z.Upstreams, z.ForceTCP)
	}
	root := s.ZoneFor(".")
	fmt.Printf("stale %v verify=%v servfail %v max %v nsid %q\n",
		root.Cache.ServeStale, root.Cache.StaleVerify, root.Cache.ServfailTTL, root.Cache.MaxTTL, root.NSID)

	_, err = corefile.Parse("localdns.corefile", strings.NewReader(".:53 {\n  cache 3600 {\n    serve_stale x\n  }\n}\n"), []netip.AddrPort{pods})
	fmt.Println(err)
	// Output:
	// kubernetes.default.svc.cluster.local. -> zone cluster.local. line 18: upstreams [10.0.0.10:53] force_tcp=true
	// mcr.microsoft.com. -> zone . line 2: upstreams [10.0.0.10:53] force_tcp=false
	// stale 20h0m0s verify=true servfail 0s max 1h0m0s nsid "localdns-pod"
	// localdns.corefile:3: cache: serve_stale: invalid duration "x"
}
