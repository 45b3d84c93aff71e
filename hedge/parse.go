package hedge

import (
	"encoding/binary"

	"github.com/dnsstandby/dnsstandby/wire"
)

// parseQuestion checks msg's header and single question and returns the
// offset just past the question. Every byte comes from a pod, so bounds
// are strict: a query must be QR=0 with opcode QUERY, a reply QR=1; QDCOUNT
// must be 1; labels at most 63 bytes, the name at most 255, no compression
// pointer (nothing precedes a question to point at, and LocalDNS echoes
// the query's question byte for byte). wire.ParseQuery would read the
// whole message (its additional section too) and takes no replies; the
// key needs only this.
func parseQuestion(msg []byte, reply bool) (end int, ok bool) {
	if len(msg) < wire.HeaderLen {
		return 0, false
	}
	flags := binary.BigEndian.Uint16(msg[2:])
	if reply {
		if flags&wire.FlagQR == 0 {
			return 0, false
		}
	} else if flags&wire.FlagQR != 0 || flags&(0xf<<11) != 0 {
		return 0, false
	}
	if binary.BigEndian.Uint16(msg[4:]) != 1 {
		return 0, false
	}
	off := wire.HeaderLen
	for {
		if off >= len(msg) {
			return 0, false
		}
		l := int(msg[off])
		off += 1 + l
		if off-wire.HeaderLen > wire.MaxNameLen {
			return 0, false
		}
		if l == 0 {
			break
		}
		if l > 63 { // a pointer or an extended label type
			return 0, false
		}
	}
	if off+4 > len(msg) {
		return 0, false
	}
	return off + 4, true
}
