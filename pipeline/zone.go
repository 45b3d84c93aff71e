package pipeline

import (
	"strings"

	"golang.org/x/net/publicsuffix"
)

// fetchZone returns the zone whose servers a resolution of name waits on,
// as far as a forwarder can tell without asking: the name's registrable
// domain (its public suffix and one label more: example.com for
// www.example.com, example.co.uk for a.b.example.co.uk; for a TLD the
// public suffix list does not know, such as `local` or `test`, its last
// label is the suffix), or the route's zone if that is longer, since a
// route's zone is served by the route's own upstreams (cluster.local by
// kube-dns). The resolutions of the names under one fetch zone share its
// cap (Config.MaxPerZone), as BIND's fetches-per-zone makes the names
// under one zone cut share theirs: a random-subdomain flood draws every
// name from under one registrable domain, whose servers are the ones it
// makes slow.
//
// name is a flight key's name (wire format, lower case); zoneLen is the
// length of the route's zone in wire format. The result is a suffix of
// name, so it costs no copy to keep.
func fetchZone(name string, zoneLen int) string {
	var offs [128]int // label starts; a name has at most 127 labels
	labels := 0
	for off := 0; off < len(name) && name[off] != 0 && labels < len(offs); off += int(name[off]) + 1 {
		offs[labels] = off
		labels++
	}
	keep := len(name) // the root, a public suffix, or its registrable domain: all of it
	if labels > 0 {
		if n := strings.Count(suffix(name, offs[:labels]), ".") + 1; labels > n+1 {
			keep = len(name) - offs[labels-n-1]
		}
	}
	keep = max(keep, min(zoneLen, len(name)))
	return name[len(name)-keep:]
}

// suffix returns the public suffix of the wire-format name whose labels
// start at offs. A dot inside a label is read as another character, so
// that the suffix counts as many labels as the name has there.
func suffix(name string, offs []int) string {
	var b strings.Builder
	b.Grow(len(name))
	for i, off := range offs {
		if i > 0 {
			b.WriteByte('.')
		}
		for _, c := range []byte(name[off+1 : off+1+int(name[off])]) {
			if c == '.' {
				c = '_'
			}
			b.WriteByte(c)
		}
	}
	s, _ := publicsuffix.PublicSuffix(b.String())
	return s
}
