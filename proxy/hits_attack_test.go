package proxy_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/costgate/costgate/internal/redistest"
)

// TestReserveAPIAttackRequestsRestoredAsReserved: a reservation of 60
// requests on a limit of 100 a day, settled, then Redis loses its data
// (FLUSHALL): the restore from the ledger must find 60 requests spent,
// and the tenant get 40 more reservations of one. Before, the ledger
// counted one request per entry, and the tenant got 99.
func TestReserveAPIAttackRequestsRestoredAsReserved(t *testing.T) {
	if d := time.Until(time.Now().Truncate(24 * time.Hour).Add(24 * time.Hour)); d < time.Minute {
		time.Sleep(d + 100*time.Millisecond) // spend and check in one day's window
	}
	redis := redistest.New(t)
	s := newStack(t, redis.URL, `
limits:
  - {name: daily, dimensions: [tenant], unit: requests, algorithm: fixed_window, rate: 100, period: 24h}
`)
	h := s.srv.Handler()
	const acme = "cg-test-acme"
	id := reserveOn(t, s, acme, `{"cost":{"requests":60}}`)
	if code, out := reserveCall(t, h, acme, "/v1/costgate/settle", fmt.Sprintf(`{"reservation_id":%q,"usage":{"tokens":0}}`, id)); code != 200 {
		t.Fatalf("settle: %d %v", code, out)
	}
	if err := redis.Client(t).FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	admitted := 0
	for range 200 {
		code, out := reserveCall(t, h, acme, "/v1/costgate/reserve", `{"cost":{"requests":1}}`)
		if code == 429 {
			break
		}
		if code != 200 {
			t.Fatalf("reserve: %d %v", code, out)
		}
		admitted++
	}
	if admitted != 40 {
		t.Fatalf("after Redis lost its data: %d reservations of one request admitted of the 40 left", admitted)
	}
}
