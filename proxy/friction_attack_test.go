package proxy_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
	"github.com/costgate/costgate/simulator"
)

// frAtkUpstream records each request body it receives, then lets next
// answer.
type frAtkUpstream struct {
	next   http.Handler
	mu     sync.Mutex
	bodies [][]byte
}

func (u *frAtkUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.bodies = append(u.bodies, b)
	u.mu.Unlock()
	r.Body = io.NopCloser(bytes.NewReader(b))
	u.next.ServeHTTP(w, r)
}

// take returns the bodies received since the last call.
func (u *frAtkUpstream) take() [][]byte {
	u.mu.Lock()
	defer u.mu.Unlock()
	b := u.bodies
	u.bodies = nil
	return b
}

// frAtkNoReport answers a chat completion without a usage report: a plain
// answer without "usage", or a stream cut after its first chunk, both
// naming the model the request asked for.
func frAtkNoReport(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model  string `json:"model"`
		Stream bool   `json:"stream"`
	}
	json.NewDecoder(r.Body).Decode(&req)
	if req.Stream {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":%q,\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hi\"}}]}\n\n", req.Model)
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}]}`, req.Model)
}

// frAtkPolicy is a policy set of one soft rule with friction, applied
// when cond holds (always for "true").
func frAtkPolicy(friction, cond string) fstest.MapFS {
	return fstest.MapFS{"friction.rego": {Data: []byte(`package costgate.policies.friction

default decision := {"outcome": "allow"}

decision := {"outcome": "soft", "reason": "pace", "friction": ` + friction + `} if ` + cond + `
`)}}
}

// frAtkSend posts body to path as the tenant acme and returns the answer,
// its body read (a cut answer's error ignored).
func frAtkSend(t *testing.T, s *stack, path, body string, header map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer cg-test-acme")
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// frAtkDecode decodes a JSON object body, failing the test if it is none.
func frAtkDecode(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("upstream got %q: %v", b, err)
	}
	return m
}

// frAtkByCreation returns the ledger entries of acme in the order the
// requests were reserved.
func frAtkByCreation(t *testing.T, s *stack) []ledger.Entry {
	t.Helper()
	es := s.entries(t)
	sort.Slice(es, func(i, j int) bool { return es[i].CreatedAt.Before(es[j].CreatedAt) })
	return es
}

const frAtkMsgs = `"messages":[{"role":"user","content":"Write a long essay about the sea."}]`

// TestFrictionAttackBilledAsTheBodyServed: a request that friction turned
// into body B (a max_tokens cap, a model downgrade) is billed exactly as
// the same client sending B itself, when the upstream's answer carries no
// usage report (a plain answer without usage; a stream cut before its
// report). The upstream receives the same body both times and answers the
// same: the estimate that settlement falls back on must be the served
// body's, not the body the client first sent.
func TestFrictionAttackBilledAsTheBodyServed(t *testing.T) {
	capFive := frAtkPolicy(`{"cap_max_tokens": 5}`, "true")
	downgrade := frAtkPolicy(`{"downgrade_model": "gpt-5.4-nano"}`, `input.request.model == "gpt-4o"`)
	cases := []struct {
		name             string
		policies         fstest.MapFS
		friction, direct string // the client's body with friction applied to it; the body friction makes of it, sent directly
	}{
		{
			"cap, a plain answer without usage", capFive,
			`{"model":"gpt-4o-mini","max_tokens":4000,` + frAtkMsgs + `}`,
			`{"model":"gpt-4o-mini","max_tokens":5,` + frAtkMsgs + `}`,
		},
		{
			"cap, a reasoning model's stream cut before its report", capFive,
			`{"model":"gpt-5.4-nano","max_completion_tokens":4000,"stream":true,` + frAtkMsgs + `}`,
			`{"model":"gpt-5.4-nano","max_completion_tokens":5,"stream":true,` + frAtkMsgs + `}`,
		},
		{
			"downgrade to a reasoning model, its stream cut before its report", downgrade,
			`{"model":"gpt-4o","max_completion_tokens":300,"stream":true,` + frAtkMsgs + `}`,
			`{"model":"gpt-5.4-nano","max_completion_tokens":300,"stream":true,` + frAtkMsgs + `}`,
		},
		{
			// The downgrade bounds the output by gpt-4o's maximum, the
			// output reserved (see TestFrictionAttackDowngradeServesNoMoreThanReserved).
			"downgrade to a model of a larger output limit, a plain answer without usage", downgrade,
			`{"model":"gpt-4o",` + frAtkMsgs + `}`,
			`{"model":"gpt-5.4-nano","max_completion_tokens":16384,` + frAtkMsgs + `}`,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			up := &frAtkUpstream{next: http.HandlerFunc(frAtkNoReport)}
			s := newStackWith(t, stackOptions{policies: c.policies, extra: roomyLimits, upstream: up})
			resp, _ := frAtkSend(t, s, "/v1/chat/completions", c.friction, nil)
			if resp == nil || resp.Header.Get("Costgate-Friction") == "" {
				t.Fatalf("the first request was not served with friction: %v", resp)
			}
			frAtkSend(t, s, "/v1/chat/completions", c.direct, nil)
			seen := up.take()
			if len(seen) != 2 {
				t.Fatalf("upstream got %d requests, want 2", len(seen))
			}
			if a, b := frAtkDecode(t, seen[0]), frAtkDecode(t, seen[1]); !reflect.DeepEqual(a, b) {
				t.Fatalf("the upstream got different bodies:\nfriction: %s\ndirect:   %s", seen[0], seen[1])
			}
			es := frAtkByCreation(t, s)
			if len(es) != 2 {
				t.Fatalf("ledger has %d entries, want 2", len(es))
			}
			f, d := es[0], es[1]
			if f.Model != d.Model || f.Actual != d.Actual || f.ActualCost != d.ActualCost {
				t.Errorf("the same served body and answer billed differently:\nwith friction: model %s, actual %+v, cost %v\ndirect:        model %s, actual %+v, cost %v",
					f.Model, f.Actual, f.ActualCost, d.Model, d.Actual, d.ActualCost)
			}
		})
	}
}

// TestFrictionAttackCapRewritesTheFieldsServed: a cap reaches the upstream
// in every output-limit field the request holds (both of chat's, when
// given both), or in the API's own field when it holds none; escaped key
// spellings and n, best_of and stream options are kept; a limit already
// below the cap is left as it is. Nothing else in the body changes.
func TestFrictionAttackCapRewritesTheFieldsServed(t *testing.T) {
	cases := []struct {
		name, path, body string
		want             map[string]any // fields the upstream must see changed
		capped           bool           // Costgate-Friction names cap_max_tokens
	}{
		{"chat, both limits", "/v1/chat/completions",
			`{"model":"gpt-4o-mini","max_tokens":4000,"max_completion_tokens":3000,` + frAtkMsgs + `}`,
			map[string]any{"max_tokens": 5.0, "max_completion_tokens": 5.0}, true},
		{"chat, no limit", "/v1/chat/completions",
			`{"model":"gpt-4o-mini",` + frAtkMsgs + `}`,
			map[string]any{"max_completion_tokens": 5.0}, true},
		{"chat, escaped key", "/v1/chat/completions",
			`{"model":"gpt-4o-mini","max\u005ftokens":4000,` + frAtkMsgs + `}`,
			map[string]any{"max_tokens": 5.0}, true},
		{"chat, minus zero", "/v1/chat/completions",
			`{"model":"gpt-4o-mini","max_tokens":-0,` + frAtkMsgs + `}`,
			map[string]any{"max_tokens": 5.0}, true},
		{"chat, n and a stream with options", "/v1/chat/completions",
			`{"model":"gpt-4o-mini","n":3,"max_tokens":4000,"stream":true,"stream_options":{"include_usage":true},` + frAtkMsgs + `}`,
			map[string]any{"max_tokens": 5.0}, true},
		{"chat, below the cap", "/v1/chat/completions",
			`{"model":"gpt-4o-mini","max_tokens":3,` + frAtkMsgs + `}`,
			map[string]any{}, false},
		{"completions, best_of", "/v1/completions",
			`{"model":"gpt-3.5-turbo-instruct","prompt":"Once upon a time","best_of":2,"max_tokens":4000}`,
			map[string]any{"max_tokens": 5.0}, true},
		{"responses", "/v1/responses",
			`{"model":"gpt-4o-mini","input":"Write a long essay.","max_output_tokens":4000}`,
			map[string]any{"max_output_tokens": 5.0}, true},
		{"responses, no limit", "/v1/responses",
			`{"model":"gpt-4o-mini","input":"Write a long essay."}`,
			map[string]any{"max_output_tokens": 5.0}, true},
		{"anthropic", "/v1/messages",
			`{"model":"claude-haiku-4-5","max_tokens":4000,` + frAtkMsgs + `}`,
			map[string]any{"max_tokens": 5.0}, true},
	}
	up := &frAtkUpstream{}
	est := estimator(t)
	up.next = simulator.New(simulator.Config{Estimator: est})
	s := newStackWith(t, stackOptions{policies: frAtkPolicy(`{"cap_max_tokens": 5}`, "true"), extra: roomyLimits, upstream: up})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, out := frAtkSend(t, s, c.path, c.body, map[string]string{"anthropic-version": "2023-06-01"})
			if resp == nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("answer: %v %s", resp, out)
			}
			if got := strings.Contains(resp.Header.Get("Costgate-Friction"), "cap_max_tokens"); got != c.capped {
				t.Errorf("Costgate-Friction %q; want cap_max_tokens named: %v", resp.Header.Get("Costgate-Friction"), c.capped)
			}
			seen := up.take()
			if len(seen) != 1 {
				t.Fatalf("upstream got %d requests, want 1", len(seen))
			}
			got, sent := frAtkDecode(t, seen[0]), frAtkDecode(t, []byte(c.body))
			for k, v := range c.want {
				sent[k] = v
			}
			if opts, ok := got["stream_options"].(map[string]any); ok && opts["include_usage"] == true {
				sent["stream_options"] = opts // costgate asks a stream for its usage report
			}
			if !reflect.DeepEqual(got, sent) {
				t.Errorf("upstream got %s\nwant %v", seen[0], sent)
			}
		})
	}
}

// TestFrictionAttackRefusedBodiesReachNoUpstream: under friction, a body
// whose priced fields are ambiguous (given twice, in two spellings, as a
// number no integer field holds) or that is not one JSON object (a BOM,
// trailing data, a compressed body) is refused with 400 before the
// upstream: friction rewrites only what was estimated.
func TestFrictionAttackRefusedBodiesReachNoUpstream(t *testing.T) {
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(`{"model":"gpt-4o","max_tokens":4000,` + frAtkMsgs + `}`))
	zw.Close()
	cases := []struct {
		name, body string
		header     map[string]string
	}{
		{"model twice", `{"model":"gpt-4o-mini","model":"gpt-4o",` + frAtkMsgs + `}`, nil},
		{"model twice, one escaped", `{"model":"gpt-4o-mini","mod\u0065l":"gpt-4o",` + frAtkMsgs + `}`, nil},
		{"max_tokens twice, one escaped", `{"model":"gpt-4o","max_tokens":5,"max\u005ftokens":100000,` + frAtkMsgs + `}`, nil},
		{"max_tokens as an exponent", `{"model":"gpt-4o","max_tokens":1e3,` + frAtkMsgs + `}`, nil},
		{"max_tokens as a fraction", `{"model":"gpt-4o","max_tokens":4000.0,` + frAtkMsgs + `}`, nil},
		{"max_tokens past int64", `{"model":"gpt-4o","max_tokens":99999999999999999999,` + frAtkMsgs + `}`, nil},
		{"n as an exponent", `{"model":"gpt-4o","n":1e1,"max_tokens":4000,` + frAtkMsgs + `}`, nil},
		{"a byte order mark", "\ufeff" + `{"model":"gpt-4o","max_tokens":4000,` + frAtkMsgs + `}`, nil},
		{"trailing data", `{"model":"gpt-4o","max_tokens":4000,` + frAtkMsgs + `}{"model":"gpt-5.5-pro"}`, nil},
		{"gzip", gz.String(), map[string]string{"Content-Encoding": "gzip"}},
	}
	up := &frAtkUpstream{next: http.HandlerFunc(frAtkNoReport)}
	pols := frAtkPolicy(`{"cap_max_tokens": 5, "downgrade_model": "gpt-4o-mini"}`, "true")
	s := newStackWith(t, stackOptions{policies: pols, extra: roomyLimits, upstream: up})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, out := frAtkSend(t, s, "/v1/chat/completions", c.body, c.header)
			if resp == nil || resp.StatusCode != http.StatusBadRequest {
				t.Errorf("answer %v %s; want 400", resp, out)
			}
			if seen := up.take(); len(seen) != 0 {
				t.Errorf("the upstream got %q", seen)
			}
		})
	}
}

// TestFrictionAttackOutputPastTheCapIsBilled: an upstream that answers
// with more output than the cap it was sent is billed what it reports.
func TestFrictionAttackOutputPastTheCapIsBilled(t *testing.T) {
	up := &frAtkUpstream{next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c1","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"a long answer"},"finish_reason":"length"}],"usage":{"prompt_tokens":20,"completion_tokens":700,"total_tokens":720}}`)
	})}
	s := newStackWith(t, stackOptions{policies: frAtkPolicy(`{"cap_max_tokens": 5}`, "true"), extra: roomyLimits, upstream: up})
	if resp, out := frAtkSend(t, s, "/v1/chat/completions", `{"model":"gpt-4o-mini","max_tokens":4000,`+frAtkMsgs+`}`, nil); resp == nil || resp.StatusCode != 200 {
		t.Fatalf("answer %v %s", resp, out)
	}
	es := frAtkByCreation(t, s)
	if len(es) != 1 || es[0].Actual.OutputTokens != 700 || es[0].Actual.InputTokens != 20 {
		t.Fatalf("ledger %+v; want the 20 input and 700 output tokens the upstream reported", es)
	}
	want := estimator(t)
	p, _ := want.Price("gpt-4o-mini")
	if c := p.Cost(costmodel.Usage{InputTokens: 20, OutputTokens: 700}); es[0].ActualCost != c {
		t.Errorf("charged %v, want %v", es[0].ActualCost, c)
	}
}

// TestFrictionAttackDelayHoldsThenReleasesItsSlot: a request held by a
// delay keeps its concurrency slot past the limit's lease period (another
// request is refused meanwhile); a client that hangs up during the delay
// gives the slot back at once, never reaches the upstream and is charged
// nothing.
func TestFrictionAttackDelayHoldsThenReleasesItsSlot(t *testing.T) {
	up := &frAtkUpstream{next: http.HandlerFunc(frAtkNoReport)}
	s := newStackWith(t, stackOptions{
		policies: frAtkPolicy(`{"delay_ms": 20000}`, `input.request.model == "gpt-4o"`),
		upstream: up,
		extra: `
limits:
  - {name: one-at-a-time, dimensions: [tenant], unit: requests, algorithm: concurrency, rate: 1, period: 1s}
`})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/v1/chat/completions",
			strings.NewReader(`{"model":"gpt-4o","max_tokens":50,`+frAtkMsgs+`}`))
		req.Header.Set("Authorization", "Bearer cg-test-acme")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("answered %d during its delay", resp.StatusCode)
		}
		done <- err
	}()
	other := `{"model":"gpt-4o-mini","max_tokens":5,` + frAtkMsgs + `}`
	// Past the held request's first lease period.
	deadline := time.Now().Add(1600 * time.Millisecond)
	for time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		if resp, out := frAtkSend(t, s, "/v1/chat/completions", other, nil); resp == nil || resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("another request while one is held by its delay: %v %s; want 429", resp, out)
		}
	}
	cancel()
	<-done
	var resp *http.Response
	for range 20 { // the hang-up is seen by the server shortly after
		if resp, _ = frAtkSend(t, s, "/v1/chat/completions", other, nil); resp != nil && resp.StatusCode == http.StatusOK {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if resp == nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("after the held client hung up: %v; want the slot back", resp)
	}
	seen := up.take()
	for _, b := range seen {
		if strings.Contains(string(b), `"gpt-4o"`) {
			t.Errorf("the request whose client hung up during its delay reached the upstream: %s", b)
		}
	}
	for _, e := range s.entries(t) {
		if e.Model == "gpt-4o" && e.Status != ledger.StatusFailed {
			t.Errorf("the request whose client hung up during its delay is in the ledger as %s, charged %v", e.Status, e.ActualCost)
		}
	}
}

// TestFrictionAttackCapSparesRequestsWithoutOutput: a cap on output or a
// model downgrade (the example budget policy's friction, on every route)
// changes nothing in a request that has no output limit to cap: an
// embeddings request and a generic upstream's JSON body reach the upstream
// as the client sent them, and the answer does not claim a cap applied.
func TestFrictionAttackCapSparesRequestsWithoutOutput(t *testing.T) {
	gen := &frAtkUpstream{next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"hits":[]}`)
	})}
	gs := httptest.NewServer(gen)
	t.Cleanup(gs.Close)
	up := &frAtkUpstream{}
	up.next = simulator.New(simulator.Config{Estimator: estimator(t)})
	s := newStackWith(t, stackOptions{
		policies: frAtkPolicy(`{"cap_max_tokens": 1024, "warning": "over 80% of budget"}`, "true"),
		upstream: up,
		extra: `
  - name: search
    kind: generic
    base_url: ` + gs.URL + `
    api_key: search-secret
    auth_header: X-Subscription-Token
    cost: {per_call: "0.002"}
` + roomyLimits,
	})
	cases := []struct {
		name, path, body string
		rec              *frAtkUpstream
	}{
		{"embeddings", "/v1/embeddings", `{"model":"text-embedding-3-small","input":"the sea"}`, up},
		{"generic JSON body", "/u/search/_search", `{"query":{"match":{"title":"sea"}},"size":10}`, gen},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, out := frAtkSend(t, s, c.path, c.body, nil)
			if resp == nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("answer %v %s", resp, out)
			}
			seen := c.rec.take()
			if len(seen) != 1 {
				t.Fatalf("upstream got %d requests", len(seen))
			}
			if got, sent := frAtkDecode(t, seen[0]), frAtkDecode(t, []byte(c.body)); !reflect.DeepEqual(got, sent) {
				t.Errorf("the upstream got %s; the client sent %s", seen[0], c.body)
			}
			if f := resp.Header.Get("Costgate-Friction"); strings.Contains(f, "cap_max_tokens") {
				t.Errorf("Costgate-Friction %q claims a cap on a request without output", f)
			}
		})
	}
}

// TestFrictionAttackDowngradeServesNoMoreThanReserved: a downgrade never
// lets the served body produce more output than the request reserved. A
// request for gpt-4o without an output limit reserves gpt-4o's maximum
// output (16,384 tokens); downgraded to a model whose maximum is 128,000,
// the body the upstream gets must still bound the output by what was
// reserved, or an output-token limit that refuses the downgraded model's
// request outright (cost_exceeds_limit) is passed by 8 times its reserve.
func TestFrictionAttackDowngradeServesNoMoreThanReserved(t *testing.T) {
	up := &frAtkUpstream{next: http.HandlerFunc(frAtkNoReport)}
	s := newStackWith(t, stackOptions{
		policies: frAtkPolicy(`{"downgrade_model": "gpt-5.4-nano"}`, `input.request.model == "gpt-4o"`),
		upstream: up,
		extra: `
limits:
  - {name: acme-output, dimensions: [tenant], unit: output_tokens, rate: 20000, period: 1m}
`})
	resp, out := frAtkSend(t, s, "/v1/chat/completions", `{"model":"gpt-5.4-nano",`+frAtkMsgs+`}`, nil)
	if resp == nil || resp.StatusCode != http.StatusBadRequest || !strings.Contains(out, "cost_exceeds_limit") {
		t.Fatalf("gpt-5.4-nano without an output limit: %v %s; want 400 cost_exceeds_limit", resp, out)
	}
	resp, out = frAtkSend(t, s, "/v1/chat/completions", `{"model":"gpt-4o",`+frAtkMsgs+`}`, nil)
	if resp == nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("gpt-4o downgraded: %v %s", resp, out)
	}
	seen := up.take()
	if len(seen) != 1 {
		t.Fatalf("upstream got %d requests, want 1", len(seen))
	}
	es := frAtkByCreation(t, s)
	if len(es) != 1 {
		t.Fatalf("ledger has %d entries, want 1", len(es))
	}
	reserved := es[0].Estimated.OutputTokens
	body := frAtkDecode(t, seen[0])
	limit := int64(128000) // gpt-5.4-nano's maximum output, when the body sets none
	for _, f := range []string{"max_tokens", "max_completion_tokens"} {
		if v, ok := body[f].(float64); ok {
			limit = min(limit, int64(v))
		}
	}
	if limit > reserved {
		t.Errorf("the upstream got %s: up to %d output tokens of %s, %d reserved", seen[0], limit, body["model"], reserved)
	}
}

// TestFrictionAttackBudgetDowngradeByAlias: the example budget policy
// (examples/policies/budget.rego) downgrades gpt-4o to gpt-4o-mini past
// 90% of a budget. A dated snapshot name of gpt-4o, priced and limited as
// gpt-4o, is downgraded too: a tenant cannot keep the expensive model by
// naming it otherwise.
func TestFrictionAttackBudgetDowngradeByAlias(t *testing.T) {
	src, err := os.ReadFile("../examples/policies/budget.rego")
	if err != nil {
		t.Fatal(err)
	}
	pols := fstest.MapFS{"budget.rego": {Data: src}}
	// The first request is charged its estimate (the upstream reports no
	// usage): 93% of the budget.
	first := `{"model":"gpt-4o-mini","max_tokens":100000,` + frAtkMsgs + `}`
	e, err := estimator(t).Estimate(costmodel.ChatCompletions, []byte(first))
	if err != nil {
		t.Fatal(err)
	}
	budget := int64(e.Cost) * 100 / 93
	for _, model := range []string{"gpt-4o", "gpt-4o-2024-08-06", "gpt-4o-2024-11-20"} {
		t.Run(model, func(t *testing.T) {
			up := &frAtkUpstream{next: http.HandlerFunc(frAtkNoReport)}
			s := newStackWith(t, stackOptions{policies: pols, upstream: up, extra: roomyLimits + fmt.Sprintf(`
budgets:
  - name: acme-daily
    scope: tenant
    amount: "%d.%09d"
`, budget/1e9, budget%1e9)})
			if resp, out := frAtkSend(t, s, "/v1/chat/completions", first, nil); resp == nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("first answer %v %s", resp, out)
			}
			s.entries(t) // settled
			up.take()
			resp, out := frAtkSend(t, s, "/v1/chat/completions", `{"model":"`+model+`","max_tokens":1,`+frAtkMsgs+`}`, nil)
			if resp == nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("answer %v %s", resp, out)
			}
			seen := up.take()
			if len(seen) != 1 {
				t.Fatalf("upstream got %d requests", len(seen))
			}
			if got := frAtkDecode(t, seen[0])["model"]; got != "gpt-4o-mini" {
				t.Errorf("past 90%% of the budget, %s was served as %v (Costgate-Friction %q); want gpt-4o-mini",
					model, got, resp.Header.Get("Costgate-Friction"))
			}
		})
	}
}

// TestFrictionAttackCapKeepsAnthropicThinkingValid: Anthropic refuses a
// request whose max_tokens is not above thinking.budget_tokens (at least
// 1,024). A cap (the example budget policy's 1,024 past 80%) must leave an
// extended-thinking request one the upstream serves, not one it refuses.
func TestFrictionAttackCapKeepsAnthropicThinkingValid(t *testing.T) {
	up := &frAtkUpstream{next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			MaxTokens int64 `json:"max_tokens"`
			Thinking  struct {
				Type         string `json:"type"`
				BudgetTokens int64  `json:"budget_tokens"`
			} `json:"thinking"`
		}
		json.NewDecoder(r.Body).Decode(&req)
		w.Header().Set("Content-Type", "application/json")
		if req.Thinking.Type == "enabled" && (req.Thinking.BudgetTokens < 1024 || req.MaxTokens <= req.Thinking.BudgetTokens) {
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens must be greater than thinking.budget_tokens"}}`)
			return
		}
		io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn","usage":{"input_tokens":20,"output_tokens":30}}`)
	})}
	s := newStackWith(t, stackOptions{policies: frAtkPolicy(`{"cap_max_tokens": 1024}`, "true"), extra: roomyLimits, upstream: up})
	resp, out := frAtkSend(t, s, "/v1/messages",
		`{"model":"claude-sonnet-4-5","max_tokens":8000,"thinking":{"type":"enabled","budget_tokens":2000},`+frAtkMsgs+`}`,
		map[string]string{"anthropic-version": "2023-06-01"})
	if resp == nil || resp.StatusCode != http.StatusOK {
		t.Errorf("a capped extended-thinking request answered %s; the upstream got %s", out, up.take())
	}
}
