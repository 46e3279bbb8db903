package ledger

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// The spool's contract (spool.go, doc.go): a torn or corrupt tail of the
// last segment (a write the machine did not finish) is cut off at open;
// damage anywhere else stops open rather than losing records silently.
// Here the last (and only) segment is damaged in its second record, and
// eight complete, valid records follow, the last of them fsynced (as
// SettleDurable leaves it). That is not a torn tail: a write the machine
// did not finish cannot precede an fsynced record: Open refuses the spool
// (it used to cut all nine records as a torn tail).
func TestSpoolDamageBeforeWholeRecordsStopsOpen(t *testing.T) {
	dir := t.TempDir()
	s, err := openSpool(dir, 1<<20, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	var firstEnd int64
	for i := range 10 {
		r := sampleRecord("r" + string(rune('a'+i)))
		pos, err := s.append(&r, 0)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			firstEnd = pos
		}
	}
	if err := s.sync(); err != nil { // the last record is durable
		t.Fatal(err)
	}
	s.close()
	path := filepath.Join(dir, segmentName(0))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[firstEnd+frameHeader+3] ^= 0x40 // one bit in the second record's payload
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err = openSpool(dir, 1<<20, t.Logf)
	if err == nil {
		end, _ := s.positions()
		s.close()
		t.Fatalf("open cut the spool from %d to %d bytes: 9 records lost, 8 of them intact and the last fsynced", len(b), end)
	}
	if !errors.Is(err, errCorrupt) {
		t.Fatalf("open: %v, want errCorrupt", err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() != int64(len(b)) {
		t.Fatalf("the refused spool was changed: %v %v", fi, err)
	}
}

// TestSpoolUnwrittenBlocksBeforeALaterWriteAreTorn: a machine that loses
// power may keep a later write and not an earlier one (neither fsynced:
// an fsync would have kept both), leaving zeros where the earlier record
// was. That is a torn tail, not damage: Open cuts it there and starts.
func TestSpoolUnwrittenBlocksBeforeALaterWriteAreTorn(t *testing.T) {
	dir := t.TempDir()
	s, err := openSpool(dir, 1<<20, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	var ends []int64
	for i := range 4 {
		r := sampleRecord("r" + string(rune('a'+i)))
		pos, err := s.append(&r, 0)
		if err != nil {
			t.Fatal(err)
		}
		ends = append(ends, pos)
	}
	s.close()
	path := filepath.Join(dir, segmentName(0))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	clear(b[ends[1]:ends[2]]) // the third record's blocks never written
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err = openSpool(dir, 1<<20, t.Logf)
	if err != nil {
		t.Fatalf("open refused a spool torn by a lost write: %v", err)
	}
	defer s.close()
	if end, _ := s.positions(); end != ends[1] {
		t.Fatalf("open kept %d bytes, want the two whole records before the lost write, %d", end, ends[1])
	}
}
