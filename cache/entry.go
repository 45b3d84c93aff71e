package cache

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/miekg/dns"

	"github.com/dnsstandby/dnsstandby/wire"
)

// entry is one cached response. data holds, in one allocation:
//
//	key | message | TTL offsets (uint16 each)
//
// The message is the response as sent to a client without EDNS: header,
// question, answer, authority and additional sections, OPT removed. The
// offsets point at every RR's TTL field so that a hit patches them without
// parsing. data is never modified after the entry is built.
type entry struct {
	data  []byte
	klen  uint16
	mlen  uint16
	ttl   uint32 // the TTL every RR is served with when fresh, before aging
	flags uint8
	// sum is the mirrored reply's content sum (mirrorFacts), to tell a
	// repeat from a change without unpacking; 0 for entries from
	// elsewhere. Beside flags it fills what was padding.
	sum    uint32
	stored int64 // unix nanoseconds when inserted (wall clock: survives snapshots)
	used   int64 // unix nanoseconds when last moved to the front of the LRU
	fresh  int64 // unix nanoseconds until which the entry is fresh
}

const (
	entryError uint8 = 1 << 0 // a cached failure (SERVFAIL): never served stale
	// entryProbation marks a mirrored entry no client has been seen to use
	// (Config.ProbationPercent).
	entryProbation uint8 = 1 << 1
)

// entryOverhead estimates the memory an entry costs beyond its data: the
// LRU list element holding the entry by value (~112 B) and its map slot
// (~40 B including load-factor slack). Measured by BenchmarkBytesPerEntry.
const entryOverhead = 160

func (e *entry) key() []byte { return e.data[:e.klen] }
func (e *entry) msg() []byte { return e.data[e.klen : int(e.klen)+int(e.mlen)] }
func (e *entry) ttlOffsets() []byte {
	return e.data[int(e.klen)+int(e.mlen):]
}
func (e *entry) cost() int64   { return int64(len(e.data)) + entryOverhead }
func (e *entry) isError() bool { return e.flags&entryError != 0 }
func (e *entry) questionLen() int {
	// The key is the lower-cased question name plus keySuffixLen bytes,
	// and the stored question is that name plus type and class.
	return int(e.klen) - keySuffixLen + 4
}

// buildEntry lays out key, msg and the TTL offsets found by walking msg.
// It fails if msg is not a well-formed message whose question matches key;
// this is also how a snapshot's entries are checked on load.
func buildEntry(key, msg []byte) (entry, error) {
	if len(msg) > 0xffff || len(key) > maxKeyLen {
		return entry{}, errors.New("entry too large")
	}
	offs, err := ttlOffsets(msg, nil)
	if err != nil {
		return entry{}, err
	}
	// Whatever is stored must unpack for the client. Re-packing a parsed
	// message is not always faithful (miekg/dns unpacks an SOA with empty
	// RDATA but packs it back unreadable), so check the bytes themselves.
	var check dns.Msg
	if err := check.Unpack(msg); err != nil {
		return entry{}, fmt.Errorf("stored message does not unpack: %w", err)
	}
	qlen := len(key) - keySuffixLen + 4
	if len(key) <= keySuffixLen || len(msg) < wire.HeaderLen+qlen {
		return entry{}, errors.New("message too short for its key")
	}
	var lower [wire.MaxNameLen]byte
	name := msg[wire.HeaderLen : wire.HeaderLen+qlen-4]
	n := wire.LowerName(lower[:], name)
	if string(lower[:n]) != string(key[:len(key)-keySuffixLen]) ||
		string(msg[wire.HeaderLen+qlen-4:wire.HeaderLen+qlen]) != string(key[len(key)-keySuffixLen:len(key)-1]) {
		return entry{}, errors.New("message question does not match key")
	}
	data := make([]byte, 0, len(key)+len(msg)+2*len(offs))
	data = append(data, key...)
	data = append(data, msg...)
	for _, o := range offs {
		data = binary.BigEndian.AppendUint16(data, o)
	}
	return entry{data: data, klen: uint16(len(key)), mlen: uint16(len(msg))}, nil
}

// ttlOffsets appends the offset of every RR's TTL field in msg to offs.
// msg must have exactly one question, with an uncompressed name.
func ttlOffsets(msg []byte, offs []uint16) ([]uint16, error) {
	if len(msg) < wire.HeaderLen || binary.BigEndian.Uint16(msg[4:]) != 1 {
		return nil, errors.New("message must have exactly one question")
	}
	rrs := int(binary.BigEndian.Uint16(msg[6:])) + int(binary.BigEndian.Uint16(msg[8:])) +
		int(binary.BigEndian.Uint16(msg[10:]))
	off, err := wire.SkipName(msg, wire.HeaderLen)
	if err != nil || off+4 > len(msg) {
		return nil, fmt.Errorf("question: %w", wire.ErrFormat)
	}
	off += 4
	for i := 0; i < rrs; i++ {
		next, ttlOff, err := wire.SkipRR(msg, off)
		if err != nil {
			return nil, fmt.Errorf("record %d: %w", i, err)
		}
		if binary.BigEndian.Uint16(msg[ttlOff-4:]) == wire.TypeOPT {
			return nil, errors.New("stored message must not carry OPT")
		}
		offs = append(offs, uint16(ttlOff))
		off = next
	}
	if off != len(msg) {
		return nil, errors.New("trailing bytes after last record")
	}
	return offs, nil
}
