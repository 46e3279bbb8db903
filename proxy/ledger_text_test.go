package proxy_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
)

// TestSettleResponseModelTheLedgerRefuses: a settle given the upstream's
// raw answer prices the model that answer names, which the caller
// writes. A model the ledger cannot store (a NUL, or longer than its
// 4096-byte bound) must not leave the reservation's entry reserved at
// its estimate while the settle answers 200 with the usage's price: the
// ledger, which the tenant is billed by, would bill the estimate (here
// 10 tokens) and never the usage the settle reported (a million tokens
// each way), though the limits were charged it. Either the settle is
// refused (400) and the reservation stays open, or the ledger bills what
// the settle answered.
func TestSettleResponseModelTheLedgerRefuses(t *testing.T) {
	for _, tc := range []struct{ name, model string }{
		{"a NUL", `gpt-4o-mini\u0000`},
		{"5000 bytes", strings.Repeat("m", 5000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStack(t, "", `
budgets:
  - {name: daily, scope: tenant, amount: "100.00"}
`)
			h := s.srv.Handler()
			id := reserveID(t, s, `{"cost":{"tokens":10},"model":"gpt-4o-mini"}`)
			body := fmt.Sprintf(`{"reservation_id":%q,"kind":"chat_completions","response":{"model":"%s","usage":{"prompt_tokens":1000000,"completion_tokens":1000000}}}`, id, tc.model)
			code, out := reserveCall(t, h, "cg-test-acme", "/v1/costgate/settle", body)
			t.Logf("settle: %d %v", code, out)
			var answered costmodel.NanoUSD
			switch code {
			case 400:
				// Refused: the reservation is still the tenant's to settle.
				code, out = reserveCall(t, h, "cg-test-acme", "/v1/costgate/settle",
					fmt.Sprintf(`{"reservation_id":%q,"usage":{"input_tokens":1000000,"output_tokens":1000000}}`, id))
				if code != 200 {
					t.Fatalf("settle after the refused one: %d %v", code, out)
				}
				fallthrough
			case 200:
				n, _ := out["cost_nanousd"].(float64)
				answered = costmodel.NanoUSD(n)
			default:
				t.Fatalf("settle: %d %v", code, out)
			}
			es := s.entries(t)
			if len(es) != 1 {
				t.Fatalf("%d ledger entries, want 1", len(es))
			}
			e := es[0]
			if e.Status != ledger.StatusSettled || e.Charge() != answered || e.Actual.InputTokens != 1_000_000 {
				t.Errorf("ledger entry: status %s, billed %v for %d input tokens (estimate %v); the settle answered %v for 1,000,000",
					e.Status, e.Charge(), e.Actual.InputTokens, e.EstimatedCost, answered)
			}
		})
	}
}

// TestReserveBodyModelIsNoFreshAllowance: the reserve API refuses a
// model the price table does not know (400 unknown_model), so that a
// limit keyed by model cannot be dodged by naming a new model each time
// (TestReserveNamesAreNoFreshAllowance checks the "model" field). A
// reservation estimated from an LLM body names its model in the body:
// the same rule must hold there, or each made-up name is a fresh
// allowance of the per-model limit, for a caller that then calls the
// real model itself and settles naming it.
func TestReserveBodyModelIsNoFreshAllowance(t *testing.T) {
	s := newStack(t, "", `
limits:
  - {name: per-model, dimensions: [tenant, model], unit: requests, rate: 1, period: 1h}
`)
	h := s.srv.Handler()
	reserve := func(model string) (int, map[string]any) {
		return reserveCall(t, h, "cg-test-acme", "/v1/costgate/reserve", fmt.Sprintf(
			`{"kind":"chat_completions","body":{"model":%q,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}}`, model))
	}
	if code, out := reserve("gpt-4o-mini"); code != 200 {
		t.Fatalf("the first reserve of gpt-4o-mini: %d %v", code, out)
	}
	if code, out := reserve("gpt-4o-mini"); code != 429 {
		t.Fatalf("the second reserve of gpt-4o-mini, on a limit of 1: %d %v; want 429", code, out)
	}
	for i := range 3 {
		model := fmt.Sprintf("gpt-4o-mini-made-up-%d", i)
		code, out := reserve(model)
		if code == 200 {
			t.Errorf("a body naming %s: 200, a fresh allowance of per-model; want 400 unknown_model (or 429)", model)
			continue
		}
		if code != 400 && code != 429 {
			t.Errorf("a body naming %s: %d %v", model, code, out)
		}
	}
}

// TestUpstreamModelTheLedgerRefuses: an upstream's answer names the
// model that served it, and the request is priced and recorded under it.
// A name the ledger cannot store (a NUL, longer than its bound) or no
// model's name at all, in a whole answer or a stream, leaves the request
// priced and recorded under the model it asked for, and its entry
// settled at the usage the answer reported.
func TestUpstreamModelTheLedgerRefuses(t *testing.T) {
	for _, tc := range []struct{ name, model string }{
		{"a NUL", `gpt-4o-mini\u0000`},
		{"a control byte", `gpt-4o-mini\n`},
		{"5000 bytes", strings.Repeat("m", 5000)},
	} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", tc.name, stream), func(t *testing.T) {
				up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
					if stream {
						w.Header().Set("Content-Type", "text/event-stream")
						fmt.Fprintf(w, `data: {"id":"c","object":"chat.completion.chunk","model":"%s","choices":[{"index":0,"delta":{"content":"hi"}}]}`+"\n\n", tc.model)
						fmt.Fprintf(w, `data: {"id":"c","object":"chat.completion.chunk","model":"%s","choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":2000}}`+"\n\n", tc.model)
						fmt.Fprint(w, "data: [DONE]\n\n")
						return
					}
					w.Header().Set("Content-Type", "application/json")
					fmt.Fprintf(w, `{"id":"c","object":"chat.completion","model":"%s","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1000,"completion_tokens":2000}}`, tc.model)
				}}
				s := newStackWith(t, stackOptions{extra: roomyLimits, upstream: up})
				e, _ := oneEntry(t, s, "/v1/chat/completions", fmt.Sprintf(`{"model":"gpt-4o-mini","stream":%v,"messages":[{"role":"user","content":"hi"}]}`, stream), nil)
				want := s.srv.Gate().Identify("cg-test-acme").Estimator().Cost("gpt-4o-mini", costmodel.Usage{InputTokens: 1000, OutputTokens: 2000})
				if e.Status != ledger.StatusSettled || e.Model != "gpt-4o-mini" || e.Actual.OutputTokens != 2000 || e.ActualCost != want {
					t.Errorf("entry %s, model %.20q, %d output tokens, %v; want settled, gpt-4o-mini, 2000, %v", e.Status, e.Model, e.Actual.OutputTokens, e.ActualCost, want)
				}
			})
		}
	}
}
