package proxy_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
)

// TestSettleReleaseAttackFailedIsNoRelease: a held reservation settled as
// failed at $0 (an upstream call that failed, status "failed") on one
// replica is a settlement on the other too, which finds its end in the
// shared PostgreSQL ledger: a settle there answers the first one's
// figures (already settled, failed), a release 409 reservation_settled.
// Only a release reads as released: a settle then is 409
// reservation_released, a second release 200.
func TestSettleReleaseAttackFailedIsNoRelease(t *testing.T) {
	redisURL, dsn := redistest.New(t).URL, pgtest.New(t)
	extra := "\nreservations:\n  secret: \"replicas-share-this-secret-0123\"\n" + `
limits:
  - {name: tpm, dimensions: [tenant], unit: tokens, algorithm: fixed_window, rate: 100000, period: 24h}
`
	a := newStackWith(t, stackOptions{redisURL: redisURL, ledgerDSN: dsn, extra: extra})
	b := newStackWith(t, stackOptions{redisURL: redisURL, ledgerDSN: dsn, extra: extra})
	const acme = "cg-test-acme"
	ended := func(t *testing.T, path, body string) string {
		t.Helper()
		id := reserveOn(t, a, acme, `{"cost":{"tokens":100}}`)
		if code, out := reserveCall(t, a.srv.Handler(), acme, path, fmt.Sprintf(body, id)); code != http.StatusOK {
			t.Fatalf("%s on the replica that made it: %d %v", path, code, out)
		}
		// The other replica holds nothing of it: it reads its end in the
		// ledger, where the maker's entry is final.
		if err := a.srv.WaitIdle(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := a.srv.Ledger().Flush(t.Context()); err != nil {
			t.Fatal(err)
		}
		return id
	}
	hb := b.srv.Handler()

	t.Run("failed at $0", func(t *testing.T) {
		id := ended(t, "/v1/costgate/settle", `{"reservation_id":%q,"status":"failed"}`)
		code, out := reserveCall(t, hb, acme, "/v1/costgate/settle", fmt.Sprintf(`{"reservation_id":%q,"usage":{"tokens":5}}`, id))
		if code != http.StatusOK || out["already_settled"] != true || out["status"] != "failed" {
			t.Errorf("settle on the other replica: %d %v; want 200, already settled, failed", code, out)
		}
		if code, out := reserveCall(t, hb, acme, "/v1/costgate/release", fmt.Sprintf(`{"reservation_id":%q}`, id)); code != http.StatusConflict || errCode(out) != "reservation_settled" {
			t.Errorf("release on the other replica: %d %v; want 409 reservation_settled", code, out)
		}
	})
	t.Run("released", func(t *testing.T) {
		id := ended(t, "/v1/costgate/release", `{"reservation_id":%q}`)
		if code, out := reserveCall(t, hb, acme, "/v1/costgate/settle", fmt.Sprintf(`{"reservation_id":%q,"usage":{"tokens":5}}`, id)); code != http.StatusConflict || errCode(out) != "reservation_released" {
			t.Errorf("settle on the other replica: %d %v; want 409 reservation_released", code, out)
		}
		if code, out := reserveCall(t, hb, acme, "/v1/costgate/release", fmt.Sprintf(`{"reservation_id":%q}`, id)); code != http.StatusOK {
			t.Errorf("release on the other replica: %d %v; want 200", code, out)
		}
	})
}
