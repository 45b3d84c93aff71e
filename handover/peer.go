package handover

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// A surge handover passes the same files as systemd's store, but from one
// running process to another over the admin socket (package admin carries
// the request and checks that both ends are root): a DaemonSet rollout
// with maxSurge starts the next pod while the last one still serves.
//
// The giver sends one offer: a header and, with it (SCM_RIGHTS), the files
// it names, in order; the taker answers with one reply once it serves from
// them. Until the reply the giver keeps serving, so a taker that dies
// midway costs nothing. Every byte of both is bounded and checked before
// it is used: the peer is root, but a confused or old one is still a peer.
//
// Offer (integers big-endian):
//
//	magic "DSBYGIVE" | length u16 | header (JSON, OfferHeader)

// LockName is the name the instance lock's file is passed under: the
// taker then holds the very lock the giver holds (an flock belongs to
// the open file, which SCM_RIGHTS shares), so the node's lock is never
// free between the two.
const LockName = "lock"

// Bounds of what is read from a peer.
const (
	offerMagic = "DSBYGIVE"
	// MaxOfferHeader bounds the header: a name is under 64 bytes and
	// there are at most MaxOfferFiles.
	MaxOfferHeader = 8192
	// MaxOfferFiles bounds the files of an offer: two sockets per listen
	// address, the cache and the lock.
	MaxOfferFiles = 64
	maxName       = 128
	maxReply      = 4096
	offerVersion  = 1
)

// OfferHeader is an offer's header: who gives and the name of each file
// passed, in order.
type OfferHeader struct {
	Version int      `json:"version"`
	PID     int      `json:"pid"`
	Names   []string `json:"names"`
}

// Offer is what a taker received: the giver's PID as it says it (the
// admin socket's SO_PEERCRED is the one to trust) and the files, each
// with its name as Name(). The taker owns the files.
type Offer struct {
	PID   int
	Files []*os.File
}

// Close closes every file of the offer not taken out of it.
func (o *Offer) Close() {
	for _, f := range o.Files {
		f.Close()
	}
	o.Files = nil
}

// TakeLock removes the file named LockName from the offer and returns it
// (nil if none).
func (o *Offer) TakeLock() *os.File {
	for i, f := range o.Files {
		if f.Name() == LockName {
			o.Files = append(o.Files[:i], o.Files[i+1:]...)
			return f
		}
	}
	return nil
}

// SendOffer writes an offer of the files fds, named names, on c: one
// message, the files attached to it.
func SendOffer(c *net.UnixConn, pid int, names []string, fds []int) error {
	if len(names) != len(fds) {
		return fmt.Errorf("handover: offer of %d names for %d files", len(names), len(fds))
	}
	if len(fds) > MaxOfferFiles {
		return fmt.Errorf("handover: offer of %d files, over %d", len(fds), MaxOfferFiles)
	}
	msg, err := encodeOffer(OfferHeader{Version: offerVersion, PID: pid, Names: names})
	if err != nil {
		return err
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	n, oobn, err := c.WriteMsgUnix(msg, oob, nil)
	if err == nil && (n != len(msg) || oobn != len(oob)) {
		err = io.ErrShortWrite
	}
	if err != nil {
		return fmt.Errorf("handover: send offer: %w", err)
	}
	return nil
}

func encodeOffer(h OfferHeader) ([]byte, error) {
	for _, name := range h.Names {
		if err := checkName(name); err != nil {
			return nil, fmt.Errorf("handover: offer: %w", err)
		}
	}
	hdr, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	if len(hdr) > MaxOfferHeader {
		return nil, fmt.Errorf("handover: offer header of %d bytes, over %d", len(hdr), MaxOfferHeader)
	}
	msg := binary.BigEndian.AppendUint16([]byte(offerMagic), uint16(len(hdr)))
	return append(msg, hdr...), nil
}

// ReadOffer reads one offer from c. The files come with the message's
// first bytes; the rest of the header may follow in more reads, which
// must bring no files. On any error every file received is closed.
func ReadOffer(c *net.UnixConn) (*Offer, error) {
	buf := make([]byte, len(offerMagic)+2+MaxOfferHeader)
	oob := make([]byte, unix.CmsgSpace(4*(MaxOfferFiles+1)))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, fmt.Errorf("handover: read offer: %w", err)
	}
	fds, ferr := parseRights(oob[:oobn])
	if ferr == nil && flags&unix.MSG_CTRUNC != 0 {
		ferr = errors.New("more files than an offer holds (control message truncated)")
	}
	got := buf[:n]
	// Read the rest of the header if the first read fell short of it.
	for ferr == nil && n > 0 {
		want, ok := offerLen(got)
		if !ok {
			if got[0] == '{' {
				break // a refusal, written at once
			}
			want = len(offerMagic) + 2
		}
		if len(got) >= want || want > len(buf) {
			break
		}
		k, koobn, _, _, err := c.ReadMsgUnix(buf[len(got):want], oob)
		if err != nil {
			ferr = fmt.Errorf("read offer: %w", err)
			break
		}
		if koobn > 0 {
			more, _ := parseRights(oob[:koobn])
			closeAll(more)
			ferr = errors.New("files past the offer's first bytes")
			break
		}
		if k == 0 {
			break
		}
		got = buf[:len(got)+k]
	}
	if ferr != nil {
		closeAll(fds)
		return nil, fmt.Errorf("handover: offer: %w", ferr)
	}
	o, err := ParseOffer(got, fds)
	if err != nil {
		return nil, err
	}
	return o, nil
}

// offerLen is the whole length of an offer whose first bytes are b, once
// b holds the magic and length.
func offerLen(b []byte) (int, bool) {
	if len(b) < len(offerMagic)+2 {
		return 0, false
	}
	return len(offerMagic) + 2 + int(binary.BigEndian.Uint16(b[len(offerMagic):])), true
}

// parseRights returns every descriptor in the control messages oob; on
// error, those already parsed are closed.
func parseRights(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("control message: %w", err)
	}
	var fds []int
	for i := range msgs {
		got, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			closeAll(fds)
			return nil, fmt.Errorf("control message: %w", err)
		}
		fds = append(fds, got...)
	}
	return fds, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// ParseOffer checks an offer's bytes msg and the descriptors fds that
// came with it, and returns the offer with each descriptor as a named
// file. It owns fds: on error it closes them all.
func ParseOffer(msg []byte, fds []int) (*Offer, error) {
	h, err := parseOfferHeader(msg, len(fds))
	if err != nil {
		closeAll(fds)
		return nil, fmt.Errorf("handover: offer: %w", err)
	}
	o := &Offer{PID: h.PID}
	for i, fd := range fds {
		o.Files = append(o.Files, os.NewFile(uintptr(fd), h.Names[i]))
	}
	return o, nil
}

func parseOfferHeader(msg []byte, nfds int) (*OfferHeader, error) {
	if nfds > MaxOfferFiles {
		return nil, fmt.Errorf("%d files, over %d", nfds, MaxOfferFiles)
	}
	if len(msg) > 0 && msg[0] == '{' && nfds == 0 {
		// A refusal (Refuse), or an admin error from a process that
		// cannot hand over: both are {"ok":false,"error":"..."}.
		var r struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(bytes.TrimSpace(msg), &r) == nil && r.Error != "" {
			return nil, fmt.Errorf("refused by the running process: %.200s", r.Error)
		}
	}
	if len(msg) < len(offerMagic)+2 || string(msg[:len(offerMagic)]) != offerMagic {
		return nil, errors.New("bad magic: not a dnsstandby handover offer")
	}
	want, _ := offerLen(msg)
	if want-len(offerMagic)-2 > MaxOfferHeader {
		return nil, fmt.Errorf("header of %d bytes, over %d", want-len(offerMagic)-2, MaxOfferHeader)
	}
	if len(msg) != want {
		return nil, fmt.Errorf("%d bytes, the header says %d", len(msg), want)
	}
	var h OfferHeader
	dec := json.NewDecoder(bytes.NewReader(msg[len(offerMagic)+2:]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&h); err != nil {
		return nil, fmt.Errorf("header: %w", err)
	}
	if dec.More() {
		return nil, errors.New("header: bytes after the JSON object")
	}
	if h.Version != offerVersion {
		return nil, fmt.Errorf("version %d, want %d", h.Version, offerVersion)
	}
	if h.PID <= 0 {
		return nil, fmt.Errorf("giver pid %d", h.PID)
	}
	if len(h.Names) != nfds {
		return nil, fmt.Errorf("%d names for %d files", len(h.Names), nfds)
	}
	seen := map[string]bool{}
	for _, name := range h.Names {
		if err := checkName(name); err != nil {
			return nil, err
		}
		if (name == CacheName || name == LockName) && seen[name] {
			return nil, fmt.Errorf("file %q twice", name)
		}
		seen[name] = true
	}
	return &h, nil
}

// checkName accepts the names a giver uses: CacheName, LockName, and
// socket names (SocketName) of printable ASCII. What a socket is, is
// checked on the socket itself (Fits).
func checkName(name string) error {
	if name == CacheName || name == LockName {
		return nil
	}
	if len(name) == 0 || len(name) > maxName {
		return fmt.Errorf("file name of %d bytes", len(name))
	}
	if !strings.HasPrefix(name, "udp-") && !strings.HasPrefix(name, "tcp-") {
		return fmt.Errorf("file name %q: neither a socket, %q nor %q", name, CacheName, LockName)
	}
	for i := 0; i < len(name); i++ {
		if name[i] <= ' ' || name[i] > '~' || name[i] == ':' {
			return fmt.Errorf("file name %q: byte %#x", name, name[i])
		}
	}
	return nil
}

// reply is the taker's answer to an offer.
type reply struct {
	OK    bool   `json:"ok"`
	PID   int    `json:"pid"`
	Error string `json:"error,omitempty"`
}

// SendReply tells the giver that the taker serves from what it gave (err
// nil: the giver stops), or why it does not (the giver goes on serving).
func SendReply(w io.Writer, pid int, err error) error {
	r := reply{OK: err == nil, PID: pid}
	if err != nil {
		r.Error = err.Error()
		if len(r.Error) > maxReply/2 {
			r.Error = r.Error[:maxReply/2]
		}
	}
	if err := json.NewEncoder(w).Encode(r); err != nil {
		return fmt.Errorf("handover: send reply: %w", err)
	}
	return nil
}

// Refuse tells a taker, instead of an offer, why there is none.
func Refuse(w io.Writer, pid int, err error) error { return SendReply(w, pid, err) }

// ReadReply reads the taker's reply from r, at most maxReply bytes: nil
// if it serves from the offer.
func ReadReply(r io.Reader) error {
	var rep reply
	dec := json.NewDecoder(io.LimitReader(r, maxReply))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		return fmt.Errorf("handover: no reply or a malformed one: %w", err)
	}
	if !rep.OK {
		if rep.Error == "" {
			rep.Error = "no reason given"
		}
		return fmt.Errorf("handover: refused by the taker: %s", rep.Error)
	}
	return nil
}
