package cache

import (
	"encoding/binary"
	"hash/maphash"

	"github.com/dnsstandby/dnsstandby/wire"
)

// A key is the lower-cased wire-format question name followed by
// keySuffixLen bytes: qtype, qclass and a byte of key flags. This is
// CoreDNS's cache key (name, type, DO, CD) plus the class, which CoreDNS
// added in 1.14.7.
const (
	keySuffixLen = 5
	maxKeyLen    = wire.MaxNameLen + keySuffixLen

	keyDO byte = 1 << 0
	keyCD byte = 1 << 1
)

// putKey writes the key for (name, qtype, qclass, do, cd) into dst, which
// must hold maxKeyLen bytes, and returns its length.
func putKey(dst *[maxKeyLen]byte, name []byte, qtype, qclass uint16, do, cd bool) int {
	n := wire.LowerName(dst[:], name)
	binary.BigEndian.PutUint16(dst[n:], qtype)
	binary.BigEndian.PutUint16(dst[n+2:], qclass)
	var f byte
	if do {
		f |= keyDO
	}
	if cd {
		f |= keyCD
	}
	dst[n+4] = f
	return n + keySuffixLen
}

// queryKey writes the key a query is looked up under.
func queryKey(dst *[maxKeyLen]byte, q *wire.Query) int {
	return putKey(dst, q.QName, q.QType, q.QClass, q.DO, q.Flags&wire.FlagCD != 0)
}

func (c *Cache) hash(key []byte) uint64 { return maphash.Bytes(c.seed, key) }
