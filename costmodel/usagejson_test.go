package costmodel

import (
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestUsageReportForms: a count given twice in a report counts at its
// larger (encoding/json keeps the last, the SDKs the first); a count in a
// form the SDKs read ("9000", 3e3, 3000.0) is read as they read it; a
// negative count makes the report unreadable, not one of no tokens.
func TestUsageReportForms(t *testing.T) {
	for _, c := range []struct {
		name string
		kind Kind
		body string
		want Usage
		err  error
	}{
		{"twice-last-smaller", ChatCompletions, `{"usage":{"prompt_tokens":9,"completion_tokens":3000,"completion_tokens":5}}`, Usage{InputTokens: 9, OutputTokens: 3000}, nil},
		{"twice-first-smaller", ChatCompletions, `{"usage":{"prompt_tokens":9,"completion_tokens":5,"completion_tokens":3000}}`, Usage{InputTokens: 9, OutputTokens: 3000}, nil},
		{"twice-in-another-case", Responses, `{"usage":{"input_tokens":9000,"INPUT_TOKENS":9,"output_tokens":3}}`, Usage{InputTokens: 9000, OutputTokens: 3}, nil},
		{"null-after", ChatCompletions, `{"usage":{"prompt_tokens":9000,"completion_tokens":3,"prompt_tokens":null}}`, Usage{InputTokens: 9000, OutputTokens: 3}, nil},
		{"details-twice", ChatCompletions, `{"usage":{"prompt_tokens":9000,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":8000},"prompt_tokens_details":{"cached_tokens":0}}}`, Usage{InputTokens: 9000, CachedInputTokens: 8000, OutputTokens: 3}, nil},
		{"forms", ChatCompletions, `{"usage":{"prompt_tokens":"9000","completion_tokens":3e3,"total_tokens":12000.0}}`, Usage{InputTokens: 9000, OutputTokens: 3000}, nil},
		{"fraction-up", ChatCompletions, `{"usage":{"prompt_tokens":9,"completion_tokens":2999.5}}`, Usage{InputTokens: 9, OutputTokens: 3000}, nil},
		{"out-of-range", ChatCompletions, `{"usage":{"prompt_tokens":9,"completion_tokens":1e30}}`, Usage{}, errAny},
		{"negative", ChatCompletions, `{"usage":{"prompt_tokens":9,"completion_tokens":-3000}}`, Usage{}, ErrNoUsage},
		{"anthropic-twice", AnthropicMessages, `{"usage":{"input_tokens":10,"output_tokens":3000,"output_tokens":5,"cache_read_input_tokens":700,"Cache_Read_Input_Tokens":0}}`, Usage{InputTokens: 710, CachedInputTokens: 700, OutputTokens: 3000}, nil},
		{"anthropic-negative", AnthropicMessages, `{"usage":{"input_tokens":10,"output_tokens":-1}}`, Usage{}, ErrNoUsage},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseUsage(c.kind, []byte(c.body))
			switch {
			case c.err == errAny && err == nil, c.err != errAny && c.err != err:
				t.Fatalf("ParseUsage(%s) = %+v, %v; want error %v", c.body, got, err, c.err)
			case got != c.want:
				t.Errorf("ParseUsage(%s) = %+v; want %+v", c.body, got, c.want)
			}
		})
	}
}

// TestUsageCountHugeExponent: a count of a few bytes whose exponent is
// huge (1e999999999, in a report or as a string) is out of range at
// once; before, it became a 415 MB integer first, some seconds of CPU
// per report, which a tenant could send to the settle API at will.
func TestUsageCountHugeExponent(t *testing.T) {
	for _, v := range []string{`1e999999999`, `"1e999999999"`, `9.5e99999999`} {
		body := []byte(`{"usage":{"prompt_tokens":9,"completion_tokens":` + v + `}}`)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := ParseUsage(ChatCompletions, body)
		runtime.ReadMemStats(&after)
		if err == nil {
			t.Errorf("a count of %s: no error", v)
		}
		if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
			t.Errorf("a count of %s allocated %d bytes to be refused", v, n)
		}
	}
	// A million digits: a decimal's parse is quadratic in them (1.5 s,
	// where refusing a count of that size that is no number takes tens of
	// milliseconds). The bound is that refusal's time four times over: the
	// race detector and a loaded machine slow both alike.
	digits := strings.Repeat("7", 1e6)
	start := time.Now()
	if _, err := ParseUsage(ChatCompletions, []byte(`{"usage":{"prompt_tokens":9,"completion_tokens":"`+strings.Repeat("x", 1e6)+`"}}`)); err == nil {
		t.Fatal("a count of a million x: no error")
	}
	bound := 4*time.Since(start) + 50*time.Millisecond
	for _, v := range []string{digits, `"` + digits + `"`, "1." + strings.Repeat("0", 1e6)} {
		start := time.Now()
		_, err := ParseUsage(ChatCompletions, []byte(`{"usage":{"prompt_tokens":9,"completion_tokens":`+v+`}}`))
		if d := time.Since(start); err == nil || d > bound {
			t.Errorf("a count of %d bytes: %v after %v, want an error within %v (four times a count of no number's)", len(v), err, d, bound)
		}
	}
}

// errAny stands for any error in TestUsageReportForms.
var errAny = wrongType("any")

// TestStreamReportKeepsDearerRates: an Anthropic message_delta that
// restates the geography or the speed as the standard one after
// message_start reported a dearer one takes nothing off it.
func TestStreamReportKeepsDearerRates(t *testing.T) {
	e := estimatorWith(t, Config{})
	m := e.NewStreamMeter(AnthropicMessages, "claude-opus-4-6")
	m.Write([]byte("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-opus-4-6\",\"usage\":{\"input_tokens\":10,\"output_tokens\":1,\"inference_geo\":\"us\",\"speed\":\"fast\"}}}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":300,\"inference_geo\":\"global\",\"speed\":\"standard\"}}\n\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"))
	u, reported := m.Usage()
	if !reported || u.InferenceGeo != "us" || u.Speed != "fast" || u.OutputTokens != 300 {
		t.Errorf("usage %+v (reported %v); want 300 output tokens at geography us and speed fast", u, reported)
	}
}
