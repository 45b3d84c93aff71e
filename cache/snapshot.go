package cache

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"time"
)

// Snapshot format, version 1 (all integers big-endian):
//
//	magic "DSBYSNAP" | version u16 | reserved u16
//	records: klen u16 | mlen u16 | ttl u32 | flags u8 | stored i64 | fresh i64 | key | message
//	end:     klen u16 = 0
//	crc32c u32 of every byte before it
//
// flags: bit 0 a cached failure, bit 1 on probation (a mirrored entry no
// client has used yet: it stays so across a restart; builds from before
// bit 1 refuse such a snapshot and start empty).
//
// Times are absolute (unix nanoseconds), so entries age across restarts.
// TTL offsets are not stored: Load recomputes them by walking each message,
// which also validates it.
const (
	snapshotMagic   = "DSBYSNAP"
	snapshotVersion = 1
	recordFixedLen  = 2 + 2 + 4 + 1 + 8 + 8
)

// ErrSnapshot matches every error Load returns for a bad snapshot.
var ErrSnapshot = errors.New("bad cache snapshot")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Save writes every entry that is still servable to w, least recently used
// first, and returns how many it wrote. Each shard is locked only while its
// entries are listed.
func (c *Cache) Save(w io.Writer) (int, error) {
	bw := bufio.NewWriter(w)
	var crc uint32
	put := func(b []byte) error {
		crc = crc32.Update(crc, castagnoli, b)
		_, err := bw.Write(b)
		return err
	}
	hdr := binary.BigEndian.AppendUint16([]byte(snapshotMagic), snapshotVersion)
	hdr = binary.BigEndian.AppendUint16(hdr, 0)
	if err := put(hdr); err != nil {
		return 0, fmt.Errorf("write snapshot header: %w", err)
	}
	start := time.Now()
	now := c.now().UnixNano()
	count, expired := 0, 0
	var fixed [recordFixedLen]byte
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		entries := s.lru.Values()
		s.mu.Unlock()
		for _, e := range entries {
			if now >= c.staleUntil(e) {
				expired++
				continue
			}
			binary.BigEndian.PutUint16(fixed[0:], e.klen)
			binary.BigEndian.PutUint16(fixed[2:], e.mlen)
			binary.BigEndian.PutUint32(fixed[4:], e.ttl)
			fixed[8] = e.flags
			binary.BigEndian.PutUint64(fixed[9:], uint64(e.stored))
			binary.BigEndian.PutUint64(fixed[17:], uint64(e.fresh))
			if err := put(fixed[:]); err != nil {
				return count, fmt.Errorf("write snapshot: %w", err)
			}
			if err := put(e.data[:int(e.klen)+int(e.mlen)]); err != nil {
				return count, fmt.Errorf("write snapshot: %w", err)
			}
			count++
		}
	}
	if err := put([]byte{0, 0}); err != nil {
		return count, fmt.Errorf("write snapshot: %w", err)
	}
	if _, err := bw.Write(binary.BigEndian.AppendUint32(nil, crc)); err != nil {
		return count, fmt.Errorf("write snapshot: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return count, fmt.Errorf("write snapshot: %w", err)
	}
	c.log.Debug("snapshot saved", slog.Int("entries", count), slog.Int("expired", expired),
		slog.String("took", time.Since(start).String()))
	return count, nil
}

// Load reads a snapshot written by Save and adds its still-servable entries
// to the cache, returning how many it added. The whole snapshot is read and
// checked (checksum, version, every message) before the first entry is
// added: on any error the cache is left exactly as it was — at start-up,
// empty — and the error matches ErrSnapshot.
func (c *Cache) Load(r io.Reader) (int, error) {
	start := time.Now()
	entries, err := c.readSnapshot(bufio.NewReader(r))
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrSnapshot, err)
	}
	now := c.now().UnixNano()
	added, expired := 0, 0
	for _, e := range entries {
		if now >= c.staleUntil(e) {
			expired++
			continue
		}
		h := c.hash(e.key())
		s := c.shardFor(h)
		if e.cost() <= s.maxBytes && s.add(h, e, c.staleUntil, now) {
			added++
		}
	}
	// Entries neither added nor expired were too large for a shard, or an
	// error entry that did not replace a servable answer.
	c.log.Debug("snapshot loaded", slog.Int("read", len(entries)), slog.Int("added", added),
		slog.Int("expired", expired), slog.String("took", time.Since(start).String()))
	return added, nil
}

func (c *Cache) readSnapshot(br *bufio.Reader) ([]entry, error) {
	var crc uint32
	read := func(b []byte) error {
		if _, err := io.ReadFull(br, b); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		crc = crc32.Update(crc, castagnoli, b)
		return nil
	}
	hdr := make([]byte, len(snapshotMagic)+4)
	if err := read(hdr); err != nil {
		return nil, fmt.Errorf("header: %w", err)
	}
	if string(hdr[:len(snapshotMagic)]) != snapshotMagic {
		return nil, errors.New("not a dnsstandby cache snapshot")
	}
	if v := binary.BigEndian.Uint16(hdr[len(snapshotMagic):]); v != snapshotVersion {
		return nil, fmt.Errorf("version %d, this build reads version %d", v, snapshotVersion)
	}

	// A snapshot of this cache holds at most MaxBytes; allow for a larger
	// cache having written it, but never let a corrupt length run away.
	budget := 4 * c.cfg.MaxBytes
	var entries []entry
	var klenBuf [2]byte
	var fixed [recordFixedLen - 2]byte
	for {
		if err := read(klenBuf[:]); err != nil {
			return nil, fmt.Errorf("record %d: %w", len(entries), err)
		}
		klen := binary.BigEndian.Uint16(klenBuf[:])
		if klen == 0 {
			break
		}
		if err := read(fixed[:]); err != nil {
			return nil, fmt.Errorf("record %d: %w", len(entries), err)
		}
		mlen := binary.BigEndian.Uint16(fixed[0:])
		if int(klen) > maxKeyLen || int(klen) <= keySuffixLen {
			return nil, fmt.Errorf("record %d: key length %d out of range", len(entries), klen)
		}
		budget -= int64(klen) + int64(mlen) + entryOverhead
		if budget < 0 {
			return nil, fmt.Errorf("record %d: snapshot larger than 4x the cache's byte limit", len(entries))
		}
		data := make([]byte, int(klen)+int(mlen))
		if err := read(data); err != nil {
			return nil, fmt.Errorf("record %d: %w", len(entries), err)
		}
		e, err := buildEntry(data[:klen], data[klen:])
		if err != nil {
			return nil, fmt.Errorf("record %d: %w", len(entries), err)
		}
		e.ttl = binary.BigEndian.Uint32(fixed[2:])
		e.flags = fixed[6]
		e.stored = int64(binary.BigEndian.Uint64(fixed[7:]))
		e.fresh = int64(binary.BigEndian.Uint64(fixed[15:]))
		if e.ttl > maxTTL || e.flags&^(entryError|entryProbation) != 0 {
			return nil, fmt.Errorf("record %d: bad ttl or flags", len(entries))
		}
		entries = append(entries, e)
	}
	want := crc
	var sum [4]byte
	if _, err := io.ReadFull(br, sum[:]); err != nil {
		return nil, fmt.Errorf("checksum: %w", io.ErrUnexpectedEOF)
	}
	if got := binary.BigEndian.Uint32(sum[:]); got != want {
		return nil, fmt.Errorf("checksum mismatch: stored %08x, computed %08x", got, want)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		return nil, errors.New("trailing bytes after checksum")
	}
	return entries, nil
}
