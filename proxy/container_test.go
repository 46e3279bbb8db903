package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/costgate/costgate/costmodel"
)

// containerGBPrice is OpenAI's price of a 20-minute session of a 1 GB
// container, $0.03; 4, 16 and 64 GB cost 4, 16 and 64 times it.
const containerGBPrice = costmodel.NanoUSD(30_000_000)

// containerUpstream answers every Responses request with a short message
// of 10 input and 2 output tokens, and no item that names a container: the
// model did not run code, and the container was created all the same.
func containerUpstream(model string) *stubUpstream {
	return &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"resp_1","object":"response","status":"completed","model":%q,"service_tier":"default","output":[`+
			`{"type":"message","id":"msg_1","role":"assistant","status":"completed","content":[{"type":"output_text","text":"Hi","annotations":[]}]}],`+
			`"usage":{"input_tokens":10,"input_tokens_details":{"cached_tokens":0},"output_tokens":2,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":12}}`, model)
	}}
}

// TestContainerSessionsBilled: a Responses request whose code_interpreter
// or shell tool asks for an automatic container has OpenAI create one and
// bill its session by its memory, whether or not the model runs code in it
// (OpenAI, "Pricing", containers; the answer names no container when the
// model ran none). The tenant is billed the tokens and the session; a
// container named by its id, or a local shell, adds nothing.
func TestContainerSessionsBilled(t *testing.T) {
	const model = "gpt-4.1-mini"
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tokens := est.Cost(model, costmodel.Usage{InputTokens: 10, OutputTokens: 2})
	auto := func(memory string) responses.ToolUnionParam {
		return responses.ToolUnionParam{OfCodeInterpreter: &responses.ToolCodeInterpreterParam{
			Container: responses.ToolCodeInterpreterContainerUnionParam{
				OfCodeInterpreterToolAuto: &responses.ToolCodeInterpreterContainerCodeInterpreterContainerAutoParam{MemoryLimit: memory},
			},
		}}
	}
	shell := func(memory responses.ContainerAutoMemoryLimit) responses.ToolUnionParam {
		return responses.ToolUnionParam{OfShell: &responses.FunctionShellToolParam{
			Environment: responses.FunctionShellToolEnvironmentUnionParam{OfContainerAuto: &responses.ContainerAutoParam{MemoryLimit: memory}},
		}}
	}
	for _, c := range []struct {
		name  string
		tools []responses.ToolUnionParam
		gb    int64
	}{
		{"code_interpreter, default memory", []responses.ToolUnionParam{auto("")}, 1},
		{"code_interpreter, 4g", []responses.ToolUnionParam{auto("4g")}, 4},
		{"code_interpreter, 64g", []responses.ToolUnionParam{auto("64g")}, 64},
		{"code_interpreter, a memory costgate does not know", []responses.ToolUnionParam{auto("8g")}, 64},
		{"shell and code_interpreter, 16g each", []responses.ToolUnionParam{shell(responses.ContainerAutoMemoryLimit16g), auto("16g")}, 32},
		{"code_interpreter, an existing container", []responses.ToolUnionParam{{OfCodeInterpreter: &responses.ToolCodeInterpreterParam{
			Container: responses.ToolCodeInterpreterContainerUnionParam{OfString: openai.String("cntr_1")},
		}}}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newStackWith(t, stackOptions{extra: roomyLimits, policies: allowAll, upstream: containerUpstream(model)})
			if _, err := s.client("cg-test-acme").Responses.New(context.Background(), responses.ResponseNewParams{
				Model: model,
				Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Plot my data.")},
				Tools: c.tools,
			}); err != nil {
				t.Fatal(err)
			}
			e := s.settled(t, 1)[0]
			want := tokens + costmodel.NanoUSD(c.gb)*containerGBPrice
			if e.ActualCost != want {
				t.Errorf("billed %v; want %v (tokens %v and %d GB of container)", e.ActualCost, want, tokens, c.gb)
			}
			if session := costmodel.NanoUSD(c.gb) * containerGBPrice; e.EstimatedCost < session {
				t.Errorf("reserved %v, less than the container's session %v", e.EstimatedCost, session)
			}
		})
	}
}

// TestContainerSessionsSettledByResponse: a reservation of the reserve
// API estimated from a body that creates a container, settled with the
// upstream's answer (which names no container), is billed the session.
func TestContainerSessionsSettledByResponse(t *testing.T) {
	s := newStackWith(t, stackOptions{extra: roomyLimits, policies: allowAll})
	id := reserveID(t, s, `{"kind":"responses","body":{"model":"gpt-4.1-mini","input":"Plot my data.",`+
		`"tools":[{"type":"code_interpreter","container":{"type":"auto","memory_limit":"4g"}}]}}`)
	answer := `{"id":"resp_1","object":"response","status":"completed","model":"gpt-4.1-mini","output":[],"usage":{"input_tokens":10,"output_tokens":2,"total_tokens":12}}`
	if code, out := reserveCall(t, s.srv.Handler(), "cg-test-acme", "/v1/costgate/settle",
		`{"reservation_id":"`+id+`","kind":"responses","response":`+answer+`}`); code != 200 {
		t.Fatalf("settle: %d %v", code, out)
	}
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	want := est.Cost("gpt-4.1-mini", costmodel.Usage{InputTokens: 10, OutputTokens: 2}) + 4*containerGBPrice
	if e := s.settled(t, 1)[0]; e.ActualCost != want {
		t.Errorf("billed %v; want %v with the 4 GB container", e.ActualCost, want)
	}
}
