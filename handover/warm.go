package handover

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"

	"golang.org/x/sys/unix"
)

// Cache file format (integers big-endian), in a sealed memfd:
//
//	magic "DSBYHAND" | version u16 | pid u32 (the writer's)
//	records: klen u16 | dlen u64 | key | data (a cache snapshot, cache.Save)
//	end:     klen u16 = 0
//
// Each record's data is a cache snapshot, which checks itself (checksum,
// every message) when loaded; the file adds only the structure, checked
// here: lengths within the file, the end marker exactly at its end.
const (
	warmMagic   = "DSBYHAND"
	warmVersion = 1
	warmHeader  = len(warmMagic) + 2 + 4
)

// seals are what the writer puts on the memfd and the reader insists on:
// nobody can change the file once it is in the store.
const seals = unix.F_SEAL_WRITE | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// CacheKey names a cache in the file: its listen address and zone.
func CacheKey(ap netip.AddrPort, zone string) string { return ap.String() + " " + zone }

// LastGoodKey names the record that carries the last known good
// configuration (package lastgood) in the file, beside the caches: no
// cache key has no address.
const LastGoodKey = "last-good"

// CacheSave is one cache as the writer takes it: its key and how to
// write its snapshot.
type CacheSave struct {
	Key  string
	Save func(io.Writer) (int, error) // returns the entries written
}

// ErrTooLarge is returned by WriteCaches when the caches exceed its limit.
var ErrTooLarge = errors.New("caches exceed the handover's size limit")

// WriteCaches writes the caches' snapshots into a new memfd of at most
// limit bytes, seals it and returns it with the entries written. pid
// names the writer, for the next process's log.
func WriteCaches(pid int, limit int64, caches []CacheSave) (*os.File, int, error) {
	fd, err := unix.MemfdCreate("dnsstandby-cache", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, 0, fmt.Errorf("handover: memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), CacheName)
	n, err := writeCaches(f, pid, limit, caches)
	if err == nil {
		if _, err = unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, seals); err != nil {
			err = fmt.Errorf("seal: %w", err)
		}
	}
	if err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("handover: write caches: %w", err)
	}
	return f, n, nil
}

func writeCaches(f *os.File, pid int, limit int64, caches []CacheSave) (int, error) {
	lw := &limitWriter{w: f, left: limit}
	bw := bufio.NewWriterSize(lw, 1<<16)
	hdr := binary.BigEndian.AppendUint16([]byte(warmMagic), warmVersion)
	hdr = binary.BigEndian.AppendUint32(hdr, uint32(pid))
	if _, err := bw.Write(hdr); err != nil {
		return 0, err
	}
	entries := 0
	for _, c := range caches {
		if len(c.Key) == 0 || len(c.Key) > 0xffff {
			return 0, fmt.Errorf("cache key of %d bytes", len(c.Key))
		}
		// The data's length is known once it is written: write a
		// placeholder, then the data, then the length in its place.
		if err := bw.Flush(); err != nil {
			return 0, err
		}
		at := limit - lw.left + 2
		var rec []byte
		rec = binary.BigEndian.AppendUint16(rec, uint16(len(c.Key)))
		rec = binary.BigEndian.AppendUint64(rec, 0)
		rec = append(rec, c.Key...)
		if _, err := bw.Write(rec); err != nil {
			return 0, err
		}
		start := limit - lw.left + int64(bw.Buffered())
		n, err := c.Save(bw)
		if err != nil {
			return 0, fmt.Errorf("cache %s: %w", c.Key, err)
		}
		if err := bw.Flush(); err != nil {
			return 0, err
		}
		entries += n
		size := binary.BigEndian.AppendUint64(nil, uint64(limit-lw.left-start))
		if _, err := f.WriteAt(size, at); err != nil {
			return 0, err
		}
	}
	if _, err := bw.Write([]byte{0, 0}); err != nil {
		return 0, err
	}
	return entries, bw.Flush()
}

// limitWriter fails a write that would take it past left bytes.
type limitWriter struct {
	w    io.Writer
	left int64
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > l.left {
		return 0, ErrTooLarge
	}
	n, err := l.w.Write(p)
	l.left -= int64(n)
	return n, err
}

// Warm is the caches a previous process handed over: each snapshot, by
// key, mapped from the memfd. Take them, then Close.
type Warm struct {
	FromPID int
	m       []byte // the mapping; nil when empty
	caches  map[string][]byte
}

// ReadCaches maps f, which must be a sealed memfd of at most limit bytes
// written by WriteCaches, and checks its structure. It does not close f:
// the mapping outlives it.
func ReadCaches(f *os.File, limit int64) (*Warm, error) {
	got, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, fmt.Errorf("handover: cache file: not a memfd: %w", err)
	}
	if got&seals != seals {
		return nil, fmt.Errorf("handover: cache file: seals %#x, want %#x", got, seals)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("handover: cache file: %w", err)
	}
	if st.Size > limit {
		return nil, fmt.Errorf("handover: cache file of %d bytes, over the limit of %d", st.Size, limit)
	}
	if st.Size < int64(warmHeader)+2 {
		return nil, fmt.Errorf("handover: cache file of %d bytes: too short", st.Size)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("handover: cache file: mmap: %w", err)
	}
	w, err := parseCaches(m)
	if err != nil {
		unix.Munmap(m)
		return nil, fmt.Errorf("handover: cache file: %w", err)
	}
	w.m = m
	return w, nil
}

func parseCaches(b []byte) (*Warm, error) {
	if string(b[:len(warmMagic)]) != warmMagic {
		return nil, errors.New("bad magic")
	}
	if v := binary.BigEndian.Uint16(b[len(warmMagic):]); v != warmVersion {
		return nil, fmt.Errorf("version %d, want %d", v, warmVersion)
	}
	w := &Warm{FromPID: int(binary.BigEndian.Uint32(b[len(warmMagic)+2:])), caches: map[string][]byte{}}
	rest := b[warmHeader:]
	for {
		if len(rest) < 2 {
			return nil, errors.New("truncated: no end marker")
		}
		klen := int(binary.BigEndian.Uint16(rest))
		rest = rest[2:]
		if klen == 0 {
			break
		}
		if len(rest) < 8 {
			return nil, errors.New("truncated record")
		}
		dlen := binary.BigEndian.Uint64(rest)
		rest = rest[8:]
		if uint64(len(rest)) < uint64(klen) || uint64(len(rest)-klen) < dlen {
			return nil, fmt.Errorf("record of %d+%d bytes past the end", klen, dlen)
		}
		key := string(rest[:klen])
		if _, dup := w.caches[key]; dup {
			return nil, fmt.Errorf("cache %s twice", key)
		}
		w.caches[key] = rest[klen : klen+int(dlen)]
		rest = rest[klen+int(dlen):]
	}
	if len(rest) != 0 {
		return nil, fmt.Errorf("%d bytes after the end marker", len(rest))
	}
	return w, nil
}

// Take returns the snapshot of the cache key and forgets it; nil if the
// file has none. The bytes are valid until Close.
func (w *Warm) Take(key string) []byte {
	if w == nil {
		return nil
	}
	b, ok := w.caches[key]
	if !ok {
		return nil
	}
	delete(w.caches, key)
	return b
}

// Len is how many caches are not taken yet.
func (w *Warm) Len() int {
	if w == nil {
		return 0
	}
	return len(w.caches)
}

// Close unmaps the file; every slice Take returned becomes invalid.
func (w *Warm) Close() error {
	if w == nil || w.m == nil {
		return nil
	}
	m := w.m
	w.m, w.caches = nil, nil
	return unix.Munmap(m)
}
