package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/costgate/costgate/config"
	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/proxy"
	"github.com/costgate/costgate/simulator"
)

// reloadAtk is a costgate in front of the simulator whose configuration a
// test changes by a reload: its limits and budgets are the YAML given to
// reload, everything else stays.
type reloadAtk struct {
	srv    *proxy.Server
	yaml   func(extra string) string
	dsn    string
	secret string // reservations.secret; empty: the data directory's key
	store  string // more of the store section, indented by two spaces
}

// upsEnd ends the upstreams, beyond the openai one, at the start of a
// reloadAtk's extra YAML.
const upsEnd = "# end of upstreams\n"

// reloadAtkStack starts costgate with extra (limits, budgets) on redisURL
// (empty: the in-memory store) and ledgerDSN (empty: the embedded ledger).
func reloadAtkStack(t *testing.T, redisURL, ledgerDSN, secret, extra string) *reloadAtk {
	t.Helper()
	return reloadAtkStackStore(t, redisURL, ledgerDSN, secret, "", extra)
}

// reloadAtkStackStore is reloadAtkStack with store, more of the store
// section (each line indented by two spaces and ended by a newline).
func reloadAtkStackStore(t *testing.T, redisURL, ledgerDSN, secret, store, extra string) *reloadAtk {
	t.Helper()
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sim := httptest.NewServer(simulator.New(simulator.Config{Estimator: est}))
	t.Cleanup(sim.Close)
	dir := t.TempDir()
	s := &reloadAtk{dsn: ledgerDSN, secret: secret, store: store}
	s.yaml = func(extra string) string {
		ups := ""
		if i := strings.Index(extra, upsEnd); i >= 0 {
			ups, extra = extra[:i], extra[i+len(upsEnd):]
		}
		res := ""
		if s.secret != "" {
			res = "reservations: {secret: " + s.secret + "}\n"
		}
		return fmt.Sprintf(`admin_token: test-admin
data_dir: %q
store:
  redis: %q
  timeout: 2s
  queue_timeout: 2s
%s%supstreams:
  - {name: openai, kind: openai, base_url: %s, api_key: sk-upstream}
%stenants:
  - name: acme
    plan: free
    keys:
      - {id: acme-key, key: cg-test-acme, user: alice}
  - name: globex
    plan: pro
    keys:
      - {id: globex-key, key: cg-test-globex}
%s`, dir, redisURL, s.store, res, sim.URL, ups, extra)
	}
	cfg := s.parse(t, extra)
	cfg.Store.Redis = redisURL
	srv, err := proxy.Open(context.Background(), cfg, proxy.Options{})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { srv.Close() })
	s.srv = srv
	return s
}

func (s *reloadAtk) parse(t *testing.T, extra string) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(s.yaml(extra)))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	cfg.Ledger.DSN = s.dsn
	return cfg
}

// reload makes extra the active limits and budgets, as a file change or
// SIGHUP does.
func (s *reloadAtk) reload(t *testing.T, extra string) {
	t.Helper()
	if err := s.tryReload(t, extra); err != nil {
		t.Fatalf("reload: %v", err)
	}
}

// tryReload is reload, its error returned.
func (s *reloadAtk) tryReload(t *testing.T, extra string) error {
	t.Helper()
	cfg := s.parse(t, extra)
	cfg.Store.Redis = s.srv.Config().Store.Redis
	s.srv.SetLoader(func() (*config.Config, error) { return cfg, nil })
	return s.srv.Reload()
}

// reloadAtkDaily is a tenant day budget of 1.00; reloadAtkMoves, reloads
// that give it counters that have not counted the day.
const reloadAtkDaily = `budgets:
  - {name: daily, scope: tenant, amount: "1.00"}
`

var reloadAtkMoves = []struct{ name, after string }{
	{"renamed", `budgets:
  - {name: daily-usd, scope: tenant, amount: "1.00"}
`},
	{"monthly", `budgets:
  - {name: daily, scope: tenant, period: month, amount: "1.00"}
`},
	{"user scope", `budgets:
  - {name: daily, scope: user, amount: "1.00"}
`},
}

// TestReloadAttackBudgetChangedKeepsItsSpend: a tenant that has spent its
// day's budget gets no fresh one when a reload renames the budget, makes it
// monthly or moves it to another scope: the budget's counter under the new
// configuration counts what the ledger holds for its period, at once, not
// from the next reconciliation (store.reconcile_interval) on.
func TestReloadAttackBudgetChangedKeepsItsSpend(t *testing.T) {
	const before = reloadAtkDaily
	for _, store := range []string{"memory", "redis"} {
		for _, tc := range reloadAtkMoves {
			t.Run(store+"/"+tc.name, func(t *testing.T) {
				url := ""
				if store == "redis" {
					url = redistest.New(t).URL
				}
				s := reloadAtkStack(t, url, "", "", before)
				h := s.srv.Handler()
				spend := func() int {
					code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/reserve", `{"cost":{"usd":"0.60"}}`)
					if code != 200 {
						return code
					}
					id, _ := out["reservation_id"].(string)
					if code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/settle", `{"reservation_id":"`+id+`","usage":{"usd":"0.60"}}`); code != 200 {
						t.Fatalf("settle: %d %v", code, out)
					}
					return 200
				}
				if code := spend(); code != 200 {
					t.Fatalf("first spend: %d", code)
				}
				if code := spend(); code != 402 {
					t.Fatalf("second spend of 0.60 on a 1.00 budget: %d, want 402", code)
				}
				s.reload(t, tc.after)
				if code := spend(); code != 402 {
					t.Errorf("after the reload (%s), 0.60 more was admitted on a budget with 0.60 of 1.00 spent today: %d, want 402", tc.name, code)
				}
			})
		}
	}
}

// TestReloadAttackHeldSettledAfterAlgorithmChange: a reservation made
// under one algorithm of a limit and settled, after a reload changed the
// algorithm, on a replica that does not hold it refunds nothing into the
// new algorithm's counter, which never held its debit: a tenant that
// drained the limit under the new algorithm gets no room back from an old
// reservation's unused estimate.
func TestReloadAttackHeldSettledAfterAlgorithmChange(t *testing.T) {
	url := redistest.New(t).URL
	dsn := pgtest.New(t)
	const secret = "reload-attack-secret-0123456789"
	const before = `limits:
  - {name: tpm, dimensions: [tenant], unit: tokens, algorithm: token_bucket, rate: 1000, period: 1h}
`
	const after = `limits:
  - {name: tpm, dimensions: [tenant], unit: tokens, algorithm: gcra, rate: 1000, period: 1h}
`
	a := reloadAtkStack(t, url, dsn, secret, before)
	b := reloadAtkStack(t, url, dsn, secret, before)
	id := reserveIDOn(t, a.srv.Handler(), `{"cost":{"tokens":1000}}`)
	a.reload(t, after)
	b.reload(t, after)
	hb := b.srv.Handler()
	drain := reserveIDOn(t, hb, `{"cost":{"tokens":1000}}`)
	if code, out := reserveCall(t, hb, "cg-test-acme", "/v1/costgate/settle", `{"reservation_id":"`+drain+`","usage":{"tokens":1000}}`); code != 200 {
		t.Fatalf("settle: %d %v", code, out)
	}
	if code, _ := reserveCall(t, hb, "cg-test-acme", "/v1/costgate/reserve", `{"cost":{"tokens":1000}}`); code != 429 {
		t.Fatalf("a drained limit admitted 1000 more: %d, want 429", code)
	}
	// The old reservation, settled at nothing on the replica that does not
	// hold it.
	if code, out := reserveCall(t, hb, "cg-test-acme", "/v1/costgate/settle", `{"reservation_id":"`+id+`","usage":{"tokens":0}}`); code != 200 {
		t.Fatalf("settle the old reservation: %d %v", code, out)
	}
	if code, _ := reserveCall(t, hb, "cg-test-acme", "/v1/costgate/reserve", `{"cost":{"tokens":1000}}`); code != 429 {
		t.Errorf("after an old reservation was settled, the drained gcra limit admitted 1000 more tokens: %d, want 429", code)
	}
}

// reserveIDOn reserves body for acme on h and returns the reservation id.
func reserveIDOn(t *testing.T, h http.Handler, body string) string {
	t.Helper()
	code, r := reserveCall(t, h, "cg-test-acme", "/v1/costgate/reserve", body)
	if code != 200 {
		t.Fatalf("reserve %s: %d %v", body, code, r)
	}
	id, _ := r["reservation_id"].(string)
	return id
}

// TestReloadAttackSecretRotatedByReload: reservations.secret changed by a
// reload is either refused (the last secret stays, and the reload says
// so) or in force at once: a reservation made after the reload is settled
// by a replica started with the new secret.
func TestReloadAttackSecretRotatedByReload(t *testing.T) {
	const old, rotated = "reload-attack-old-secret-0123", "reload-attack-new-secret-4567"
	url := redistest.New(t).URL
	dsn := pgtest.New(t)
	a := reloadAtkStack(t, url, dsn, old, "")
	a.secret = rotated
	if err := a.tryReload(t, ""); err != nil {
		return // refused: the old secret stays, and the operator is told
	}
	b := reloadAtkStack(t, url, dsn, rotated, "")
	id := reserveIDOn(t, a.srv.Handler(), `{"cost":{"tokens":10}}`)
	if code, out := reserveCall(t, b.srv.Handler(), "cg-test-acme", "/v1/costgate/settle", `{"reservation_id":"`+id+`","usage":{"tokens":5}}`); code != 200 {
		t.Errorf("a reservation made after a reload rotated the secret cannot be settled on a replica with the new secret: %d %s", code, errCode(out))
	}
}

// TestReloadAttackPriceChangedBeforeSettle: a reload that cuts a model's
// price and a generic upstream's cost rule alike, between reserve and
// settle, bills held reservations under one rule: the same settlement
// bills the same whichever replica settles it and whichever price
// changed (all at the prices of admission, or all at those in force).
func TestReloadAttackPriceChangedBeforeSettle(t *testing.T) {
	url := redistest.New(t).URL
	dsn := pgtest.New(t)
	const secret = "reload-attack-secret-0123456789"
	prices := func(input, perCall string) string {
		return `  - name: search
    kind: generic
    base_url: http://127.0.0.1:1
    api_key: search-secret
    cost: {per_call: "` + perCall + `"}
` + upsEnd + `costs:
  prices: {m1: {input: "` + input + `", output: "10.00", max_output_tokens: 4096}}
`
	}
	// $1.00 per million input tokens and per call, then $0.01 for both.
	a := reloadAtkStack(t, url, dsn, secret, prices("1.00", "1.00"))
	b := reloadAtkStack(t, url, dsn, secret, prices("1.00", "1.00"))
	ha := a.srv.Handler()
	const model = `{"model":"m1","cost":{"input_tokens":1000000}}`
	onA := reserveIDOn(t, ha, model)
	onB := reserveIDOn(t, ha, model)
	search := reserveIDOn(t, ha, `{"upstream":"search","cost":{"units":1}}`)
	a.reload(t, prices("0.01", "0.01"))
	b.reload(t, prices("0.01", "0.01"))
	billed := func(h http.Handler, id, usage string) string {
		t.Helper()
		code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/settle", `{"reservation_id":"`+id+`","usage":`+usage+`}`)
		if code != 200 {
			t.Fatalf("settle: %d %v", code, out)
		}
		usd, _ := out["cost_usd"].(string)
		return usd
	}
	heldModel := billed(ha, onA, `{"input_tokens":1000000}`)
	otherModel := billed(b.srv.Handler(), onB, `{"input_tokens":1000000}`)
	heldRule := billed(ha, search, `{"units":1}`)
	if heldModel != otherModel || heldModel != heldRule {
		t.Errorf("one settlement, three bills: m1 on the replica holding it %s, on another replica %s; a call priced by the upstream's rule on the replica holding it %s", heldModel, otherModel, heldRule)
	}
}

// TestReloadAttackRacingRequests: reloads that change a limit's and a
// budget's capacity (and a leased limit's lease), back and forth, while
// proxied requests and reserve/settle calls run lose no settlement: every
// ledger entry is final, and the limit and the budget have counted exactly
// what the ledger bills (the leased limit, once the replica has returned
// its leases at Close, at least that).
func TestReloadAttackRacingRequests(t *testing.T) {
	url := redistest.New(t).URL
	dsn := pgtest.New(t)
	const secret = "reload-attack-secret-0123456789"
	cfgs := [2]string{`limits:
  - {name: tpm, dimensions: [tenant], unit: tokens, algorithm: fixed_window, rate: 50000000, period: 1h}
  - {name: leased, dimensions: [tenant], unit: tokens, algorithm: fixed_window, rate: 50000000, period: 1h, lease: {max_share: 0.01, ttl: 2s}}
budgets:
  - {name: daily, scope: tenant, amount: "1000.00"}
`, `limits:
  - {name: tpm, dimensions: [tenant], unit: tokens, algorithm: fixed_window, rate: 60000000, period: 1h}
  - {name: leased, dimensions: [tenant], unit: tokens, algorithm: fixed_window, rate: 60000000, period: 1h, lease: {max_share: 0.02, ttl: 3s}}
budgets:
  - {name: daily, scope: tenant, amount: "2000.00"}
`}
	s := reloadAtkStack(t, url, dsn, secret, cfgs[0])
	h := s.srv.Handler()
	stop := make(chan struct{})
	reloaded := make(chan int)
	go func() {
		n := 0
		defer func() { reloaded <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			n++
			cfg := s.parse(t, cfgs[n%2])
			cfg.Store.Redis = url
			s.srv.SetLoader(func() (*config.Config, error) { return cfg, nil })
			if err := s.srv.Reload(); err != nil {
				t.Errorf("reload: %v", err)
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	var wg sync.WaitGroup
	var served atomic.Int64
	for w := range 6 {
		wg.Go(func() {
			for i := range 30 {
				if (w+i)%2 == 0 {
					req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"model":"gpt-4o-mini","max_tokens":16,"messages":[{"role":"user","content":"hello there"}]}`))
					req.Header.Set("Authorization", "Bearer cg-test-acme")
					req.Header.Set("Content-Type", "application/json")
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, req)
					if rec.Code != 200 {
						t.Errorf("chat: %d %s", rec.Code, rec.Body)
						return
					}
					served.Add(1)
					continue
				}
				code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/reserve", `{"model":"gpt-4o-mini","cost":{"input_tokens":500,"output_tokens":500}}`)
				if code != 200 {
					t.Errorf("reserve: %d %v", code, out)
					return
				}
				id, _ := out["reservation_id"].(string)
				usage := fmt.Sprintf(`{"input_tokens":%d,"output_tokens":%d}`, 10*i+w, 3*i)
				if code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/settle", `{"reservation_id":"`+id+`","usage":`+usage+`}`); code != 200 {
					t.Errorf("settle: %d %v", code, out)
					return
				}
				served.Add(1)
			}
		})
	}
	wg.Wait()
	close(stop)
	if n := <-reloaded; n < 5 {
		t.Logf("only %d reloads ran during the requests", n)
	}
	if t.Failed() {
		return
	}
	es := (&stack{srv: s.srv}).entries(t)
	if int64(len(es)) != served.Load() {
		t.Fatalf("%d ledger entries for %d requests served", len(es), served.Load())
	}
	var tokens, usd, refunds int64
	for _, e := range es {
		if e.Status != ledger.StatusSettled {
			t.Errorf("entry %s is %s, want settled", e.RequestID, e.Status)
		}
		tokens += e.Actual.InputTokens + e.Actual.OutputTokens
		usd += int64(e.ActualCost)
		refunds += max(int64(e.EstimatedCost-e.ActualCost), 0)
	}
	used := func(s *reloadAtk) map[string]int64 {
		g := s.srv.Gate()
		res, d := g.Reserve(context.Background(), &gate.Request{Caller: g.Identify("cg-test-acme"), Route: "/x", States: true, Check: true})
		if res != nil {
			res.Cancel(context.Background())
		}
		out := map[string]int64{}
		for _, l := range d.Limits {
			out[l.Name] = l.Capacity - l.Remaining
		}
		return out
	}
	// A reload that changes a budget reconciles it with the ledger, and a
	// reconciliation racing a settlement may keep its refund counted (see
	// TestReloadAttackReconcileRacingSettlements): the budget counts what
	// the ledger bills, more by at most the refunds, never less.
	if u := used(s); u["tpm"] != tokens || u["daily"] < usd || u["daily"] > usd+refunds {
		t.Errorf("the limit counted %d tokens and the budget %d nano-USD; the ledger bills %d tokens and %d nano-USD (refunds %d)", u["tpm"], u["daily"], tokens, usd, refunds)
	}
	// The leased limit, once the replica returned its leases: read by a
	// replica that holds none.
	if err := s.srv.Close(); err != nil {
		t.Fatal(err)
	}
	strict := reloadAtkStack(t, url, dsn, secret, `limits:
  - {name: leased, dimensions: [tenant], unit: tokens, algorithm: fixed_window, rate: 60000000, period: 1h}
`)
	// A refund of a reservation whose lease a reload ended is counted
	// spent (see the README's "Hot keys: leases"): the leased limit may
	// count more than the ledger bills, never less.
	if u := used(strict); u["leased"] < tokens {
		t.Errorf("the leased limit counted %d tokens once its leases were returned; the ledger bills %d", u["leased"], tokens)
	}
}

// TestReloadAttackReconcileRacingSettlements: the budgets' reconciliation
// with the ledger (store.reconcile_interval, here 10 ms), running while
// requests settle below their estimates, never leaves a budget's counter
// below what the ledger bills once they are settled (no spend is lost),
// and above it by at most the refunds of those settlements (a
// reconciliation that read a request's estimate from the ledger before
// its settlement reached it may raise the counter past the refund).
func TestReloadAttackReconcileRacingSettlements(t *testing.T) {
	for _, tc := range []struct{ name, redis, dsn string }{
		{"memory+embedded", "", ""},
		{"redis+postgres", redistest.New(t).URL, pgtest.New(t)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := reloadAtkStackStore(t, tc.redis, tc.dsn, "", "  reconcile_interval: 10ms\n", `budgets:
  - {name: daily, scope: tenant, amount: "1000.00"}
`)
			h := s.srv.Handler()
			var wg sync.WaitGroup
			for w := range 4 {
				wg.Go(func() {
					for i := range 40 {
						if (w+i)%2 == 0 {
							req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"model":"gpt-4o-mini","max_tokens":16,"messages":[{"role":"user","content":"hello there"}]}`))
							req.Header.Set("Authorization", "Bearer cg-test-acme")
							rec := httptest.NewRecorder()
							h.ServeHTTP(rec, req)
							if rec.Code != 200 {
								t.Errorf("chat: %d %s", rec.Code, rec.Body)
								return
							}
							continue
						}
						code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/reserve", `{"cost":{"usd":"0.50"}}`)
						if code != 200 {
							t.Errorf("reserve: %d %v", code, out)
							return
						}
						id, _ := out["reservation_id"].(string)
						usage := fmt.Sprintf(`{"usd":"0.%02d"}`, (w*40+i)%50)
						if code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/settle", `{"reservation_id":"`+id+`","usage":`+usage+`}`); code != 200 {
							t.Errorf("settle: %d %v", code, out)
							return
						}
					}
				})
			}
			wg.Wait()
			if t.Failed() {
				return
			}
			var billed, refunds int64
			for _, e := range (&stack{srv: s.srv}).entries(t) {
				billed += int64(e.ActualCost)
				refunds += max(int64(e.EstimatedCost-e.ActualCost), 0)
			}
			g := s.srv.Gate()
			_, d := g.Reserve(context.Background(), &gate.Request{Caller: g.Identify("cg-test-acme"), Route: "/x", States: true, Check: true})
			for _, l := range d.Limits {
				if counted := l.Capacity - l.Remaining; l.Name == "daily" && (counted < billed || counted > billed+refunds) {
					t.Errorf("the budget counted %d nano-USD; the ledger bills %d (refunds %d)", counted, billed, refunds)
				}
			}
		})
	}
}

// TestReloadAttackBudgetChangedUnderLoad: a reload that renames a spent
// budget, makes it monthly or moves it to another scope, while callers
// keep asking the tenant's reserve API for more than is left. The new
// configuration's counters have not counted the day until they are
// restored from the ledger; a request decided on one before then would be
// admitted, and the restore, which raises a counter to the ledger's spend
// and no further, would forget it. Every request must be refused, before
// the reload and after it.
func TestReloadAttackBudgetChangedUnderLoad(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		for _, tc := range reloadAtkMoves {
			t.Run(store+"/"+tc.name, func(t *testing.T) {
				url := ""
				if store == "redis" {
					url = redistest.New(t).URL
				}
				s := reloadAtkStack(t, url, "", "", reloadAtkDaily)
				h := s.srv.Handler()
				if code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/reserve", `{"cost":{"usd":"0.60"}}`); code != 200 {
					t.Fatalf("first reserve: %d %v", code, out)
				}
				hm := reloadAtkHammer(t, h)
				s.reload(t, tc.after)
				if a := hm.halt(t, 100); a > 0 {
					t.Errorf("%d reservations of 0.60 admitted around the reload (%s), on a budget with 0.60 of 1.00 spent today", a, tc.name)
				}
			})
		}
	}
}

// reserveHammer is 8 callers asking acme's reserve API for 0.60 each, in
// turn on its handlers, until halted.
type reserveHammer struct {
	admitted, sent atomic.Int64
	stop           atomic.Bool
	wg             sync.WaitGroup
}

// reloadAtkHammer starts a reserveHammer on hs, once its callers have
// made 50 calls.
func reloadAtkHammer(t *testing.T, hs ...http.Handler) *reserveHammer {
	hm := &reserveHammer{}
	for i := range 8 {
		h := hs[i%len(hs)]
		hm.wg.Go(func() {
			for !hm.stop.Load() {
				hm.sent.Add(1)
				switch code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/reserve", `{"cost":{"usd":"0.60"}}`); code {
				case http.StatusOK:
					hm.admitted.Add(1)
				case http.StatusPaymentRequired:
				default:
					t.Errorf("reserve: %d %v", code, out)
					return
				}
			}
		})
	}
	reloadAtkAwait(t, "the callers running", func() bool { return hm.sent.Load() > 50 })
	return hm
}

// halt lets the callers make more calls, then stops them and returns how
// many were admitted.
func (hm *reserveHammer) halt(t *testing.T, more int64) int64 {
	n := hm.sent.Load()
	reloadAtkAwait(t, "the callers after the change", func() bool { return hm.sent.Load() > n+more })
	hm.stop.Store(true)
	hm.wg.Wait()
	return hm.admitted.Load()
}

// reloadAtkAwait waits up to 10 s for cond, polling.
func reloadAtkAwait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("%s: not within 10 s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
