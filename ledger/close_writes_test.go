package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
)

// Writers reserve and settle while another goroutine flushes and Close
// runs. Every Reserve and Settle that returned nil must be in the store
// after the next Open, exactly once, at its settlement when it was
// settled; small segments make settlements land in later segments than
// their reservations.
func TestCloseDuringWritesAndFlush(t *testing.T) {
	forEachStore(t, func(t *testing.T, cfg ledger.Config) {
		ctx := context.Background()
		cfg.SegmentSize = 64 << 10
		cfg.BatchSize = 16
		cfg.Logf = func(string, ...any) {}
		l, err := ledger.Open(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		var (
			mu       sync.Mutex
			reserved = map[string]bool{}
			settled  = map[string]costmodel.NanoUSD{}
			wg       sync.WaitGroup
			stop     = make(chan struct{})
		)
		at := time.Now()
		for w := range 4 {
			wg.Go(func() {
				var pending []string
				for i := 0; ; i++ {
					time.Sleep(200 * time.Microsecond) // pace the writers
					select {
					case <-stop:
						return
					default:
					}
					id := fmt.Sprintf("w%d-%d", w, i)
					if err := l.Reserve(ctx, reservation(id, at)); err == nil {
						mu.Lock()
						reserved[id] = true
						mu.Unlock()
						pending = append(pending, id)
					} else if !errors.Is(err, ledger.ErrClosed) {
						t.Errorf("reserve: %v", err)
					}
					if len(pending) > 8 {
						sid := pending[0]
						pending = pending[1:]
						c := costmodel.NanoUSD(100 + i)
						if err := l.Settle(ctx, settlement(sid, c)); err == nil {
							mu.Lock()
							settled[sid] = c
							mu.Unlock()
						} else if !errors.Is(err, ledger.ErrClosed) {
							t.Errorf("settle: %v", err)
						}
					}
				}
			})
		}
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				fctx, cancel := context.WithTimeout(ctx, time.Second)
				_ = l.Flush(fctx)
				cancel()
			}
		})
		time.Sleep(200 * time.Millisecond) // let the writers run a while
		closeErr := l.Close()
		close(stop)
		wg.Wait()
		if closeErr != nil {
			t.Logf("close: %v", closeErr)
		}
		l2 := open(t, cfg)
		flush(t, l2)
		got := map[string]ledger.Entry{}
		for _, e := range all(t, l2, ledger.Query{}) {
			if _, dup := got[e.RequestID]; dup {
				t.Errorf("%s twice", e.RequestID)
			}
			got[e.RequestID] = e
		}
		mu.Lock()
		defer mu.Unlock()
		var want costmodel.NanoUSD
		for id := range reserved {
			e, ok := got[id]
			if !ok {
				t.Errorf("%s reserved but missing", id)
				continue
			}
			if c, ok := settled[id]; ok {
				if e.Status != ledger.StatusSettled || e.ActualCost != c {
					t.Errorf("%s settled at %d: %+v", id, c, e)
				}
				want += c
			} else {
				if e.Status != ledger.StatusRecovered && e.Status != ledger.StatusSettled {
					t.Errorf("%s: status %s after reopen", id, e.Status)
				}
				want += e.ActualCost
			}
		}
		if len(got) != len(reserved) {
			t.Errorf("%d entries, %d reserved", len(got), len(reserved))
		}
		sp, err := l2.Spend(ctx, ledger.SpendQuery{Tenant: "acme", Period: "day"})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%d reserved, %d settled, spend %d", len(reserved), len(settled), sp)
		if sp != want {
			t.Errorf("spend %d, entries sum to %d", sp, want)
		}
	})
}
