package gate

import (
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
)

// Attacks on the learned output estimate (output_reserve: pNN): a tenant
// that teaches its keys short answers, then looks for a way past
// max_exposure.

// learnedAtkYAML reserves the learned p95 (20 samples are enough), with
// max_exposure $0.02, model m1 at $1 per million input tokens and $10 per
// million output tokens, and tenant acme's budget of $0.05 a day.
const learnedAtkYAML = `
costs:
  output_reserve: p95
  learned: {min_samples: 20, interval: 1h, max_exposure: "0.02"}
  prices: {m1: {input: "1.00", output: "10.00", max_output_tokens: 4096}}
budgets:
  - {name: acme-daily, scope: tenant, amount: "0.05"}
`

// learnedAtkRequest is a chat request for m1 of caller c with max_tokens
// 1000, on route.
func learnedAtkRequest(t *testing.T, c *Caller, route string) *Request {
	t.Helper()
	est, err := c.Estimator().Estimate(costmodel.ChatCompletions,
		[]byte(`{"model":"m1","max_tokens":1000,"messages":[{"role":"user","content":"hello"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	return &Request{Caller: c, Route: route, Estimate: est}
}

// learnedAtkTeach settles 25 answers of 10 output tokens on c's key of
// route: from then on it reserves about 10.
func learnedAtkTeach(t *testing.T, g *Gate, c *Caller, route string) {
	t.Helper()
	ctx := context.Background()
	for range 25 {
		req := learnedAtkRequest(t, c, route)
		res, d := g.Reserve(ctx, req)
		if res == nil {
			t.Fatalf("teaching: refused: %+v", d)
		}
		if _, ok := res.Record(ctx); !ok {
			t.Fatal("teaching: record refused")
		}
		u := costmodel.Usage{InputTokens: req.Estimate.Usage.InputTokens, OutputTokens: 10}
		res.Settle(ctx, Charge{Usage: u, Cost: res.Price("m1", u), HTTPStatus: 200})
	}
}

// TestLearnedAttackExpiredHoldsEscapeExposure: a reserve/settle caller
// whose reservations are never settled is charged, at their expiry, their
// estimate: under output_reserve: 100 the whole output limit, the worst
// case, and under pNN too, not the learned estimate (the expiry gives the
// exposure back, so a learned charge would leave what the answers may
// have cost beyond it unbounded). A tenant that teaches its key 10-token
// answers, then reserves max_tokens 1000 and lets every hold expire, is
// admitted no more output than a $0.05 budget and max_exposure $0.02 pay
// for.
func TestLearnedAttackExpiredHoldsEscapeExposure(t *testing.T) {
	ctx := context.Background()
	g := openAcme(t, learnedAtkYAML)
	c := g.Identify("cg-acme")
	const route = "/v1/costgate/reserve" // as the proxy's reserve endpoint records an LLM body
	learnedAtkTeach(t, g, c, route)

	full := learnedAtkRequest(t, c, route).Estimate.Cost // the request at its whole output limit
	var admitted int
	var exposed costmodel.NanoUSD // the most the expired holds' answers may have cost
	for range 200 {
		res, _ := g.Reserve(ctx, learnedAtkRequest(t, c, route))
		if res == nil {
			break
		}
		if _, ok := res.Record(ctx); !ok {
			t.Fatal("record refused")
		}
		res.Hold(time.Minute)
		g.expireHolds(time.Now().Add(2 * time.Minute)) // the caller never settles
		admitted++
		exposed += full
	}
	const budget, maxExposure = 50_000_000, 20_000_000
	if exposed > budget+maxExposure {
		t.Errorf("%d holds of max_tokens 1000 admitted and expired at their learned estimate: their answers may have cost %s, "+
			"against a $0.05 budget and max_exposure $0.02 (%d holds at the whole limit, %s each, would have been refused past %d)",
			admitted, exposed, admitted, full, (budget+maxExposure)/int64(full))
	}
}

// learnedAtkDirectory is a control plane of tenant acme's keys cg-open
// (any model) and cg-narrow, whose key level allows only model m2.
type learnedAtkDirectory struct{}

func (learnedAtkDirectory) Lookup(sum [sha256.Size]byte, _ time.Time) (Principal, bool) {
	switch sum {
	case sha256.Sum256([]byte("cg-open")):
		p := Principal{Tenant: "acme", KeyID: "open", Plan: "p"}
		p.Levels[0] = &Level{Kind: "key", Name: "open"}
		return p, true
	case sha256.Sum256([]byte("cg-narrow")):
		p := Principal{Tenant: "acme", KeyID: "narrow", Plan: "p"}
		p.Levels[0] = &Level{Kind: "key", Name: "narrow", Models: []string{"m2"}}
		return p, true
	}
	return Principal{}, false
}

func (learnedAtkDirectory) Budgets(string) []LevelBudget { return nil }
func (learnedAtkDirectory) BudgetTenants() []string      { return nil }

// TestLearnedAttackForbiddenModelLeaksExposure: a request its key's level
// does not allow (403) takes none of the tenant's max_exposure: requests
// of one narrow key for a model it may not use must not leave every other
// key of the tenant reserving its whole output limit, as if learned
// reservations were in flight.
func TestLearnedAttackForbiddenModelLeaksExposure(t *testing.T) {
	ctx := context.Background()
	g := openAcme(t, learnedAtkYAML)
	g.SetDirectory(learnedAtkDirectory{})
	open, narrow := g.Identify("cg-open"), g.Identify("cg-narrow")
	if open == nil || narrow == nil {
		t.Fatal("the directory's keys are unknown")
	}
	const route = "/v1/chat/completions"
	learnedAtkTeach(t, g, open, route)
	for i := range 5 {
		if res, d := g.Reserve(ctx, learnedAtkRequest(t, narrow, route)); res != nil || d.Status != 403 {
			t.Fatalf("narrow key's request %d for m1: %v %+v, want 403", i, res != nil, d)
		}
	}
	res, d := g.Reserve(ctx, learnedAtkRequest(t, open, route))
	if res == nil {
		t.Fatalf("open key refused: %+v", d)
	}
	defer res.Cancel(ctx)
	if got := res.Request().Estimate.Usage.OutputTokens; got >= 1000 {
		x, _ := g.learned.exposure.Load("acme")
		e := x.(*exposure)
		e.mu.Lock()
		held := costmodel.NanoUSD(e.usd)
		e.mu.Unlock()
		t.Errorf("with nothing in flight, the open key reserved %d output tokens (its whole limit): "+
			"five refused requests of another key hold %s of the tenant's max_exposure", got, held)
	}
}
