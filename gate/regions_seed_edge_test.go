package gate_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
)

// TestRegionSeedBesideAnUnconfiguredRow: regions eu, us and ap share
// acme's $0.01 day budget. us spends it whole ($0.001 a request) and goes
// down. The budget is renamed: ap reloads, reads its cap of the new name
// (0: the ledger's spend of us is seeded) and is then decommissioned, its
// row of the new name left in PostgreSQL. eu comes up with the new name
// and regions eu and us only: the rows of the new name are ap's and, once
// it has rebalanced, eu's, as many as the regions configured, while us,
// configured, still has none. us must be seeded from the ledger at every
// rebalance all the same: eu admits nothing of the spent budget. (Counted
// by rows, us went unseeded from eu's second rebalance on, and eu was
// given the budget again.)
func TestRegionSeedBesideAnUnconfiguredRow(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.New(t)
	open := func(region string, regions []string, budget string) *gate.Gate {
		t.Helper()
		return openYAML(t, seedEdgeYAML(t.TempDir(), region, regions, redistest.New(t).URL, dsn, budget))
	}
	all := []string{"eu", "us", "ap"}

	us := open("us", all, "name: daily")
	spent := 0
	for deadline := time.Now().Add(20 * time.Second); spent < 10 && time.Now().Before(deadline); {
		if regAtkSpend(t, us, usd("0.001")) {
			spent++
		} else {
			time.Sleep(60 * time.Millisecond) // its cap grows at its rebalances, every 50 ms on the system clock
		}
	}
	if spent != 10 {
		t.Fatalf("us spent %d of 10 requests", spent)
	}
	if err := us.Ledger().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	us.Close()

	ap := open("ap", all, "name: daily-usd")
	if regAtkSpend(t, ap, usd("0.001")) {
		t.Fatal("ap admitted a request of the renamed budget that us had spent")
	}
	ap.Close()

	eu := open("eu", []string{"eu", "us"}, "name: daily-usd")
	admitted := 0
	for end := time.Now().Add(time.Second); time.Now().Before(end); {
		if regAtkSpend(t, eu, usd("0.001")) {
			admitted++
		} else {
			time.Sleep(20 * time.Millisecond) // across many of eu's rebalances
		}
	}
	if admitted > 0 {
		t.Errorf("eu admitted %d of $0.001 of a $0.01 day budget us had spent (renamed; ap, no longer configured, holds a row of it; us none)", admitted)
	}
}

// seedEdgeYAML is regionYAML with the regions configured.
func seedEdgeYAML(dir, region string, regions []string, redis, dsn, budget string) string {
	return strings.Replace(regionYAML(dir, region, redis, dsn, budget),
		"names: [eu, us]", fmt.Sprintf("names: [%s]", strings.Join(regions, ", ")), 1)
}
