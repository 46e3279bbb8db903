package proxy_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/ledger"
)

// stubUpstream is a stub upstream: fn answers every request after the
// request's body has been read into body.
type stubUpstream struct {
	fn func(w http.ResponseWriter, r *http.Request, body []byte)
}

func (u *stubUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	u.fn(w, r, body)
}

// oneEntry sends body to path with acme's key (and the extra headers),
// reads the answer whole, and returns the one settled ledger entry.
func oneEntry(t *testing.T, s *stack, path, body string, hdr map[string]string) (ledger.Entry, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer cg-test-acme")
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	// A transport that does not decompress for us: the client asked for
	// gzip itself when it set Accept-Encoding.
	resp, err := (&http.Transport{DisableCompression: true}).RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	es := s.settled(t, 1)
	return es[0], got
}

// TestAnthropicSeveralMessageDeltasBillTheLast: Anthropic's streaming format is
// "message_start, content blocks, one or more message_delta events,
// message_stop", and message_delta's usage is cumulative: the request is
// billed the last one, not settled at the first.
func TestAnthropicSeveralMessageDeltasBillTheLast(t *testing.T) {
	up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, _ []byte) {
		f := w.(http.Flusher)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"claude-haiku-4-5\",\"usage\":{\"input_tokens\":12,\"output_tokens\":1}}}\n\n")
		fmt.Fprint(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n")
		fmt.Fprint(w, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{},\"usage\":{\"output_tokens\":2}}\n\n")
		f.Flush()
		for range 1000 {
			fmt.Fprint(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" more\"}}\n\n")
		}
		fmt.Fprint(w, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":3000}}\n\n")
		fmt.Fprint(w, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
		f.Flush()
	}}
	s := newStackWith(t, stackOptions{extra: roomyLimits, upstream: up})
	e, _ := oneEntry(t, s, "/v1/messages", `{"model":"claude-haiku-4-5","max_tokens":8000,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
	if e.Actual.OutputTokens != 3000 {
		t.Errorf("charged %d output tokens; the upstream's last (cumulative) message_delta billed 3000", e.Actual.OutputTokens)
	}
}

// TestContinuousUsageStatsBillTheLast: an OpenAI-compatible upstream (vLLM) that
// the client asks for stream_options.continuous_usage_stats puts the
// cumulative usage in every chunk. costgate keeps the client's other stream
// options; the request is billed the last report, not settled at the
// first chunk that carries one (which left the rest of the answer free).
func TestContinuousUsageStatsBillTheLast(t *testing.T) {
	up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, body []byte) {
		var req struct {
			StreamOptions struct {
				IncludeUsage    bool `json:"include_usage"`
				ContinuousUsage bool `json:"continuous_usage_stats"`
			} `json:"stream_options"`
		}
		json.Unmarshal(body, &req)
		w.Header().Set("Content-Type", "text/event-stream")
		const n = 1000
		for i := 1; i <= n; i++ {
			usage := ""
			if req.StreamOptions.IncludeUsage && req.StreamOptions.ContinuousUsage {
				usage = fmt.Sprintf(`,"usage":{"prompt_tokens":10,"completion_tokens":%d,"total_tokens":%d}`, i, 10+i)
			}
			fmt.Fprintf(w, `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":" word"}}]%s}`+"\n\n", usage)
		}
		if req.StreamOptions.IncludeUsage {
			fmt.Fprintf(w, `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":%d,"total_tokens":%d}}`+"\n\n", n, 10+n)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}}
	s := newStackWith(t, stackOptions{extra: roomyLimits, upstream: up})
	e, _ := oneEntry(t, s, "/v1/chat/completions", `{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true},"messages":[{"role":"user","content":"hi"}]}`, nil)
	if e.Actual.OutputTokens != 1000 {
		t.Errorf("charged %d output tokens; the upstream billed 1000", e.Actual.OutputTokens)
	}
}

// gzipIfAsked answers like a server that compresses when the client
// accepts it.
func gzipIfAsked(w http.ResponseWriter, r *http.Request, contentType string, body []byte) {
	w.Header().Set("Content-Type", contentType)
	if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		w.Write(body)
		return
	}
	w.Header().Set("Content-Encoding", "gzip")
	zw := gzip.NewWriter(w)
	zw.Write(body)
	zw.Close()
}

// TestClientGzipDoesNotHideUsage: a client's Accept-Encoding: gzip does
// not reach the upstream (which would compress what costgate meters, so
// that it found no usage): the stream and the plain answer are billed
// what the upstream reported.
func TestClientGzipDoesNotHideUsage(t *testing.T) {
	var stream bytes.Buffer
	for range 100 {
		stream.WriteString(`data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":" word"}}]}` + "\n\n")
	}
	stream.WriteString(`data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":4000,"completion_tokens_details":{"reasoning_tokens":3900}}}` + "\n\n")
	stream.WriteString("data: [DONE]\n\n")
	plain := []byte(`{"id":"c","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":4000,"completion_tokens_details":{"reasoning_tokens":3900}}}`)
	up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, body []byte) {
		if bytes.Contains(body, []byte(`"stream":true`)) {
			gzipIfAsked(w, r, "text/event-stream", stream.Bytes())
			return
		}
		gzipIfAsked(w, r, "application/json", plain)
	}}
	for _, c := range []struct{ name, costs, body string }{
		{"stream", "", `{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":8000,"messages":[{"role":"user","content":"hi"}]}`},
		{"plain", "", `{"model":"gpt-4o-mini","max_completion_tokens":8000,"messages":[{"role":"user","content":"hi"}]}`},
		{"plain-reserve-10", "\ncosts:\n  output_reserve: 10\n", `{"model":"gpt-4o-mini","max_completion_tokens":8000,"messages":[{"role":"user","content":"hi"}]}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newStackWith(t, stackOptions{extra: c.costs + roomyLimits, upstream: up})
			e, got := oneEntry(t, s, "/v1/chat/completions", c.body, map[string]string{"Accept-Encoding": "gzip"})
			t.Logf("client got %d bytes (gzip magic: %v)", len(got), bytes.HasPrefix(got, []byte{0x1f, 0x8b}))
			if e.Actual.OutputTokens != 4000 || e.Actual.InputTokens != 10 {
				t.Errorf("charged %d input / %d output tokens; the upstream billed 10 / 4000", e.Actual.InputTokens, e.Actual.OutputTokens)
			}
			want := estimator(t).Cost("gpt-4o-mini", costmodel.Usage{InputTokens: 10, OutputTokens: 4000, ReasoningTokens: 3900})
			if e.ActualCost < want {
				t.Errorf("charged %v; the upstream billed %v", e.ActualCost, want)
			}
		})
	}
}

var _ = context.Background

// TestGuardChecksPastRunningUsage: with the stream guard on and a
// budget worth about 150 output tokens, a stream whose first chunk carries
// a (cumulative, continuous_usage_stats) usage object is still stopped at
// the budget: a running total is not the end of the stream (the guard
// took any usage for it, and let thousands of tokens through).
func TestGuardChecksPastRunningUsage(t *testing.T) {
	const n = 3000
	up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		for i := 1; i <= n; i++ {
			fmt.Fprintf(w, `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":" word"}}],"usage":{"prompt_tokens":10,"completion_tokens":%d,"total_tokens":%d}}`+"\n\n", i, 10+i)
			if i == 1 {
				f.Flush()
			}
		}
		fmt.Fprintf(w, `data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":%d,"total_tokens":%d}}`+"\n\n", n, 10+n)
		fmt.Fprint(w, "data: [DONE]\n\n")
	}}
	s := newStackWith(t, stackOptions{policies: allowAll, extra: guardConfig("0.0001", 16), upstream: up})
	e, got := oneEntry(t, s, "/v1/chat/completions", `{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true},"max_completion_tokens":5000,"messages":[{"role":"user","content":"hi"}]}`, nil)
	shown := int64(bytes.Count(got, []byte(`" word"`)))
	est := estimator(t)
	budget := costmodel.NanoUSD(100_000)
	bound := est.Cost("gpt-4o-mini", costmodel.Usage{OutputTokens: 16})
	t.Logf("client got %d content chunks; ledger: %d output tokens, %v", shown, e.Actual.OutputTokens, e.ActualCost)
	if served := est.Cost("gpt-4o-mini", costmodel.Usage{InputTokens: 10, OutputTokens: shown}); served > budget+bound {
		t.Errorf("the client was served %d output tokens (%v) past a %v budget: the guard did not stop the stream", shown, served, budget)
	}
	if e.Actual.OutputTokens < shown {
		t.Errorf("billed %d output tokens; the client got %d and the upstream billed %d", e.Actual.OutputTokens, shown, n)
	}
}

// TestLargeAnswerChargedItsOutputLimit: a plain answer larger than 8 MiB
// (logprobs with top_logprobs: 20 inflate an answer about 300-fold) is
// passed on before its usage, at its end, can be read: it is charged the
// request's output limit (4000, what the upstream billed here), not the
// reserve, which with output_reserve 10 holds a tenth of it.
func TestLargeAnswerChargedItsOutputLimit(t *testing.T) {
	up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/json")
		var b bytes.Buffer
		b.WriteString(`{"id":"c","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"logprobs":{"content":[`)
		for i := 0; b.Len() < 9<<20; i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`{"token":" word","logprob":-0.1,"top_logprobs":[{"token":" word","logprob":-0.1},{"token":" other","logprob":-2.3}]}`)
		}
		b.WriteString(`]},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":4000}}`)
		w.Write(b.Bytes())
	}}
	s := newStackWith(t, stackOptions{extra: "\ncosts:\n  output_reserve: 10\n" + roomyLimits, upstream: up})
	e, got := oneEntry(t, s, "/v1/chat/completions", `{"model":"gpt-4o-mini","max_completion_tokens":4000,"logprobs":true,"top_logprobs":20,"messages":[{"role":"user","content":"hi"}]}`, nil)
	t.Logf("client got %d bytes", len(got))
	if e.Actual.OutputTokens != 4000 {
		t.Errorf("charged %d output tokens (%v); the upstream billed 4000", e.Actual.OutputTokens, e.ActualCost)
	}
}

// TestHiddenStreamUsageStillBilled: a client that says include_usage
// false still pays the report costgate asked for and never sees it;
// Anthropic cache tokens in message_start are priced.
func TestHiddenStreamUsageStillBilled(t *testing.T) {
	up := &stubUpstream{fn: func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		if r.URL.Path == "/v1/messages" {
			fmt.Fprint(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"claude-haiku-4-5\",\"usage\":{\"input_tokens\":12,\"cache_creation_input_tokens\":3000,\"cache_read_input_tokens\":50000,\"output_tokens\":1}}}\n\n")
			fmt.Fprint(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n")
			fmt.Fprint(w, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":700}}\n\n")
			fmt.Fprint(w, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
			return
		}
		inc := bytes.Contains(body, []byte(`"include_usage":true`))
		nul := ""
		if inc {
			nul = `,"usage":null`
		}
		fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]%s}\r\n\r\n", nul)
		if inc {
			fmt.Fprint(w, "data:{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-4o-mini\",\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":4000}}\r\n\r\n")
		}
		fmt.Fprint(w, "data: [DONE]\r\n\r\n")
	}}
	t.Run("include_usage-false", func(t *testing.T) {
		s := newStackWith(t, stackOptions{extra: roomyLimits, upstream: up})
		e, got := oneEntry(t, s, "/v1/chat/completions", `{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":false},"messages":[{"role":"user","content":"hi"}]}`, nil)
		if e.Actual.OutputTokens != 4000 || bytes.Contains(got, []byte("usage")) {
			t.Errorf("charged %+v; client got %q", e.Actual, got)
		}
	})
	t.Run("anthropic-cache", func(t *testing.T) {
		s := newStackWith(t, stackOptions{extra: roomyLimits, upstream: up})
		e, _ := oneEntry(t, s, "/v1/messages", `{"model":"claude-haiku-4-5","max_tokens":1000,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
		want := costmodel.Usage{InputTokens: 53012, CachedInputTokens: 50000, CacheWriteTokens: 3000, OutputTokens: 700}
		if e.Actual != want || e.ActualCost != estimator(t).Cost("claude-haiku-4-5", want) {
			t.Errorf("charged %+v %v; want %+v", e.Actual, e.ActualCost, want)
		}
	})
}
