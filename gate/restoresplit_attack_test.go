package gate

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/weighted"
)

// TestRestoreSplitAtkRaceTheFirstCall: a tenant whose ledger names more
// users than one Redis call of a restore carries (restoreBatch; the rate
// limit service and the reserve API take any user name) has its restore
// after a data loss sent in several calls. Each wrote the tenant's
// generation marker, and the configured budgets ride in the last: between
// the first call and the last, the tenant was marked fresh while its
// $0.01 daily budget, spent four times over in the ledger, stood at 0 in
// Redis, and the requests of other users decided then were admitted.
// The marker must be written with the last call only: a request that
// comes before it finds the tenant stale and waits for the restore.
func TestRestoreSplitAtkRaceTheFirstCall(t *testing.T) {
	ctx := context.Background()
	dsn, srv := pgtest.New(t), redistest.New(t)
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q, timeout: 5s, queue_timeout: 5s}
ledger: {dsn: %q}
tenants:
  - {name: acme, plan: small, keys: [{id: dave-key, key: cg-dave, user: dave}]}
budgets:
  - {name: per-user, scope: user, amount: "1.00"}
  - {name: daily, scope: tenant, amount: "0.01"}
`, t.TempDir(), srv.URL, dsn)))
	if err != nil {
		t.Fatal(err)
	}
	g := openConfig(t, cfg)
	n := 4 * restoreBatch
	for i := range n {
		e := ledger.Entry{RequestID: fmt.Sprintf("split-%d", i), Tenant: "acme", User: fmt.Sprintf("u%05d", i),
			Route: "/x", EstimatedCost: 10_000} // $0.00001 each: $0.04096 in all
		if err := g.Ledger().Reserve(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.Ledger().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	rc := srv.Client(t)
	if err := rc.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	var (
		mu       sync.Mutex
		admitted int
		wg       sync.WaitGroup
	)
	spend := func(user string) {
		defer wg.Done()
		res, d := g.Reserve(ctx, &Request{Caller: g.Trusted("acme", user, "", "small"), Route: "/x",
			Estimate: costmodel.Estimate{Cost: 1_000_000}})
		if res == nil {
			if d.Status != 402 {
				t.Errorf("%s refused with %d: %+v", user, d.Status, d)
			}
			return
		}
		if d, ok := res.Record(ctx); !ok {
			t.Errorf("record: %+v", d)
		}
		res.Settle(ctx, Charge{Cost: 1_000_000, HTTPStatus: 200})
		mu.Lock()
		admitted++
		mu.Unlock()
	}
	// The first request finds the loss and restores acme; the others
	// come as soon as acme's marker is written, while it restores.
	first := make(chan struct{})
	wg.Add(1)
	go func() {
		defer close(first)
		spend("u00000")
	}()
	marked := false
	for !marked {
		select {
		case <-first:
			marked = true
		default:
			marked = rc.Exists(ctx, "cg:g:{acme}").Val() == 1
		}
	}
	for i := range 8 {
		wg.Add(1)
		go spend(fmt.Sprintf("late-%d", i))
	}
	wg.Wait()
	if admitted != 0 {
		t.Errorf("after Redis lost its data: %d of $0.001 admitted to acme, whose $0.01 daily budget the ledger says is spent ($0.041)", admitted)
	}
}

// TestRestoreSplitAtkLossBetweenTheCalls: the restore of a tenant whose
// ledger names more users than one Redis call carries is made in several
// calls, the last of which marks the tenant fresh. Redis loses its data
// again between the first call and the last (a restart in a crash loop,
// a second failover): the users the first call restored were at zero
// again under a fresh marker, and each spent its budget once more (1,024
// of 2,058 users who had spent theirs were admitted). Each call after
// the first now finds the one before it in the store, or the restore
// fails, and the next request restores the tenant again: none is
// admitted.
func TestRestoreSplitAtkLossBetweenTheCalls(t *testing.T) {
	ctx := context.Background()
	dsn, srv := pgtest.New(t), redistest.New(t)
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q, timeout: 5s, queue_timeout: 5s}
ledger: {dsn: %q}
tenants:
  - {name: acme, plan: small, keys: [{id: dave-key, key: cg-dave, user: dave}]}
budgets:
  - {name: per-user, scope: user, amount: "0.00001"}
`, t.TempDir(), srv.URL, dsn)))
	if err != nil {
		t.Fatal(err)
	}
	g := openConfig(t, cfg)
	n := 2*restoreBatch + 10
	for i := range n {
		e := ledger.Entry{RequestID: fmt.Sprintf("split-%d", i), Tenant: "acme", User: fmt.Sprintf("u%05d", i),
			Route: "/x", EstimatedCost: 10_000} // each user's whole budget
		if err := g.Ledger().Reserve(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.Ledger().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	rc := srv.Client(t)
	if err := rc.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// Redis loses its data again after the restore's first call.
	g.store.store = &lossAfterFirstCall{store: g.store.store, loss: func() {
		if err := rc.FlushAll(ctx).Err(); err != nil {
			t.Error(err)
		}
	}}
	admitted := 0
	for i := range n {
		res, d := g.Reserve(ctx, &Request{Caller: g.Trusted("acme", fmt.Sprintf("u%05d", i), "", "small"), Route: "/x",
			Estimate: costmodel.Estimate{Cost: 1_000}})
		if res != nil {
			admitted++
			res.Cancel(ctx)
		} else if d.Status != 402 && i > 0 {
			t.Fatalf("u%05d refused with %d: %+v", i, d.Status, d)
		}
	}
	if admitted > 0 {
		t.Errorf("after Redis lost its data twice, the second amid the restore: %d of %d users who had spent their budget were admitted again", admitted, n)
	}
}

// lossAfterFirstCall is a store that loses its data (loss) once, after
// the first call of a restore made in several (RestoreCounters or
// RestoreStage).
type lossAfterFirstCall struct {
	store
	loss func()
	once sync.Once
}

func (s *lossAfterFirstCall) RestoreCounters(ctx context.Context, items []weighted.Item, counted []int64) error {
	err := s.store.RestoreCounters(ctx, items, counted)
	s.once.Do(s.loss)
	return err
}

func (s *lossAfterFirstCall) RestoreStage(ctx context.Context, items []weighted.Item, counted []int64, st weighted.Stage) error {
	err := s.store.(weighted.StagedRestorer).RestoreStage(ctx, items, counted, st)
	s.once.Do(s.loss)
	return err
}
