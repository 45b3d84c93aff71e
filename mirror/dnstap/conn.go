package dnstap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync/atomic"
	"time"

	fs "github.com/farsightsec/golang-framestream"
)

// errContentType means the sender offers no ContentType.
var errContentType = errors.New("sender does not offer content type " + ContentType)

// conn is one Frame Streams connection, served by its own goroutine.
type conn struct {
	r  *Receiver     // always non-nil
	nc *net.UnixConn // always non-nil
	id uint64        // for logs: 1, 2, ... in accept order

	lastFrame atomic.Int64 // unix nanoseconds of the accept or the last data frame; eviction takes the smallest
	shutCause atomic.Int32 // 1+cause once the receiver closed it (shutdown, eviction); 0 before
}

func newConn(r *Receiver, nc *net.UnixConn, id uint64) *conn {
	c := &conn{r: r, nc: nc, id: id}
	c.lastFrame.Store(time.Now().UnixNano())
	return c
}

// shut closes the connection from outside its goroutine, whose blocked read
// then fails; why is the cause it reports.
func (c *conn) shut(why cause) {
	c.shutCause.CompareAndSwap(0, int32(why)+1)
	c.nc.Close()
}

// serve reads the stream until it ends, then closes and accounts for it.
func (c *conn) serve() {
	start := time.Now()
	records, why, err := c.run()
	c.finish(start, records, why, err)
}

// finish closes the connection and counts and logs how it ended.
func (c *conn) finish(start time.Time, records uint64, why cause, err error) {
	c.nc.Close()
	if s := c.shutCause.Load(); s != 0 {
		why, err = cause(s-1), nil
	}
	c.r.forget(c)
	st := &c.r.stats
	level := slog.LevelInfo
	switch why {
	case causeOversize, causeTruncated, causeProtocol:
		st.badFrame.Add(1)
		level = slog.LevelWarn
	case causeHandshakeTimeout, causeContentType, causeReadError:
		level = slog.LevelWarn
	}
	// Last, so that a reader who sees the disconnect sees the rest.
	st.disconnects[why].Add(1)
	attrs := []slog.Attr{slog.Uint64("conn", c.id), slog.String("cause", why.String()),
		slog.Uint64("records", records), slog.String("duration", time.Since(start).Round(time.Millisecond).String())}
	if err != nil {
		attrs = append(attrs, slog.Any("err", err))
	}
	c.r.log.LogAttrs(context.Background(), level, "dnstap connection closed", attrs...)
}

// run does the handshake and then reads data frames until the stream
// ends. It returns the data frames read and why it stopped.
func (c *conn) run() (records uint64, why cause, err error) {
	cfg := &c.r.cfg
	fr := newFrameReader(c.nc, cfg.MaxFrameSize)
	// The deadline covers the handshake only: see the comment on idle
	// streams in receiver.go for why a started stream has none.
	if err := c.nc.SetDeadline(time.Now().Add(cfg.HandshakeTimeout)); err != nil {
		return 0, causeReadError, err
	}
	bidi, err := c.handshake(fr)
	if err != nil {
		return 0, classify(err), fmt.Errorf("handshake: %w", err)
	}
	if err := c.nc.SetDeadline(time.Time{}); err != nil {
		return 0, causeReadError, err
	}
	c.r.log.Info("dnstap stream started", "conn", c.id, "bidirectional", bidi)
	for {
		data, ctl, isControl, err := fr.next()
		if err == io.EOF {
			return records, causeEOF, nil
		}
		if err != nil {
			return records, classify(err), err
		}
		if isControl {
			if ctl.typ != fs.CONTROL_STOP {
				return records, causeProtocol, fmt.Errorf("%w: %s after START", errProtocol, controlName(ctl.typ))
			}
			if bidi {
				c.nc.SetWriteDeadline(time.Now().Add(finishTimeout))
				if _, err := c.nc.Write(appendControl(nil, fs.CONTROL_FINISH)); err != nil {
					return records, causeReadError, fmt.Errorf("write FINISH: %w", err)
				}
			}
			return records, causeStop, nil
		}
		records++
		c.lastFrame.Store(time.Now().UnixNano())
		c.r.record(data)
	}
}

// handshake reads READY, answers ACCEPT and reads START (bidirectional), or
// reads START alone (unidirectional).
func (c *conn) handshake(fr *frameReader) (bidi bool, err error) {
	cf, err := fr.nextControl()
	if err != nil {
		return false, err
	}
	if cf.typ == fs.CONTROL_READY {
		if !cf.hasContentType(ContentType) {
			return false, fmt.Errorf("%w (READY offers %q)", errContentType, cf.contentTypes)
		}
		if _, err := c.nc.Write(appendControl(nil, fs.CONTROL_ACCEPT, ContentType)); err != nil {
			return false, fmt.Errorf("write ACCEPT: %w", err)
		}
		bidi = true
		if cf, err = fr.nextControl(); err != nil {
			return false, err
		}
	}
	if cf.typ != fs.CONTROL_START {
		return false, fmt.Errorf("%w: %s where START was due", errProtocol, controlName(cf.typ))
	}
	// START names the content type, or none (golang-framestream's reader
	// accepts both).
	if len(cf.contentTypes) > 0 && !cf.hasContentType(ContentType) {
		return false, fmt.Errorf("%w (START names %q)", errContentType, cf.contentTypes)
	}
	return bidi, nil
}

// classify names the cause of a stream's end from its error.
func classify(err error) cause {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return causeHandshakeTimeout // the only read deadline is the handshake's
	case errors.Is(err, errOversize):
		return causeOversize
	case errors.Is(err, errTruncated):
		return causeTruncated
	case errors.Is(err, errProtocol):
		return causeProtocol
	case errors.Is(err, errContentType):
		return causeContentType
	case errors.Is(err, io.EOF):
		return causeEOF
	}
	return causeReadError
}
