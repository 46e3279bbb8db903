package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/costgate/costgate/client"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/simulator"
)

// The integration tests run the client against costgate itself, started
// in process, on the in-memory store and on Redis + PostgreSQL.

const milli = costmodel.Dollar / 1000

// baseYAML is the config the tests share: the simulator as the OpenAI
// upstream, the search API (searchAPI) as a generic upstream priced like
// searchRule, and two tenants. %[1]s is the simulator's URL, %[2]s the
// search API's.
const baseYAML = `
admin_token: test-admin
store:
  timeout: 2s
  queue_timeout: 2s
upstreams:
  - name: openai
    kind: openai
    base_url: %[1]s
    api_key: sk-upstream-secret
  - name: search
    kind: generic
    base_url: %[2]s
    api_key: search-secret
    auth_header: X-Api-Key
    cost:
      unit: results
      per_call: "0.001"
      per_unit: "0.0001"
      units: {query: count, json: count, default: 10, max: 50}
      actual: {json: units_used, header: X-Units}
tenants:
  - name: acme
    plan: free
    keys:
      - id: acme-key
        key: cg-test-acme
        user: alice
  - name: globex
    plan: pro
    keys:
      - id: globex-key
        key: cg-test-globex
`

// stack is costgate with the simulator and the search API behind it.
type stack struct {
	*costgate
	api *searchAPI
}

// newStack starts a stack on store with more config (limits, budgets,
// costs) and policies (nil: none).
func newStack(t *testing.T, store, extra string, pol fs.FS) *stack {
	t.Helper()
	sim := httptest.NewServer(simulator.New(simulator.Config{Estimator: estimator(t)}))
	t.Cleanup(sim.Close)
	api := newSearchAPI(t)
	return &stack{startCostgate(t, store, fmt.Sprintf(baseYAML, sim.URL, api.url)+extra, pol), api}
}

func (s *stack) client(key string) *client.Client { return client.New(s.url, key) }

func estimator(t *testing.T) *costmodel.Estimator {
	t.Helper()
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return est
}

func final(e ledger.Entry) bool { return e.Status.Final() }

// show is a settlement without its ids, which are long.
func show(st *client.Settlement) string {
	if st == nil {
		return "no settlement"
	}
	return fmt.Sprintf("{%s %v already_settled=%v}", st.Status, st.Cost, st.AlreadySettled)
}

// forStores runs test on each store.
func forStores(t *testing.T, test func(t *testing.T, store string)) {
	for _, store := range stores {
		t.Run(store, func(t *testing.T) { test(t, store) })
	}
}

// TestReserveSettle: a reservation by cost, by a generic upstream's units
// and by an LLM request's body; settling charges the usage, and settling
// again repeats the first settlement.
func TestReserveSettle(t *testing.T) {
	forStores(t, func(t *testing.T, store string) {
		s := newStack(t, store, "", nil)
		acme := s.client("cg-test-acme")
		ctx := context.Background()

		before := time.Now()
		r, err := acme.Reserve(ctx, client.ReserveRequest{Cost: client.Cost{Requests: 1, USD: 10 * milli}})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(r.ID, "rsv_") || !strings.HasPrefix(r.RequestID, "req_") {
			t.Errorf("ids %q %q", r.ID, r.RequestID)
		}
		if r.ExpiresAt.Before(before.Add(5*time.Minute-time.Second)) || r.ExpiresAt.After(time.Now().Add(5*time.Minute+time.Second)) {
			t.Errorf("expires at %v, want 5 minutes from now", r.ExpiresAt)
		}
		if r.Estimate.Cost != 10*milli || r.Estimate.Requests != 1 || r.Friction != nil || r.Degraded {
			t.Errorf("reservation estimate %+v friction %+v degraded %v", r.Estimate, r.Friction, r.Degraded)
		}
		st, err := r.Settle(ctx, client.Usage{USD: 4 * milli})
		if err != nil {
			t.Fatal(err)
		}
		want := client.Settlement{ReservationID: r.ID, RequestID: r.RequestID, Status: "settled", Cost: 4 * milli}
		if *st != want {
			t.Errorf("settlement %s, want %s", show(st), show(&want))
		}
		st, err = r.Settle(ctx, client.Usage{USD: 9 * milli})
		want.AlreadySettled = true
		if err != nil || *st != want {
			t.Errorf("second settlement %s %v, want %s", show(st), err, show(&want))
		}
		e := s.entry(t, "acme", r.RequestID, final)
		if e.ActualCost != 4*milli || e.EstimatedCost != 10*milli || e.Status != ledger.StatusSettled || e.Route != "/v1/costgate/reserve" {
			t.Errorf("ledger entry %+v", e)
		}

		// Units priced by the search upstream's rule: $0.001 + $0.0001 a unit.
		r, err = acme.Reserve(ctx, client.ReserveRequest{Cost: client.Cost{Requests: 1, Units: 20}, Upstream: "search", Route: "search.web"})
		if err != nil {
			t.Fatal(err)
		}
		if r.Estimate.Units != 20 || r.Estimate.Cost != 3*milli {
			t.Errorf("estimate %+v, want 20 units at $0.003", r.Estimate)
		}
		if st, err = r.Settle(ctx, client.Usage{Units: 7}); err != nil || st.Cost != 17*milli/10 {
			t.Errorf("settlement %s %v, want $0.0017", show(st), err)
		}
		e = s.entry(t, "acme", r.RequestID, final)
		if e.Upstream != "search" || e.Route != "search.web" || e.Actual.Units != 7 || e.ActualCost != 17*milli/10 {
			t.Errorf("ledger entry %+v", e)
		}

		// An LLM request estimated from its body, settled from the
		// upstream's own answer.
		body := `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hello there, how are you?"}],"max_tokens":20}`
		r, err = acme.Reserve(ctx, client.ReserveRequest{Kind: "chat_completions", Body: json.RawMessage(body)})
		if err != nil {
			t.Fatal(err)
		}
		if r.Estimate.InputTokens <= 0 || r.Estimate.OutputTokens != 20 || r.Estimate.Cost <= 0 {
			t.Errorf("estimate %+v", r.Estimate)
		}
		raw := `{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"Fine."},"finish_reason":"stop"}],"usage":{"prompt_tokens":14,"completion_tokens":3,"total_tokens":17}}`
		st, err = r.SettleResponse(ctx, "chat_completions", []byte(raw))
		if err != nil {
			t.Fatal(err)
		}
		if want := estimator(t).Cost("gpt-4o-mini", costmodel.Usage{InputTokens: 14, OutputTokens: 3}); st.Cost != want {
			t.Errorf("settled %v, want %v", st.Cost, want)
		}
		e = s.entry(t, "acme", r.RequestID, final)
		if e.Actual.InputTokens != 14 || e.Actual.OutputTokens != 3 || e.Model != "gpt-4o-mini" {
			t.Errorf("ledger entry %+v", e)
		}
	})
}

// TestRelease: a release returns the reservation to the budget; releasing
// twice is harmless; a released reservation cannot be settled, nor a
// settled one released.
func TestRelease(t *testing.T) {
	forStores(t, func(t *testing.T, store string) {
		s := newStack(t, store, `
budgets:
  - name: acme-daily
    scope: tenant
    amount: "0.05"
`, nil)
		acme := s.client("cg-test-acme")
		ctx := context.Background()
		r, err := acme.Reserve(ctx, client.ReserveRequest{Cost: client.Cost{Requests: 1, USD: 40 * milli}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := acme.Reserve(ctx, client.ReserveRequest{Cost: client.Cost{Requests: 1, USD: 40 * milli}}); !errors.Is(err, client.ErrBudgetExceeded) {
			t.Fatalf("a second $0.04 of a $0.05 budget: %v, want 402", err)
		}
		if err := r.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := r.Release(ctx); err != nil {
			t.Errorf("second release: %v", err)
		}
		_, err = r.Settle(ctx, client.Usage{USD: milli})
		var api *client.APIError
		if !errors.Is(err, client.ErrReservationReleased) || !errors.As(err, &api) || api.Status != http.StatusConflict {
			t.Errorf("settle after release: %v, want 409 reservation_released", err)
		}
		e := s.entry(t, "acme", r.RequestID, final)
		if e.ActualCost != 0 {
			t.Errorf("released reservation's ledger entry: %+v", e)
		}

		// The release gave the $0.04 back.
		r, err = acme.Reserve(ctx, client.ReserveRequest{Cost: client.Cost{Requests: 1, USD: 40 * milli}})
		if err != nil {
			t.Fatalf("after the release: %v", err)
		}
		if _, err := r.Settle(ctx, client.Usage{USD: milli}); err != nil {
			t.Fatal(err)
		}
		err = r.Release(ctx)
		if !errors.Is(err, client.ErrReservationSettled) || !errors.As(err, &api) || api.Status != http.StatusConflict {
			t.Errorf("release after settle: %v, want 409 reservation_settled", err)
		}
	})
}

// TestExpiry: a reservation not settled within its TTL is refused
// settlement (410), and its ledger entry is charged the estimate and
// marked expired.
func TestExpiry(t *testing.T) {
	forStores(t, func(t *testing.T, store string) {
		s := newStack(t, store, "", nil)
		acme := s.client("cg-test-acme")
		ctx := context.Background()
		r, err := acme.Reserve(ctx, client.ReserveRequest{Cost: client.Cost{Requests: 1, USD: 10 * milli}, TTL: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Until(r.ExpiresAt); d > time.Second+100*time.Millisecond {
			t.Errorf("expires in %v, want 1s", d)
		}
		// costgate takes no clock: the TTL runs in real time, and its
		// expiry sweep runs every second.
		time.Sleep(time.Until(r.ExpiresAt) + 50*time.Millisecond)
		_, err = r.Settle(ctx, client.Usage{USD: milli})
		var api *client.APIError
		if !errors.Is(err, client.ErrReservationExpired) || !errors.As(err, &api) || api.Status != http.StatusGone {
			t.Fatalf("settle after expiry: %v, want 410 reservation_expired", err)
		}
		e := s.entry(t, "acme", r.RequestID, func(e ledger.Entry) bool { return e.Status == ledger.StatusExpired })
		if e.ActualCost != 10*milli {
			t.Errorf("expired entry charged %v, want the estimate $0.01: %+v", e.ActualCost, e)
		}
	})
}

// TestBadInput: what costgate refuses to read, and another tenant's
// reservation, leave the reservation as it was.
func TestBadInput(t *testing.T) {
	forStores(t, func(t *testing.T, store string) {
		s := newStack(t, store, "", nil)
		acme, globex := s.client("cg-test-acme"), s.client("cg-test-globex")
		ctx := context.Background()
		r, err := acme.Reserve(ctx, client.ReserveRequest{Cost: client.Cost{Requests: 1, USD: 10 * milli}})
		if err != nil {
			t.Fatal(err)
		}
		units, err := acme.Reserve(ctx, client.ReserveRequest{Cost: client.Cost{Requests: 1, Units: 1}, Upstream: "search"})
		if err != nil {
			t.Fatal(err)
		}
		settle := func(c *client.Client, id string, u client.Usage) func() error {
			return func() error { _, err := c.Settle(ctx, id, u); return err }
		}
		reserve := func(req client.ReserveRequest) func() error {
			return func() error { _, err := acme.Reserve(ctx, req); return err }
		}
		cases := []struct {
			name   string
			call   func() error
			status int
			is     error
		}{
			{"unknown reservation", settle(acme, "rsv_doesnotexist", client.Usage{}), 404, client.ErrUnknownReservation},
			{"malformed id", settle(acme, "not-a-reservation", client.Usage{}), 404, client.ErrUnknownReservation},
			{"release of an unknown reservation", func() error { return acme.Release(ctx, "rsv_doesnotexist") }, 404, client.ErrUnknownReservation},
			{"negative units", settle(acme, units.ID, client.Usage{Units: -1}), 400, client.ErrInvalidRequest},
			{"negative tokens", settle(acme, r.ID, client.Usage{InputTokens: -5}), 400, client.ErrInvalidRequest},
			{"negative dollars", settle(acme, r.ID, client.Usage{USD: -1}), 400, client.ErrInvalidRequest},
			{"overflowing units", settle(acme, units.ID, client.Usage{Units: math.MaxInt64}), 400, client.ErrInvalidRequest},
			{"another tenant settles", settle(globex, r.ID, client.Usage{}), 404, client.ErrUnknownReservation},
			{"another tenant releases", func() error { return globex.Release(ctx, r.ID) }, 404, client.ErrUnknownReservation},
			{"negative reservation", reserve(client.ReserveRequest{Cost: client.Cost{Requests: 1, USD: -1}}), 400, client.ErrInvalidRequest},
			{"overflowing reservation", reserve(client.ReserveRequest{Cost: client.Cost{Requests: 1, Units: math.MaxInt64}, Upstream: "search"}), 400, client.ErrInvalidRequest},
			{"TTL over an hour", reserve(client.ReserveRequest{Cost: client.Cost{Requests: 1}, TTL: 2 * time.Hour}), 400, client.ErrInvalidRequest},
			{"unknown upstream", reserve(client.ReserveRequest{Cost: client.Cost{Requests: 1, Units: 1}, Upstream: "nope"}), 400, client.ErrInvalidRequest},
			{"unknown kind", reserve(client.ReserveRequest{Kind: "fax", Body: json.RawMessage(`{}`)}), 400, client.ErrInvalidRequest},
			{"malformed LLM request", reserve(client.ReserveRequest{Kind: "chat_completions", Body: json.RawMessage(`{"model":"gpt-4o-mini","messages":5}`)}), 400, client.ErrInvalidRequest},
			{"bad key", func() error {
				_, err := client.New(s.url, "cg-wrong").Reserve(ctx, client.ReserveRequest{Cost: client.Cost{Requests: 1}})
				return err
			}, 401, client.ErrUnauthorized},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				err := tc.call()
				var api *client.APIError
				if !errors.As(err, &api) || api.Status != tc.status || !errors.Is(err, tc.is) {
					t.Errorf("error %v, want %d (%v)", err, tc.status, tc.is)
				}
				if errors.Is(err, client.ErrNotJSON) {
					t.Errorf("costgate's answer is not JSON: %v", err)
				}
			})
		}

		// Nothing above settled or released them.
		for _, c := range []struct {
			res  *client.Reservation
			u    client.Usage
			want costmodel.NanoUSD
		}{
			{r, client.Usage{USD: 2 * milli}, 2 * milli},
			{units, client.Usage{Units: 1}, 11 * milli / 10},
		} {
			st, err := c.res.Settle(ctx, c.u)
			if err != nil || st.AlreadySettled || st.Cost != c.want {
				t.Errorf("settling after the bad input: %s %v, want %v", show(st), err, c.want)
			}
		}
	})
}

// refusalPolicy refuses the route "closed" (403) and warns on "warned".
var refusalPolicy = fstest.MapFS{"client.rego": {Data: []byte(`package costgate.policies.clienttest

default decision := {"outcome": "allow"}

decision := {"outcome": "hard", "status": 403, "reason": "this route is closed"} if {
	input.request.route == "closed"
} else := {"outcome": "soft", "friction": {"warning": "mind the budget", "delay_ms": 1}} if {
	input.request.route == "warned"
}
`)}}

// TestRefusals: a rate limit refuses with 429, a budget with 402 and a
// policy with 403, each with what a caller needs to wait or give up.
func TestRefusals(t *testing.T) {
	forStores(t, func(t *testing.T, store string) {
		ctx := context.Background()
		t.Run("429", func(t *testing.T) {
			s := newStack(t, store, `
limits:
  - name: acme-calls
    dimensions: [tenant]
    unit: requests
    rate: 2
    period: 1m
`, nil)
			acme := s.client("cg-test-acme")
			for i := range 2 {
				r, err := acme.Reserve(ctx, client.ReserveRequest{Cost: client.Cost{Requests: 1}})
				if err != nil {
					t.Fatalf("call %d: %v", i, err)
				}
				if !strings.Contains(r.RateLimit, "acme-calls") || !strings.Contains(r.RateLimitPolicy, "acme-calls") {
					t.Errorf("RateLimit %q, RateLimit-Policy %q", r.RateLimit, r.RateLimitPolicy)
				}
			}
			_, err := acme.Reserve(ctx, client.ReserveRequest{Cost: client.Cost{Requests: 1}})
			var refused *client.RefusedError
			if !errors.As(err, &refused) || !errors.Is(err, client.ErrRateLimited) || errors.Is(err, client.ErrBudgetExceeded) {
				t.Fatalf("third call: %v, want 429", err)
			}
			if refused.Status != 429 || refused.Type != "rate_limit_exceeded" || refused.Code != "acme-calls" ||
				refused.RetryAfter <= 0 || refused.RetryAfter > time.Minute || refused.RateLimit == "" || refused.RateLimitPolicy == "" {
				t.Errorf("refusal %+v", refused)
			}
			// Another tenant has its own limit.
			if _, err := s.client("cg-test-globex").Reserve(ctx, client.ReserveRequest{Cost: client.Cost{Requests: 1}}); err != nil {
				t.Errorf("globex: %v", err)
			}
		})
		t.Run("402", func(t *testing.T) {
			s := newStack(t, store, `
budgets:
  - name: acme-daily
    scope: tenant
    amount: "0.05"
`, nil)
			acme := s.client("cg-test-acme")
			r, err := acme.Reserve(ctx, client.ReserveRequest{Cost: client.Cost{Requests: 1, USD: 30 * milli}})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := r.Settle(ctx, client.Usage{USD: 30 * milli}); err != nil {
				t.Fatal(err)
			}
			_, err = acme.Reserve(ctx, client.ReserveRequest{Cost: client.Cost{Requests: 1, USD: 30 * milli}})
			var refused *client.RefusedError
			if !errors.As(err, &refused) || !errors.Is(err, client.ErrBudgetExceeded) {
				t.Fatalf("over the budget: %v, want 402", err)
			}
			if refused.Status != 402 || refused.Type != "budget_exceeded" || refused.Code != "acme-daily" || refused.RetryAfter <= 0 {
				t.Errorf("refusal %+v", refused)
			}
			// What is left still fits, to the nano-dollar.
			if r, err = acme.Reserve(ctx, client.ReserveRequest{Cost: client.Cost{Requests: 1, USD: 20 * milli}}); err != nil {
				t.Fatalf("the rest of the budget: %v", err)
			}
			r.Release(ctx)
		})
		t.Run("403 and friction", func(t *testing.T) {
			s := newStack(t, store, "", refusalPolicy)
			acme := s.client("cg-test-acme")
			_, err := acme.Reserve(ctx, client.ReserveRequest{Cost: client.Cost{Requests: 1}, Route: "closed"})
			var refused *client.RefusedError
			if !errors.As(err, &refused) || !errors.Is(err, client.ErrForbidden) || refused.Status != 403 || refused.Policy == "" ||
				!strings.Contains(refused.Message, "closed") {
				t.Fatalf("closed route: %v (%+v), want 403 from the policy", err, refused)
			}
			r, err := acme.Reserve(ctx, client.ReserveRequest{Cost: client.Cost{Requests: 1}, Route: "warned"})
			if err != nil {
				t.Fatal(err)
			}
			if r.Friction == nil || r.Friction.Warning != "mind the budget" || r.Friction.Delay != time.Millisecond {
				t.Errorf("friction %+v", r.Friction)
			}
			r.Release(ctx)
		})
	})
}

// TestTransportOnSearchAPI: an http.Client gated by a Transport calls the
// search API directly; costgate's ledger holds what each call cost, by
// the search upstream's rule, an error answer costs nothing, and a call
// over the budget never reaches the API.
func TestTransportOnSearchAPI(t *testing.T) {
	forStores(t, func(t *testing.T, store string) {
		s := newStack(t, store, `
budgets:
  - name: acme-daily
    scope: tenant
    amount: "0.004"
`, nil)
		var settled []*client.Settlement
		hc := &http.Client{Transport: &client.Transport{
			Client: s.client("cg-test-acme"), Rule: searchRule, Upstream: "search", Route: "search.web",
			Settled: func(_ *http.Request, st *client.Settlement, err error) {
				if err != nil {
					t.Errorf("settle: %v", err)
				}
				settled = append(settled, st)
			},
		}}
		get := func(path string) (int, string, error) {
			req, _ := http.NewRequest("GET", s.api.url+path, nil)
			req.Header.Set("X-Api-Key", "search-secret")
			resp, err := hc.Do(req)
			if err != nil {
				return 0, "", err
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b), err
		}

		// An error answer: settled as failed, not charged.
		if code, _, err := get("/missing?count=4"); err != nil || code != 404 {
			t.Fatalf("missing: %d %v", code, err)
		}
		e := s.entry(t, "acme", settled[0].RequestID, final)
		if e.Status != ledger.StatusFailed || e.ActualCost != 0 || settled[0].Cost != 0 {
			t.Errorf("error answer charged: %+v", e)
		}

		// 20 results asked, 7 served: reserved $0.003, charged $0.0017.
		code, body, err := get("/search?q=costgate&count=20")
		if err != nil || code != 200 || !strings.Contains(body, `"units_used":7`) {
			t.Fatalf("search: %d %s %v", code, body, err)
		}
		e = s.entry(t, "acme", settled[1].RequestID, final)
		if e.Upstream != "search" || e.Route != "search.web" || e.Actual.Units != 7 || e.ActualCost != 17*milli/10 ||
			e.EstimatedCost != 3*milli || e.Status != ledger.StatusSettled {
			t.Errorf("ledger entry %+v", e)
		}

		// $0.0023 left: another 20 ($0.003) is refused before the API.
		_, _, err = get("/search?q=costgate&count=20")
		var refused *client.RefusedError
		if !errors.As(err, &refused) || !errors.Is(err, client.ErrBudgetExceeded) {
			t.Fatalf("over the budget: %v, want a 402 refusal", err)
		}
		if n := s.api.calls.Load(); n != 2 {
			t.Errorf("the API was called %d times, want 2", n)
		}
		// 2 results ($0.0012) fit.
		if code, _, err := get("/search?q=costgate&count=2"); err != nil || code != 200 {
			t.Errorf("small search: %d %v", code, err)
		}
	})
}

// TestOneBudget: a tenant's calls through the proxy and through the
// reserve/settle API draw on one budget, to the nano-dollar.
func TestOneBudget(t *testing.T) {
	forStores(t, func(t *testing.T, store string) {
		const budget = costmodel.Dollar
		s := newStack(t, store, `
costs:
  prices:
    gpt-4o-mini: {input: "1000", output: "1000"}
budgets:
  - name: acme-daily
    scope: tenant
    amount: "1.00"
`, nil)
		sdk := openai.NewClient(option.WithBaseURL(s.url+"/v1/"), option.WithAPIKey("cg-test-acme"), option.WithMaxRetries(0))
		ctx := context.Background()
		chat := func() error {
			_, err := sdk.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
				Model:     "gpt-4o-mini",
				Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("What does a token cost?")},
				MaxTokens: openai.Int(16),
			})
			return err
		}
		spent := func() costmodel.NanoUSD {
			var sum costmodel.NanoUSD
			for _, e := range s.entries(t, "acme") {
				sum += e.ActualCost
			}
			return sum
		}

		// Half the budget through the proxy, at about $0.03 a request.
		var proxySpent costmodel.NanoUSD
		for proxySpent < budget/2 {
			if err := chat(); err != nil {
				t.Fatalf("after %v: %v", proxySpent, err)
			}
			proxySpent = spent()
		}
		rest := budget - proxySpent
		acme := s.client("cg-test-acme")

		// The other half through the API: one nano-dollar more is refused.
		if _, err := acme.Reserve(ctx, client.ReserveRequest{Cost: client.Cost{Requests: 1, USD: rest + 1}}); !errors.Is(err, client.ErrBudgetExceeded) {
			t.Fatalf("reserving %v with %v left: %v, want 402", rest+1, rest, err)
		}
		r, err := acme.Reserve(ctx, client.ReserveRequest{Cost: client.Cost{Requests: 1, USD: rest}})
		if err != nil {
			t.Fatalf("reserving the %v left: %v", rest, err)
		}
		if st, err := r.Settle(ctx, client.Usage{USD: rest}); err != nil || st.Cost != rest {
			t.Fatalf("settling %v: %s %v", rest, show(st), err)
		}

		// The budget is spent for both.
		if _, err := acme.Reserve(ctx, client.ReserveRequest{Cost: client.Cost{Requests: 1, USD: 1}}); !errors.Is(err, client.ErrBudgetExceeded) {
			t.Errorf("API after the budget: %v, want 402", err)
		}
		var apiErr *openai.Error
		if err := chat(); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusPaymentRequired {
			t.Errorf("proxy after the budget: %v, want 402", err)
		}
		if got := spent(); got != budget {
			t.Errorf("ledger total %v, want %v", got, budget)
		}
	})
}

// TestSettleOnAnotherReplica: two replicas share Redis, PostgreSQL and the
// reservation secret; a reservation made on one settles on the other, and
// nothing is charged twice, whichever replica a second settle or a release
// reaches: each is told the first settlement (claimed in Redis).
func TestSettleOnAnotherReplica(t *testing.T) {
	redisURL := redistest.New(t).URL
	dsn := pgtest.New(t)
	sim := httptest.NewServer(simulator.New(simulator.Config{Estimator: estimator(t)}))
	t.Cleanup(sim.Close)
	api := newSearchAPI(t)
	yaml := fmt.Sprintf(baseYAML, sim.URL, api.url) + `
reservations:
  secret: a-secret-both-replicas-share
budgets:
  - name: acme-daily
    scope: tenant
    amount: "0.01"
`
	var replicas [2]*costgate
	for i := range replicas {
		c, err := openCostgate(yaml, redisURL, dsn, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		replicas[i] = c
	}
	ctx := context.Background()
	first, other := client.New(replicas[0].url, "cg-test-acme"), client.New(replicas[1].url, "cg-test-acme")
	r, err := first.Reserve(ctx, client.ReserveRequest{Cost: client.Cost{Requests: 1, USD: 10 * milli}})
	if err != nil {
		t.Fatal(err)
	}
	st, err := other.Settle(ctx, r.ID, client.Usage{USD: 4 * milli})
	if err != nil || st.Cost != 4*milli || st.AlreadySettled {
		t.Fatalf("settle on the other replica: %s %v", show(st), err)
	}
	st, err = other.Settle(ctx, r.ID, client.Usage{USD: 9 * milli})
	if err != nil || st.Cost != 4*milli || !st.AlreadySettled {
		t.Fatalf("second settle on the other replica: %s %v; want the first's $0.004, already settled", show(st), err)
	}
	st, err = first.Settle(ctx, r.ID, client.Usage{USD: 1 * milli})
	if err != nil || st.Cost != 4*milli || !st.AlreadySettled {
		t.Fatalf("a settle on the first replica: %s %v; want the first's $0.004, already settled", show(st), err)
	}
	if err := first.Release(ctx, r.ID); !errors.Is(err, client.ErrReservationSettled) {
		t.Errorf("release on the first replica after the settle: %v, want ErrReservationSettled", err)
	}

	// $0.004 stays charged: $0.006 is left.
	for i, c := range replicas {
		e := c.entry(t, "acme", r.RequestID, final)
		if e.ActualCost != 4*milli || e.Status != ledger.StatusSettled {
			t.Errorf("replica %d's ledger entry: %v %s, want $0.004 settled", i, e.ActualCost, e.Status)
		}
	}
	for _, c := range []*client.Client{first, other} {
		if _, err := c.Reserve(ctx, client.ReserveRequest{Cost: client.Cost{Requests: 1, USD: 6*milli + 1}}); !errors.Is(err, client.ErrBudgetExceeded) {
			t.Errorf("reserving $0.006000001 of the $0.006 left: %v, want 402", err)
		}
	}
	r, err = other.Reserve(ctx, client.ReserveRequest{Cost: client.Cost{Requests: 1, USD: 6 * milli}})
	if err != nil {
		t.Fatalf("reserving the $0.006 left: %v", err)
	}
	r.Release(ctx)
}

// TestSettleWhileRedisHangs: a settle sent while Redis answers nothing
// (CLIENT PAUSE, longer than store.timeout) is answered within a bound,
// not held for the pause, and the reservation ends once: a settle after
// Redis is back answers the first one's figures, or settles it then, and
// the ledger's entry is final at the cost settled, charged once.
func TestSettleWhileRedisHangs(t *testing.T) {
	srv := redistest.New(t)
	dsn := pgtest.New(t)
	sim := httptest.NewServer(simulator.New(simulator.Config{Estimator: estimator(t)}))
	t.Cleanup(sim.Close)
	api := newSearchAPI(t)
	yaml := strings.Replace(fmt.Sprintf(baseYAML, sim.URL, api.url), "  timeout: 2s\n", "  timeout: 100ms\n", 1) +
		"reservations:\n  secret: a-secret-of-this-test\n"
	c, err := openCostgate(yaml, srv.URL, dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ctx := context.Background()
	cl := client.New(c.url, "cg-test-acme")
	r, err := cl.Reserve(ctx, client.ReserveRequest{Cost: client.Cost{Requests: 1, USD: 10 * milli}})
	if err != nil {
		t.Fatal(err)
	}
	const pause = 3 * time.Second
	if err := srv.Client(t).Do(ctx, "CLIENT", "PAUSE", pause.Milliseconds(), "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	first, ferr := cl.Settle(ctx, r.ID, client.Usage{USD: 4 * milli})
	took := time.Since(paused)
	t.Logf("settle while Redis hangs: %s %v after %s", show(first), ferr, took)
	// store.timeout (100 ms) and then the claim's own bound (1 s): held for
	// the pause (3 s) before the client ended calls at their deadlines.
	if took >= 2*time.Second {
		t.Fatalf("the settle took %s of a %s pause: want it answered within store.timeout and the claim's bound", took, pause)
	}
	time.Sleep(time.Until(paused.Add(pause + 200*time.Millisecond)))
	again, err := cl.Settle(ctx, r.ID, client.Usage{USD: 9 * milli})
	if err != nil || again.Cost != 4*milli {
		t.Fatalf("settle after the pause: %s %v (the first: %s %v); want the first's $0.004", show(again), err, show(first), ferr)
	}
	if ferr == nil && (first.Cost != 4*milli || !again.AlreadySettled) {
		t.Fatalf("first settle %s, then %s: want $0.004, then already settled", show(first), show(again))
	}
	if e := c.entry(t, "acme", r.RequestID, final); e.ActualCost != 4*milli || e.Status != ledger.StatusSettled {
		t.Fatalf("ledger entry: %v %s, want $0.004 settled", e.ActualCost, e.Status)
	}
}
