package proxy_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/anthropics/anthropic-sdk-go"
	anthropicopt "github.com/anthropics/anthropic-sdk-go/option"

	"github.com/costgate/costgate/costmodel"
)

// fastModeUsage is an Anthropic usage object of 100,000 input and 10,000
// output tokens served at speed (left out when empty).
func fastModeUsage(speed string) string {
	u := `{"input_tokens":100000,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":10000,"service_tier":"standard"`
	if speed != "" {
		u += fmt.Sprintf(`,"speed":%q`, speed)
	}
	return u + "}"
}

// TestFastModeBilled: Anthropic's fast mode (`"speed": "fast"`) serves
// Opus 4.6 at 6x its standard rates, and the answer's usage.speed says
// which speed it ran at (Anthropic, "Fast mode": "billing always reflects
// the speed a request actually ran at"). A tenant that asks for it is
// billed and reserved the fast rates; an answer that does not say its
// speed is billed the speed asked for; one served at the standard speed is
// billed the standard rates.
func TestFastModeBilled(t *testing.T) {
	const model = "claude-opus-4-6"
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	standard := est.Cost(model, costmodel.Usage{InputTokens: 100000, OutputTokens: 10000})
	fast := est.Cost(model, costmodel.Usage{InputTokens: 100000, OutputTokens: 10000, Speed: "fast"})
	if fast != 6*standard {
		t.Fatalf("fast mode priced %v, want 6 x %v", fast, standard)
	}
	for _, c := range []struct {
		name     string
		ask      anthropic.MessageNewParamsSpeed
		answered string // usage.speed of the answer, "" for none
		stream   bool
		want     costmodel.NanoUSD
	}{
		{"fast answered fast", anthropic.MessageNewParamsSpeedFast, "fast", false, fast},
		{"fast answered fast, streamed", anthropic.MessageNewParamsSpeedFast, "fast", true, fast},
		{"fast answered without a speed", anthropic.MessageNewParamsSpeedFast, "", false, fast},
		{"fast answered without a speed, streamed", anthropic.MessageNewParamsSpeedFast, "", true, fast},
		{"fast answered standard", anthropic.MessageNewParamsSpeedFast, "standard", false, standard},
		{"standard asked, fast answered", "", "fast", true, fast},
		{"standard", "", "standard", false, standard},
	} {
		t.Run(c.name, func(t *testing.T) {
			u := fastModeUsage(c.answered)
			// message_delta repeats the counts without the speed, as the
			// SDK's MessageDeltaUsage has none.
			delta := `{"input_tokens":100000,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":10000}`
			s := newStackWith(t, stackOptions{extra: roomyLimits, policies: allowAll, upstream: provAtkAnthropic(model, u, u, delta)})
			cl := anthropic.NewClient(anthropicopt.WithBaseURL(s.url+"/"), anthropicopt.WithAPIKey("cg-test-acme"), anthropicopt.WithMaxRetries(0))
			params := anthropic.MessageNewParams{
				Model:     model,
				MaxTokens: 10000,
				Speed:     c.ask,
				Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Hi"))},
			}
			ctx := context.Background()
			if c.stream {
				st := cl.Messages.NewStreaming(ctx, params)
				for st.Next() {
				}
				if err := st.Err(); err != nil {
					t.Fatal(err)
				}
				st.Close()
			} else if _, err := cl.Messages.New(ctx, params); err != nil {
				t.Fatal(err)
			}
			e := s.settled(t, 1)[0]
			if e.ActualCost != c.want {
				t.Errorf("billed %v, want %v (standard %v, fast %v)", e.ActualCost, c.want, standard, fast)
			}
			// The reservation is priced at the speed asked for: its output
			// part alone (10,000 tokens) is 6x at the fast rates.
			askedOut := est.Cost(model, costmodel.Usage{OutputTokens: 10000, Speed: string(c.ask)})
			if e.EstimatedCost < askedOut {
				t.Errorf("reserved %v, less than the %v of the output the request may produce at speed %q", e.EstimatedCost, askedOut, c.ask)
			}
			if c.ask == "" && e.EstimatedCost >= 6*est.Cost(model, costmodel.Usage{OutputTokens: 10000}) {
				t.Errorf("a standard request reserved %v, the fast rates", e.EstimatedCost)
			}
		})
	}
}

// TestFastModeEstimate: the request's speed prices the estimate; a speed
// that is not a string is refused, as Anthropic refuses it.
func TestFastModeEstimate(t *testing.T) {
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	body := func(speed string) []byte {
		return []byte(`{"model":"claude-opus-4-6","max_tokens":1000,` + speed + `"messages":[{"role":"user","content":"Hi"}]}`)
	}
	std, err := est.Estimate(costmodel.AnthropicMessages, body(""))
	if err != nil {
		t.Fatal(err)
	}
	for _, speed := range []string{`"speed":"fast",`, `"spe\u0065d":"fast",`, `"speed":"turbo",`} {
		e, err := est.Estimate(costmodel.AnthropicMessages, body(speed))
		if err != nil {
			t.Fatalf("%s: %v", speed, err)
		}
		if e.Cost != 6*std.Cost {
			t.Errorf("%s: estimated %v, want 6 x %v", speed, e.Cost, std.Cost)
		}
	}
	if e, err := est.Estimate(costmodel.AnthropicMessages, body(`"speed":"standard",`)); err != nil || e.Cost != std.Cost {
		t.Errorf(`"speed":"standard": %v %v, want %v`, e.Cost, err, std.Cost)
	}
	if _, err := est.Estimate(costmodel.AnthropicMessages, body(`"speed":6,`)); err == nil {
		t.Error(`"speed":6 was estimated; want a bad request`)
	}
}
