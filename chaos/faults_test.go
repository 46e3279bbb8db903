package chaos_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
)

// load runs workers that send a mix of plain chat completions, streams and
// Anthropic messages through costgate until stop is called. A worker whose
// request fails (costgate is down) paces its retries.
type load struct {
	p    *process
	key  string
	wg   sync.WaitGroup
	quit chan struct{}
	n    atomic.Int64

	mu      sync.Mutex
	results []result
}

// startLoad starts workers; after, when set, is called with every result
// by the worker that got it.
func startLoad(p *process, key string, workers int, after func(result)) *load {
	l := &load{p: p, key: key, quit: make(chan struct{})}
	c := newClient(p)
	for range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for {
				select {
				case <-l.quit:
					return
				default:
				}
				n := int(l.n.Add(1))
				var r result
				switch n % 3 {
				case 0:
					r = c.call(context.Background(), key, "/v1/chat/completions", chatBody("gpt-4o-mini", 40, false, prompt(n, 30)), nil, 0)
				case 1:
					r = c.call(context.Background(), key, "/v1/chat/completions", chatBody("gpt-4o-mini", 30, true, prompt(n, 30)), nil, 0)
				default:
					r = c.call(context.Background(), key, "/v1/messages", messagesBody("claude-haiku-4-5", 40, false, prompt(n, 30)), nil, 0)
				}
				l.mu.Lock()
				l.results = append(l.results, r)
				l.mu.Unlock()
				if after != nil {
					after(r)
				}
				if r.Err != nil || r.Status >= 500 {
					select {
					case <-l.quit:
					case <-time.After(10 * time.Millisecond): // pace retries while costgate is down
					}
				}
			}
		}()
	}
	return l
}

func (l *load) stop() []result {
	close(l.quit)
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.results
}

// ledgerCheck compares the ledger with the upstream's bills after a fault:
// every request the upstream received has exactly one entry, no entry is
// doubled, and every request the client saw complete is settled at what
// the upstream billed. It reports the figures and returns the number of
// completed requests not billed their usage.
func ledgerCheck(t *testing.T, p *process, up *upstream, tenant string, results []result) {
	t.Helper()
	up.waitDone(t, 60*time.Second)
	bills, noID := up.snapshot()
	if noID > 0 {
		t.Errorf("%d requests reached the upstream without an X-Request-Id", noID)
	}
	es := p.finalLedger(t, tenant, len(bills))
	byID := map[string][]entry{}
	for _, e := range es {
		byID[e.RequestID] = append(byID[e.RequestID], e)
	}
	statuses := map[string]int{}
	for _, e := range es {
		statuses[e.Status]++
	}
	lost, doubled, orphan := 0, 0, 0
	for id := range bills {
		switch n := len(byID[id]); {
		case n == 0:
			lost++
			if lost <= 5 {
				t.Errorf("upstream request %s has no ledger entry", id)
			}
		case n > 1:
			doubled++
			t.Errorf("upstream request %s has %d ledger entries", id, n)
		}
	}
	for id := range byID {
		if _, ok := bills[id]; !ok {
			orphan++ // admitted, never reached the upstream (killed before forwarding)
		}
	}
	complete, unbilled, recovered := 0, 0, 0
	var missing int64
	clientStatus := map[int]int{}
	for _, r := range results {
		if r.Err != nil {
			clientStatus[-1]++
		} else {
			clientStatus[r.Status]++
		}
		if !r.Complete {
			continue
		}
		complete++
		b, ok := bills[r.ID]
		if !ok {
			t.Errorf("request %s completed at the client but the upstream has no record of it", r.ID)
			continue
		}
		want := billCost(b)
		es := byID[r.ID]
		if len(es) != 1 || es[0].Status != "settled" || es[0].ActualCost != want {
			unbilled++
			if len(es) == 1 && es[0].Status == "recovered" {
				recovered++
			}
			got := "no entry"
			if len(es) > 0 {
				got = fmt.Sprintf("%s at %d nUSD", es[0].Status, es[0].ActualCost)
				missing += want - es[0].ActualCost
			}
			if unbilled <= 5 {
				t.Errorf("request %s completed at the client, the upstream billed %d nUSD, the ledger has %s", r.ID, want, got)
			}
		}
	}
	t.Logf("client: %d requests %v, %d complete; upstream: %d requests; ledger: %d entries %v; lost %d, doubled %d, entries never forwarded %d; completed but not billed their usage: %d (%d recovered at the estimate; billed - charged = %d nUSD)",
		len(results), clientStatus, complete, len(bills), len(es), statuses, lost, doubled, orphan, unbilled, recovered, missing)
	if unbilled > 0 {
		t.Errorf("%d of %d requests that completed at the client are not billed their upstream usage", unbilled, complete)
	}
}

// TestKillUnderLoad (drill 5) SIGKILLs costgate while 8 clients send plain
// chat, streams and Anthropic messages, restarts it on the same data
// directory, twice (six times with CHAOS_LONG), with the embedded ledger
// and with PostgreSQL. Each kill is sent by the client the moment it has
// read a stream to its end ([DONE] or message_stop), and the upstream
// closes a stream 20 ms after its last event, as a real one may: the
// client has its whole answer while costgate still waits for the end of
// the upstream's body.
//
// Bounds: every request the upstream received has exactly one ledger entry
// (none lost, none doubled), and every request the client saw complete is
// settled at what the upstream billed (not recovered at its estimate).
func TestKillUnderLoad(t *testing.T) {
	kills := 2
	if long() {
		kills = 6
	}
	for _, ledgerKind := range []string{"embedded", "postgres"} {
		t.Run(ledgerKind, func(t *testing.T) {
			t.Parallel()
			up := newUpstream(t, 5)
			up.tokenInterval = 2 * time.Millisecond
			ledgerYAML := ""
			if ledgerKind == "postgres" {
				ledgerYAML = fmt.Sprintf("ledger:\n  dsn: %q\n", pgtest.New(t))
			}
			up.tail = 20 * time.Millisecond
			p := startCostgate(t, ledgerYAML+upstreamsYAML(up)+pricesYAML+tenantsYAML("killed"))
			var armed atomic.Bool
			killed := make(chan string, 1)
			l := startLoad(p, "cg-killed", 8, func(r result) {
				if r.Stream && r.Complete && armed.CompareAndSwap(true, false) {
					p.Kill()
					killed <- r.ID
				}
			})
			for k := range kills {
				from := up.traffic.Load()
				waitFor(t, 60*time.Second, "traffic through costgate", func() bool { return up.traffic.Load() >= from+40 })
				armed.Store(true)
				select {
				case id := <-killed:
					t.Logf("kill %d: SIGKILL after %d upstream requests, as %s completed at the client", k+1, up.traffic.Load(), id)
				case <-time.After(60 * time.Second):
					t.Fatal("no stream completed within 60 s")
				}
				p.Start()
			}
			from := up.traffic.Load()
			waitFor(t, 60*time.Second, "traffic after the last restart", func() bool { return up.traffic.Load() >= from+20 })
			results := l.stop()
			ledgerCheck(t, p, up, "killed", results)
		})
	}
}

// TestPostgresOutage (drill 6) stops a private PostgreSQL (pg_ctl stop -m
// immediate) while 8 clients send requests through costgate, keeps the
// load on while it is down, then starts it again.
//
// Bounds: no request fails during the outage (the ledger spools), every
// request the upstream received has exactly one ledger entry once the
// spool is replayed, and every request the client saw complete is settled
// at what the upstream billed.
func TestPostgresOutage(t *testing.T) {
	t.Parallel()
	pg := pgtest.NewPrivate(t)
	up := newUpstream(t, 6)
	up.tokenInterval = time.Millisecond
	p := startCostgate(t, fmt.Sprintf("ledger:\n  dsn: %q\n", pg.URL())+upstreamsYAML(up)+pricesYAML+tenantsYAML("spooled"))
	l := startLoad(p, "cg-spooled", 8, nil)
	waitFor(t, 60*time.Second, "traffic before the outage", func() bool { return up.traffic.Load() >= 40 })
	l.mu.Lock()
	before := len(l.results)
	l.mu.Unlock()
	pg.Stop()
	from := up.traffic.Load()
	waitFor(t, 60*time.Second, "traffic during the outage", func() bool { return up.traffic.Load() >= from+80 })
	l.mu.Lock()
	during := append([]result(nil), l.results[before:]...)
	l.mu.Unlock()
	pg.Start()
	from = up.traffic.Load()
	waitFor(t, 60*time.Second, "traffic after the outage", func() bool { return up.traffic.Load() >= from+20 })
	results := l.stop()
	failed := 0
	for _, r := range during {
		if r.Err != nil || r.Status != 200 {
			failed++
		}
	}
	t.Logf("during the outage: %d requests answered, %d not 200", len(during), failed)
	if failed > 0 {
		t.Errorf("%d of %d requests failed while PostgreSQL was down", failed, len(during))
	}
	ledgerCheck(t, p, up, "spooled", results)
}

// TestRedisDataLoss (drill 7) spends a tenant's daily budget of $0.02 on
// the Redis store with 8 concurrent clients while Redis loses its data
// twice under load: once when 40% of the budget is billed Redis is killed
// and restarted empty on the same port, once when 70% is billed (or the
// budget refuses again) it is emptied with FLUSHALL. The clients then run until each is refused with
// 402 three times in a row (or 600 requests in all).
//
// costgate reserves half of max_tokens, as in drill 3.
//
// Bound: as in drill 3, the tenant's spend is at most budget + C x O
// (C = 8 clients, O the largest overshoot of one entry): losing the
// counters must not give the tenant a fresh budget.
func TestRedisDataLoss(t *testing.T) {
	t.Parallel()
	const clients, maxRequests = 8, 600
	const budget = int64(20_000_000)
	rs := redistest.New(t)
	up := newUpstream(t, 7)
	p := startCostgate(t, fmt.Sprintf(`store:
  redis: %q
  breaker_failures: 3
  breaker_cooldown: 200ms
`, rs.URL)+upstreamsYAML(up)+pricesYAML+"  output_reserve: 50\n"+tenantsYAML("lossy")+`budgets:
  - {name: lossy-daily, plans: [lossy], scope: tenant, period: day, amount: "0.02"}
`)
	billed := func() int64 {
		bills, _ := up.snapshot()
		var sum int64
		for _, b := range bills {
			sum += billCost(b)
		}
		return sum
	}
	var final atomic.Bool
	var sent atomic.Int64
	var mu sync.Mutex
	statuses := map[string]map[int]int{}
	phase := "before"
	c := newClient(p)
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			refusals := 0
			for refusals < 3 || !final.Load() {
				n := int(sent.Add(1))
				if n > maxRequests {
					return
				}
				r := c.call(context.Background(), "cg-lossy", "/v1/chat/completions", chatBody("gpt-4o-mini", 100, false, prompt(n, 150)), nil, 0)
				if r.Err != nil {
					r.Status = -1
				}
				mu.Lock()
				if statuses[phase] == nil {
					statuses[phase] = map[int]int{}
				}
				statuses[phase][r.Status]++
				mu.Unlock()
				if r.Status == 200 {
					refusals = 0
					continue
				}
				refusals++
				time.Sleep(10 * time.Millisecond) // pace a refused client (load shaping)
			}
		}()
	}
	setPhase := func(s string) {
		mu.Lock()
		phase = s
		mu.Unlock()
		spent, _ := p.spend("lossy")
		t.Logf("%s: upstream billed %d nUSD (%.2f of the budget), ledger spend %d", s, billed(), float64(billed())/float64(budget), spent)
	}
	if !poll(90*time.Second, func() bool { return billed() >= budget*4/10 }) {
		t.Errorf("40%% of the budget was never billed (%d nUSD)", billed())
	}
	rs.Stop(t)
	rs.Restart(t)
	setPhase("after restart")
	// FLUSHALL at 70% of the budget billed, or as soon as the budget
	// refuses again after the restart (as it must when the loss was
	// detected).
	refusedAgain := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return statuses["after restart"][402] > 0
	}
	poll(90*time.Second, func() bool { return billed() >= budget*7/10 || refusedAgain() })
	if err := rs.Client(t).FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	setPhase("after FLUSHALL")
	final.Store(true)
	wg.Wait()
	up.waitDone(t, 30*time.Second)
	es := p.finalLedger(t, "lossy", 1)
	var over int64
	for _, e := range es {
		over = max(over, e.ActualCost-e.EstimatedCost)
	}
	spent, err := p.spend("lossy")
	if err != nil {
		t.Fatal(err)
	}
	bound := budget + clients*max(over, 0)
	t.Logf("budget %d nUSD: spend %d (%.2f of the budget) over %d entries, upstream billed %d; largest overshoot %d; bound %d; statuses by phase %v",
		budget, spent, float64(spent)/float64(budget), len(es), billed(), over, bound, statuses)
	if spent > bound {
		t.Errorf("after Redis lost its data, spend %d nUSD exceeds budget %d + %d x largest overshoot %d = %d (%.2fx the budget)",
			spent, budget, clients, over, bound, float64(spent)/float64(budget))
	}
}
