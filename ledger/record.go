package ledger

// A spool record is a frame
//
//	length uint32 LE | crc32c(payload) uint32 LE | payload
//
// and its payload is a kind byte followed by the entry's fields, strings as
// uvarint length and bytes, numbers as varints, times as Unix microseconds.
// The node that wrote a record is the node of the spool, so it is not in the
// record. A tick's payload is its kind and a position, no entry. The kinds
// of tallies and ticks came after the others: a spool that holds them is
// damage to a version before them, which must not open it.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/costgate/costgate/costmodel"
)

type kind byte

const (
	kindReserve kind = 1
	kindSettle  kind = 2
	// kindRecover finalizes at their estimate all reservations of this node
	// that are still open when the record is applied. Open appends one
	// after the records of the previous run.
	kindRecover kind = 3
	// kindExtend raises the estimate of a reservation still open to the
	// record's (the stream guard debited more of its output beyond the
	// reservation): a recovery finalizes it at that. It raises a
	// recovered entry's charge with it, and changes nothing on another
	// final entry, or when not above the current estimate.
	kindExtend kind = 4
	// kindTally is one call counted on descriptor limits alone (see
	// Ledger.Tally): its entry's shape and KeyDesc, no request id. The
	// flusher writes nothing for it; a tick writes the aggregate of many.
	kindTally kind = 5
	// kindTick says that the tallies before spool position pos are in the
	// entries written before it (see Ledger.tick). Its payload is the
	// kind and pos, a varint, with no entry.
	kindTick kind = 6
	// kindFold replaces some of this node's tick entries by fewer that
	// sum their counters (see fold.go): it deletes the entries it names
	// and inserts its own, in one transaction. Its payload is the kind,
	// the count of the names and each name, then the count of the entries
	// and each entry, its length and its fields as a reservation's.
	kindFold kind = 7
)

type record struct {
	kind kind
	e    Entry
	pos  int64 // a tick's position (kindTick); 0 for the other kinds
	fold *fold // a fold's entries (kindFold); nil for the other kinds
}

// fold is what a fold record replaces: the entries named drop, by the
// entries put.
type fold struct {
	drop []string
	put  []Entry
}

// A fold record holds at most maxFoldDrops names and maxFoldPuts entries.
const (
	maxFoldDrops = 1024
	maxFoldPuts  = 32
)

const (
	frameHeader = 8
	maxPayload  = 1 << 20
)

var (
	crcTable = crc32.MakeTable(crc32.Castagnoli)

	errTorn    = errors.New("ledger: torn spool record")
	errCorrupt = errors.New("ledger: corrupt spool record")
)

// appendFrame encodes r as a frame at the end of b.
func appendFrame(b []byte, r *record) []byte {
	start := len(b)
	b = append(b, make([]byte, frameHeader)...)
	b = append(b, byte(r.kind))
	switch r.kind {
	case kindTick:
		b = binary.AppendVarint(b, r.pos)
		return sealFrame(b, start)
	case kindFold:
		b = binary.AppendUvarint(b, uint64(len(r.fold.drop)))
		for _, id := range r.fold.drop {
			b = binary.AppendUvarint(b, uint64(len(id)))
			b = append(b, id...)
		}
		b = binary.AppendUvarint(b, uint64(len(r.fold.put)))
		var e []byte
		for i := range r.fold.put {
			// Its length first, so that it may end as a record ends.
			e = appendEntry(e[:0], &r.fold.put[i])
			b = binary.AppendUvarint(b, uint64(len(e)))
			b = append(b, e...)
		}
		return sealFrame(b, start)
	}
	return sealFrame(appendEntry(b, &r.e), start)
}

// appendEntry encodes e's fields at the end of b.
func appendEntry(b []byte, e *Entry) []byte {
	for _, s := range [...]string{e.RequestID, e.Tenant, e.User, e.KeyID, e.Route, e.Upstream,
		e.Model, e.Region, e.Decision, e.Policy, e.Friction, string(e.Status)} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	for _, v := range [...]int64{int64(e.HTTPStatus),
		e.Estimated.InputTokens, e.Estimated.CachedInputTokens, e.Estimated.CacheWriteTokens,
		e.Estimated.OutputTokens, e.Estimated.ReasoningTokens, e.Estimated.Units,
		e.Actual.InputTokens, e.Actual.CachedInputTokens, e.Actual.CacheWriteTokens,
		e.Actual.OutputTokens, e.Actual.ReasoningTokens, e.Actual.Units,
		int64(e.EstimatedCost), int64(e.ActualCost), unixMicro(e.CreatedAt), unixMicro(e.SettledAt)} {
		b = binary.AppendVarint(b, v)
	}
	// The extra usage (see usageExtra), then the requests counted, then
	// the key model and route, then the plan, then the key ip and
	// attributes, then the descriptor counters, after the fields of
	// earlier versions: their records end before them, and read as no
	// extra usage, 1 request, no key model or route, no plan, no key ip
	// or attributes and no descriptor counters. A record ends
	// after its last field that is not its default, the fields before it
	// written all the same.
	est, act := extraOf(&e.Estimated), extraOf(&e.Actual)
	byDesc := e.KeyDesc != ""
	byIP := e.KeyIP != "" || e.KeyAttrs != "" || byDesc
	planned := e.Plan != "" || byIP
	keyed := e.KeyModel != "" || e.KeyRoute != "" || planned
	if est != "" || act != "" || e.Requests != 1 || keyed {
		for _, s := range [...]string{est, act} {
			b = binary.AppendUvarint(b, uint64(len(s)))
			b = append(b, s...)
		}
	}
	if e.Requests != 1 || keyed {
		b = binary.AppendVarint(b, e.Requests)
	}
	if keyed {
		for _, s := range [...]string{e.KeyModel, e.KeyRoute} {
			b = binary.AppendUvarint(b, uint64(len(s)))
			b = append(b, s...)
		}
	}
	if planned {
		b = binary.AppendUvarint(b, uint64(len(e.Plan)))
		b = append(b, e.Plan...)
	}
	if byIP {
		for _, s := range [...]string{e.KeyIP, e.KeyAttrs} {
			b = binary.AppendUvarint(b, uint64(len(s)))
			b = append(b, s...)
		}
	}
	if byDesc {
		b = binary.AppendUvarint(b, uint64(len(e.KeyDesc)))
		b = append(b, e.KeyDesc...)
	}
	return b
}

// sealFrame writes the header of the frame that starts at b[start].
func sealFrame(b []byte, start int) []byte {
	payload := b[start+frameHeader:]
	binary.LittleEndian.PutUint32(b[start:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(b[start+4:], crc32.Checksum(payload, crcTable))
	return b
}

// readFrame decodes the frame at the start of b and returns its length.
// errTorn means b ends inside the frame; errCorrupt that the frame is bad.
// names, when not nil, shares the strings of repeated values among the
// records it decodes.
func readFrame(b []byte, r *record, names *interner) (int, error) {
	payload, err := checkFrame(b)
	if err != nil {
		return 0, err
	}
	if err := decodePayload(payload, r, names); err != nil {
		return 0, err
	}
	return frameHeader + len(payload), nil
}

// readFrameKind is readFrame that decodes a tally's record no further
// than its kind: r is then record{kind: kindTally}. The flusher, which
// writes nothing of a tally's record (a tick writes the tallies'
// entries), reads the spool so.
func readFrameKind(b []byte, r *record, names *interner) (int, error) {
	if len(b) <= frameHeader || kind(b[frameHeader]) != kindTally {
		return readFrame(b, r, names)
	}
	payload, err := checkFrame(b)
	if err != nil {
		return 0, err
	}
	*r = record{kind: kindTally}
	return frameHeader + len(payload), nil
}

// checkFrame returns the payload of the frame at the start of b, its
// length and checksum checked: errTorn when b ends before it does.
func checkFrame(b []byte) ([]byte, error) {
	if len(b) < frameHeader {
		return nil, errTorn
	}
	n := binary.LittleEndian.Uint32(b)
	if n == 0 || n > maxPayload {
		return nil, fmt.Errorf("%w: length %d", errCorrupt, n)
	}
	if uint64(len(b)) < frameHeader+uint64(n) {
		return nil, errTorn
	}
	payload := b[frameHeader : frameHeader+n]
	if crc32.Checksum(payload, crcTable) != binary.LittleEndian.Uint32(b[4:]) {
		return nil, fmt.Errorf("%w: checksum mismatch", errCorrupt)
	}
	return payload, nil
}

func decodePayload(p []byte, r *record, names *interner) error {
	d := decoder{b: p, names: names}
	r.kind = kind(d.byte())
	if r.kind < kindReserve || r.kind > kindFold {
		return fmt.Errorf("%w: kind %d", errCorrupt, r.kind)
	}
	r.pos, r.fold = 0, nil
	switch r.kind {
	case kindTick:
		r.e = Entry{}
		r.pos = d.varint()
		if d.err == nil && (len(d.b) != 0 || r.pos < 0) {
			return fmt.Errorf("%w: tick", errCorrupt)
		}
		return d.err
	case kindFold:
		r.e = Entry{}
		f, err := decodeFold(&d)
		r.fold = f
		return err
	}
	return decodeEntry(&d, &r.e)
}

// decodeFold reads a fold's payload after its kind.
func decodeFold(d *decoder) (*fold, error) {
	f := &fold{}
	n := d.uvarint()
	if d.err == nil && n > maxFoldDrops {
		return nil, fmt.Errorf("%w: fold of %d entries", errCorrupt, n)
	}
	for range n {
		f.drop = append(f.drop, d.string())
	}
	n = d.uvarint()
	if d.err == nil && n > maxFoldPuts {
		return nil, fmt.Errorf("%w: fold into %d entries", errCorrupt, n)
	}
	f.put = make([]Entry, n)
	for i := range f.put {
		size := d.uvarint()
		if d.err != nil || size > uint64(len(d.b)) {
			d.fail()
			return nil, d.err
		}
		sub := decoder{b: d.b[:size], names: d.names}
		d.b = d.b[size:]
		if err := decodeEntry(&sub, &f.put[i]); err != nil {
			return nil, err
		}
	}
	if d.err != nil {
		return nil, d.err
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", errCorrupt, len(d.b))
	}
	return f, nil
}

// decodeEntry reads an entry's fields, to the end of d.
func decodeEntry(d *decoder, e *Entry) error {
	e.RequestID = d.string()
	for _, s := range [...]*string{&e.Tenant, &e.User, &e.KeyID, &e.Route, &e.Upstream,
		&e.Model, &e.Region, &e.Decision, &e.Policy, &e.Friction} {
		*s = d.name()
	}
	e.Status = Status(d.name())
	var created, settled, http, estCost, actCost int64
	for _, v := range [...]*int64{&http,
		&e.Estimated.InputTokens, &e.Estimated.CachedInputTokens, &e.Estimated.CacheWriteTokens,
		&e.Estimated.OutputTokens, &e.Estimated.ReasoningTokens, &e.Estimated.Units,
		&e.Actual.InputTokens, &e.Actual.CachedInputTokens, &e.Actual.CacheWriteTokens,
		&e.Actual.OutputTokens, &e.Actual.ReasoningTokens, &e.Actual.Units,
		&estCost, &actCost, &created, &settled} {
		*v = d.varint()
	}
	if d.err == nil && len(d.b) != 0 {
		est, act := d.string(), d.string()
		if d.err == nil && (setExtra(&e.Estimated, est) != nil || setExtra(&e.Actual, act) != nil) {
			return fmt.Errorf("%w: extra usage", errCorrupt)
		}
	}
	e.Requests = 1
	if d.err == nil && len(d.b) != 0 {
		e.Requests = d.varint()
	}
	e.KeyModel, e.KeyRoute = "", ""
	if d.err == nil && len(d.b) != 0 {
		e.KeyModel, e.KeyRoute = d.name(), d.name()
	}
	e.Plan = ""
	if d.err == nil && len(d.b) != 0 {
		e.Plan = d.name()
	}
	e.KeyIP, e.KeyAttrs = "", ""
	if d.err == nil && len(d.b) != 0 {
		e.KeyIP, e.KeyAttrs = d.name(), d.stringUpTo(MaxKeyAttrs)
	}
	e.KeyDesc = ""
	if d.err == nil && len(d.b) != 0 {
		e.KeyDesc = d.stringUpTo(MaxKeyDesc)
	}
	if d.err != nil {
		return d.err
	}
	if len(d.b) != 0 {
		return fmt.Errorf("%w: %d trailing bytes", errCorrupt, len(d.b))
	}
	if http < 0 || http > 999 {
		return fmt.Errorf("%w: http status %d", errCorrupt, http)
	}
	if e.Requests < 0 {
		return fmt.Errorf("%w: requests %d", errCorrupt, e.Requests)
	}
	if e.Status != "" && !e.Status.valid() {
		return fmt.Errorf("%w: status %q", errCorrupt, e.Status)
	}
	e.HTTPStatus = int(http)
	e.EstimatedCost, e.ActualCost = costmodel.NanoUSD(estCost), costmodel.NanoUSD(actCost)
	e.CreatedAt, e.SettledAt = fromMicro(created), fromMicro(settled)
	return nil
}

type decoder struct {
	b     []byte
	err   error
	names *interner
}

// interner hands out one string per distinct value: the tenants, users,
// models and routes of a batch repeat, and a string per field per record
// was most of the flusher's allocations.
type interner struct{ m map[string]string }

// maxInterned bounds an interner: past it, it starts over.
const maxInterned = 4096

func (in *interner) get(b []byte) string {
	if s, ok := in.m[string(b)]; ok {
		return s
	}
	if in.m == nil || len(in.m) >= maxInterned {
		in.m = make(map[string]string)
	}
	s := string(b)
	in.m[s] = s
	return s
}

func (d *decoder) byte() byte {
	if d.err != nil || len(d.b) == 0 {
		d.fail()
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) string() string { return d.stringUpTo(maxField) }

// stringUpTo is string for a field of at most max bytes.
func (d *decoder) stringUpTo(max uint64) string {
	n, k := binary.Uvarint(d.b)
	if d.err != nil || k <= 0 || n > max || uint64(len(d.b)-k) < n {
		d.fail()
		return ""
	}
	s := string(d.b[k : k+int(n)])
	d.b = d.b[k+int(n):]
	return s
}

// name is string for a value that repeats across records.
func (d *decoder) name() string {
	if d.names == nil {
		return d.string()
	}
	n, k := binary.Uvarint(d.b)
	if d.err != nil || k <= 0 || n > maxField || uint64(len(d.b)-k) < n {
		d.fail()
		return ""
	}
	if n == 0 {
		d.b = d.b[k:]
		return ""
	}
	s := d.names.get(d.b[k : k+int(n)])
	d.b = d.b[k+int(n):]
	return s
}

func (d *decoder) uvarint() uint64 {
	v, k := binary.Uvarint(d.b)
	if d.err != nil || k <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[k:]
	return v
}

func (d *decoder) varint() int64 {
	v, k := binary.Varint(d.b)
	if d.err != nil || k <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[k:]
	return v
}

func (d *decoder) fail() {
	if d.err == nil {
		d.err = fmt.Errorf("%w: truncated payload", errCorrupt)
	}
}

func unixMicro(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMicro()
}

func fromMicro(us int64) time.Time {
	if us == 0 {
		return time.Time{}
	}
	return time.UnixMicro(us).UTC()
}
