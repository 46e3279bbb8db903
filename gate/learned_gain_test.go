package gate_test

import (
	"container/heap"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/gate"
)

// gainRow is one rule's outcome on the generated workload.
type gainRow struct {
	rule                        string
	served, refused, affordable int
	spent, overspend            float64
	tokens, tokenOverrun        int64
}

// simRequest is one request of the generated workload.
type simRequest struct {
	at, dur   float64 // arrival and duration, in seconds
	maxTokens int64
	out       int64 // the output it really produces
}

// simPrompt is every request's prompt, about 500 tokens.
var simPrompt = strings.Repeat("hello ", 495)

// simRate is the workload's requests per second.
const simRate = 50

// workload generates n requests: Poisson arrivals (simRate a second), half of
// them with max_tokens 1024 and half 4096, output lengths log-normal
// (median 245 tokens, σ 1.0) capped at max_tokens, 0.5 s plus 20 ms per
// output token long.
func workload(seed uint64, n int) []simRequest {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e37))
	reqs := make([]simRequest, n)
	t := 0.0
	for i := range reqs {
		t += rng.ExpFloat64() / simRate
		mt := int64(1024)
		if rng.IntN(2) == 1 {
			mt = 4096
		}
		out := min(int64(math.Exp(5.5+1.0*rng.NormFloat64())), mt)
		reqs[i] = simRequest{at: t, dur: 0.5 + 0.02*float64(out), maxTokens: mt, out: out}
	}
	return reqs
}

type inflight struct {
	end  float64
	res  *gate.Reservation
	cost float64
	tok  int64
	in   int64
}
type flights []inflight

func (f flights) Len() int           { return len(f) }
func (f flights) Less(i, j int) bool { return f[i].end < f[j].end }
func (f flights) Swap(i, j int)      { f[i], f[j] = f[j], f[i] }
func (f *flights) Push(x any)        { *f = append(*f, x.(inflight)) }
func (f *flights) Pop() any {
	old := *f
	x := old[len(old)-1]
	*f = old[:len(old)-1]
	return x
}

// simulate replays reqs through g for tenant acme, whose daily budget is
// budget dollars and whose daily token limit is tokenLimit, and counts
// the refusals that the request could have afforded: its real cost, with
// what was settled, what the requests in flight really cost, and what the
// refusals counted before it really cost, fits the budget and the token
// limit (so the requests counted could all have been served together).
func simulate(t *testing.T, g *gate.Gate, rule string, reqs []simRequest, budget float64, tokenLimit int64) gainRow {
	t.Helper()
	ctx := context.Background()
	c := g.Identify("cg-acme")
	price := func(u costmodel.Usage) costmodel.NanoUSD { return c.Estimator().Cost("m1", u) }
	row := gainRow{rule: rule}
	var fl flights
	var settledUSD, flightUSD float64
	var settledTok, flightTok int64
	// extra is what the refusals counted affordable so far really cost:
	// they are counted only while all of them together fit.
	var extraUSD float64
	var extraTok int64
	settle := func(until float64) {
		for fl.Len() > 0 && fl[0].end <= until {
			f := heap.Pop(&fl).(inflight)
			u := costmodel.Usage{InputTokens: f.in, OutputTokens: f.tok - f.in}
			f.res.Settle(ctx, gate.Charge{Usage: u, Cost: price(u), HTTPStatus: 200})
			settledUSD += f.cost
			flightUSD -= f.cost
			settledTok += f.tok
			flightTok -= f.tok
		}
	}
	for _, q := range reqs {
		settle(q.at)
		est, err := c.Estimator().Estimate(costmodel.ChatCompletions, fmt.Appendf(nil,
			`{"model":"m1","max_tokens":%d,"messages":[{"role":"user","content":%q}]}`, q.maxTokens, simPrompt))
		if err != nil {
			t.Fatal(err)
		}
		in := est.Usage.InputTokens
		real := costmodel.Usage{InputTokens: in, OutputTokens: q.out}
		cost := float64(price(real)) / 1e9
		tok := in + q.out
		res, d := g.Reserve(ctx, &gate.Request{Caller: c, Route: "/v1/chat/completions", Estimate: est})
		if res == nil {
			row.refused++
			if d.Status != 402 && d.Status != 429 {
				t.Fatalf("refused with %d: %+v", d.Status, d.Error)
			}
			if settledUSD+flightUSD+extraUSD+cost <= budget && settledTok+flightTok+extraTok+tok <= tokenLimit {
				row.affordable++
				extraUSD += cost
				extraTok += tok
			}
			continue
		}
		row.served++
		heap.Push(&fl, inflight{end: q.at + q.dur, res: res, cost: cost, tok: tok, in: in})
		flightUSD += cost
		flightTok += tok
	}
	settle(math.Inf(1))
	row.spent, row.tokens = settledUSD, settledTok
	row.overspend = max(settledUSD-budget, 0)
	row.tokenOverrun = max(settledTok-tokenLimit, 0)
	return row
}

// TestLearnedGain replays one generated workload under today's rule
// (output_reserve 100 and 50: the gate reserves as serve does) and under output_reserve: p95, against a
// daily budget and a daily token limit, and prints the table the README
// shows (go test -run TestLearnedGain -v ./gate/).
func TestLearnedGain(t *testing.T) {
	const (
		budget     = 10.0
		tokenLimit = 4_000_000
		n          = 6000
	)
	reqs := workload(42, n)
	history := workload(7, 2000) // the tenant's past traffic the learned rule starts from
	limits := fmt.Sprintf(`limits:
  - {name: tokens-day, dimensions: [tenant], unit: tokens, rate: %d, period: 24h}
budgets:
  - {name: daily, scope: tenant, amount: "%v"}
`, tokenLimit, budget)
	var rows []gainRow
	for _, r := range []struct{ rule, reserve, exposure string }{
		{"today: output_reserve 100", "100", ""},
		{"today: output_reserve 50", "50", ""},
		{"learned p95, max_exposure $1 (default)", "p95", ""},
		{"learned p95, max_exposure $5", "p95", `max_exposure: "5", max_exposure_tokens: 1000000`},
		{"learned p90, max_exposure $5", "p90", `max_exposure: "5", max_exposure_tokens: 1000000`},
	} {
		rule := r.rule
		var knobs []string
		if r.exposure != "" {
			knobs = append(knobs, r.exposure)
		}
		g := openReserveGate(t, t.TempDir(), "", r.reserve, limits, knobs...)
		if strings.HasPrefix(rule, "learned") {
			c := g.Identify("cg-acme")
			for _, h := range history {
				req := &gate.Request{Caller: c, Route: "/v1/chat/completions", Estimate: costmodel.Estimate{
					Kind: costmodel.ChatCompletions, Model: "m1", MaxOutputTokens: h.maxTokens, OutputCap: h.maxTokens, Outputs: 1}}
				k, ok := gate.LearnedKey(c, req.Route, req)
				if !ok {
					t.Fatal("the workload's requests are not learnable")
				}
				g.Learned().Observe(k, h.out)
			}
		}
		rows = append(rows, simulate(t, g, rule, reqs, budget, tokenLimit))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n%d requests, budget $%.2f, token limit %d; refused = by the budget or the token limit\n", n, budget, tokenLimit)
	fmt.Fprintf(&b, "| rule | served | refused | refused but affordable | spent | budget overspend | tokens | token overrun |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %d | %d | %d (%.1f%% of requests) | $%.4f | $%.4f | %d | %d |\n", r.rule, r.served, r.refused, r.affordable,
			100*float64(r.affordable)/float64(n), r.spent, r.overspend, r.tokens, r.tokenOverrun)
	}
	t.Log(b.String())
	today, learnedRow, wide := rows[0], rows[2], rows[3]
	if learnedRow.affordable >= today.affordable || wide.affordable*2 >= today.affordable {
		t.Errorf("the learned rule refuses %d (max_exposure $5: %d) affordable requests, today's %d", learnedRow.affordable, wide.affordable, today.affordable)
	}
	if today.overspend != 0 || today.tokenOverrun != 0 {
		t.Errorf("today's whole reservation overspent: %+v", today)
	}
	// The default max_exposure is $1 and 100000 tokens per tenant and replica.
	if learnedRow.overspend > 1 || learnedRow.tokenOverrun > 100_000 || wide.overspend > 5 || rows[4].overspend > 5 {
		t.Errorf("a learned rule overspent beyond max_exposure: %+v", rows[2:])
	}
}

// TestLearnedOverspendIsBounded: a tenant teaches its key short answers,
// then holds as many requests in flight as it is admitted and makes every
// answer as long as max_tokens allows. Settlement charges the difference,
// and the budget is exceeded by at most costs.learned.max_exposure (one
// replica), after which the tenant is refused. Without the bound (a huge
// max_exposure) the same attack exceeds the budget many times over.
func TestLearnedOverspendIsBounded(t *testing.T) {
	const budget = 0.05
	for _, c := range []struct {
		exposure string
		bound    float64
	}{{"0.02", 0.02}, {"0.012", 0.012}, {"1000", math.Inf(1)}} {
		t.Run("max_exposure "+c.exposure, func(t *testing.T) {
			g := openReserveGate(t, t.TempDir(), "", "p95", fmt.Sprintf("budgets:\n  - {name: daily, scope: tenant, amount: %q}\n", fmt.Sprint(budget)),
				fmt.Sprintf("max_exposure: %q", c.exposure), "max_exposure_tokens: 1000000000")
			ctx := context.Background()
			var spent costmodel.NanoUSD
			charge := func(res *gate.Reservation, out int64) {
				u := costmodel.Usage{InputTokens: res.Request().Estimate.Usage.InputTokens, OutputTokens: out}
				cost := res.Price("m1", u)
				res.Settle(ctx, gate.Charge{Usage: u, Cost: cost, HTTPStatus: 200})
				spent += cost
			}
			for range 40 { // short answers: the key's p95 is 10 tokens
				res, d := g.Reserve(ctx, chatRequest(t, g, "cg-acme", 1000))
				if res == nil {
					t.Fatalf("training refused: %+v", d)
				}
				charge(res, 10)
			}
			var held []*gate.Reservation
			learnedN := 0
			for {
				res, d := g.Reserve(ctx, chatRequest(t, g, "cg-acme", 1000))
				if res == nil {
					if d.Status != 402 {
						t.Fatalf("refused with %d, want 402: %+v", d.Status, d.Error)
					}
					break
				}
				if res.Request().Estimate.Usage.OutputTokens < 1000 {
					learnedN++
				}
				held = append(held, res)
			}
			for _, res := range held {
				charge(res, 1000) // every answer as long as max_tokens
			}
			over := float64(spent)/1e9 - budget
			t.Logf("max_exposure $%s: %d requests in flight, %d of them learned; spent $%.6f of $%.2f: overspend $%.6f",
				c.exposure, len(held), learnedN, float64(spent)/1e9, budget, over)
			if over > c.bound {
				t.Fatalf("overspend $%.6f beyond max_exposure $%v", over, c.bound)
			}
			if math.IsInf(c.bound, 1) && over < 50*budget {
				t.Fatalf("without a bound the attack overspent only $%.6f: the test does not attack", over)
			}
			if !math.IsInf(c.bound, 1) && learnedN == 0 {
				t.Fatal("no learned reservation: the bound was not tested")
			}
			// In debt, the tenant is refused until the period resets.
			if res, d := g.Reserve(ctx, chatRequest(t, g, "cg-acme", 10)); res != nil || d.Status != 402 {
				t.Fatalf("after the overspend: %+v", d)
			}
		})
	}
}
