package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// TestZeroReserveAttackSpentLimit: a tenant whose limit or budget is spent
// reserves a cost of 0 of it (0 tokens, $0, 0 requests), which is admitted
// as long as the spent limit has room for nothing, and then settles
// whatever it used: the spend passes the hard limit by that much, again
// and again. A reservation of 0 needs room for one unit of each limit, as
// a check does: refused once the limit is spent. On each store.
func TestZeroReserveAttackSpentLimit(t *testing.T) {
	for _, c := range []struct {
		name, limits  string
		spend, settle string // the amounts that spend the limit, reserved and settled
		zero          string // the reservation of 0
		want          int
	}{
		{"tokens", `
limits:
  - {name: tpd, dimensions: [tenant], unit: tokens, algorithm: fixed_window, rate: 100, period: 24h}
`, `{"tokens":100}`, `{"tokens":100}`, `{"cost":{"tokens":0}}`, http.StatusTooManyRequests},
		{"input tokens of a token bucket", `
limits:
  - {name: itpd, dimensions: [tenant], unit: input_tokens, algorithm: token_bucket, rate: 100, period: 24h}
`, `{"input_tokens":100}`, `{"input_tokens":100}`, `{"cost":{"output_tokens":50}}`, http.StatusTooManyRequests},
		{"budget", `
budgets:
  - {name: daily, scope: tenant, amount: "0.10"}
`, `{"usd":"0.10"}`, `{"usd":"0.10"}`, `{"cost":{"usd":"0"}}`, http.StatusPaymentRequired},
		{"budget, no cost named", `
budgets:
  - {name: daily, scope: tenant, amount: "0.10"}
`, `{"usd":"0.10"}`, `{"usd":"0.10"}`, `{}`, http.StatusPaymentRequired},
		{"requests", `
limits:
  - {name: rpd, dimensions: [tenant], unit: requests, algorithm: sliding_window, rate: 2, period: 24h}
`, `{"requests":2}`, `{}`, `{"cost":{"requests":0}}`, http.StatusTooManyRequests},
	} {
		t.Run(c.name, func(t *testing.T) {
			onEachStore(t, func(t *testing.T, url string) {
				s := newStackWith(t, stackOptions{redisURL: url, policies: allowAll, extra: c.limits})
				h := s.srv.Handler()
				const acme = "cg-test-acme"
				id := reserveOn(t, s, acme, `{"cost":`+c.spend+`}`)
				if code, out := reserveCall(t, h, acme, "/v1/costgate/settle", fmt.Sprintf(`{"reservation_id":%q,"usage":%s}`, id, c.settle)); code != 200 {
					t.Fatalf("settle: %d %v", code, out)
				}
				code, out := reserveCall(t, h, acme, "/v1/costgate/reserve", c.zero)
				if code != c.want {
					t.Errorf("reserve %s on a spent limit: %d %v; want %d", c.zero, code, out, c.want)
				}
				if code == 200 {
					id, _ := out["reservation_id"].(string)
					code, out := reserveCall(t, h, acme, "/v1/costgate/settle",
						fmt.Sprintf(`{"reservation_id":%q,"usage":{"tokens":100000,"usd":"100"}}`, id))
					t.Errorf("and settled 100000 tokens and $100 over the spent limit: %d %v", code, out)
				}
			})
		})
	}
}

// TestZeroReserveAttackGenericZeroUnits: a generic upstream priced per
// credit, whose request names its credits (?credits=0 prices the call at
// $0) and whose answer reports the credits it cost. A tenant whose budget
// is spent asks for 0 credits: the call must be refused as any other,
// not admitted at $0 and charged what the upstream reports beyond the
// budget.
func TestZeroReserveAttackGenericZeroUnits(t *testing.T) {
	var calls atomic.Int64
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"content":"<html/>","credits_used":40}`)
	})
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	onEachStore(t, func(t *testing.T, url string) {
		calls.Store(0)
		s := newStackWith(t, stackOptions{redisURL: url, policies: allowAll, extra: `
  - name: scrape
    kind: generic
    base_url: ` + srv.URL + `
    api_key: scrape-secret
    cost:
      unit: credits
      per_unit: "0.001"
      units: {query: credits, default: 1, max: 100}
      actual: {json: credits_used, max: 100}
limits:
  - {name: rpm, dimensions: [tenant], unit: requests, algorithm: fixed_window, rate: 1000, period: 1m}
budgets:
  - {name: daily, scope: tenant, amount: "0.040"}
`})
		get := func(query string) int {
			req, _ := http.NewRequest(http.MethodGet, s.url+"/u/scrape/fetch?"+query, nil)
			req.Header.Set("Authorization", "Bearer cg-test-acme")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode
		}
		if code := get("credits=40"); code != http.StatusOK {
			t.Fatalf("the first call: %d", code)
		}
		if err := s.srv.WaitIdle(t.Context()); err != nil {
			t.Fatal(err)
		}
		if code := get("credits=0"); code != http.StatusPaymentRequired {
			t.Errorf("a call of 0 credits on the spent budget: %d; want 402", code)
		}
		if n := calls.Load(); n != 1 {
			t.Errorf("the upstream ran %d calls, billing 40 credits each, on a budget of 40", n)
		}
	})
}

// TestZeroReserveEmbeddingOnSpentOutputLimit: the unit an open request
// (the reserve API, a generic upstream that reports its units) reserves on
// a limit it costs nothing on is not asked of a proxied LLM request, whose
// estimate bounds what it is charged there: an embedding, which produces
// no output, is served while the tenant's output tokens are spent, as
// before.
func TestZeroReserveEmbeddingOnSpentOutputLimit(t *testing.T) {
	onEachStore(t, func(t *testing.T, url string) {
		s := newStackWith(t, stackOptions{redisURL: url, policies: allowAll, extra: `
limits:
  - {name: otpd, dimensions: [tenant], unit: output_tokens, algorithm: fixed_window, rate: 100, period: 24h}
`})
		h := s.srv.Handler()
		const acme = "cg-test-acme"
		id := reserveOn(t, s, acme, `{"cost":{"output_tokens":100}}`)
		if code, out := reserveCall(t, h, acme, "/v1/costgate/settle", fmt.Sprintf(`{"reservation_id":%q,"usage":{"output_tokens":100}}`, id)); code != 200 {
			t.Fatalf("settle: %d %v", code, out)
		}
		if code, out := reserveCall(t, h, acme, "/v1/costgate/reserve", `{"cost":{"input_tokens":10}}`); code != http.StatusTooManyRequests {
			t.Errorf("a reservation on the spent output limit: %d %v; want 429", code, out)
		}
		resp := s.post(t, t.Context(), "/v1/embeddings", `{"model":"text-embedding-3-small","input":"hello"}`)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("an embedding while output tokens are spent: %d %s; want 200", resp.StatusCode, body)
		}
	})
}
