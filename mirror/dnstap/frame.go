package dnstap

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	fs "github.com/farsightsec/golang-framestream"
)

// Frame Streams (the fstrm protocol CoreDNS speaks through
// golang-framestream): every frame is a 32-bit big-endian length and that
// many bytes. A length of 0 escapes a control frame: its own 32-bit length,
// a 32-bit control type, then fields, each a 32-bit field type (only
// CONTENT_TYPE exists), a 32-bit length and the bytes.
//
// A bidirectional sender (CoreDNS) sends READY listing its content types,
// waits for ACCEPT naming the chosen one, sends START, data frames, and at
// the end STOP, to which the receiver answers FINISH. A unidirectional
// sender starts with START.

// ContentType is the only content type the receiver accepts.
const ContentType = "protobuf:dnstap.Dnstap"

// maxControlFrame bounds a control frame's length: the protocol's own limit
// (fstrm and golang-framestream both refuse more than 512 bytes).
const maxControlFrame = fs.CONTROL_FRAME_LENGTH_MAX

// Errors that end a stream; the connection's disconnect cause names them.
var (
	errOversize  = errors.New("frame larger than the limit")
	errTruncated = errors.New("stream ended inside a frame")
	errProtocol  = errors.New("frame streams protocol violation")
)

// control is a decoded control frame. Its content types alias the reader's
// scratch buffer: valid until the next read.
type control struct {
	typ          uint32
	contentTypes [][]byte
}

// hasContentType reports whether ct is among the frame's content types.
func (c *control) hasContentType(ct string) bool {
	for _, t := range c.contentTypes {
		if string(t) == ct {
			return true
		}
	}
	return false
}

// frameReader reads frames from a stream with every length bounded, so
// that no peer can make it allocate or read more than max bytes at a time.
type frameReader struct {
	br  *bufio.Reader
	max int // data frame limit; always > 0

	hdr [4]byte
	ctl [maxControlFrame]byte
	buf []byte // grows on demand up to max; reused for every data frame
}

// readBufSize sizes the buffered reader. CoreDNS writes through a 4 KiB
// bufio.Writer (golang-framestream's), so reads arrive in chunks of about
// that size; 16 KiB takes several in one system call.
const readBufSize = 16 << 10

// initialFrameBuf is the data buffer's first size: a CLIENT_RESPONSE with a
// typical reply (a few hundred bytes) fits without growing.
const initialFrameBuf = 4 << 10

func newFrameReader(r io.Reader, max int) *frameReader {
	return &frameReader{br: bufio.NewReaderSize(r, readBufSize), max: max, buf: make([]byte, initialFrameBuf)}
}

// u32 reads a big-endian uint32. atStart says an EOF before its first byte
// is a clean end (io.EOF), not a truncation.
func (f *frameReader) u32(atStart bool) (uint32, error) {
	if _, err := io.ReadFull(f.br, f.hdr[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || (err == io.EOF && !atStart) {
			return 0, errTruncated
		}
		return 0, err
	}
	return binary.BigEndian.Uint32(f.hdr[:]), nil
}

// next reads one frame. A data frame comes back in data, valid until the
// next call; a control frame comes back in c with isControl set. io.EOF
// means the stream ended cleanly between frames.
func (f *frameReader) next() (data []byte, c control, isControl bool, err error) {
	n, err := f.u32(true)
	if err != nil {
		return nil, c, false, err
	}
	if n == 0 {
		c, err = f.control()
		return nil, c, true, err
	}
	if n > uint32(f.max) {
		return nil, c, false, fmt.Errorf("%w: data frame of %d bytes, limit %d", errOversize, n, f.max)
	}
	if int(n) > len(f.buf) {
		f.buf = make([]byte, min(max(int(n), 2*len(f.buf)), f.max))
	}
	if _, err := io.ReadFull(f.br, f.buf[:n]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || err == io.EOF {
			err = errTruncated
		}
		return nil, c, false, err
	}
	return f.buf[:n], c, false, nil
}

// nextControl reads a frame that must be a control frame: during the
// handshake a data frame is a protocol error, and its payload is not read.
func (f *frameReader) nextControl() (control, error) {
	n, err := f.u32(true)
	if err != nil {
		return control{}, err
	}
	if n != 0 {
		return control{}, fmt.Errorf("%w: data frame (%d bytes) before START", errProtocol, n)
	}
	return f.control()
}

// control reads a control frame after its escape.
func (f *frameReader) control() (control, error) {
	n, err := f.u32(false)
	if err != nil {
		return control{}, err
	}
	if n > maxControlFrame {
		return control{}, fmt.Errorf("%w: control frame of %d bytes, limit %d", errOversize, n, maxControlFrame)
	}
	b := f.ctl[:n]
	if _, err := io.ReadFull(f.br, b); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || err == io.EOF {
			err = errTruncated
		}
		return control{}, err
	}
	return parseControl(b)
}

// parseControl decodes a control frame's body (after its length).
func parseControl(b []byte) (control, error) {
	var c control
	if len(b) < 4 {
		return c, fmt.Errorf("%w: control frame of %d bytes has no type", errProtocol, len(b))
	}
	c.typ = binary.BigEndian.Uint32(b)
	b = b[4:]
	for len(b) > 0 {
		if len(b) < 8 {
			return c, fmt.Errorf("%w: %d stray bytes after the control fields", errProtocol, len(b))
		}
		ft, n := binary.BigEndian.Uint32(b), binary.BigEndian.Uint32(b[4:])
		b = b[8:]
		if ft != fs.CONTROL_FIELD_CONTENT_TYPE {
			return c, fmt.Errorf("%w: unknown control field type %d", errProtocol, ft)
		}
		if n > uint32(len(b)) {
			return c, fmt.Errorf("%w: content type of %d bytes overruns its control frame", errProtocol, n)
		}
		c.contentTypes = append(c.contentTypes, b[:n])
		b = b[n:]
	}
	return c, nil
}

// appendControl appends an escaped control frame of type typ carrying the
// content types, ready to be written in one call.
func appendControl(dst []byte, typ uint32, contentTypes ...string) []byte {
	n := 4
	for _, ct := range contentTypes {
		n += 8 + len(ct)
	}
	dst = binary.BigEndian.AppendUint32(dst, 0)
	dst = binary.BigEndian.AppendUint32(dst, uint32(n))
	dst = binary.BigEndian.AppendUint32(dst, typ)
	for _, ct := range contentTypes {
		dst = binary.BigEndian.AppendUint32(dst, fs.CONTROL_FIELD_CONTENT_TYPE)
		dst = binary.BigEndian.AppendUint32(dst, uint32(len(ct)))
		dst = append(dst, ct...)
	}
	return dst
}

// controlName names a control type for logs and errors.
func controlName(typ uint32) string {
	switch typ {
	case fs.CONTROL_ACCEPT:
		return "ACCEPT"
	case fs.CONTROL_START:
		return "START"
	case fs.CONTROL_STOP:
		return "STOP"
	case fs.CONTROL_READY:
		return "READY"
	case fs.CONTROL_FINISH:
		return "FINISH"
	}
	return fmt.Sprintf("control type %d", typ)
}
