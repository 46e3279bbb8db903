package chaos_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/costgate/costgate/internal/pgtest"
	"github.com/costgate/costgate/internal/redistest"
)

// stuckUpstream answers OpenAI chat completions and Anthropic messages,
// streamed or not, writing a fixed number of one-token words and then
// holding the connection open (no end; no usage report unless report is
// set) until the caller goes: the state of an answer under way at the moment costgate is
// killed. It records, per X-Request-Id, the words it handed to the
// connection, which the upstream bills.
type stuckUpstream struct {
	srv   *httptest.Server
	words int // words written before the hold
	// report, when above 0, makes a stream send its end and its usage
	// report (report prompt tokens, the words as output) before the hold,
	// short of its last event ([DONE] or message_stop).
	report int64

	mu      sync.Mutex
	written map[string]int  // request id: words written
	held    map[string]bool // request id: holding now
}

func newStuckUpstream(t *testing.T, words int) *stuckUpstream {
	t.Helper()
	u := &stuckUpstream{words: words, written: map[string]int{}, held: map[string]bool{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", u.handle(false))
	mux.HandleFunc("POST /v1/messages", u.handle(true))
	u.srv = httptest.NewServer(mux)
	t.Cleanup(u.srv.Close)
	return u
}

func (u *stuckUpstream) handle(anthropic bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req upstreamRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		id := r.Header.Get("X-Request-Id")
		u.mu.Lock()
		u.written[id] = 0
		u.mu.Unlock()
		flusher := w.(http.Flusher)
		wrote := func(n int) {
			u.mu.Lock()
			u.written[id] = n
			u.mu.Unlock()
		}
		if !req.Stream {
			// A plain answer cut before its end: headers and the first
			// part of the body, then nothing (costgate reads it whole
			// before it settles).
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", "100000")
			w.WriteHeader(200)
			fmt.Fprintf(w, `{"id":"up-%s","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"%s`, id, reply(int64(u.words)))
			flusher.Flush()
			wrote(u.words)
		} else {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(200)
			if anthropic {
				fmt.Fprintf(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"up-%s\",\"type\":\"message\",\"role\":\"assistant\",\"model\":%q,\"content\":[],\"usage\":{\"input_tokens\":%d,\"output_tokens\":1}}}\n\n", id, req.Model, max(u.report, 1))
				fmt.Fprint(w, "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n")
			}
			for i := range u.words {
				if anthropic {
					b, _ := json.Marshal(map[string]any{"type": "content_block_delta", "index": 0,
						"delta": map[string]string{"type": "text_delta", "text": word(int64(i))}})
					fmt.Fprintf(w, "event: content_block_delta\ndata: %s\n\n", b)
				} else {
					b, _ := json.Marshal(chunk("up-"+id, req.Model, word(int64(i)), nil))
					fmt.Fprintf(w, "data: %s\n\n", b)
				}
				flusher.Flush()
				wrote(i + 1)
			}
			if u.report > 0 {
				if anthropic {
					fmt.Fprint(w, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n")
					fmt.Fprintf(w, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"input_tokens\":%d,\"output_tokens\":%d}}\n\n", u.report, u.words)
				} else {
					b, _ := json.Marshal(chunk("up-"+id, req.Model, "", "stop"))
					fmt.Fprintf(w, "data: %s\n\n", b)
					b, _ = json.Marshal(map[string]any{"id": "up-" + id, "object": "chat.completion.chunk", "created": 0, "model": req.Model,
						"choices": []any{}, "usage": map[string]int64{"prompt_tokens": u.report, "completion_tokens": int64(u.words), "total_tokens": u.report + int64(u.words)}})
					fmt.Fprintf(w, "data: %s\n\n", b)
				}
				flusher.Flush()
			}
		}
		u.mu.Lock()
		u.held[id] = true
		u.mu.Unlock()
		<-r.Context().Done()
		u.mu.Lock()
		u.held[id] = false
		u.mu.Unlock()
	}
}

// holding is the number of requests the upstream holds now.
func (u *stuckUpstream) holding() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, h := range u.held {
		if h {
			n++
		}
	}
	return n
}

func (u *stuckUpstream) snapshot() map[string]int {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make(map[string]int, len(u.written))
	for k, v := range u.written {
		out[k] = v
	}
	return out
}

// stuckYAML points both kinds of upstream at u.
func stuckYAML(u *stuckUpstream) string {
	return fmt.Sprintf(`upstreams:
  - {name: openai, kind: openai, base_url: %s, api_key: sk-chaos, timeout: 2m}
  - {name: anthropic, kind: anthropic, base_url: %s, api_key: sk-ant-chaos, timeout: 2m}
`, u.srv.URL, u.srv.URL)
}

// crashRequest is one kind of request killed in flight.
type crashRequest struct {
	name  string
	path  string
	model string
	body  func(n int) string
}

var crashRequests = []crashRequest{
	{"chat", "/v1/chat/completions", "gpt-4o-mini", func(n int) string { return chatBody("gpt-4o-mini", 300, false, prompt(n, 40)) }},
	{"chat-stream", "/v1/chat/completions", "gpt-4o-mini", func(n int) string { return chatBody("gpt-4o-mini", 300, true, prompt(n, 40)) }},
	{"messages-stream", "/v1/messages", "claude-haiku-4-5", func(n int) string { return messagesBody("claude-haiku-4-5", 300, true, prompt(n, 40)) }},
}

// sendHeld sends n requests of each kind in crashRequests and returns once
// the upstream holds every one of them (each has written its words).
func sendHeld(t *testing.T, p *process, u *stuckUpstream, key string, n int) {
	t.Helper()
	c := newClient(p)
	sent := 0
	for _, k := range crashRequests {
		for i := range n {
			sent++
			go c.call(context.Background(), key, k.path, k.body(sent*7+i), nil, 0)
		}
	}
	waitFor(t, 5*time.Second, "the upstream to hold every request", func() bool { return u.holding() == sent })
}

// checkCrashLedger checks, after the restart, that every request the
// upstream received has exactly one final entry, charged at least what the
// upstream billed for the words it wrote (its prompt at the estimate's
// exact count, plus the words), and that the tenant's spend is the
// ledger's sum.
func checkCrashLedger(t *testing.T, p *process, u *stuckUpstream, tenant string) []entry {
	t.Helper()
	written := u.snapshot()
	es := p.finalLedger(t, tenant, len(written))
	byID := map[string][]entry{}
	var sum int64
	for _, e := range es {
		byID[e.RequestID] = append(byID[e.RequestID], e)
		sum += e.charge()
	}
	for id, words := range written {
		got := byID[id]
		if len(got) != 1 {
			t.Errorf("request %s reached the upstream and has %d ledger entries, want 1", id, len(got))
			continue
		}
		e := got[0]
		bill := cost(e.Model, e.Estimated.InputTokens, 0, 0, int64(words))
		if e.charge() < bill {
			t.Errorf("request %s (%s, status %s): charged %d nUSD (estimate %d), but the upstream billed %d nUSD for its prompt and the %d words it wrote",
				id, e.Route, e.Status, e.charge(), e.EstimatedCost, bill, words)
		}
	}
	spent, err := p.spend(tenant)
	if err != nil {
		t.Fatal(err)
	}
	if spent != sum {
		t.Errorf("spend after the restart is %d nUSD, the ledger's entries sum to %d", spent, sum)
	}
	return es
}

// TestCrashAttackInFlight kills costgate (SIGKILL) while requests are in
// flight at the worst moments the upstream can hold still: a plain answer
// half read (costgate reads it whole before it settles), an OpenAI stream
// and an Anthropic stream after some output and before their usage
// report. It restarts costgate on the same data directory, with the
// embedded ledger and with PostgreSQL.
//
// Must hold after the restart: costgate starts (ready, no panic in its
// log); every request that reached the upstream has exactly one final
// entry (recovered at its estimate, per the README), charged at least the
// upstream's bill for what it wrote; spend equals the ledger's sum.
func TestCrashAttackInFlight(t *testing.T) {
	for _, ledgerKind := range []string{"embedded", "postgres"} {
		t.Run(ledgerKind, func(t *testing.T) {
			t.Parallel()
			u := newStuckUpstream(t, 40)
			ledgerYAML := ""
			if ledgerKind == "postgres" {
				ledgerYAML = fmt.Sprintf("ledger:\n  dsn: %q\n", pgtest.New(t))
			}
			p := startCostgate(t, ledgerYAML+stuckYAML(u)+pricesYAML+tenantsYAML("inflight"))
			sendHeld(t, p, u, "cg-inflight", 2)
			p.Kill()
			p.Start()
			es := checkCrashLedger(t, p, u, "inflight")
			for _, e := range es {
				if e.Status != "recovered" {
					t.Errorf("request %s: status %s after the kill, want recovered", e.RequestID, e.Status)
				}
			}
			noPanic(t, p)
		})
	}
}

// TestCrashAttackTwice kills costgate while requests are in flight, starts
// it and kills it again as soon as it is ready (the second run has
// appended its recovery marker; its replay of the first run may or may
// not have reached the store), then starts it a third time: two recovery
// markers in a row in the spool.
//
// Must hold: as after one kill, every request that reached the upstream
// has exactly one final entry at least its upstream bill; none doubled;
// spend is the ledger's sum; the third start is clean.
func TestCrashAttackTwice(t *testing.T) {
	for _, ledgerKind := range []string{"embedded", "postgres"} {
		t.Run(ledgerKind, func(t *testing.T) {
			t.Parallel()
			u := newStuckUpstream(t, 10)
			ledgerYAML := ""
			if ledgerKind == "postgres" {
				ledgerYAML = fmt.Sprintf("ledger:\n  dsn: %q\n", pgtest.New(t))
			}
			p := startCostgate(t, ledgerYAML+stuckYAML(u)+pricesYAML+tenantsYAML("twice"))
			sendHeld(t, p, u, "cg-twice", 3)
			p.Kill()
			p.Start()
			p.Kill() // during the recovery of the first run
			p.Start()
			checkCrashLedger(t, p, u, "twice")
			noPanic(t, p)
		})
	}
}

// noPanic fails t when costgate's log shows a panic or a fatal error.
func noPanic(t *testing.T, p *process) {
	t.Helper()
	b, err := readLog(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"panic:", "fatal error:", "goroutine "} {
		if strings.Contains(b, bad) {
			t.Errorf("costgate's log holds %q", bad)
		}
	}
}

func readLog(p *process) (string, error) {
	b, err := os.ReadFile(p.log)
	return string(b), err
}

// TestCrashAttackStreamGuard kills costgate mid-stream with the stream
// guard on (output_reserve 5, increments of 16 tokens): each stream has
// been admitted on 5% of its max_tokens (15 of 300 tokens) and has had its
// output beyond that debited, increment by increment, in the limiter, 40
// words written. The in-memory store (the default) starts empty at the
// restart and its budgets are restored from the ledger.
//
// Must hold: each stream's entry is charged at least what the upstream
// billed (its prompt and the 40 words it wrote), as the limiter had
// already counted; and so the budget after the restart counts it: spend
// is at least the upstream's bill. Otherwise a kill mid-stream forgets
// every increment the guard debited, the tenant pays its estimate for a
// stream that ran far past it, and the budget restored from the ledger
// admits that much again (over-admission by the sum of the streams'
// output beyond 5%, not the "one increment per stream" the README bounds).
func TestCrashAttackStreamGuard(t *testing.T) {
	t.Parallel()
	u := newStuckUpstream(t, 40)
	p := startCostgate(t, stuckYAML(u)+pricesYAML+"  output_reserve: 5\nstream_guard: {enabled: true, increment_tokens: 16}\n"+
		tenantsYAML("guarded")+"budgets:\n  - {name: guarded-daily, plans: [guarded], scope: tenant, period: day, amount: \"1.00\"}\n")
	c := newClient(p)
	const streams = 4
	read := make(chan int, streams)
	for i := range streams {
		go readEvents(c, "cg-guarded", chatBody("gpt-4o-mini", 300, true, prompt(100+i, 40)), 40, read)
	}
	// The guard debits an increment before its event goes on to the
	// client: once the client has read the 40 words, they are debited.
	for range streams {
		select {
		case n := <-read:
			if n < 40 {
				t.Fatalf("a stream ended after %d words, before the kill", n)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the streams did not pass 40 words within 5 s")
		}
	}
	p.Kill()
	p.Start()
	checkCrashLedger(t, p, u, "guarded")
}

// heldAPI posts a JSON body to the data plane of p with key and decodes
// the answer into v; it returns the status.
func heldAPI(t *testing.T, p *process, key, path, body string, v any) int {
	t.Helper()
	req, _ := http.NewRequest("POST", p.URL()+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if v != nil && resp.StatusCode == 200 {
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("%s: %v: %s", path, err, b)
		}
	}
	if resp.StatusCode != 200 {
		t.Logf("%s: %d %s", path, resp.StatusCode, b)
	}
	return resp.StatusCode
}

type heldReservation struct {
	ID        string `json:"reservation_id"`
	RequestID string `json:"request_id"`
}

// TestCrashAttackHeldSettledElsewhere makes a held reservation (reserve
// API) on replica A, kills A, settles the reservation on replica B (same
// Redis, same PostgreSQL ledger, same reservations secret) at a usage
// above the estimate while A is dead (A's expiry never runs), then
// restarts A, whose recovery runs over its open reservations.
//
// Must hold: B's settlement stands: the entry is settled at the reported
// usage, once; A's recovery does not turn it back to the estimate; spend
// counts it once; a second settle answers already_settled.
func TestCrashAttackHeldSettledElsewhere(t *testing.T) {
	t.Parallel()
	rs := redistest.New(t)
	u := newStuckUpstream(t, 1)
	cfg := fmt.Sprintf("ledger:\n  dsn: %q\n", pgtest.New(t)) + patientStoreYAML(rs.URL) +
		"reservations: {secret: chaos-crash-secret-0123456789}\n" + stuckYAML(u) + pricesYAML + tenantsYAML("held")
	a := startCostgate(t, cfg)
	b := startCostgate(t, cfg)
	var r heldReservation
	if st := heldAPI(t, a, "cg-held", "/v1/costgate/reserve", `{"cost":{"input_tokens":1000,"output_tokens":100},"model":"gpt-4o-mini"}`, &r); st != 200 {
		t.Fatalf("reserve: %d", st)
	}
	a.Kill()
	settle := fmt.Sprintf(`{"reservation_id":%q,"usage":{"input_tokens":3000,"output_tokens":500}}`, r.ID)
	want := cost("gpt-4o-mini", 3000, 0, 0, 500)
	if st := heldAPI(t, b, "cg-held", "/v1/costgate/settle", settle, nil); st != 200 {
		t.Fatalf("settle on B while A is dead: %d", st)
	}
	a.Start()
	es := a.finalLedger(t, "held", 1)
	if len(es) != 1 || es[0].Status != "settled" || es[0].ActualCost != want {
		t.Fatalf("after A's restart the ledger holds %+v, want one entry settled at %d nUSD", es, want)
	}
	var again struct {
		Already bool `json:"already_settled"`
	}
	if st := heldAPI(t, a, "cg-held", "/v1/costgate/settle", settle, &again); st != 200 || !again.Already {
		t.Errorf("a second settle on A: %d, already_settled %v", st, again.Already)
	}
	if spent, err := b.spend("held"); err != nil || spent != want {
		t.Errorf("spend %d (%v), want %d", spent, err, want)
	}
}

// TestCrashAttackHeldSettledAfterRestart makes a held reservation with a
// TTL of 5 minutes, kills the process that made it, restarts it on the
// same data directory, and settles the reservation, well within its TTL,
// at a usage above the estimate (the caller called its upstream while
// costgate was down, as a held reservation allows), on the embedded
// ledger and on PostgreSQL.
//
// Must hold (README: "any replica can settle or release it"; "a
// settlement it records later for a recovered entry still wins"; a
// reservation is settled at its estimate only "when it expires"): the
// settlement is taken (200) and the entry is settled at the reported
// usage, so that the tenant pays what it reported, not the lower estimate.
func TestCrashAttackHeldSettledAfterRestart(t *testing.T) {
	for _, ledgerKind := range []string{"embedded", "postgres"} {
		t.Run(ledgerKind, func(t *testing.T) {
			t.Parallel()
			u := newStuckUpstream(t, 1)
			ledgerYAML := ""
			if ledgerKind == "postgres" {
				ledgerYAML = fmt.Sprintf("ledger:\n  dsn: %q\n", pgtest.New(t))
			}
			p := startCostgate(t, ledgerYAML+stuckYAML(u)+pricesYAML+tenantsYAML("heldr"))
			var r heldReservation
			if st := heldAPI(t, p, "cg-heldr", "/v1/costgate/reserve", `{"cost":{"input_tokens":1000,"output_tokens":100},"model":"gpt-4o-mini","ttl":"5m"}`, &r); st != 200 {
				t.Fatalf("reserve: %d", st)
			}
			p.Kill()
			p.Start()
			want := cost("gpt-4o-mini", 3000, 0, 0, 500)
			settle := fmt.Sprintf(`{"reservation_id":%q,"usage":{"input_tokens":3000,"output_tokens":500}}`, r.ID)
			st := heldAPI(t, p, "cg-heldr", "/v1/costgate/settle", settle, nil)
			es := p.finalLedger(t, "heldr", 1)
			if st != 200 || len(es) != 1 || es[0].Status != "settled" || es[0].ActualCost != want {
				t.Errorf("settle within the TTL after a restart: %d; ledger %+v; want 200 and one entry settled at %d nUSD (the estimate was %d)",
					st, es, want, cost("gpt-4o-mini", 1000, 0, 0, 100))
			}
		})
	}
}

// TestCrashAttackLeasedRestart runs a leased fixed window of 100 requests
// per 24 h (at most 50 leased, ttl 2 s) on Redis, admits 40 racers,
// kills costgate holding a lease, restarts it on the same data directory
// and Redis, and drains the limit.
//
// Bound (README, leases: per window, at most D x M for D replicas dead
// holding leases): admitted in all at most 100 + 50 = 150, and, once the
// dead run's lease is past its TTL, at least 100.
func TestCrashAttackLeasedRestart(t *testing.T) {
	t.Parallel()
	u := newUpstream(t, 1)
	cfg := patientStoreYAML(redistest.New(t).URL) + upstreamsYAML(u) + pricesYAML + tenantsYAML("lr") +
		"limits:\n  - {name: lr, plans: [lr], dimensions: [tenant], algorithm: fixed_window, unit: requests, rate: 100, period: 24h, lease: {max_share: 0.5, ttl: 2s}}\n"
	p := startCostgate(t, cfg)
	day := clearOfMidnight(t)
	admitted := race(p, "cg-lr", 40)[200]
	p.Kill()
	killed := time.Now()
	p.Start()
	deadline := time.Now().Add(8 * time.Second)
	for {
		s := race(p, "cg-lr", 20)
		admitted += s[200]
		if s[200] == 0 && time.Since(killed) > 3*time.Second {
			break
		}
		if time.Now().After(deadline) {
			break
		}
		if s[200] == 0 {
			time.Sleep(100 * time.Millisecond)
		}
	}
	sameDay(t, day)
	t.Logf("admitted %d in all of 100 across the kill", admitted)
	if admitted > 150 || admitted < 100 {
		t.Errorf("admitted %d across a kill holding a lease, want between 100 and 150", admitted)
	}
}

// readEvents sends a chat stream and sends on read the number of data
// events it has read once it has want of them (or the stream ended), then
// keeps reading until the connection ends.
func readEvents(c *client, key, body string, want int, read chan<- int) {
	readEventsAt(c, key, "/v1/chat/completions", body, want, read)
}

// readEventsAt is readEvents on path.
func readEventsAt(c *client, key, path, body string, want int, read chan<- int) {
	req, _ := http.NewRequest("POST", c.p.URL()+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		read <- 0
		return
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	n, sent := 0, false
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data:") {
			n++
		}
		if n >= want && !sent {
			read <- n
			sent = true
		}
	}
	if !sent {
		read <- n
	}
}

// TestCrashAttackReload holds requests in flight at the upstream on Redis
// under a daily budget of $1, reloads a config that renames the budget and
// lowers it to $0.009 (a renamed budget is a new counter, brought up to
// the ledger's spend by the reload), kills costgate at once, and restarts
// it on the new config.
//
// Must hold: the held requests are recovered at their estimate, once, and
// the new budget's counter counts them after the restart: a request that
// would take spend past $0.009 is refused with 402.
func TestCrashAttackReload(t *testing.T) {
	t.Parallel()
	u := newStuckUpstream(t, 5)
	budget := func(name, amount string) string {
		return fmt.Sprintf("budgets:\n  - {name: %s, plans: [reload], scope: tenant, period: day, amount: %q}\n", name, amount)
	}
	base := patientStoreYAML(redistest.New(t).URL) + stuckYAML(u) + pricesYAML + tenantsYAML("reload")
	p := startCostgate(t, base+budget("before", "1.00"))
	sendHeld(t, p, u, "cg-reload", 2)
	old, err := os.ReadFile(p.config)
	if err != nil {
		t.Fatal(err)
	}
	next := strings.Replace(string(old), budget("before", "1.00"), budget("after", "0.009"), 1)
	if err := os.WriteFile(p.config, []byte(next), 0o600); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("POST", p.AdminURL()+"/admin/v1/reload", nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("reload: %d %s", resp.StatusCode, b)
	}
	p.Kill()
	p.Start()
	es := checkCrashLedger(t, p, u, "reload")
	var sum int64
	for _, e := range es {
		sum += e.charge()
	}
	const amount = 9_000_000
	body := chatBody("gpt-4o-mini", 300, false, prompt(999, 40))
	est := cost("gpt-4o-mini", es[0].Estimated.InputTokens, 0, 0, 300)
	if sum >= amount || sum+est <= amount {
		t.Fatalf("setup: the ledger holds %d nUSD, a request %d, the budget %d: want ledger < budget < ledger + request", sum, est, amount)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	r := newClient(p).call(ctx, "cg-reload", "/v1/chat/completions", body, nil, 0)
	if r.Status != 402 {
		t.Errorf("after a kill right after the reload, a request of about %d nUSD on top of the ledger's %d against a budget of %d: status %d (err %v), want 402",
			est, sum, amount, r.Status, r.Err)
	}
}

// TestCrashAttackAfterUsageReport kills costgate after a stream's usage
// report passed (OpenAI: the finish chunk and the usage chunk; Anthropic:
// message_delta with its usage) and the client read it, before the
// stream's last event ([DONE], message_stop): the upstream holds there.
// The upstream reports a prompt of 500 tokens, far above costgate's count
// of the prompt (as hidden system or tool tokens make it), so the estimate
// (max_tokens 50) is below the bill.
//
// Must hold (README, "Every request is in the ledger before its answer
// ends": a stream is settled at its final event, and one cut between its
// usage report and that event is recovered at its estimate): after the
// restart each request has exactly one entry, recovered at its estimate,
// and the spend counts it once. The reported usage is not billed: an
// upstream may send running or early reports, so only the final event
// settles (TestStreamAttackUsageReportsFlushedApart).
func TestCrashAttackAfterUsageReport(t *testing.T) {
	for _, ledgerKind := range []string{"embedded", "postgres"} {
		t.Run(ledgerKind, func(t *testing.T) {
			t.Parallel()
			u := newStuckUpstream(t, 40)
			u.report = 500
			ledgerYAML := ""
			if ledgerKind == "postgres" {
				ledgerYAML = fmt.Sprintf("ledger:\n  dsn: %q\n", pgtest.New(t))
			}
			p := startCostgate(t, ledgerYAML+stuckYAML(u)+pricesYAML+tenantsYAML("reported"))
			c := newClient(p)
			read := make(chan int, 2)
			chat := `{"model":"gpt-4o-mini","max_tokens":50,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"say forty words"}]}`
			go readEventsAt(c, "cg-reported", "/v1/chat/completions", chat, 40+2, read)
			go readEventsAt(c, "cg-reported", "/v1/messages", messagesBody("claude-haiku-4-5", 50, true, "say forty words"), 40+4, read)
			for range 2 {
				select {
				case <-read:
				case <-time.After(5 * time.Second):
					t.Fatal("the client did not read the usage reports within 5 s")
				}
			}
			p.Kill()
			p.Start()
			es := p.finalLedger(t, "reported", 2)
			if len(es) != 2 {
				t.Errorf("%d entries, want one per request (2)", len(es))
			}
			for _, e := range es {
				if e.Status != "recovered" || e.ActualCost != e.EstimatedCost || e.EstimatedCost <= 0 {
					t.Errorf("%s: %s at %d nUSD (estimate %d) after a kill past its usage report, want recovered at its estimate",
						e.Route, e.Status, e.charge(), e.EstimatedCost)
				}
			}
		})
	}
}
