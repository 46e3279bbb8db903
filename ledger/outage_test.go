package ledger_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/ledger"
)

// TestPostgresOutage stops a private PostgreSQL for 10 s (immediate mode,
// as a crash does) under a steady load of reservations and settlements, then
// starts it again: every admitted request must end up in the store exactly
// once, settled at its actual cost, and the spend must match.
func TestPostgresOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("outage test in -short mode")
	}
	t.Parallel()
	pg := pgtest.NewPrivate(t)
	var logged atomic.Int64
	l := open(t, ledger.Config{
		Dir: t.TempDir(), DSN: pg.URL(), RetryMax: 200 * time.Millisecond,
		Logf: func(f string, a ...any) {
			if logged.Add(1) <= 20 {
				t.Logf(f, a...)
			}
		},
	})
	ctx := context.Background()

	const workers, lag = 4, 16
	var (
		stop     = make(chan struct{})
		wg       sync.WaitGroup
		mu       sync.Mutex
		admitted = map[string]costmodel.NanoUSD{} // id → the cost it is settled at
		failures []error
	)
	for w := range workers {
		wg.Go(func() {
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			var pending []string
			settleOne := func() {
				id := pending[0]
				pending = pending[1:]
				mu.Lock()
				c := admitted[id]
				mu.Unlock()
				if err := l.Settle(ctx, settlement(id, c)); err != nil {
					mu.Lock()
					failures = append(failures, err)
					mu.Unlock()
				}
			}
			for seq := 0; ; seq++ {
				select {
				case <-stop:
					for len(pending) > 0 {
						settleOne()
					}
					return
				case <-tick.C:
				}
				id := fmt.Sprintf("o-%d-%d", w, seq)
				if err := l.Reserve(ctx, reservation(id, t0.Add(time.Duration(seq)*time.Millisecond))); err != nil {
					mu.Lock()
					failures = append(failures, err)
					mu.Unlock()
					continue
				}
				mu.Lock()
				admitted[id] = costmodel.NanoUSD(100 + seq%50 + w)
				mu.Unlock()
				if pending = append(pending, id); len(pending) > lag {
					settleOne()
				}
			}
		})
	}

	waitFlushed := func() {
		t.Helper()
		fctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		if err := l.Flush(fctx); err != nil {
			t.Fatalf("Flush: %v", err)
		}
	}
	<-time.After(time.Second)
	waitFlushed()
	pg.Stop()
	outage := time.Now()
	<-time.After(10 * time.Second)
	st := l.Stats()
	if st.StoreErr == nil || st.Pending == 0 {
		t.Errorf("after 10 s of outage: %+v, want a store error and records waiting in the spool", st)
	}
	pg.Start()
	t.Logf("outage of %s; %d bytes waited in the spool", time.Since(outage).Round(time.Millisecond), st.Pending)
	<-time.After(time.Second)
	close(stop)
	wg.Wait()
	waitFlushed()
	if len(failures) > 0 {
		t.Fatalf("%d calls failed, first: %v", len(failures), failures[0])
	}

	entries := all(t, l, ledger.Query{Tenant: "acme", Limit: ledger.MaxLimit})
	var sum costmodel.NanoUSD
	for _, e := range entries {
		want, ok := admitted[e.RequestID]
		switch {
		case !ok:
			t.Fatalf("entry %s was never admitted", e.RequestID)
		case e.Status != ledger.StatusSettled || e.ActualCost != want:
			t.Fatalf("%s: %s at %d, want settled at %d", e.RequestID, e.Status, e.ActualCost, want)
		}
		sum += e.Charge()
	}
	if len(entries) != len(admitted) {
		t.Fatalf("%d entries for %d admitted requests", len(entries), len(admitted))
	}
	sp, err := l.Spend(ctx, ledger.SpendQuery{Tenant: "acme", Period: "month", At: t0})
	if err != nil {
		t.Fatal(err)
	}
	if sp != sum {
		t.Fatalf("Spend = %d, want %d", sp, sum)
	}
	t.Logf("%d requests admitted and settled exactly once across the outage", len(admitted))
}
