package handover

import (
	"bytes"
	"encoding/binary"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// pair returns the two ends of a connected unix stream socket, as the
// admin socket gives them.
func pair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "pair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// openFDs counts this process's open descriptors, to see that a refused
// offer leaves none behind.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func offerBytes(t *testing.T, h OfferHeader) []byte {
	t.Helper()
	b, err := encodeOffer(h)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func raw(magic string, body string) []byte {
	b := binary.BigEndian.AppendUint16([]byte(magic), uint16(len(body)))
	return append(b, body...)
}

// TestParseOfferHostile: every malformed offer is refused, with every
// descriptor that came with it closed.
func TestParseOfferHostile(t *testing.T) {
	good := OfferHeader{Version: offerVersion, PID: 42, Names: []string{"udp-169.254.10.11-53-0", CacheName}}
	long := strings.Repeat("x", MaxOfferHeader+1)
	tests := []struct {
		name string
		msg  []byte
		fds  int
		want string
	}{
		{"empty", nil, 2, "bad magic"},
		{"bad magic", raw("DSBYHAND", `{}`), 0, "bad magic"},
		{"length past the bytes", append(offerBytes(t, good)[:20], 0), 2, "header says"},
		{"bytes past the length", append(offerBytes(t, good), '}'), 2, "header says"},
		{"header over the bound", raw(offerMagic, long), 0, "over"},
		{"not JSON", raw(offerMagic, "{{{"), 2, "header"},
		{"unknown field", raw(offerMagic, `{"version":1,"pid":1,"names":[],"evil":1}`), 0, "unknown field"},
		{"two objects", raw(offerMagic, `{"version":1,"pid":1,"names":[]}{}`), 0, "after the JSON"},
		{"version", raw(offerMagic, `{"version":2,"pid":1,"names":[]}`), 0, "version 2"},
		{"pid zero", raw(offerMagic, `{"version":1,"pid":0,"names":[]}`), 0, "giver pid 0"},
		{"fewer names than files", raw(offerMagic, `{"version":1,"pid":1,"names":["cache"]}`), 2, "1 names for 2 files"},
		{"more names than files", offerBytes(t, good), 1, "2 names for 1 files"},
		{"too many files", offerBytes(t, good), MaxOfferFiles + 1, "over"},
		{"cache twice", raw(offerMagic, `{"version":1,"pid":1,"names":["cache","cache"]}`), 2, "twice"},
		{"lock twice", raw(offerMagic, `{"version":1,"pid":1,"names":["lock","lock"]}`), 2, "twice"},
		{"unknown name", raw(offerMagic, `{"version":1,"pid":1,"names":["passwd"]}`), 1, "neither a socket"},
		{"name with a newline", raw(offerMagic, `{"version":1,"pid":1,"names":["udp-1\n"]}`), 1, "byte"},
		{"name too long", raw(offerMagic, `{"version":1,"pid":1,"names":["udp-`+strings.Repeat("1", maxName)+`"]}`), 1, "bytes"},
		{"refusal", []byte(`{"ok":false,"pid":7,"error":"a handover is under way"}` + "\n"), 0, "refused by the running process: a handover is under way"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := openFDs(t)
			var fds []int
			for range tt.fds {
				fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
				if err != nil {
					t.Fatal(err)
				}
				fds = append(fds, fd)
			}
			o, err := ParseOffer(tt.msg, fds)
			if err == nil {
				o.Close()
				t.Fatalf("ParseOffer accepted %q", tt.msg)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q, want it to say %q", err, tt.want)
			}
			if after := openFDs(t); after != before {
				t.Errorf("%d descriptors open after the refusal, %d before", after, before)
			}
		})
	}
}

// TestOfferRoundTrip: sockets, a cache file and a lock sent on one end
// arrive on the other as files of the same names, the sockets fit their
// addresses (Fits), and FromFiles takes them as it takes systemd's.
func TestOfferRoundTrip(t *testing.T) {
	udp := listen(t, "udp4", "127.0.0.1:0", true)
	tcp := listen(t, "tcp4", "127.0.0.1:0", true)
	ap, tap := localAddr(t, udp), localAddr(t, tcp)
	cache, _, err := WriteCaches(os.Getpid(), 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Close()
	lock, err := os.Create(filepath.Join(t.TempDir(), "lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}

	giver, taker := pair(t)
	names := []string{SocketName(ap, true, 0), SocketName(tap, false, 0), CacheName, LockName}
	fds := []int{int(udp.Fd()), int(tcp.Fd()), int(cache.Fd()), int(lock.Fd())}
	if err := SendOffer(giver, 1234, names, fds); err != nil {
		t.Fatal(err)
	}
	o, err := ReadOffer(taker)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if o.PID != 1234 || len(o.Files) != 4 {
		t.Fatalf("offer from %d with %d files, want 1234 and 4", o.PID, len(o.Files))
	}
	for i, f := range o.Files {
		if f.Name() != names[i] {
			t.Errorf("file %d named %q, want %q", i, f.Name(), names[i])
		}
	}
	if err := Fits(int(o.Files[0].Fd()), ap, true); err != nil {
		t.Errorf("UDP socket received does not fit %s: %v", ap, err)
	}
	if err := Fits(int(o.Files[1].Fd()), tap, false); err != nil {
		t.Errorf("TCP listener received does not fit %s: %v", tap, err)
	}
	// The lock is the giver's open file: flock on it succeeds without
	// blocking, as it would not on another open file of the same path.
	lf := o.TakeLock()
	if lf == nil {
		t.Fatal("no lock in the offer")
	}
	defer lf.Close()
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Errorf("flock on the lock received: %v", err)
	}
	other, _ := os.Open(lock.Name())
	defer other.Close()
	if err := unix.Flock(int(other.Fd()), unix.LOCK_EX|unix.LOCK_NB); err == nil {
		t.Error("another open file of the lock took it: the lock passed is not held")
	}

	in := FromFiles(o.Files, nil)
	o.Files = nil
	if c := in.Cache(); c == nil {
		t.Error("cache file not found among the files received")
	} else {
		w, err := ReadCaches(c, 1<<20)
		if err != nil {
			t.Errorf("cache file received: %v", err)
		} else {
			w.Close()
		}
		c.Close()
	}
	u := in.TakeUDP(ap)
	l := in.TakeTCP(tap)
	if u == nil || l == nil {
		t.Fatalf("Take: UDP %v, TCP %v: want both", u, l)
	}
	u.Close()
	l.Close()
}

// TestOfferBounds: more files than an offer holds are refused, and a
// header the giver would make too large is not sent.
func TestOfferBounds(t *testing.T) {
	giver, taker := pair(t)
	var fds []int
	var names []string
	for range MaxOfferFiles + 2 {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		fds = append(fds, fd)
		names = append(names, "udp-x")
	}
	if err := SendOffer(giver, 1, names, fds); err == nil {
		t.Error("SendOffer sent more than MaxOfferFiles files")
	}
	// Sent raw, past SendOffer's check: the taker's control buffer
	// truncates, and it refuses and closes what came.
	msg := offerBytes(t, OfferHeader{Version: offerVersion, PID: 1, Names: names})
	if _, _, err := giver.WriteMsgUnix(msg, unix.UnixRights(fds...), nil); err != nil {
		t.Fatal(err)
	}
	before := openFDs(t)
	if o, err := ReadOffer(taker); err == nil {
		o.Close()
		t.Fatal("ReadOffer took an offer of too many files")
	} else if !strings.Contains(err.Error(), "truncated") && !strings.Contains(err.Error(), "over") {
		t.Errorf("error %q, want it to say truncated or over", err)
	}
	if after := openFDs(t); after > before {
		t.Errorf("%d descriptors open after the refusal, %d before", after, before)
	}
	if _, err := encodeOffer(OfferHeader{Version: 1, PID: 1, Names: []string{"udp-" + strings.Repeat("1", 1000)}}); err == nil {
		t.Error("encodeOffer took a name over the bound")
	}
}

// TestOfferInPieces: a header that arrives in several reads is put back
// together; files after its first bytes are refused.
func TestOfferInPieces(t *testing.T) {
	giver, taker := pair(t)
	msg := offerBytes(t, OfferHeader{Version: offerVersion, PID: 9, Names: nil})
	go func() {
		giver.Write(msg[:5])
		time.Sleep(20 * time.Millisecond)
		giver.Write(msg[5:])
	}()
	o, err := ReadOffer(taker)
	if err != nil {
		t.Fatal(err)
	}
	if o.PID != 9 {
		t.Errorf("pid %d, want 9", o.PID)
	}
}

// TestReply: the giver stops only on an ok reply; malformed and oversized
// replies are errors.
func TestReply(t *testing.T) {
	var b bytes.Buffer
	if err := SendReply(&b, 5, nil); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, in, want string
	}{
		{"ok", b.String(), ""},
		{"refused", `{"ok":false,"pid":5,"error":"start failed"}`, "refused by the taker: start failed"},
		{"refused without a reason", `{"ok":false}`, "no reason given"},
		{"empty", "", "no reply"},
		{"unknown field", `{"ok":true,"x":1}`, "unknown field"},
		{"oversized", `{"ok":true,"error":"` + strings.Repeat("a", maxReply) + `"}`, "no reply"},
		{"not JSON", "OK\n", "no reply"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ReadReply(strings.NewReader(tt.in))
			if tt.want == "" {
				if err != nil {
					t.Fatalf("ReadReply: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ReadReply = %v, want an error saying %q", err, tt.want)
			}
		})
	}
}
