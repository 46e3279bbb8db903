package proxy_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"
)

// delayAtkPolicy holds acme's requests 20 s and globex's 100 ms.
var delayAtkPolicy = fstest.MapFS{"delay.rego": {Data: []byte(`package costgate.policies.delay

decision := {"outcome": "soft", "reason": "slow down", "friction": {"delay_ms": 20000}} if input.caller.tenant == "acme"

decision := {"outcome": "soft", "reason": "slow down", "friction": {"delay_ms": 100}} if input.caller.tenant == "globex"
`)}}

// delayAtkPost sends body to path with key; a client that has not had
// its answer within wait hangs up, and the answer is nil.
func delayAtkPost(t *testing.T, s *stack, path, key, body string, wait time.Duration) (*http.Response, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// TestDelayAtkOneTenantsBacklogIsBounded: a policy's friction delay holds
// each request (its goroutine, its connection, its reservation with every
// slot it took) for up to 30 s before it reaches the upstream. A tenant
// the policy delays, sending as many requests as it likes, must not hold
// an unbounded number of them on a replica: past its bound, a delayed
// request is refused at once with 429 and a Retry-After of the delay
// (proxied and reserve API alike), and another tenant's delayed requests
// are not refused for it.
func TestDelayAtkOneTenantsBacklogIsBounded(t *testing.T) {
	s := newStackWith(t, stackOptions{extra: roomyLimits, policies: delayAtkPolicy})
	const chat = `{"model":"gpt-4o-mini","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`

	// acme sends 200 at once: those past its bound are refused at once,
	// where before every one was held.
	const sent = 200
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	refusals := make(chan *http.Response, sent)
	for range sent {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/v1/chat/completions", strings.NewReader(chat))
			req.Header.Set("Authorization", "Bearer cg-test-acme")
			req.Header.Set("Content-Type", "application/json")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				refusals <- resp
			}
		})
	}
	want := sent - 64
	timeout := time.After(8 * time.Second)
	for n := 0; n < want; n++ {
		select {
		case resp := <-refusals:
			if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "20" {
				t.Fatalf("acme past its delay bound: %d Retry-After %q; want 429 with Retry-After 20",
					resp.StatusCode, resp.Header.Get("Retry-After"))
			}
		case <-timeout:
			t.Fatalf("acme sent %d requests into a 20 s friction delay: %d answered within 8 s; want %d refused at once past its bound of 64", sent, n, want)
		}
	}

	// Its bound holds its reservations too.
	resp, out := delayAtkPost(t, s, "/v1/costgate/reserve", "cg-test-acme", `{"cost":{"tokens":10},"model":"gpt-4o-mini"}`, 5*time.Second)
	if resp == nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("acme's reservation past its delay bound: %v %s; want 429", resp, out)
	}

	// globex, delayed 100 ms, is served meanwhile.
	resp, out = delayAtkPost(t, s, "/v1/chat/completions", "cg-test-globex", chat, 5*time.Second)
	if resp == nil || resp.StatusCode != http.StatusOK || !strings.Contains(resp.Header.Get("Costgate-Friction"), "delay") {
		t.Errorf("globex while acme's delay backlog is full: %v %s; want 200 after its delay", resp, out)
	}
}
