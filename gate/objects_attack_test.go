package gate

import (
	"context"
	"fmt"
	"testing"
)

// With the in-memory store, the records of upstream objects' tenants live
// in one bounded table for every tenant. One tenant that makes as many
// stored answers as the table holds (cheap requests, each a record) must
// not evict another tenant's records: globex's stored answer, made first,
// is still its own to continue. Before, the table was two generations
// dropped whole, and acme's 262,144 records left globex's continuation a
// 404.
func TestObjectsAttackOneTenantFillsTheTable(t *testing.T) {
	g := openAcme(t, "")
	ctx := context.Background()
	if err := g.OwnObject(ctx, "globex", "resp_globex"); err != nil {
		t.Fatal(err)
	}
	for i := range memObjects {
		if err := g.OwnObject(ctx, "acme", fmt.Sprintf("resp_acme_%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if tenant, ok, err := g.ObjectOwner(ctx, "resp_globex"); err != nil || !ok || tenant != "globex" {
		t.Errorf("globex's stored answer after acme's %d: %q found %v (%v); want globex's", memObjects, tenant, ok, err)
	}
	// acme gave up its own oldest, and keeps its newest.
	if _, ok, _ := g.ObjectOwner(ctx, "resp_acme_0"); ok {
		t.Error("acme's oldest record is kept past the bound")
	}
	if tenant, ok, _ := g.ObjectOwner(ctx, fmt.Sprint("resp_acme_", memObjects-1)); !ok || tenant != "acme" {
		t.Errorf("acme's newest record: %q %v", tenant, ok)
	}
}
