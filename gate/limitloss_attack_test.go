package gate

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/internal/redistest"
)

// openYAML opens a gate on the configuration yaml; the caller closes it.
func openYAML(t *testing.T, yaml string) *Gate {
	t.Helper()
	cfg, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	g, err := Open(context.Background(), cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// onDataDir returns a function that opens a gate on the embedded
// default (the in-memory store, the embedded ledger) in a data_dir of
// t's, the same at every call, with the configuration's rest (YAML lines
// after admin_token and data_dir): a restart, which finds the ledger
// again and a store that starts empty. The caller closes each gate.
func onDataDir(t *testing.T, rest string) func() *Gate {
	dir := t.TempDir()
	return func() *Gate {
		t.Helper()
		return openYAML(t, fmt.Sprintf("\nadmin_token: t\ndata_dir: %q\n", dir)+rest)
	}
}

// acmeRedisGate opens a gate on a private Redis with tenant acme (key
// cg-acme, user ann) and one limit, limit (a YAML flow mapping); the gate
// is closed at the test's end.
func acmeRedisGate(t *testing.T, limit string) (*Gate, *redistest.Server) {
	t.Helper()
	srv := redistest.New(t)
	g := openYAML(t, fmt.Sprintf(`
admin_token: t
data_dir: %q
store: {redis: %q, timeout: 5s, queue_timeout: 5s}
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme, user: ann}]}
limits:
  - %s
`, t.TempDir(), srv.URL, limit))
	t.Cleanup(func() { g.Close() })
	return g, srv
}

// awayFromWindowEdge waits, when a fixed window of period ends within a
// minute, until it has ended: a test that spends a window and then checks
// what is left of it must do both in one window.
func awayFromWindowEdge(t *testing.T, period time.Duration) {
	t.Helper()
	if d := time.Until(time.Now().Truncate(period).Add(period)); d < time.Minute {
		t.Logf("waiting %v for the window to turn", d)
		time.Sleep(d + 100*time.Millisecond)
	}
}

// TestLimitLossAtkDollarLimitsHold: a limit in dollars keyed by the
// caller is a spend cap over a window of its own, as a budget is over
// its period. acme spends it ($0.01 in $0.001 requests) and Redis then
// loses its data (FLUSHALL): the first request after the loss finds the
// tenant's counters gone, and must not find the limit empty. Before, a
// budget's counter was restored from the ledger and a limit's was not,
// so acme spent the window's dollars again.
func TestLimitLossAtkDollarLimitsHold(t *testing.T) {
	for _, algo := range sharedAlgorithms {
		for _, dims := range []string{"[tenant]", "[user]", "[api_key]", "[tenant, user]"} {
			t.Run(algo+dims, func(t *testing.T) {
				t.Parallel()
				awayFromWindowEdge(t, 24*time.Hour)
				g, srv := acmeRedisGate(t, fmt.Sprintf(`{name: spend, dimensions: %s, unit: usd, rate_usd: "0.01", period: 24h, algorithm: %s}`, dims, algo))
				if n := spendAcmeUntil(t, g, 4, 429); n != 4 {
					t.Fatalf("before the first loss: %d admitted of 4", n)
				}
				if err := srv.Client(t).FlushAll(context.Background()).Err(); err != nil {
					t.Fatal(err)
				}
				// The restore counts what was spent, and no more.
				if n := spendAcmeUntil(t, g, 20, 429); n != 6 {
					t.Fatalf("after Redis lost its data: %d admitted of the $0.006 left of a $0.01 limit, in $0.001 requests", n)
				}
				if err := srv.Client(t).FlushAll(context.Background()).Err(); err != nil {
					t.Fatal(err)
				}
				if n := spendAcmeUntil(t, g, 20, 429); n > 0 {
					t.Fatalf("after Redis lost its data again: %d more admitted of a $0.01 limit acme had spent", n)
				}
			})
		}
	}
}

// TestLimitLossAtkRestartOnMemory: the embedded default (the in-memory
// store, the embedded ledger) restarted: the new process's store starts
// empty, and a dollar limit acme spent must stay spent.
func TestLimitLossAtkRestartOnMemory(t *testing.T) {
	before, after := spendAcmeAroundARestart(t, `
limits:
  - {name: spend, dimensions: [tenant], unit: usd, rate_usd: "0.01", period: 1h, algorithm: sliding_window}
`)
	if before != 10 {
		t.Fatalf("before the restart: %d admitted of a $0.01 limit, in $0.001 requests", before)
	}
	if after > 0 {
		t.Fatalf("after a restart: %d more admitted of a $0.01 limit acme had spent this hour", after)
	}
}

// spendAcmeAroundARestart opens a gate on the embedded default (the
// in-memory store, the embedded ledger in a data_dir) with acme and the
// config's rest, spends acme's requests until a 429, restarts the gate
// on the same data_dir, spends again, and returns how many were admitted
// before and after the restart.
func spendAcmeAroundARestart(t *testing.T, rest string) (before, after int) {
	t.Helper()
	open := onDataDir(t, `tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme}]}
`+rest)
	g := open()
	before = spendAcmeUntil(t, g, 20, 429)
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	g = open()
	defer g.Close()
	return before, spendAcmeUntil(t, g, 20, 429)
}

// TestLimitLossAtkGlobalDollarLimitHolds: a limit in dollars with one key
// for the whole deployment (no dimension, or the region) is its spend
// cap. Two tenants spend it ($0.006 and $0.004 of $0.01) and the store
// then loses its data (Redis flushed; the embedded default restarted):
// the counter has no tenant's marker, and must still not come back
// empty.
func TestLimitLossAtkGlobalDollarLimitHolds(t *testing.T) {
	for _, algo := range sharedAlgorithms {
		for _, dims := range []string{"[]", "[region]"} {
			for _, store := range []string{"redis", "memory"} {
				t.Run(algo+dims+"/"+store, func(t *testing.T) {
					t.Parallel()
					awayFromWindowEdge(t, 24*time.Hour)
					dir := t.TempDir()
					var srv *redistest.Server
					storeYAML := ""
					if store == "redis" {
						srv = redistest.New(t)
						storeYAML = fmt.Sprintf("store: {redis: %q, timeout: 5s, queue_timeout: 5s}", srv.URL)
					}
					open := func() *Gate {
						return openYAML(t, fmt.Sprintf(`
admin_token: t
data_dir: %q
region: eu
%s
tenants:
  - {name: acme, plan: small, keys: [{id: acme-key, key: cg-acme}]}
  - {name: beta, plan: small, keys: [{id: beta-key, key: cg-beta}]}
limits:
  - {name: all-spend, dimensions: %s, unit: usd, rate_usd: "0.01", period: 24h, algorithm: %s}
`, dir, storeYAML, dims, algo))
					}
					g := open()
					defer func() { g.Close() }()
					if a, b := spendAsUntil(t, g, "cg-acme", 6, 429), spendAsUntil(t, g, "cg-beta", 4, 429); a+b != 10 {
						t.Fatalf("before the loss: %d and %d admitted of 6 and 4", a, b)
					}
					if store == "redis" {
						if err := srv.Client(t).FlushAll(context.Background()).Err(); err != nil {
							t.Fatal(err)
						}
					} else {
						if err := g.Close(); err != nil {
							t.Fatal(err)
						}
						g = open()
					}
					if n := spendAsUntil(t, g, "cg-beta", 20, 429) + spendAsUntil(t, g, "cg-acme", 20, 429); n > 0 {
						t.Fatalf("after the store lost its data: %d more admitted of a $0.01 global limit both tenants had spent", n)
					}
				})
			}
		}
	}
}
