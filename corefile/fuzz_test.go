package corefile

import (
	"bytes"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// FuzzParse feeds arbitrary Corefiles to Parse. Nothing may panic; an
// error must be an *Error or ErrNoServerBlock, and what Parse returns must
// hold together.
func FuzzParse(f *testing.F) {
	files, err := filepath.Glob("testdata/*.corefile")
	if err != nil {
		f.Fatal(err)
	}
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{
		".:53 {\n  bind 169.254.10.11\n  forward . 10.0.0.10 {\n    force_tcp\n  }\n  cache 30 {\n    serve_stale 1h verify\n  }\n  nsid\n}\n",
		"cluster.local in-addr.arpa 10.0.0.0/22 fd00::/62:53 dns://ip6.arpa {\n  bind 169.254.10.10 169.254.10.11 {\n    except 169.254.10.10\n  }\n}\n",
		"(snip) {\n  cache {\n    success 10 20 3\n    denial 10 20 3\n    prefetch 3 1m 50%\n    disable denial example.org\n    keepttl\n  }\n}\n. {\n  \n}\n",
		".:53\nforward example.org tls://1.1.1.1 [::1]:53 ::1 {\n  except a.example.org\n  health_check 1s no_rec domain x.\n}\nforward . /etc/resolv.conf\n",
		"tls://.:53 {\n}\n.:53 .:53 {\n}\n",
		"{$HOME} {\n  {$PATH}\n}\n",
	} {
		f.Add([]byte(s))
	}
	listen := []netip.AddrPort{podListener, nodeListener, netip.MustParseAddrPort("[fd00::11]:53")}
	f.Fuzz(func(t *testing.T, data []byte) {
		if bytes.Contains(data, []byte("import")) {
			// import reads the file system (a glob, /dev/zero...), which a
			// fuzzer should not drive.
			return
		}
		s, err := Parse("fuzz.corefile", bytes.NewReader(data), listen)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) && !errors.Is(err, ErrNoServerBlock) {
				t.Fatalf("error %T %v is neither *Error nor ErrNoServerBlock", err, err)
			}
			return
		}
		if len(s.Zones) == 0 {
			t.Fatal("no zones and no error")
		}
		for i, z := range s.Zones {
			if z.Name != strings.ToLower(dns.Fqdn(z.Name)) {
				t.Fatalf("zone name %q not fully qualified lower case", z.Name)
			}
			serves := false
			for _, ap := range listen {
				serves = serves || z.Serves(ap)
			}
			if !serves {
				t.Fatalf("zone %s (bind %v port %d) serves no listen address", z.Name, z.Bind, z.Port)
			}
			if i > 0 && dns.CountLabel(z.Name) > dns.CountLabel(s.Zones[i-1].Name) {
				t.Fatalf("zones not most specific first: %s after %s", z.Name, s.Zones[i-1].Name)
			}
			if z.Cache != nil && (z.Cache.SuccessCapacity < 1024 || z.Cache.MaxTTL <= 0 || z.Cache.ServeStale < 0) {
				t.Fatalf("cache out of range: %+v", *z.Cache)
			}
			if len(z.Upstreams) > maxUpstreams {
				t.Fatalf("%d upstreams", len(z.Upstreams))
			}
			if got := s.ZoneFor(z.Name); got == nil || got.Name != z.Name {
				t.Fatalf("ZoneFor(%s) = %v", z.Name, got)
			}
			s.ZoneForAddr(podListener, "x."+z.Name)
		}
	})
}
