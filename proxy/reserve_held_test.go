package proxy_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/costgate/costgate/ledger"
)

// reserveID reserves body for acme and returns the reservation id.
func reserveID(t *testing.T, s *stack, body string) string {
	t.Helper()
	code, r := reserveCall(t, s.srv.Handler(), "cg-test-acme", "/v1/costgate/reserve", body)
	if code != 200 {
		t.Fatalf("reserve %s: %d %v", body, code, r)
	}
	id, _ := r["reservation_id"].(string)
	return id
}

// TestConcurrentSettlesEndOnce: twelve settles and releases of one
// reservation at once end it once: at most one settle answers
// already_settled false, no ledger entry stays reserved, and the limit
// and the budget are charged exactly what the ledger bills.
func TestConcurrentSettlesEndOnce(t *testing.T) {
	onEachStore(t, func(t *testing.T, url string) {
		s := newStack(t, url, `
limits:
  - {name: tpm, dimensions: [tenant], unit: tokens, algorithm: fixed_window, rate: 100000, period: 1h}
budgets:
  - {name: daily, scope: tenant, amount: "100.00"}
`)
		h := s.srv.Handler()
		for round := range 5 {
			id := reserveID(t, s, `{"cost":{"tokens":1000,"usd":"1.00"}}`)
			var wg sync.WaitGroup
			var mu sync.Mutex
			firsts := 0
			for i := range 12 {
				wg.Go(func() {
					path, body := "/v1/costgate/settle", fmt.Sprintf(`{"reservation_id":%q,"usage":{"tokens":%d,"usd":"0.%02d"}}`, id, 10*(i+1), i+1)
					if i%4 == 3 {
						path, body = "/v1/costgate/release", fmt.Sprintf(`{"reservation_id":%q}`, id)
					}
					code, out := reserveCall(t, h, "cg-test-acme", path, body)
					mu.Lock()
					defer mu.Unlock()
					if code == 200 && out["already_settled"] == false {
						firsts++
					}
				})
			}
			wg.Wait()
			if firsts > 1 {
				t.Errorf("round %d: %d settles answered already_settled false", round, firsts)
			}
		}
		es := s.entries(t)
		var sum, tokens int64
		for _, e := range es {
			if e.Status == ledger.StatusReserved {
				t.Errorf("entry %s still reserved", e.RequestID)
			}
			sum += int64(e.ActualCost)
			tokens += e.Actual.InputTokens
		}
		left := limitsLeft(t, s)
		if len(left) != 2 || left[0] != 100000-tokens {
			t.Errorf("tpm left %v; want %d (ledger tokens %d)", left, 100000-tokens, tokens)
		}
		if len(left) == 2 && left[1] != 100_000_000_000-sum {
			t.Errorf("budget left %d; want %d (ledger sum %d)", left[1], 100_000_000_000-sum, sum)
		}
	})
}

// TestHeldReservationKeepsItsSlot: a concurrency limit holds a request's
// units as long as its request runs (README, limits[].period), and a
// reservation held open by the reserve API is such a request: its slot
// stays taken past the lease period until it is settled, and then comes
// back.
func TestHeldReservationKeepsItsSlot(t *testing.T) {
	onEachStore(t, func(t *testing.T, url string) {
		s := newStackWith(t, stackOptions{redisURL: url, policies: allowAll, extra: `
limits:
  - {name: one-at-a-time, dimensions: [tenant], unit: requests, algorithm: concurrency, rate: 1, period: 1s}
`})
		h := s.srv.Handler()
		first := reserveID(t, s, `{"ttl":"1m"}`)
		if code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/reserve", `{"ttl":"1m"}`); code != 429 {
			t.Fatalf("second reserve while the first is open: %d %v; want 429", code, out)
		}
		time.Sleep(2500 * time.Millisecond) // past the 1 s lease, well before the 1 m ttl
		if code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/reserve", `{"ttl":"1m"}`); code != 429 {
			t.Errorf("a reserve 2.5 s later, the first still open (ttl 1m): %d %s; want 429: two in flight under a concurrency limit of 1", code, errCode(out))
		}
		if code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/settle", `{"reservation_id":"`+first+`","usage":{}}`); code != 200 {
			t.Fatalf("settle of the first: %d %v", code, out)
		}
		second := reserveID(t, s, `{"ttl":"1m"}`) // the slot is back
		if code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/release", `{"reservation_id":"`+second+`"}`); code != 200 {
			t.Fatalf("release of the second: %d %v", code, out)
		}
		reserveID(t, s, `{"ttl":"1m"}`)
	})
}

// TestReserveAnswerCountsRequests: the answer's estimate is what the gate
// reserved; an explicit "requests": 0 counts as one request (every
// reservation is one), and the answer says so.
func TestReserveAnswerCountsRequests(t *testing.T) {
	s := newStack(t, "", `
limits:
  - {name: rph, dimensions: [tenant], unit: requests, rate: 2, period: 1h}
`)
	h := s.srv.Handler()
	var codes []int
	for range 3 {
		code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/reserve", `{"cost":{"requests":0}}`)
		codes = append(codes, code)
		if code != 200 {
			continue
		}
		if est, _ := out["estimate"].(map[string]any); est["requests"] != float64(1) {
			t.Errorf("a reserve of requests 0 answers estimate.requests %v; the gate counts 1", est["requests"])
		}
	}
	if fmt.Sprint(codes) != "[200 200 429]" {
		t.Errorf("three reserves of requests 0 on a limit of 2 requests: %v, want [200 200 429]", codes)
	}
}
