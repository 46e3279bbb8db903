package ledger

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
)

func sampleRecord(id string) record {
	return record{kind: kindSettle, e: Entry{
		RequestID: id, Tenant: "acme", User: "ann", KeyID: "k", Route: "chat", Upstream: "openai",
		Model: "gpt-4o", Region: "eu", Decision: "friction", Policy: "p", Friction: "delay",
		Status: StatusFailed, HTTPStatus: 529,
		Estimated:     costmodel.Usage{InputTokens: 1, CachedInputTokens: 2, CacheWriteTokens: 3, OutputTokens: 4, ReasoningTokens: 5, Units: 6},
		Actual:        costmodel.Usage{InputTokens: 7, CachedInputTokens: 8, CacheWriteTokens: 9, OutputTokens: 10, ReasoningTokens: 11, Units: 12},
		EstimatedCost: 1 << 40, ActualCost: 13,
		CreatedAt: time.UnixMicro(1_700_000_000_123_456).UTC(), SettledAt: time.UnixMicro(1_700_000_001_000_001).UTC(),
	}}
}

func TestRecordRoundTrip(t *testing.T) {
	for _, r := range []record{
		sampleRecord("a"),
		{kind: kindReserve, e: Entry{RequestID: "b"}},
		{kind: kindRecover, e: Entry{CreatedAt: time.UnixMicro(1).UTC()}},
	} {
		b := appendFrame(nil, &r)
		var got record
		n, err := readFrame(b, &got, nil)
		if err != nil || n != len(b) {
			t.Fatalf("readFrame: %d, %v", n, err)
		}
		if got != r {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, r)
		}
		for cut := 0; cut < len(b); cut++ {
			if _, err := readFrame(b[:cut], &got, nil); !errors.Is(err, errTorn) {
				t.Fatalf("frame cut at %d of %d: %v, want errTorn", cut, len(b), err)
			}
		}
		for i := frameHeader; i < len(b); i++ {
			bad := bytes.Clone(b)
			bad[i] ^= 0x40
			if _, err := readFrame(bad, &got, nil); !errors.Is(err, errCorrupt) {
				t.Fatalf("byte %d flipped: %v, want errCorrupt", i, err)
			}
		}
	}
}

func FuzzReadFrame(f *testing.F) {
	r := sampleRecord("fuzz")
	f.Add(appendFrame(nil, &r))
	r.e.Plan = "free" // the last field a record may carry
	f.Add(appendFrame(nil, &r))
	f.Add(appendFrame(nil, &record{kind: kindRecover}))
	r.kind = kindTally
	f.Add(appendFrame(nil, &r))
	f.Add(appendFrame(nil, &record{kind: kindTick, pos: 7}))
	put := sampleRecord("tly_n_0123abcd.f1_0").e
	put.KeyDesc = "search\t0\t10\t60000000000\t10\t0\tacme\t7"
	f.Add(appendFrame(nil, &record{kind: kindFold, fold: &fold{drop: []string{"tly_n_0123abcd_3f_0", "tly_n_0123abcd_40_1"}, put: []Entry{put, put}}}))
	f.Add(appendFrame(nil, &record{kind: kindFold, fold: &fold{}}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var r, k record
		n, err := readFrame(b, &r, &interner{})
		// The flusher's reading: the same frame, a tally's record no
		// further than its kind.
		nk, errk := readFrameKind(b, &k, &interner{})
		if errk != nil && !errors.Is(errk, errTorn) && !errors.Is(errk, errCorrupt) {
			t.Fatalf("unexpected error %v", errk)
		}
		if err == nil {
			want := r
			if r.kind == kindTally {
				want = record{kind: kindTally}
			}
			if errk != nil || nk != n || !reflect.DeepEqual(k, want) {
				t.Fatalf("readFrameKind = %d, %+v, %v; want %d, %+v", nk, k, errk, n, want)
			}
		}
		if err != nil {
			if !errors.Is(err, errTorn) && !errors.Is(err, errCorrupt) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		if n < frameHeader || n > len(b) {
			t.Fatalf("length %d of %d bytes", n, len(b))
		}
		var again record
		if _, err := readFrame(appendFrame(nil, &r), &again, &interner{}); err != nil || !reflect.DeepEqual(again, r) {
			t.Fatalf("re-encoded record reads back as %+v, %v; want %+v", again, err, r)
		}
	})
}

func appendN(t *testing.T, s *spool, n int, prefix string) int64 {
	t.Helper()
	var end int64
	for i := range n {
		r := sampleRecord(fmt.Sprintf("%s%d", prefix, i))
		var err error
		if end, err = s.append(&r, 0); err != nil {
			t.Fatal(err)
		}
	}
	return end
}

func readAll(t *testing.T, s *spool, from int64) []record {
	t.Helper()
	var buf []byte
	recs, next, err := s.read(from, 1<<20, nil, &buf)
	if err != nil {
		t.Fatal(err)
	}
	if end, _ := s.positions(); next != end {
		t.Fatalf("read stopped at %d, end is %d", next, end)
	}
	return recs
}

func TestSpoolTornTailIsCut(t *testing.T) {
	dir := t.TempDir()
	s, err := openSpool(dir, 1<<20, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	end := appendN(t, s, 10, "r")
	s.close()
	// A write the machine did not finish: half a frame.
	r := sampleRecord("torn")
	frame := appendFrame(nil, &r)
	f, err := os.OpenFile(filepath.Join(dir, segmentName(0)), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(frame[:len(frame)/2])
	f.Close()

	s, err = openSpool(dir, 1<<20, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	if got, _ := s.positions(); got != end {
		t.Fatalf("end after reopen %d, want %d", got, end)
	}
	appendN(t, s, 1, "after")
	recs := readAll(t, s, 0)
	if len(recs) != 11 || recs[10].e.RequestID != "after0" {
		t.Fatalf("%d records, last %q", len(recs), recs[len(recs)-1].e.RequestID)
	}
}

func TestSpoolCorruptionBeforeTheTailIsAnError(t *testing.T) {
	dir := t.TempDir()
	s, err := openSpool(dir, 1024, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, s, 30, "r")
	s.close()
	first := filepath.Join(dir, segmentName(0))
	b, err := os.ReadFile(first)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 1
	os.WriteFile(first, b, 0o600)
	if s, err := openSpool(dir, 1024, t.Logf); !errors.Is(err, errCorrupt) {
		if s != nil {
			s.close()
		}
		t.Fatalf("open with a damaged sealed segment: %v, want errCorrupt", err)
	}
}

func TestSpoolRotatesAndDropsApplied(t *testing.T) {
	dir := t.TempDir()
	s, err := openSpool(dir, 1024, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	end := appendN(t, s, 40, "r")
	segs, _ := filepath.Glob(filepath.Join(dir, "*.spool"))
	if len(segs) < 5 {
		t.Fatalf("%d segments of 1 KiB for %d bytes", len(segs), end)
	}
	recs := readAll(t, s, 0)
	if len(recs) != 40 {
		t.Fatalf("read %d records across segments, want 40", len(recs))
	}
	for i, r := range recs {
		if r.e.RequestID != fmt.Sprintf("r%d", i) {
			t.Fatalf("record %d is %s", i, r.e.RequestID)
		}
	}
	mid := int64(0)
	var buf []byte
	_, mid, err = s.read(0, 20, nil, &buf)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.markApplied(mid); err != nil {
		t.Fatal(err)
	}
	s.close()
	s, err = openSpool(dir, 1024, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	if _, applied := s.positions(); applied != mid {
		t.Fatalf("applied after reopen %d, want %d", applied, mid)
	}
	rest := readAll(t, s, mid)
	if len(rest) != 20 || rest[0].e.RequestID != "r20" {
		t.Fatalf("after the applied position: %d records, first %s", len(rest), rest[0].e.RequestID)
	}
	after, _ := filepath.Glob(filepath.Join(dir, "*.spool"))
	if len(after) >= len(segs) {
		t.Fatalf("%d segments before, %d after half was applied: nothing was deleted", len(segs), len(after))
	}
	s.markApplied(end)
	if left, _ := filepath.Glob(filepath.Join(dir, "*.spool")); len(left) != 1 {
		t.Fatalf("%d segments left once all is applied, want the last one", len(left))
	}
}

func TestMergeRules(t *testing.T) {
	at := time.UnixMicro(1_000_000).UTC()
	reserved := &Entry{RequestID: "r", Tenant: "t", Model: "m", Status: StatusReserved, EstimatedCost: 50, CreatedAt: at}
	recovered := &Entry{RequestID: "r", Tenant: "t", Model: "m", Status: StatusRecovered, EstimatedCost: 50, ActualCost: 50, CreatedAt: at}
	settled := &Entry{RequestID: "r", Tenant: "t", Status: StatusSettled, EstimatedCost: 50, ActualCost: 20, CreatedAt: at}
	reserve := &record{kind: kindReserve, e: Entry{RequestID: "r", Tenant: "t", EstimatedCost: 50, CreatedAt: at}}
	settle := &record{kind: kindSettle, e: Entry{RequestID: "r", Status: StatusSettled, Model: "m2", ActualCost: 30, CreatedAt: at}}
	for _, c := range []struct {
		name       string
		cur        *Entry
		r          *record
		wantStatus Status // "" when nothing changes
		wantCharge costmodel.NanoUSD
		wantDelta  int64
	}{
		{"reserve new", nil, reserve, StatusReserved, 50, 50},
		{"reserve again", reserved, reserve, "", 0, 0},
		{"reserve after settle", settled, reserve, "", 0, 0},
		{"settle reserved", reserved, settle, StatusSettled, 30, -20},
		{"settle recovered", recovered, settle, StatusSettled, 30, -20},
		{"settle settled", settled, settle, "", 0, 0},
		{"settle unknown", nil, settle, StatusSettled, 30, 30},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, delta := merge(c.cur, c.r)
			if c.wantStatus == "" {
				if got != nil {
					t.Fatalf("changed to %+v, want no change", got)
				}
				return
			}
			if got == nil || got.Status != c.wantStatus || got.Charge() != c.wantCharge || delta != c.wantDelta {
				t.Fatalf("got %+v delta %d, want %s charged %d delta %d", got, delta, c.wantStatus, c.wantCharge, c.wantDelta)
			}
			if c.r.kind == kindSettle && c.cur != nil && got.Model != "m2" {
				t.Fatalf("model %q, want the settlement's m2", got.Model)
			}
		})
	}
}
