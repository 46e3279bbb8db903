package rls_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/rls"
)

// hitsConfig gives acme 100 requests a day, and a domain whose priced
// search descriptor debits its hits in requests and whose tokens
// descriptor charges a stream's output tokens: both are recorded in the
// ledger (they cost money).
const hitsConfig = `
admin_token: t
tenants:
  - {name: acme, plan: free, keys: [{key: k-acme}]}
limits:
  - {name: daily, dimensions: [tenant], unit: requests, rate: 100, period: 24h, algorithm: fixed_window}
costs:
  prices:
    test-model: {input: "1.00", output: "10.00"}
rls:
  domains:
    - domain: edge
      descriptors:
        - key: tenant
          as: tenant
          descriptors:
            - {key: generic_key, value: search, price_per_hit: "0.0001"}
            - key: model
              as: model
              descriptors:
                - {key: tokens, value: output, hits: output_tokens}
`

// TestHitsAtkRestoredAsDebited: acme spends 60 of its 100 requests a day
// in one call of hits_addend 60, and Envoy reports a stream's output
// tokens after it (a usage charge, no request); Redis then loses its data
// (FLUSHALL). The restore from the ledger must find 60 requests spent,
// and acme get 40 more. Before, the ledger counted one request per entry:
// 2, and acme got 98.
func TestHitsAtkRestoredAsDebited(t *testing.T) {
	e := hitsEnv(t, hitsConfig)
	if r := e.ask(t, "edge", 0, hits(500, d("tenant", "acme", "model", "test-model", "tokens", "output"))); r.GetOverallCode() != OK {
		t.Fatalf("a charge of 500 output tokens: %s", codes_(r))
	}
	loseRedis(t, e)
	if n := admitOnes(t, e); n != 40 {
		t.Fatalf("after Redis lost its data: %d requests admitted of the 40 acme had left", n)
	}
}

// hitsEnv opens yaml's env on Redis, not within a minute of the day's
// end (the tests spend and check in one day's window), and debits 60
// hits of acme's search.
func hitsEnv(t *testing.T, yaml string) *env {
	t.Helper()
	awayFromDayEnd(time.Minute)
	e := newEnv(t, yaml, true, rls.Options{})
	if r := e.ask(t, "edge", 0, hits(60, d("tenant", "acme", "generic_key", "search"))); r.GetOverallCode() != OK {
		t.Fatalf("a debit of 60 of 100: %s", codes_(r))
	}
	return e
}

// awayFromDayEnd waits for the next UTC day when less than left remains
// of this one: the tests that spend a limit of a day and check it after a
// loss do so in one day's window.
func awayFromDayEnd(left time.Duration) { awayFromWindowEnd(24*time.Hour, left) }

// awayFromWindowEnd waits for the next window of period (a fixed window's,
// which starts on the UTC clock's multiples of it) when less than left
// remains of this one.
func awayFromWindowEnd(period, left time.Duration) {
	if d := time.Until(time.Now().Truncate(period).Add(period)); d < left {
		time.Sleep(d + 100*time.Millisecond)
	}
}

// loseRedis writes e's ledger records, then empties its Redis.
func loseRedis(t *testing.T, e *env) {
	t.Helper()
	ctx := context.Background()
	if err := e.g.Ledger().Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.redis.Client(t).FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
}

// admitOnes asks for acme's requests of one hit until one is refused,
// at most 200, and returns how many were admitted.
func admitOnes(t *testing.T, e *env) (admitted int) {
	t.Helper()
	for range 200 {
		if e.ask(t, "edge", 1, d("tenant", "acme")).GetOverallCode() != OK {
			break
		}
		admitted++
	}
	return admitted
}

// unpricedConfig is hitsConfig without a price: acme's search calls and
// the output tokens it reports cost nothing, and count on its 100
// requests and 1,000 tokens a day all the same. Tenants the configuration
// does not list (bench-*) have no limit of their own, only the
// descriptor's.
const unpricedConfig = `
admin_token: t
tenants:
  - {name: acme, plan: free, keys: [{key: k-acme}]}
limits:
  - {name: daily, plans: [free], dimensions: [tenant], unit: requests, rate: 100, period: 24h, algorithm: fixed_window}
  - {name: daily-tokens, plans: [free], dimensions: [tenant], unit: tokens, rate: 1000, period: 24h, algorithm: fixed_window}
rls:
  domains:
    - domain: edge
      descriptors:
        - key: tenant
          value: bench-*
          as: tenant
          rate_limit: {unit: minute, requests_per_unit: 1000}
        - key: tenant
          as: tenant
          descriptors:
            - {key: generic_key, value: search}
            - {key: tokens, value: output, hits: output_tokens}
`

// TestHitsAtkUnpricedRestored: as TestHitsAtkRestoredAsDebited, but the
// calls cost nothing, so that only the limiter counts them: a debit of 60
// hits and a charge of 700 output tokens, then Redis loses its data.
// acme must get 40 more requests, and 300 tokens fill its 1,000. Before, the
// rate limit service recorded only what cost money, and the restore
// found nothing: 100 requests and 1,000 tokens again. A tenant limited
// by a descriptor's limit alone (bench-1) is recorded too, at no cost:
// each entry records the descriptor's counter, which a restore brings
// back (TestDescLossAtk*).
func TestHitsAtkUnpricedRestored(t *testing.T) {
	e := hitsEnv(t, unpricedConfig)
	if r := e.ask(t, "edge", 0, hits(700, d("tenant", "acme", "tokens", "output"))); r.GetOverallCode() != OK {
		t.Fatalf("a charge of 700 output tokens: %s", codes_(r))
	}
	for range 3 {
		if r := e.ask(t, "edge", 1, d("tenant", "bench-1")); r.GetOverallCode() != OK {
			t.Fatalf("bench-1: %s", codes_(r))
		}
	}
	loseRedis(t, e)
	page, err := e.g.Ledger().Entries(context.Background(), ledger.Query{Tenant: "bench-1"})
	if err != nil {
		t.Fatal(err)
	}
	// Its calls are tallies (ledger.Tally): the entries of their second
	// record the 3 hits between them.
	hitsRecorded := int64(0)
	for _, en := range page.Entries {
		if en.KeyDesc == "" || en.Charge() != 0 {
			t.Errorf("bench-1's entry %+v: want its descriptor counter recorded, at no cost", en)
		}
		for _, line := range strings.Split(en.KeyDesc, "\n") {
			n, _ := strconv.ParseInt(line[strings.LastIndexByte(line, '\t')+1:], 10, 64)
			hitsRecorded += n
		}
	}
	if hitsRecorded != 3 {
		t.Errorf("bench-1, limited by a descriptor alone, has %d hits recorded in %d ledger entries, want 3", hitsRecorded, len(page.Entries))
	}
	// 300 tokens were left: a charge of 300 fills the limit, and a check
	// (hits_addend 0) then finds no room.
	if r := e.ask(t, "edge", 0, hits(300, d("tenant", "acme", "tokens", "output"))); r.GetOverallCode() != OK {
		t.Fatalf("a charge of 300 output tokens: %s", codes_(r))
	}
	if r := e.ask(t, "edge", 0, hits(0, d("tenant", "acme"))); r.GetOverallCode() != OVER {
		t.Errorf("after Redis lost its data and 300 tokens more, a check on acme's 1,000 tokens a day: %s, want OVER_LIMIT", codes_(r))
	}
	if n := admitOnes(t, e); n != 40 {
		t.Errorf("after Redis lost its data: %d requests admitted of the 40 acme had left", n)
	}
}
