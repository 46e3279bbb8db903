package chaos_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// prompt returns a user message of about n words.
func prompt(seed, n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "request %d:", seed)
	for i := range n {
		b.WriteString(word(int64(seed + i*7)))
	}
	return b.String()
}

// budgetRun sends requests from clients concurrent clients until each has
// seen three 402 in a row, or until maxRequests were sent. It returns the
// statuses seen.
func budgetRun(t *testing.T, p *process, key string, clients, maxRequests int, body func(n int) string) map[int]int {
	t.Helper()
	c := newClient(p)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		statuses = map[int]int{}
		sent     atomic.Int64
	)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			refusals := 0
			for refusals < 3 {
				n := int(sent.Add(1))
				if n > maxRequests {
					return
				}
				r := c.call(context.Background(), key, "/v1/chat/completions", body(n), nil, 0)
				if r.Err != nil {
					r.Status = -1
				}
				mu.Lock()
				statuses[r.Status]++
				mu.Unlock()
				if r.Status == 402 {
					refusals++
				} else {
					refusals = 0
				}
			}
		}()
	}
	wg.Wait()
	return statuses
}

// TestBudgetUntil402 (drill 3) spends a daily budget of $0.02 with 8
// concurrent clients until every client is refused with 402, on both
// stores. costgate reserves half of max_tokens (output_reserve: 50) and the
// upstream reports a prompt up to 30% above costgate's count and an output
// up to max_tokens, so many requests cost more than their estimate.
//
// Bound: the tenant's spend (GET /admin/v1/tenants/{t}/spend?period=day)
// is at most budget + C x O, where C = 8 is the number of requests that can
// be in flight at once and O the largest overshoot (actual - estimated
// cost) of one ledger entry. It also holds that the spend equals the sum
// of the ledger's entries and the sum the upstream billed.
func TestBudgetUntil402(t *testing.T) {
	stores(t, func(t *testing.T, redisURL string) {
		budgetUntil402(t, storeYAML(redisURL), "")
	})
}

// budgetUntil402 is drill 3 on the store section store, with lease (a
// budget's lease, "" for none) on the tenant's budget.
func budgetUntil402(t *testing.T, store, lease string) {
	const clients = 8
	const budget = int64(20_000_000) // $0.02 in nano-dollars
	if lease != "" {
		lease = ", lease: " + lease
	}
	up := newUpstream(t, 3)
	p := startCostgate(t, store+upstreamsYAML(up)+pricesYAML+"  output_reserve: 50\n"+tenantsYAML("spender")+`budgets:
  - {name: spender-daily, plans: [spender], scope: tenant, period: day, amount: "0.02"`+lease+`}
`)
	statuses := budgetRun(t, p, "cg-spender", clients, 2000, func(n int) string {
		return chatBody("gpt-4o-mini", 100, false, prompt(n, 150))
	})
	up.waitDone(t, 30*time.Second)
	bills, _ := up.snapshot()
	es := p.finalLedger(t, "spender", statuses[200])
	var sum, billed, over int64
	for _, e := range es {
		sum += e.charge()
		over = max(over, e.ActualCost-e.EstimatedCost)
		if b, ok := bills[e.RequestID]; ok {
			billed += billCost(b)
		}
	}
	spent, err := p.spend("spender")
	if err != nil {
		t.Fatal(err)
	}
	bound := budget + clients*max(over, 0)
	t.Logf("budget %d nUSD%s, %d clients: statuses %v; spend %d nUSD (%.3f of the budget), ledger sum %d over %d entries, upstream billed %d; largest overshoot %d; bound %d",
		budget, lease, clients, statuses, spent, float64(spent)/float64(budget), sum, len(es), billed, over, bound)
	if spent > bound {
		t.Errorf("spend %d nUSD exceeds budget %d + %d x largest overshoot %d = %d", spent, budget, clients, over, bound)
	}
	if statuses[402] == 0 {
		t.Errorf("no request was refused with 402")
	}
	if spent != sum || sum != billed {
		t.Errorf("spend %d, ledger sum %d and upstream billed %d differ", spent, sum, billed)
	}
}

// mixCase is one kind of request of the mixed-accounting drill.
type mixCase struct {
	name string
	path string
	body func(n int, rng *rand.Rand) string
	cut  bool // the client closes the stream at a random event
	// burst makes the upstream write the stream's words without a pause.
	burst bool
}

var mixCases = []mixCase{
	{"chat", "/v1/chat/completions", func(n int, _ *rand.Rand) string { return chatBody("gpt-4o-mini", 60, false, prompt(n, 40)) }, false, false},
	{"chat-reasoning", "/v1/chat/completions", func(n int, _ *rand.Rand) string { return chatBody("o4-mini", 80, false, prompt(n, 40)) }, false, false},
	{"stream", "/v1/chat/completions", func(n int, _ *rand.Rand) string { return chatBody("gpt-4o-mini", 40, true, prompt(n, 30)) }, false, false},
	{"stream-own-usage", "/v1/chat/completions", func(n int, _ *rand.Rand) string {
		return strings.Replace(chatBody("gpt-4o-mini", 40, true, prompt(n, 30)), `"stream":true`, `"stream":true,"stream_options":{"include_usage":true}`, 1)
	}, false, false},
	{"stream-reasoning", "/v1/chat/completions", func(n int, _ *rand.Rand) string { return chatBody("o4-mini", 40, true, prompt(n, 30)) }, false, false},
	{"stream-cut", "/v1/chat/completions", func(n int, _ *rand.Rand) string { return chatBody("gpt-4o-mini", 60, true, prompt(n, 30)) }, true, false},
	{"stream-cut-burst", "/v1/chat/completions", func(n int, _ *rand.Rand) string { return chatBody("gpt-4o-mini", 60, true, prompt(n, 30)) }, true, true},
	{"messages", "/v1/messages", func(n int, _ *rand.Rand) string { return messagesBody("claude-haiku-4-5", 60, false, prompt(n, 40)) }, false, false},
	{"messages-stream", "/v1/messages", func(n int, _ *rand.Rand) string { return messagesBody("claude-haiku-4-5", 40, true, prompt(n, 30)) }, false, false},
	{"embeddings", "/v1/embeddings", func(n int, _ *rand.Rand) string { return embeddingsBody("text-embedding-3-small", prompt(n, 50)) }, false, false},
}

// TestMixedExactAccounting (drill 4) sends a mix of chat completions (with
// cached and reasoning tokens), streams (usage asked for by costgate or by
// the client), streams the client cuts at a random event (the upstream
// writing a word every millisecond, or all at once), Anthropic
// messages (plain and streamed, with cache reads and writes) and
// embeddings through costgate to the random-usage upstream, 8 at a time.
//
// Bounds, per ledger entry against the upstream's bill for the same
// X-Request-Id: every entry's cost is at least what the upstream billed;
// where the upstream sent its usage report and the client read the whole
// answer, the entry's usage and cost equal the upstream's exactly; the sum
// of the entries of those requests equals the sum billed for them; no
// request the upstream served lacks an entry, and no entry lacks an
// upstream request.
func TestMixedExactAccounting(t *testing.T) {
	t.Parallel()
	requests := 200
	if long() {
		requests = 1500
	}
	up := newUpstream(t, 4)
	up.tokenInterval = time.Millisecond
	p := startCostgate(t, upstreamsYAML(up)+pricesYAML+tenantsYAML("mixed"))
	c := newClient(p)
	type sent struct {
		mixCase
		result
	}
	var (
		mu   sync.Mutex
		done []sent
		next atomic.Int64
		wg   sync.WaitGroup
	)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for {
				n := int(next.Add(1))
				if n > requests {
					return
				}
				mc := mixCases[n%len(mixCases)]
				cut := 0
				if mc.cut {
					cut = 2 + rng.IntN(30)
				}
				var header map[string]string
				if mc.burst {
					header = map[string]string{"X-Chaos-Burst": "1"}
				}
				r := c.call(context.Background(), "cg-mixed", mc.path, mc.body(n, rng), header, cut)
				mu.Lock()
				done = append(done, sent{mc, r})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	up.waitDone(t, 30*time.Second)
	bills, noID := up.snapshot()
	if noID > 0 {
		t.Errorf("%d requests reached the upstream without an X-Request-Id", noID)
	}
	byID := map[string]sent{}
	for _, s := range done {
		if s.Err != nil || s.Status != 200 {
			t.Errorf("%s: status %d, err %v: %.200s", s.name, s.Status, s.Err, s.Body)
			continue
		}
		byID[s.ID] = s
	}
	es := p.finalLedger(t, "mixed", len(byID))

	type tally struct{ n, exact, short int }
	tallies := map[string]*tally{}
	for _, mc := range mixCases {
		tallies[mc.name] = &tally{}
	}
	seen := map[string]int{}
	var sumExact, billedExact, shortfall int64
	for _, e := range es {
		seen[e.RequestID]++
		b, ok := bills[e.RequestID]
		if !ok {
			t.Errorf("ledger entry %s (%s %s) has no upstream request", e.RequestID, e.Route, e.Model)
			continue
		}
		s := byID[e.RequestID]
		tl := tallies[s.name]
		if tl == nil {
			t.Errorf("ledger entry %s was not sent by the drill", e.RequestID)
			continue
		}
		tl.n++
		want := billCost(b)
		if b.Reported && s.Complete {
			tl.exact++
			sumExact += e.ActualCost
			billedExact += want
			got := usage{e.Actual.InputTokens, e.Actual.CachedInputTokens, e.Actual.CacheWriteTokens, e.Actual.OutputTokens, e.Actual.ReasoningTokens}
			bu := usage{b.Usage.InputTokens, b.Usage.CachedInputTokens, b.Usage.CacheWriteTokens, b.Usage.OutputTokens, b.Usage.ReasoningTokens}
			if got != bu || e.ActualCost != want {
				t.Errorf("%s %s: ledger has usage %+v cost %d, the upstream reported %+v cost %d", s.name, e.RequestID, got, e.ActualCost, bu, want)
			}
			continue
		}
		if e.ActualCost < want {
			tl.short++
			shortfall += want - e.ActualCost
			if tl.short > 3 {
				continue // counted in the summary below
			}
			t.Errorf("%s %s (cut %v, reported %v): ledger charges %d nUSD (usage %+v), less than the %d the upstream billed (usage %+v)",
				s.name, e.RequestID, b.Cut, b.Reported, e.ActualCost, e.Actual, want, b.Usage)
		}
	}
	lost := 0
	for id, b := range bills {
		if seen[id] != 1 {
			lost++
			t.Errorf("upstream request %s (%s %s): %d ledger entries, want 1", id, b.Path, b.Model, seen[id])
		}
	}
	for _, mc := range mixCases {
		tl := tallies[mc.name]
		t.Logf("%-17s %3d entries, %3d exact, %d charged below the upstream's bill", mc.name, tl.n, tl.exact, tl.short)
	}
	t.Logf("%d requests, %d entries, %d upstream requests without exactly one entry; exact sum %d nUSD against %d billed; total shortfall %d nUSD",
		len(done), len(es), lost, sumExact, billedExact, shortfall)
	if shortfall > 0 {
		t.Errorf("entries of cut streams are charged %d nUSD less in all than the upstream billed for them (counts per case above)", shortfall)
	}
	if sumExact != billedExact {
		t.Errorf("the entries of fully reported requests sum to %d nUSD, the upstream billed %d", sumExact, billedExact)
	}
}
