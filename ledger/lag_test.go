package ledger_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/costgate/costgate/internal/servicetest"
	"github.com/costgate/costgate/ledger"
)

// TestLagGrowsWhileTheStoreIsDown: with the database unreachable, entries
// wait in the spool and Stats says how much and for how long.
func TestLagGrowsWhileTheStoreIsDown(t *testing.T) {
	port := servicetest.FreePort(t) // nothing listens there
	ctx := context.Background()
	l, err := ledger.Open(ctx, ledger.Config{
		DSN:          fmt.Sprintf("postgres://postgres@127.0.0.1:%d/x?sslmode=disable&connect_timeout=1", port),
		Dir:          t.TempDir(),
		CloseTimeout: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Reserve(ctx, ledger.Entry{RequestID: "r1", Tenant: "acme", EstimatedCost: 1}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for l.Stats().Lag < 50*time.Millisecond {
		if time.Now().After(deadline) {
			t.Fatalf("lag did not grow: %+v", l.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st := l.Stats(); st.Pending == 0 || st.StoreErr == nil {
		t.Errorf("stats while the store is down: %+v", st)
	}
}
