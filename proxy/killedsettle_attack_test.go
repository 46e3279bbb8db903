package proxy_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/ledger"
)

// TestSettleAtkKilledAfterItsClaim: a replica settles a held reservation
// in one Redis script call (the claim of its end and the limits' charge)
// and writes the settlement to its ledger after; killed between the two,
// it leaves Redis saying "settled at $0.30" and the ledger the entry
// reserved at its $1.00 estimate. The client, whose answer the kill
// lost, retries the settlement, which is answered from the claim
// (already_settled, $0.30). The ledger must then hold the settlement the
// answer states, on the replica that made the reservation whether it
// ran on or restarted (its entry recovered at the estimate): before, the
// entry stayed reserved, or recovered at $1.00, for good, and the
// settlement answered twice was billed nowhere. A release so killed and
// retried leaves the entry released (failed, $0), where it stayed
// reserved, or was charged its estimate.
func TestSettleAtkKilledAfterItsClaim(t *testing.T) {
	const extra = `
reservations:
  secret: "replicas-share-this-secret-0123"
budgets:
  - {name: daily, scope: tenant, amount: "100.00"}
`
	ends := []struct {
		name, claim, path, body string
		answer                  func(code int, out map[string]any) bool
		status                  ledger.Status
		cost                    costmodel.NanoUSD
	}{
		{"settle", "1 300000000 settled 0123456789abcdef", "/v1/costgate/settle", `{"reservation_id":%q,"usage":{"usd":"0.30"}}`,
			func(code int, out map[string]any) bool {
				return code == 200 && out["already_settled"] == true && out["cost_usd"] == "0.300000000"
			}, ledger.StatusSettled, 300_000_000},
		{"release", "2 0 - 0123456789abcdef", "/v1/costgate/release", `{"reservation_id":%q}`,
			func(code int, out map[string]any) bool { return code == 200 && out["status"] == "released" },
			ledger.StatusFailed, 0},
	}
	for _, end := range ends {
		for _, restart := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/restarted=%v", end.name, restart), func(t *testing.T) {
				rs := redistest.New(t)
				dir := t.TempDir()
				s := newStackWith(t, stackOptions{redisURL: rs.URL, extra: extra, dataDir: dir})
				code, r := reserveCall(t, s.srv.Handler(), "cg-test-acme", "/v1/costgate/reserve", `{"cost":{"usd":"1.00"},"ttl":"1h"}`)
				if code != 200 {
					t.Fatalf("reserve: %d %v", code, r)
				}
				id, _ := r["reservation_id"].(string)
				rid, _ := r["request_id"].(string)
				// What the killed replica's settling script left in Redis:
				// the claim of its end (its state, 1 settled or 2
				// released; its cost; its ledger status; its token).
				rdb := rs.Client(t)
				if err := rdb.Set(context.Background(), "{acme}:costgate:held:"+rid, end.claim, 0).Err(); err != nil {
					t.Fatal(err)
				}
				if restart {
					if err := s.srv.Close(); err != nil {
						t.Fatal(err)
					}
					s = newStackWith(t, stackOptions{redisURL: rs.URL, extra: extra, dataDir: dir})
				}
				code, out := reserveCall(t, s.srv.Handler(), "cg-test-acme", end.path, fmt.Sprintf(end.body, id))
				if !end.answer(code, out) {
					t.Fatalf("%s retried: %d %v; want the claim's answer", end.name, code, out)
				}
				es := s.entries(t)
				if len(es) != 1 || es[0].Status != end.status || es[0].ActualCost != end.cost {
					t.Errorf("ledger %+v; want one entry %s at %v, as the answers say", es, end.status, end.cost)
				}
			})
		}
	}
}

// TestSameEndAtOnceBillsOnce: one settlement (or one release) sent eight
// times at once to the replica that holds the reservation, on Redis:
// one wins its claim and bills it, and the others, which lose theirs to
// the same end, bill it too where the entry is still reserved (see
// TestSettleAtkKilledAfterItsClaim), apart from the winner's own billing
// of the same reservation (the race detector watches). The ledger holds
// one entry a reservation, ended as the answers say.
func TestSameEndAtOnceBillsOnce(t *testing.T) {
	s := newStack(t, redistest.New(t).URL, `
budgets:
  - {name: daily, scope: tenant, amount: "100.00"}
`)
	h := s.srv.Handler()
	want := map[string]ledger.Status{}
	for round := range 6 {
		id := reserveID(t, s, `{"cost":{"tokens":1000,"usd":"1.00"}}`)
		path, body := "/v1/costgate/settle", fmt.Sprintf(`{"reservation_id":%q,"usage":{"tokens":100,"usd":"0.30"}}`, id)
		status := ledger.StatusSettled
		if round%2 == 1 {
			path, body, status = "/v1/costgate/release", fmt.Sprintf(`{"reservation_id":%q}`, id), ledger.StatusFailed
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		firsts := 0
		start := make(chan struct{})
		for range 8 {
			wg.Go(func() {
				<-start
				code, out := reserveCall(t, h, "cg-test-acme", path, body)
				mu.Lock()
				defer mu.Unlock()
				if code != 200 {
					t.Errorf("round %d: %s: %d %v", round, path, code, out)
				}
				if out["already_settled"] == false {
					firsts++
				}
				if rid, _ := out["request_id"].(string); rid != "" {
					want[rid] = status
				}
			})
		}
		close(start)
		wg.Wait()
		if status == ledger.StatusSettled && firsts != 1 {
			t.Errorf("round %d: %d settles answered already_settled false; want 1", round, firsts)
		}
	}
	es := s.entries(t)
	if len(es) != len(want) {
		t.Errorf("%d ledger entries for %d reservations", len(es), len(want))
	}
	for _, e := range es {
		cost := costmodel.NanoUSD(300_000_000)
		if want[e.RequestID] == ledger.StatusFailed {
			cost = 0
		}
		if e.Status != want[e.RequestID] || e.ActualCost != cost {
			t.Errorf("entry %s: %s %v; want %s %v", e.RequestID, e.Status, e.ActualCost, want[e.RequestID], cost)
		}
	}
}
