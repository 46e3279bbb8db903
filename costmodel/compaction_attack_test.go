package costmodel

import (
	"fmt"
	"testing"
)

// TestUsageAtkCompactionIterations: a request that turns on Anthropic's
// server-side compaction (context_management's compact_20260112) runs a
// sampling step that summarizes the conversation before the answer, and
// is billed it: its usage lists each step in iterations, and its top-level
// counts leave the compaction out (Anthropic: "to calculate total tokens
// consumed and billed for a request, sum across all entries in
// usage.iterations"). Read at the top-level counts, a compaction of
// 150,000 input and 3,000 output tokens before an answer of 12,000 and
// 1,000 was charged 12,000 and 1,000: $0.085 at claude-opus-4-6 for the
// $0.91 billed. Each kind is charged at the larger of its count and the
// steps' sum, in an answer and in a stream's message_start or
// message_delta.
func TestUsageAtkCompactionIterations(t *testing.T) {
	const (
		iterations = `"iterations":[{"type":"compaction","input_tokens":150000,"output_tokens":3000},{"type":"message","input_tokens":12000,"output_tokens":1000}]`
		wantIn     = 162000
		wantOut    = 4000
	)
	e := estimatorWith(t, Config{})
	check := func(t *testing.T, u Usage) {
		t.Helper()
		if u.InputTokens != wantIn || u.OutputTokens != wantOut {
			t.Errorf("charged %d input and %d output tokens; the upstream billed %d and %d", u.InputTokens, u.OutputTokens, wantIn, wantOut)
		}
		if got, want := e.Cost("claude-opus-4-6", u), e.Cost("claude-opus-4-6", Usage{InputTokens: wantIn, OutputTokens: wantOut}); got < want {
			t.Errorf("charged %v; the upstream billed %v", got, want)
		}
	}
	eachIterationsReport(t, e, "claude-opus-4-6", 12000, 1000, iterations, check)
	t.Run("a negative step", func(t *testing.T) {
		if _, err := ParseUsage(AnthropicMessages, []byte(`{"usage":{"input_tokens":12000,"output_tokens":1000,"iterations":[{"type":"compaction","input_tokens":-150000,"output_tokens":3000}]}}`)); err == nil {
			t.Errorf("a step of -150,000 input tokens was read as a report")
		}
	})
}

// eachIterationsReport runs check on the usage read from an Anthropic
// report of model, of in input and out output tokens and iterations (a
// member, `"iterations":[...]`): an answer's, also beside an empty
// "Iterations" before it, and a stream's, iterations in message_delta
// and in message_start.
func eachIterationsReport(t *testing.T, e *Estimator, model string, in, out int, iterations string, check func(*testing.T, Usage)) {
	t.Helper()
	for _, c := range []struct{ name, usage string }{
		{"answer", fmt.Sprintf(`{"input_tokens":%d,"output_tokens":%d,%s}`, in, out, iterations)},
		{"answer, iterations twice", fmt.Sprintf(`{"input_tokens":%d,"output_tokens":%d,"Iterations":[],%s}`, in, out, iterations)},
	} {
		t.Run(c.name, func(t *testing.T) {
			u, err := ParseUsage(AnthropicMessages, []byte(`{"type":"message","model":"`+model+`","content":[],"usage":`+c.usage+`}`))
			if err != nil {
				t.Fatal(err)
			}
			check(t, u)
		})
	}
	for _, c := range []struct{ name, start, delta string }{
		{"stream, in message_delta", fmt.Sprintf(`{"input_tokens":%d,"output_tokens":1}`, in), fmt.Sprintf(`{"output_tokens":%d,%s}`, out, iterations)},
		{"stream, in message_start", fmt.Sprintf(`{"input_tokens":%d,"output_tokens":1,%s}`, in, iterations), fmt.Sprintf(`{"output_tokens":%d}`, out)},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := e.NewStreamMeter(AnthropicMessages, model)
			m.Write([]byte("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"" + model + "\",\"usage\":" + c.start + "}}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":" + c.delta + "}\n\n" +
				"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"))
			u, reported := m.Usage()
			if !reported {
				t.Fatalf("no report read: %+v", u)
			}
			check(t, u)
		})
	}
}
