package tap

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"testing"
)

// TestConsumerAhead reads records laid out as the kernel writes them into
// plain memory: fn gets each committed record in order, a discarded one
// is skipped, a busy one ends the read, and ahead is shown each record
// before fn gets the one before it.
func TestConsumerAhead(t *testing.T) {
	const size = 256
	type rec struct {
		data  string
		flags uint32
	}
	ring := []rec{{"a", 0}, {"bb", ringDiscardBit}, {"ccc", 0}, {"dddd", 0}, {"eeeee", ringBusyBit}}
	for _, tc := range []struct {
		name  string
		ahead bool
		want  []string
	}{
		{"fn only", false, []string{"fn a", "fn ccc", "fn dddd"}},
		{"one ahead", true, []string{"ahead a", "ahead ccc", "fn a", "ahead dddd", "fn ccc", "fn dddd"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cons, prod uint64
			c := &consumer{cons: &cons, prod: &prod, data: make([]byte, 2*size), size: size}
			var busyAt uint64
			for _, r := range ring {
				if r.flags&ringBusyBit != 0 {
					busyAt = prod
				}
				binary.NativeEndian.PutUint32(c.data[prod:], uint32(len(r.data))|r.flags)
				copy(c.data[prod+ringHeaderSize:], r.data)
				prod += (ringHeaderSize + uint64(len(r.data)) + 7) &^ 7
			}
			var got []string
			var ahead func([]byte)
			if tc.ahead {
				ahead = func(b []byte) { got = append(got, "ahead "+string(b)) }
			}
			n := c.each(func(b []byte) { got = append(got, "fn "+string(b)) }, ahead)
			if !slices.Equal(got, tc.want) || n != 3 {
				t.Errorf("each = %d calls %q, want 3 records, calls %q", n, got, tc.want)
			}
			if cons != busyAt {
				t.Errorf("consumer position %d, want %d (at the busy record)", cons, busyAt)
			}
		})
	}
}

// TestPrefetchRecord: Config.Prefetch is shown a reply record's DNS
// payload, and nothing else.
func TestPrefetchRecord(t *testing.T) {
	payload := dnsReply(t, "a.example")
	record := func(kind uint32, pkt []byte, whole int) []byte {
		b := make([]byte, recHeader, recHeader+len(pkt))
		binary.NativeEndian.PutUint32(b[recLen:], uint32(whole))
		binary.NativeEndian.PutUint32(b[recKind:], kind)
		return append(b, pkt...)
	}
	rep := reply(netip.AddrPortFrom(localDNS, 53), payload)
	for _, tc := range []struct {
		name string
		rec  []byte
		want bool
	}{
		{"reply", record(recordReply, rep, len(rep)), true},
		{"IPv6 reply", record(recordReply, reply(netip.AddrPortFrom(localDNS6, 53), payload), len(rep)+20), true},
		{"query", record(recordQuery, query(netip.AddrPortFrom(localDNS, 53), dnsQuery(t, "a.example")), len(rep)), false},
		{"wake", record(recordWake, nil, 0), false},
		{"cut to its size class", record(recordReply, rep, len(rep)+1), false},
		{"not a UDP packet", record(recordReply, rep[:10], 10), false},
		{"short header", record(recordReply, rep, len(rep))[:recHeader-1], false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var shown [][]byte
			tp := &Tap{ahead: func(b []byte) { shown = append(shown, b) }}
			tp.prefetchRecord(tc.rec)
			switch {
			case !tc.want && len(shown) != 0:
				t.Errorf("shown %d payloads, want none", len(shown))
			case tc.want && (len(shown) != 1 || string(shown[0]) != string(payload)):
				t.Errorf("shown %s, want the reply's DNS payload once", fmt.Sprint(shown))
			}
		})
	}
}
