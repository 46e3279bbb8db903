package proxy_test

// Attacks on the policy layer as the proxy uses it: a tenant that spells
// its request so that a policy reads it otherwise than it is priced and
// forwarded, and policies whose answers are odd (a delay too large to be a
// duration, a downgrade to a dearer model). Each test checks what reached
// the upstream and what was debited against what the policy asked.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/simulator"
)

// policyAtkCounter counts the requests that reach next (nil: a small JSON
// answer).
type policyAtkCounter struct {
	n    atomic.Int64
	next http.Handler
}

func (c *policyAtkCounter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.n.Add(1)
	if c.next != nil {
		c.next.ServeHTTP(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write([]byte(`{"results":[]}`))
}

// policyAtkSearchYAML is a generic search upstream named search, priced by
// the complexity of its query as examples/costrules/search.yaml prices it:
// the page size from ?size or the body's size (at most 100), the offset
// from ?from or the body's from, the page from ?page.
func policyAtkSearchYAML(base string) string {
	return `
  - name: search
    kind: generic
    base_url: ` + base + `
    api_key: search-secret
    auth_header: X-Search-Key
    cost:
      unit: complexity points
      per_call: "0.0005"
      per_unit: "0.0001"
      complexity:
        query: {query: q, json: query}
        page_size: {query: size, json: size, default: 10, max: 100}
        offset: {query: from, json: from}
        page: {query: page}
        filter_prefix: "filter."
limits:
  - name: acme-requests
    dimensions: [tenant]
    unit: requests
    rate: 1000
    period: 1m
`
}

// TestPolicyAttackPaginationSpelling: examples/policies/search_pagination
// refuses (403) a search past page 100. The page the policy reads must be
// the page costgate prices and forwards: a request that the cost rule
// prices as page 201 or deeper is refused whichever way it spells its
// position (a page with a space or a fraction, which the cost rule reads;
// an offset with an oversized page size, which the cost rule caps; an
// offset next to page=1; an offset in the JSON body).
func TestPolicyAttackPaginationSpelling(t *testing.T) {
	up := &policyAtkCounter{}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	s := newStackWith(t, stackOptions{extra: policyAtkSearchYAML(srv.URL), policies: os.DirFS("../examples/policies")})

	cases := []struct {
		name, method, target, body string
	}{
		{"plain page (control)", "GET", "/u/search/search?q=go&page=201", ""},
		{"page with a leading space", "GET", "/u/search/search?q=go&page=%20201", ""},
		{"page with a fraction", "GET", "/u/search/search?q=go&page=201.0", ""},
		{"offset (control)", "GET", "/u/search/search?q=go&from=2000", ""},
		{"offset with a page size above its cap", "GET", "/u/search/search?q=go&from=20000&size=1000000", ""},
		{"offset beside page=1", "GET", "/u/search/search?q=go&page=1&from=20000", ""},
		{"offset in the JSON body", "POST", "/u/search/search", `{"query":"go","from":20000}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := up.n.Load()
			req, err := http.NewRequest(c.method, s.url+c.target, strings.NewReader(c.body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer cg-test-acme")
			if c.body != "" {
				req.Header.Set("Content-Type", "application/json")
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			reached := up.n.Load() - before
			if resp.StatusCode == http.StatusForbidden && reached == 0 {
				return
			}
			// What it was priced at: page 201 of 10 results (offset 2000)
			// scores 98 complexity points.
			var units int64 = -1
			for _, e := range s.entries(t) {
				if e.RequestID == resp.Header.Get("X-Request-Id") {
					units = e.Estimated.Units
				}
			}
			t.Errorf("%s %s %s: %d, reached the upstream %d times, priced at %d complexity points (page 201 is 98); priced past page 100, search_pagination must refuse it with 403",
				c.method, c.target, c.body, resp.StatusCode, reached, units)
		})
	}
}

// policyAtkSim is the simulator behind a counter.
func policyAtkSim(t *testing.T) *policyAtkCounter {
	t.Helper()
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return &policyAtkCounter{next: simulator.New(simulator.Config{Estimator: est})}
}

// policyAtkDelay is a policy that answers every request with a soft
// decision delaying it delay milliseconds (a Rego integer literal).
func policyAtkDelay(delay string) fstest.MapFS {
	return fstest.MapFS{"delay.rego": {Data: []byte(`package costgate.policies.delay

decision := {"outcome": "soft", "reason": "slow down", "friction": {"delay_ms": ` + delay + `}}
`)}}
}

// TestPolicyAttackHugeDelay: a delay_ms no duration can hold is still a
// delay: the proxy waits its cap (30 s) before forwarding, as it does for
// any delay above the cap, and never forwards at once. The client gives up
// after 300 ms: nothing may have reached the upstream by then.
func TestPolicyAttackHugeDelay(t *testing.T) {
	for _, delay := range []string{
		"1000000000000",       // 31 years: capped at 30 s (control)
		"10000000000000",      // 317 years: more nanoseconds than an int64 holds
		"9223372036854775807", // the largest 64-bit integer
	} {
		t.Run(delay, func(t *testing.T) {
			up := policyAtkSim(t)
			s := newStackWith(t, stackOptions{extra: roomyLimits, policies: policyAtkDelay(delay), upstream: up})
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/v1/chat/completions",
				strings.NewReader(`{"model":"gpt-4o-mini","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer cg-test-acme")
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				resp.Body.Close()
				t.Fatalf("delay_ms %s: answered %d (Costgate-Friction %q) at once; want the request held for 30 s",
					delay, resp.StatusCode, resp.Header.Get("Costgate-Friction"))
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatal(err)
			}
			if n := up.n.Load(); n != 0 {
				t.Errorf("delay_ms %s: the upstream was reached %d times within 300 ms", delay, n)
			}
		})
	}
}

// TestPolicyAttackReserveHugeDelay: the reserve API applies a policy's
// delay as the proxy does: a delay_ms too large for a duration holds the
// answer for the cap, it does not answer at once.
func TestPolicyAttackReserveHugeDelay(t *testing.T) {
	s := newStackWith(t, stackOptions{extra: roomyLimits, policies: policyAtkDelay("9223372036854775807")})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/v1/costgate/reserve",
		strings.NewReader(`{"cost":{"tokens":10},"model":"gpt-4o-mini"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer cg-test-acme")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("reserve answered %d at once; want the answer held for 30 s", resp.StatusCode)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
}

// TestPolicyAttackDowngradeToDearerModel: a downgrade_model is applied
// after the limits were debited for the model asked for. When the model it
// names costs more (an operator's mistake, or a catch-all rule such as
// examples/demo's "anything but gpt-4o-mini becomes gpt-4o-mini" met by a
// cheaper model), the request must not be served past a dollar limit it
// was admitted under: it is refused, re-debited, or served as asked. The
// limit holds $0.001 a minute; gpt-4o-mini's estimate fits it, o1-pro's
// answer alone (at $150 per million input tokens) does not.
func TestPolicyAttackDowngradeToDearerModel(t *testing.T) {
	pol := fstest.MapFS{"dg.rego": {Data: []byte(`package costgate.policies.dg

decision := {"outcome": "soft", "reason": "cheaper model", "friction": {"downgrade_model": "o1-pro"}} if {
	input.request.model != "o1-pro"
}
`)}}
	const capacity = costmodel.NanoUSD(1_000_000) // $0.001
	s := newStackWith(t, stackOptions{policies: pol, extra: `
limits:
  - name: acme-usd
    dimensions: [tenant]
    unit: usd
    rate_usd: "0.001"
    period: 1m
`})
	var admitted []string
	for range 3 {
		resp := s.post(t, context.Background(), "/v1/chat/completions",
			`{"model":"gpt-4o-mini","max_tokens":16,"messages":[{"role":"user","content":"hello there"}]}`)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			admitted = append(admitted, resp.Header.Get("Costgate-Friction"))
		}
	}
	var spent costmodel.NanoUSD
	var models []string
	for _, e := range s.settled(t, len(admitted)) {
		spent += e.ActualCost
		models = append(models, e.Model)
	}
	if spent > capacity {
		t.Errorf("%d requests admitted under a $0.001 limit (friction %q) were served as %v and charged %d nano-USD, %d past the limit",
			len(admitted), admitted, models, spent, spent-capacity)
	}
}

// policyAtkSlowForbid is a policy that forbids every request (403) after
// work that keeps it on the general evaluator for a while.
var policyAtkSlowForbid = fstest.MapFS{"forbid.rego": {Data: []byte(`package costgate.policies.forbid

decision := {"outcome": "hard", "status": 403, "reason": "forbidden"} if {
	count([x | some x in numbers.range(1, 60000); x % 7 == 0]) > 0
}
`)}}

// TestPolicyAttackDisconnectDuringPolicy: a policy's refusal does not
// depend on the client staying connected. A client that sends its request
// and hangs up while the policies evaluate must not have the request
// forwarded: the cancelled evaluation is not an allow.
func TestPolicyAttackDisconnectDuringPolicy(t *testing.T) {
	up := policyAtkSim(t)
	s := newStackWith(t, stackOptions{extra: roomyLimits, policies: policyAtkSlowForbid, upstream: up})
	body := `{"model":"gpt-4o-mini","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`

	// Connected, the request is refused.
	resp := s.post(t, context.Background(), "/v1/chat/completions", body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("connected client: %d, want 403", resp.StatusCode)
	}

	// The client hangs up as soon as its request is sent: the server sees
	// it gone while the policy evaluates.
	var handled sync.WaitGroup
	handled.Add(1)
	h := s.srv.Handler()
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer handled.Done()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	host := strings.TrimPrefix(front.URL, "http://")
	conn, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer cg-test-acme\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", host, len(body), body)
	conn.Close()
	handled.Wait()
	if err := s.srv.WaitIdle(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := up.n.Load(); n != 0 {
		t.Errorf("a request every policy refuses reached the upstream %d times after its client hung up; ledger: %+v", n, s.entries(t))
	}
}
