package tap

import (
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// cmsg appends one control message to ctl, as the kernel lays it out.
func cmsg(ctl []byte, level, typ int32, data []byte) []byte {
	b := make([]byte, unix.CmsgSpace(len(data)))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = level, typ
	h.SetLen(unix.CmsgLen(len(data)))
	copy(b[unix.CmsgLen(0):], data)
	return append(ctl, b...)
}

// TestRxTime parses the receive time out of control messages laid out by
// hand, without allocating, and finds none where there is none.
func TestRxTime(t *testing.T) {
	ts := unix.NsecToTimespec(1_700_000_000_123_456_789)
	tsBytes := unsafe.Slice((*byte)(unsafe.Pointer(&ts)), sizeofTimespec)
	stamp := cmsg(nil, unix.SOL_SOCKET, unix.SCM_TIMESTAMPNS, tsBytes)
	other := cmsg(nil, unix.SOL_PACKET, unix.PACKET_AUXDATA, make([]byte, 20))
	tests := []struct {
		name string
		ctl  []byte
		want int64 // 0: none
	}{
		{"timestamp", stamp, 1_700_000_000_123_456_789},
		{"after another message", append(append([]byte(nil), other...), stamp...), 1_700_000_000_123_456_789},
		{"before another message", append(append([]byte(nil), stamp...), other...), 1_700_000_000_123_456_789},
		{"none", nil, 0},
		{"another message only", other, 0},
		{"cut short", stamp[:len(stamp)-4], 0},
		{"header only", stamp[:unix.SizeofCmsghdr], 0},
		{"zero time", cmsg(nil, unix.SOL_SOCKET, unix.SCM_TIMESTAMPNS, make([]byte, sizeofTimespec)), 0},
		{"length below the header", func() []byte {
			b := append([]byte(nil), stamp...)
			(*unix.Cmsghdr)(unsafe.Pointer(&b[0])).SetLen(4)
			return b
		}(), 0},
	}
	for _, tt := range tests {
		at, ok := rxTime(tt.ctl)
		if ok != (tt.want != 0) || at != tt.want {
			t.Errorf("%s: %d %v, want %d", tt.name, at, ok, tt.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { rxTime(stamp) }); n != 0 {
		t.Errorf("rxTime allocates %v times", n)
	}
}
