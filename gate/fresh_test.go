package gate

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/weighted"
)

// TestRestoreEachTagFromItsOwnSpend: a call whose items span two stale
// tenants restores each from its own ledger spend; one tenant's restore
// does not mark the other's counters fresh while they are still empty.
func TestRestoreEachTagFromItsOwnSpend(t *testing.T) {
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
admin_token: t
data_dir: %q
upstreams: [{name: openai, kind: openai, simulate: always}]
tenants:
  - {name: a, plan: p, keys: [{id: ka, key: cg-a}]}
  - {name: b, plan: p, keys: [{id: kb, key: cg-b}]}
budgets:
  - {name: daily, scope: tenant, amount: "1.00"}
`, t.TempDir())))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Store.Redis, cfg.Ledger.DSN = "", ""
	s, err := Open(context.Background(), cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	spent := map[string]costmodel.NanoUSD{"a": 300_000_000, "b": 700_000_000}
	for tenant, cost := range spent {
		e := ledger.Entry{RequestID: "req-" + tenant, Tenant: tenant, KeyID: "k" + tenant, Route: "/v1/chat/completions",
			Upstream: "openai", Model: "gpt-4o-mini", Status: ledger.StatusReserved, EstimatedCost: cost, CreatedAt: time.Now()}
		if err := s.ledger.Reserve(ctx, e); err != nil {
			t.Fatal(err)
		}
		e.Status, e.ActualCost, e.SettledAt = ledger.StatusSettled, cost, time.Now()
		if err := s.ledger.Settle(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	// A fresh store: both tenants are stale.
	st := s.state.Load()
	s.store = s.fresh(weighted.NewMemory(weighted.MemoryConfig{Generations: true}), 1)
	var items []weighted.Item
	for _, tenant := range []string{"a", "b"} {
		l := st.limits[0]
		items = append(items, weighted.Item{Limit: l.limit, Key: l.callerKey(&Caller{Tenant: tenant, Plan: "p", st: st})})
	}
	res, err := s.store.Peek(ctx, items)
	if err != nil {
		t.Fatal(err)
	}
	for i, tenant := range []string{"a", "b"} {
		if used := res.Items[i].Capacity - res.Items[i].Remaining; used != int64(spent[tenant]) {
			t.Errorf("tenant %s: counter at %d after the restore, the ledger says %d", tenant, used, spent[tenant])
		}
	}
}
