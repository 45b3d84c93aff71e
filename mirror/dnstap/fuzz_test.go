package dnstap

import (
	"bytes"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	tap "github.com/dnstap/golang-dnstap"
	fs "github.com/farsightsec/golang-framestream"
)

// FuzzDnstapMessage checks extract against proto.Unmarshal on arbitrary
// bytes: same verdict, same reply.
func FuzzDnstapMessage(f *testing.F) {
	for _, c := range extractCases(f) {
		f.Add(c.in)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		resp, v := extract(in)
		oresp, ov := oracle(in)
		if v != ov || !bytes.Equal(resp, oresp) || (resp == nil) != (oresp == nil) {
			t.Fatalf("extract = %d %x; proto.Unmarshal = %d %x", v, resp, ov, oresp)
		}
	})
}

// FuzzFrames feeds arbitrary bytes to one connection, after a valid
// handshake or instead of one, with small limits. The stream must end with
// a known cause (never the handshake timeout: the input ends, so the
// reader must see its end), every data frame counted once, and nothing
// larger than the limit handed on.
func FuzzFrames(f *testing.F) {
	good := dataFrame(tapFrame(f, tap.Message_CLIENT_RESPONSE, reply(f, "www.example.com")))
	query := dataFrame(tapFrame(f, tap.Message_CLIENT_QUERY, nil))
	stop := ctlFrame(fs.CONTROL_STOP)
	seeds := []struct {
		stream    []byte
		handshake bool
	}{
		{nil, false},
		{nil, true},
		{bytes.Join([][]byte{good, query, good, stop}, nil), true},
		{bytes.Join([][]byte{handshakeBytes(), good, stop}, nil), false},
		{bytes.Join([][]byte{ctlFrame(fs.CONTROL_START, ContentType), good, stop}, nil), false},
		{bytes.Join([][]byte{ctlFrame(fs.CONTROL_READY, "a", "b", ContentType), ctlFrame(fs.CONTROL_START), good}, nil), false},
		{append(good, 0, 0, 0x10, 0), true},       // oversize
		{good[:len(good)-1], true},                // truncated
		{[]byte{0, 0, 0, 0, 0, 0, 2, 0}, false},   // oversize control
		{[]byte{0, 0, 0, 0, 0, 0, 0, 1, 0}, true}, // control without type
		{[]byte("\x00\x00\x00\x05hello"), true},   // data that is no protobuf
		{[]byte("GET / HTTP/1.1\r\n\r\n"), false},
	}
	for _, s := range seeds {
		f.Add(s.stream, s.handshake)
	}
	// One cache for the whole run: the stream goes all the way in.
	c := newCache(f)
	const maxFrame = 4096
	f.Fuzz(func(t *testing.T, stream []byte, handshake bool) {
		if handshake {
			stream = append(handshakeBytes(), stream...)
		}
		r := &Receiver{
			cfg: Config{MaxFrameSize: maxFrame, HandshakeTimeout: DefaultConfig().HandshakeTimeout},
			log: slog.New(slog.DiscardHandler),
			sink: func(resp []byte) error {
				if len(resp) > maxFrame {
					t.Fatalf("a %d-byte reply passed a %d-byte frame limit", len(resp), maxFrame)
				}
				return c.Insert(resp)
			},
		}
		records, why := serveStream(t, r, stream)
		if why == causeHandshakeTimeout || why >= numCauses {
			t.Fatalf("stream ended with cause %d (%v)", why, why)
		}
		st := r.Stats()
		if counted := st.Accepted + st.RejectedTotal() - st.Rejected[ReasonBadFrame]; counted != records {
			t.Fatalf("%d data frames read, %d counted: %+v", records, counted, st)
		}
	})
}

// serveStream serves one connection whose peer writes stream and then
// shuts its write side, and returns what the connection's goroutine saw.
func serveStream(t testing.TB, r *Receiver, stream []byte) (uint64, cause) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	ours, peer := fileConn(t, fds[0]), fileConn(t, fds[1])
	defer peer.Close()
	var wg sync.WaitGroup
	wg.Go(func() {
		peer.Write(stream) // fails once our side stops reading and closes
		peer.CloseWrite()
	})
	c := newConn(r, ours, 1)
	r.stats.open.Add(1)
	start := time.Now()
	records, why, err := c.run()
	c.finish(start, records, why, err)
	wg.Wait()
	return records, why
}

func fileConn(t testing.TB, fd int) *net.UnixConn {
	f := os.NewFile(uintptr(fd), "socketpair")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	return c.(*net.UnixConn)
}
