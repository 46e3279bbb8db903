package gate

import (
	"fmt"
	"testing"
	"time"
)

// The attacks of the other loss tests on sliding logs, which the
// algorithm lists of TestLimitLossAtkDollarLimitsHold,
// TestLimitLossAtkGlobalDollarLimitHolds, TestLimitLossAtkUnitLimitsHold,
// TestLimitLossAtkModelLimitsHold and the shared limits' tests
// (sharedAlgorithms) hold too: the ledger down, the local fallback and
// the embedded default restarted. A sliding log's counter comes back as
// one mark of the ledger's count at the restore's time (see
// weighted.Restorer). Before, a sliding log was not restored at all: it
// came back empty after each loss, and a tenant that had spent 6 of its
// 10 requests a day was admitted 10 more.

// TestLimitLossAtkLogLimitsLedgerDown: ledgerDownLoss on a sliding log
// keyed by the caller, by the caller and the model, by the model, and by
// nothing, each in another unit, fail-closed and fail-open: restored from
// this node's last read plus its spool while the database is out (6 of
// 10 admitted after the second loss, not 10), and a fail-closed one this
// node never read refuses with 503 until the database answers, then
// admits nothing of the 10 spent.
func TestLimitLossAtkLogLimitsLedgerDown(t *testing.T) {
	for _, posture := range []string{"fail_closed", "fail_open"} {
		for _, c := range []struct {
			dims, unit, rate string
			a, b             groupRequest
		}{
			{"[tenant]", "requests", "rate: 10", groupRequest{key: "cg-acme"}, groupRequest{key: "cg-acme"}},
			{"[tenant, model]", "usd", `rate_usd: "0.00001"`, groupRequest{key: "cg-acme", model: "gpt-4o"}, groupRequest{key: "cg-acme", model: "gpt-4o"}},
			{"[model]", "tokens", "rate: 50", groupRequest{key: "cg-acme", model: "gpt-4o"}, groupRequest{key: "cg-beta", model: "gpt-4o"}},
			{"[]", "requests", "rate: 10", groupRequest{key: "cg-acme"}, groupRequest{key: "cg-beta"}},
		} {
			t.Run(posture+"/"+c.unit+c.dims, func(t *testing.T) {
				t.Parallel()
				awayFromWindowEdge(t, 24*time.Hour)
				ledgerDownLoss(t, "", fmt.Sprintf("{name: daylog, dimensions: %s, unit: %s, %s, period: 24h, algorithm: sliding_log, on_store_failure: %s}", c.dims, c.unit, c.rate, posture), posture, c.a, c.b)
			})
		}
	}
}

// TestLimitLossAtkLogLimitsOnTheFallback: Redis refuses writes and the
// local fallback of one of two replicas takes over, empty: a sliding log
// keyed by the caller and the model, or by the model alone, is restored
// at its share of what the ledger counted (4 of 10 spent: the fallback
// holds 5 and counts 2) and admits 3. Before, it came back empty on the
// fallback, which admitted 5.
func TestLimitLossAtkLogLimitsOnTheFallback(t *testing.T) {
	for _, dims := range []string{"[tenant, model]", "[model]"} {
		t.Run(dims, func(t *testing.T) {
			t.Parallel()
			fallbackShareLoss(t, "", "{name: model-log, dimensions: "+dims+", unit: requests, rate: 10, period: 24h, algorithm: sliding_log}", groupRequest{model: "gpt-4o"}, "cg-acme")
		})
	}
}

// TestLimitLossAtkLogLimitRestartOnMemory: the embedded default (the
// in-memory store, the embedded ledger) restarted: a sliding log in
// dollars acme spent this hour stays spent in the new process, whose
// store starts empty. Before, the new process admitted 10 more.
func TestLimitLossAtkLogLimitRestartOnMemory(t *testing.T) {
	before, after := spendAcmeAroundARestart(t, `
limits:
  - {name: spend, dimensions: [tenant], unit: usd, rate_usd: "0.01", period: 1h, algorithm: sliding_log}
`)
	if before != 10 {
		t.Fatalf("before the restart: %d admitted of a $0.01 limit, in $0.001 requests", before)
	}
	if after > 0 {
		t.Fatalf("after a restart: %d more admitted of a $0.01 limit acme had spent this hour", after)
	}
}
