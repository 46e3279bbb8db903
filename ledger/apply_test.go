package ledger

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/pgtest"
)

// TestBatchesApplyIdempotently applies every batch twice, as the flusher
// does when a commit succeeded but its acknowledgement was lost, and checks
// that the store ends as if each had been applied once.
func TestBatchesApplyIdempotently(t *testing.T) {
	ctx := context.Background()
	stores := map[string]func(t *testing.T) store{
		"embedded": func(t *testing.T) store {
			s, err := openSQLite(ctx, filepath.Join(t.TempDir(), "ledger.db"), 0)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		"postgres": func(t *testing.T) store {
			s, err := openPostgres(ctx, pgtest.New(t), 0, t.Logf)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	}
	for name, mk := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := mk(t)
			defer s.close()
			at := time.Date(2026, 2, 3, 4, 5, 6, 0, time.UTC)
			reserve := func(id string) record {
				return record{kind: kindReserve, e: Entry{RequestID: id, Tenant: "acme", EstimatedCost: 100, CreatedAt: at}}
			}
			settle := func(id string, c costmodel.NanoUSD) record {
				return record{kind: kindSettle, e: Entry{RequestID: id, Status: StatusSettled, ActualCost: c, CreatedAt: at, SettledAt: at}}
			}
			batches := [][]record{
				{reserve("a"), reserve("b"), settle("a", 7)},
				{{kind: kindRecover, e: Entry{RequestID: "m1", CreatedAt: at}}, reserve("c"), reserve("d")}, // b is the dead run's
				{settle("b", 9), settle("c", 11)},
				{settle("c", 99), reserve("a")},
			}
			var st openSet
			for i, b := range batches {
				for try := range 2 {
					tx, err := s.begin(ctx)
					if err != nil {
						t.Fatal(err)
					}
					r, err := applyRecords(ctx, tx, "node1", "m1", b, &st)
					if err != nil {
						t.Fatalf("batch %d, try %d: %v", i, try, err)
					}
					if err := tx.commit(ctx); err != nil {
						t.Fatal(err)
					}
					if try == 1 {
						st.apply(r) // the first commit's result was "lost"
					}
				}
			}
			es, err := s.entries(ctx, Query{}, nil, 10)
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]struct {
				status Status
				charge costmodel.NanoUSD
			}{
				"a": {StatusSettled, 7}, "b": {StatusSettled, 9}, "c": {StatusSettled, 11}, "d": {StatusReserved, 100},
			}
			if len(es) != len(want) {
				t.Fatalf("%d entries, want %d: %+v", len(es), len(want), es)
			}
			for _, e := range es {
				if w := want[e.RequestID]; e.Status != w.status || e.Charge() != w.charge {
					t.Errorf("%s: %s charged %d, want %s charged %d", e.RequestID, e.Status, e.Charge(), w.status, w.charge)
				}
			}
			sp, err := s.spend(ctx, "acme", "", "", at.Add(-time.Hour), at.Add(time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			sum, err := s.summary(ctx, at.Add(-time.Hour), at.Add(time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			if sp != 7+9+11+100 || len(sum) != 1 || sum[0].Spend != sp || sum[0].Entries != 4 {
				t.Fatalf("spend %d, summary %+v; want %d over 4 entries", sp, sum, 7+9+11+100)
			}
		})
	}
}

// TestOpenSetMarkIsALowerBound opens and closes many reservations in
// batches and checks after each that the mark is at most the earliest
// CreatedAt of the reservations open, and zero only when none is.
func TestOpenSetMarkIsALowerBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	st := openSet{}
	truth := map[string]int64{}
	next := 0
	for batch := range 300 {
		r := &batchResult{opened: map[string]int64{}, closed: map[string]bool{}}
		for range rng.IntN(200) {
			id := fmt.Sprintf("r%d", next)
			at := int64(1_000_000 + next*10 - rng.IntN(500)) // roughly increasing
			next++
			r.opened[id] = at
			truth[id] = at
		}
		for id := range truth {
			if _, fresh := r.opened[id]; !fresh && rng.IntN(60) == 0 {
				r.closed[id] = true
				delete(truth, id)
			}
		}
		for id := range r.opened {
			if rng.IntN(20) == 0 { // opened and closed in the same batch
				delete(r.opened, id)
				delete(truth, id)
			}
		}
		low := st.since(r)
		st.apply(r)
		want := int64(0)
		for _, at := range truth {
			if want == 0 || at < want {
				want = at
			}
		}
		switch {
		case want == 0 && len(truth) == 0:
		case low.IsZero() || low.UnixMicro() > want:
			t.Fatalf("batch %d: mark %v above the earliest open reservation %v (%d open)", batch, low, fromMicro(want), len(truth))
		}
	}
	if len(truth) <= exactLimit {
		t.Fatalf("only %d open at the end: the bound path (more than %d) was not exercised", len(truth), exactLimit)
	}
}

// TestSettlementOfARecoveredEntryClosesIt: when another process recovers a
// reservation of this run (RecoverNode) and this run settles it later, the
// settlement takes it out of the open set, and the mark follows.
func TestSettlementOfARecoveredEntryClosesIt(t *testing.T) {
	ctx := context.Background()
	s, err := openSQLite(ctx, filepath.Join(t.TempDir(), "ledger.db"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	at := time.Date(2026, 3, 14, 15, 0, 0, 0, time.UTC)
	st := &openSet{}
	apply := func(recs ...record) {
		t.Helper()
		tx, err := s.begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r, err := applyRecords(ctx, tx, "x", "m", recs, st)
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.commit(ctx); err != nil {
			t.Fatal(err)
		}
		st.apply(r)
	}
	e := Entry{RequestID: "a", Tenant: "acme", EstimatedCost: 5, CreatedAt: at}
	apply(record{kind: kindRecover, e: Entry{RequestID: "m", CreatedAt: at}}, record{kind: kindReserve, e: e})

	tx, err := s.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := tx.recoverNode(ctx, "x", at.Add(time.Hour), at.Add(time.Hour)); err != nil || n != 1 {
		t.Fatalf("recoverNode = %d, %v", n, err)
	}
	if err := tx.commit(ctx); err != nil {
		t.Fatal(err)
	}

	settle := e
	settle.Status, settle.ActualCost, settle.SettledAt = StatusSettled, 3, at.Add(2*time.Hour)
	apply(record{kind: kindSettle, e: settle})
	if len(st.open) != 0 {
		t.Errorf("open set %v after the settlement, want empty", st.open)
	}
	var since int64
	if err := s.db.QueryRowContext(ctx, "SELECT open_since FROM ledger_nodes WHERE node = 'x'").Scan(&since); err != nil {
		t.Fatal(err)
	}
	if since != 0 {
		t.Errorf("open-since mark %v, want none", fromMicro(since))
	}
}
