package gate

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/weighted"
)

// heldStore is a limiter store whose restores wait for restoreGo, and
// which, once armed, holds the first stale answer it gives until staleGo:
// a call that reached the store while a restore ran, answered after it
// ended, as a loaded machine answers it.
type heldStore struct {
	store
	mu                    sync.Mutex
	armed                 bool
	restoring, staleHeld  chan struct{} // closed when a restore waits, when a stale answer is held
	restoreGo, staleGo    chan struct{}
	restoringOnce, heldOn sync.Once
}

func (h *heldStore) Restore(ctx context.Context, items []weighted.Item, counted []int64) error {
	h.restoringOnce.Do(func() { close(h.restoring) })
	<-h.restoreGo
	return h.store.Restore(ctx, items, counted)
}

func (h *heldStore) Debit(ctx context.Context, id string, items []weighted.Item) (weighted.Result, error) {
	res, err := h.store.Debit(ctx, id, items)
	h.mu.Lock()
	hold := h.armed && errors.Is(err, weighted.ErrStale)
	if hold {
		h.armed = false
	}
	h.mu.Unlock()
	if hold {
		h.heldOn.Do(func() { close(h.staleHeld) })
		<-h.staleGo
	}
	return res, err
}

// TestRestoreTwiceAtkCallSentDuringTheRestore: Redis loses its data and
// a request's call finds its tenant stale: the restore begins. Another
// call of the tenant is sent while the restore runs, reaches Redis before
// the restore writes the tenant's marker, and its stale answer comes back
// after the restore ended. That answer is the same loss: the tenant is
// restored once. Before, the second call, sent after the restore was
// noted, restored the tenant a second time, and every request debited
// between the two restores and written to the ledger after the second
// was charged twice: 200 racers on a fresh Redis admitted 49 of a limit
// of 50 (chaos.TestRacersExactLimits, when the machine was loaded).
func TestRestoreTwiceAtkCallSentDuringTheRestore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := redistest.New(t)
	g := openYAML(t, fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q, timeout: 5s, queue_timeout: 5s}
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme, user: ann}]}
limits:
  - {name: day, dimensions: [tenant], unit: requests, rate: 10, period: 24h, algorithm: sliding_window}
`, t.TempDir(), srv.URL))
	t.Cleanup(func() { g.Close() })
	acme := groupRequest{key: "cg-acme"}
	if n := spendGroupUntil(t, g, acme, 2, 429); n != 2 {
		t.Fatalf("before the loss: %d admitted of 2", n)
	}
	res, d := g.Reserve(ctx, acme.request(g))
	if res == nil {
		t.Fatalf("refused: %+v", d)
	}
	items := append([]weighted.Item(nil), res.items...)
	res.Cancel(ctx)

	h := &heldStore{store: g.store.store, restoring: make(chan struct{}), staleHeld: make(chan struct{}),
		restoreGo: make(chan struct{}), staleGo: make(chan struct{})}
	f := g.fresh(h, 1)
	flushRedis(t, srv)
	before := f.lost.seq.Load()
	debit := func(id string) <-chan error {
		done := make(chan error, 1)
		go func() {
			res, err := f.Debit(ctx, id, items)
			if err == nil && !res.Allowed {
				err = fmt.Errorf("refused: %+v", res)
			}
			done <- err
		}()
		return done
	}
	first := debit("first")
	waitOr(t, h.restoring, "the first call's restore")
	h.mu.Lock()
	h.armed = true
	h.mu.Unlock()
	second := debit("second")
	waitOr(t, h.staleHeld, "the second call's stale answer")
	close(h.restoreGo)
	if err := <-first; err != nil {
		t.Fatalf("the first call: %v", err)
	}
	close(h.staleGo)
	if err := <-second; err != nil {
		t.Fatalf("the second call: %v", err)
	}
	if n := f.lost.seq.Load() - before; n != 1 {
		t.Fatalf("one loss restored %d times; want once", n)
	}
	res2, err := f.Peek(ctx, items)
	if err != nil {
		t.Fatal(err)
	}
	if got := res2.Items[0].Remaining; got != 6 {
		t.Fatalf("after 2 spent before the loss and 2 debited after: %d left of 10; want 6", got)
	}
}

// waitOr waits for ch to close, for at most 20 s.
func waitOr(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: not within 20 s", what)
	}
}
