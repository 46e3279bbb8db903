package simulator_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go"
	anthropicoption "github.com/anthropics/anthropic-sdk-go/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/costgate/costgate/costmodel"
	"github.com/costgate/costgate/simulator"
)

// defaultReplyTokens is the reply length of a request that sets no maximum
// when Config.ReplyTokens is zero.
const defaultReplyTokens = 48

// upstream is the simulator on loopback. It keeps the body of every request
// it was sent, so that a test can estimate exactly what an SDK sent.
type upstream struct {
	url string
	est *costmodel.Estimator

	mu     sync.Mutex
	bodies [][]byte
}

func newEstimator(t *testing.T) *costmodel.Estimator {
	t.Helper()
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return est
}

// newUpstream serves a simulator with cfg; cfg.Estimator is set for it.
func newUpstream(t *testing.T, cfg simulator.Config) *upstream {
	t.Helper()
	u := &upstream{est: newEstimator(t)}
	cfg.Estimator = u.est
	sim := simulator.New(cfg)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		u.mu.Lock()
		u.bodies = append(u.bodies, b)
		u.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(b))
		sim.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	u.url = ts.URL
	return u
}

// lastBody is the body of the last request served.
func (u *upstream) lastBody(t *testing.T) []byte {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.bodies) == 0 {
		t.Fatal("the simulator was sent no request")
	}
	return u.bodies[len(u.bodies)-1]
}

func (u *upstream) openai() openai.Client {
	return openai.NewClient(option.WithBaseURL(u.url+"/v1/"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0))
}

func (u *upstream) anthropic() anthropic.Client {
	return anthropic.NewClient(anthropicoption.WithBaseURL(u.url+"/"), anthropicoption.WithAPIKey("sk-ant-test"), anthropicoption.WithMaxRetries(0))
}

// post sends body to path and returns the status and the whole answer.
func (u *upstream) post(t *testing.T, path, body string) (int, []byte) {
	t.Helper()
	resp, err := http.Post(u.url+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// reply is what a client read from one answer.
type reply struct {
	text    string
	in, out int64 // the usage the answer reported
}

// TestUsageMatchesEstimate drives every API, plain and streaming, with the
// official SDKs and checks the usage reported against costmodel: the input
// equals the estimate of the exact body sent, the output is the count of the
// text returned and within the request's maximum, and the same request gets
// the same answer.
func TestUsageMatchesEstimate(t *testing.T) {
	type call func(ctx context.Context, u *upstream, model string, max int64) (reply, error)

	chat := func(ctx context.Context, u *upstream, model string, max int64) (reply, error) {
		c := u.openai()
		p := openai.ChatCompletionNewParams{
			Model: model,
			Messages: []openai.ChatCompletionMessageParamUnion{
				openai.SystemMessage("You answer briefly."),
				openai.UserMessage("What does a token cost?"),
			},
		}
		if max > 0 {
			p.MaxTokens = openai.Int(max)
		}
		r, err := c.Chat.Completions.New(ctx, p)
		if err != nil {
			return reply{}, err
		}
		if len(r.Choices) != 1 {
			return reply{}, errors.New("want one choice")
		}
		return reply{r.Choices[0].Message.Content, r.Usage.PromptTokens, r.Usage.CompletionTokens}, nil
	}
	chatMaxCompletion := func(ctx context.Context, u *upstream, model string, max int64) (reply, error) {
		c := u.openai()
		r, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:               model,
			Messages:            []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Count to ten.")},
			MaxCompletionTokens: openai.Int(max),
		})
		if err != nil {
			return reply{}, err
		}
		return reply{r.Choices[0].Message.Content, r.Usage.PromptTokens, r.Usage.CompletionTokens}, nil
	}
	chatStream := func(ctx context.Context, u *upstream, model string, max int64) (reply, error) {
		c := u.openai()
		s := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
			Model:         model,
			Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Stream me an answer.")},
			MaxTokens:     openai.Int(max),
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
		})
		defer s.Close()
		var acc openai.ChatCompletionAccumulator
		for s.Next() {
			acc.AddChunk(s.Current())
		}
		if err := s.Err(); err != nil {
			return reply{}, err
		}
		if len(acc.Choices) != 1 {
			return reply{}, errors.New("want one choice")
		}
		return reply{acc.Choices[0].Message.Content, acc.Usage.PromptTokens, acc.Usage.CompletionTokens}, nil
	}
	completion := func(ctx context.Context, u *upstream, model string, max int64) (reply, error) {
		c := u.openai()
		r, err := c.Completions.New(ctx, openai.CompletionNewParams{
			Model:     openai.CompletionNewParamsModel(model),
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
			MaxTokens: openai.Int(max),
		})
		if err != nil {
			return reply{}, err
		}
		return reply{r.Choices[0].Text, r.Usage.PromptTokens, r.Usage.CompletionTokens}, nil
	}
	completionStream := func(ctx context.Context, u *upstream, model string, max int64) (reply, error) {
		c := u.openai()
		s := c.Completions.NewStreaming(ctx, openai.CompletionNewParams{
			Model:         openai.CompletionNewParamsModel(model),
			Prompt:        openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a stream")},
			MaxTokens:     openai.Int(max),
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
		})
		defer s.Close()
		var r reply
		for s.Next() {
			ch := s.Current()
			for _, c := range ch.Choices {
				r.text += c.Text
			}
			if ch.Usage.PromptTokens != 0 || ch.Usage.CompletionTokens != 0 {
				r.in, r.out = ch.Usage.PromptTokens, ch.Usage.CompletionTokens
			}
		}
		return r, s.Err()
	}
	embedding := func(ctx context.Context, u *upstream, model string, _ int64) (reply, error) {
		c := u.openai()
		r, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{
			Model: model,
			Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"first document", "second, longer document"}},
		})
		if err != nil {
			return reply{}, err
		}
		if len(r.Data) == 0 || len(r.Data[0].Embedding) == 0 {
			return reply{}, errors.New("no embedding")
		}
		return reply{in: r.Usage.PromptTokens}, nil
	}
	response := func(ctx context.Context, u *upstream, model string, max int64) (reply, error) {
		c := u.openai()
		r, err := c.Responses.New(ctx, responses.ResponseNewParams{
			Model:           model,
			Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("Explain rate limits.")},
			MaxOutputTokens: openai.Int(max),
		})
		if err != nil {
			return reply{}, err
		}
		return reply{r.OutputText(), r.Usage.InputTokens, r.Usage.OutputTokens}, nil
	}
	responseStream := func(ctx context.Context, u *upstream, model string, max int64) (reply, error) {
		c := u.openai()
		s := c.Responses.NewStreaming(ctx, responses.ResponseNewParams{
			Model:           model,
			Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("Explain streaming.")},
			MaxOutputTokens: openai.Int(max),
		})
		defer s.Close()
		var r reply
		completed := false
		for s.Next() {
			ev := s.Current()
			switch ev.Type {
			case "response.output_text.delta":
				r.text += ev.Delta
			case "response.completed":
				completed = true
				r.in, r.out = ev.Response.Usage.InputTokens, ev.Response.Usage.OutputTokens
				if got := ev.Response.OutputText(); got != r.text {
					return reply{}, errors.New("response.completed text " + got + " differs from the deltas " + r.text)
				}
			}
		}
		if err := s.Err(); err != nil {
			return reply{}, err
		}
		if !completed {
			return reply{}, errors.New("no response.completed event")
		}
		return r, nil
	}
	message := func(ctx context.Context, u *upstream, model string, max int64) (reply, error) {
		c := u.anthropic()
		m, err := c.Messages.New(ctx, anthropic.MessageNewParams{
			Model:     anthropic.Model(model),
			MaxTokens: max,
			System:    []anthropic.TextBlockParam{{Text: "You answer briefly."}},
			Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("What does a token cost?"))},
		})
		if err != nil {
			return reply{}, err
		}
		var text string
		for _, b := range m.Content {
			text += b.Text
		}
		return reply{text, m.Usage.InputTokens, m.Usage.OutputTokens}, nil
	}
	messageStream := func(ctx context.Context, u *upstream, model string, max int64) (reply, error) {
		c := u.anthropic()
		s := c.Messages.NewStreaming(ctx, anthropic.MessageNewParams{
			Model:     anthropic.Model(model),
			MaxTokens: max,
			Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Stream me an answer."))},
		})
		defer s.Close()
		var m anthropic.Message
		for s.Next() {
			if err := m.Accumulate(s.Current()); err != nil {
				return reply{}, err
			}
		}
		if err := s.Err(); err != nil {
			return reply{}, err
		}
		var text string
		for _, b := range m.Content {
			text += b.Text
		}
		return reply{text, m.Usage.InputTokens, m.Usage.OutputTokens}, nil
	}

	tests := []struct {
		name  string
		kind  costmodel.Kind
		model string
		max   int64 // 0: the request sets no maximum
		call  call
	}{
		{"chat", costmodel.ChatCompletions, "gpt-4o-mini", 16, chat},
		{"chat without max_tokens", costmodel.ChatCompletions, "gpt-4o", 0, chat},
		{"chat with max_completion_tokens", costmodel.ChatCompletions, "gpt-4.1-mini", 5, chatMaxCompletion},
		{"chat cl100k model", costmodel.ChatCompletions, "gpt-4", 12, chat},
		{"chat stream", costmodel.ChatCompletions, "gpt-4o-mini", 20, chatStream},
		{"completions", costmodel.Completions, "gpt-3.5-turbo-instruct", 10, completion},
		{"completions stream", costmodel.Completions, "gpt-3.5-turbo-instruct", 7, completionStream},
		{"embeddings", costmodel.Embeddings, "text-embedding-3-small", 0, embedding},
		{"responses", costmodel.Responses, "gpt-4o-mini", 16, response},
		{"responses stream", costmodel.Responses, "gpt-4o-mini", 9, responseStream},
		{"anthropic messages", costmodel.AnthropicMessages, "claude-haiku-4-5", 24, message},
		{"anthropic messages stream", costmodel.AnthropicMessages, "claude-sonnet-4-5", 11, messageStream},
	}
	u := newUpstream(t, simulator.Config{})
	ctx := t.Context()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.call(ctx, u, tt.model, tt.max)
			if err != nil {
				t.Fatal(err)
			}
			body := u.lastBody(t)
			est, err := u.est.Estimate(tt.kind, body)
			if err != nil {
				t.Fatalf("estimate of the body sent: %v\n%s", err, body)
			}
			if got.in != est.Usage.InputTokens {
				t.Errorf("input tokens reported %d, the estimate of the body counts %d\nbody: %s", got.in, est.Usage.InputTokens, body)
			}
			if tt.kind == costmodel.Embeddings {
				if got.out != 0 || got.text != "" {
					t.Errorf("embeddings reply %+v, want no output", got)
				}
			} else {
				if got.text == "" {
					t.Fatal("empty reply")
				}
				if want := u.est.CountText(tt.model, got.text); got.out != want {
					t.Errorf("output tokens reported %d, the reply %q counts %d", got.out, got.text, want)
				}
				limit := tt.max
				if limit == 0 {
					limit = defaultReplyTokens
				}
				if got.out > limit {
					t.Errorf("output tokens %d exceed the maximum %d", got.out, limit)
				}
			}

			again, err := tt.call(ctx, u, tt.model, tt.max)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(u.lastBody(t), body) {
				t.Fatalf("the SDK sent a different body the second time:\n%s\n%s", body, u.lastBody(t))
			}
			if again != got {
				t.Errorf("the same request got %+v, then %+v", got, again)
			}
		})
	}
}

// TestReplyTokens checks that Config.ReplyTokens bounds a reply that sets
// no maximum, and that a request's smaller maximum wins over it.
func TestReplyTokens(t *testing.T) {
	tests := []struct {
		name        string
		replyTokens int
		body        string
		want        int64
	}{
		{"config bound", 5, `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`, 5},
		{"request bound below config", 30, `{"model":"gpt-4o-mini","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`, 3},
		{"config bound below request", 4, `{"model":"gpt-4o-mini","max_tokens":30,"messages":[{"role":"user","content":"hi"}]}`, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := newUpstream(t, simulator.Config{ReplyTokens: tt.replyTokens})
			status, b := u.post(t, "/v1/chat/completions", tt.body)
			if status != http.StatusOK {
				t.Fatalf("status %d: %s", status, b)
			}
			var r struct {
				Usage struct {
					CompletionTokens int64 `json:"completion_tokens"`
				} `json:"usage"`
			}
			if err := json.Unmarshal(b, &r); err != nil {
				t.Fatal(err)
			}
			if r.Usage.CompletionTokens != tt.want {
				t.Errorf("completion tokens %d, want %d", r.Usage.CompletionTokens, tt.want)
			}
		})
	}
}

// TestDeterministic checks that the same body gets byte for byte the same
// answer, plain and streamed, and that a different body gets another one.
func TestDeterministic(t *testing.T) {
	tests := []struct {
		name, path, body, other string
	}{
		{"chat", "/v1/chat/completions",
			`{"model":"gpt-4o-mini","max_tokens":12,"messages":[{"role":"user","content":"one"}]}`,
			`{"model":"gpt-4o-mini","max_tokens":12,"messages":[{"role":"user","content":"two"}]}`},
		{"chat stream", "/v1/chat/completions",
			`{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"max_tokens":12,"messages":[{"role":"user","content":"one"}]}`,
			`{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"max_tokens":12,"messages":[{"role":"user","content":"two"}]}`},
		{"completions", "/v1/completions",
			`{"model":"gpt-3.5-turbo-instruct","max_tokens":12,"prompt":"one"}`,
			`{"model":"gpt-3.5-turbo-instruct","max_tokens":12,"prompt":"two"}`},
		{"embeddings", "/v1/embeddings",
			`{"model":"text-embedding-3-small","input":"one"}`,
			`{"model":"text-embedding-3-small","input":"two"}`},
		{"responses stream", "/v1/responses",
			`{"model":"gpt-4o-mini","stream":true,"max_output_tokens":12,"input":"one"}`,
			`{"model":"gpt-4o-mini","stream":true,"max_output_tokens":12,"input":"two"}`},
		{"anthropic", "/v1/messages",
			`{"model":"claude-haiku-4-5","max_tokens":12,"messages":[{"role":"user","content":"one"}]}`,
			`{"model":"claude-haiku-4-5","max_tokens":12,"messages":[{"role":"user","content":"two"}]}`},
		{"anthropic stream", "/v1/messages",
			`{"model":"claude-haiku-4-5","stream":true,"max_tokens":12,"messages":[{"role":"user","content":"one"}]}`,
			`{"model":"claude-haiku-4-5","stream":true,"max_tokens":12,"messages":[{"role":"user","content":"two"}]}`},
	}
	u := newUpstream(t, simulator.Config{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s1, first := u.post(t, tt.path, tt.body)
			s2, second := u.post(t, tt.path, tt.body)
			s3, other := u.post(t, tt.path, tt.other)
			if s1 != http.StatusOK || s2 != http.StatusOK || s3 != http.StatusOK {
				t.Fatalf("statuses %d %d %d: %s", s1, s2, s3, first)
			}
			if !bytes.Equal(first, second) {
				t.Errorf("the same body got two answers:\n%s\n%s", first, second)
			}
			if bytes.Equal(first, other) {
				t.Errorf("different bodies got the same answer:\n%s", first)
			}
		})
	}
}

// event is one server-sent event.
type event struct {
	name string
	data string
}

// readEvents splits an SSE body into its events.
func readEvents(t *testing.T, b []byte) []event {
	t.Helper()
	var evs []event
	var cur event
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur != (event{}) {
				evs = append(evs, cur)
			}
			cur = event{}
		case strings.HasPrefix(line, "event: "):
			cur.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			cur.data += strings.TrimPrefix(line, "data: ")
		default:
			t.Fatalf("unexpected SSE line %q", line)
		}
	}
	if cur != (event{}) {
		t.Fatalf("stream ends inside an event: %+v", cur)
	}
	return evs
}

// TestOpenAIStreamUsage checks the OpenAI stream's usage chunk: sent only
// when stream_options.include_usage is true, last before data: [DONE], with
// no choices and the exact usage.
func TestOpenAIStreamUsage(t *testing.T) {
	tests := []struct {
		name      string
		kind      costmodel.Kind
		path      string
		body      string
		wantUsage bool
	}{
		{"chat include_usage true", costmodel.ChatCompletions, "/v1/chat/completions",
			`{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"max_tokens":9,"messages":[{"role":"user","content":"hello"}]}`, true},
		{"chat include_usage false", costmodel.ChatCompletions, "/v1/chat/completions",
			`{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":false},"max_tokens":9,"messages":[{"role":"user","content":"hello"}]}`, false},
		{"chat no stream_options", costmodel.ChatCompletions, "/v1/chat/completions",
			`{"model":"gpt-4o-mini","stream":true,"max_tokens":9,"messages":[{"role":"user","content":"hello"}]}`, false},
		{"completions include_usage true", costmodel.Completions, "/v1/completions",
			`{"model":"gpt-3.5-turbo-instruct","stream":true,"stream_options":{"include_usage":true},"max_tokens":6,"prompt":"hello"}`, true},
		{"completions no stream_options", costmodel.Completions, "/v1/completions",
			`{"model":"gpt-3.5-turbo-instruct","stream":true,"max_tokens":6,"prompt":"hello"}`, false},
	}
	u := newUpstream(t, simulator.Config{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, b := u.post(t, tt.path, tt.body)
			if status != http.StatusOK {
				t.Fatalf("status %d: %s", status, b)
			}
			if !bytes.HasSuffix(b, []byte("data: [DONE]\n\n")) {
				t.Fatalf("the stream does not end with data: [DONE]:\n%s", b)
			}
			evs := readEvents(t, b)
			if n := len(evs); n < 2 || evs[n-1].data != "[DONE]" {
				t.Fatalf("events %+v", evs)
			}
			type chunk struct {
				Choices []struct {
					Text  string `json:"text"`
					Delta struct {
						Content string `json:"content"`
					} `json:"delta"`
				} `json:"choices"`
				Usage *struct {
					PromptTokens     int64 `json:"prompt_tokens"`
					CompletionTokens int64 `json:"completion_tokens"`
					TotalTokens      int64 `json:"total_tokens"`
				} `json:"usage"`
			}
			var text string
			var usage *chunk
			usageAt, usages := -1, 0
			evs = evs[:len(evs)-1]
			for i, ev := range evs {
				var c chunk
				if err := json.Unmarshal([]byte(ev.data), &c); err != nil {
					t.Fatalf("event %d: %v: %s", i, err, ev.data)
				}
				for _, ch := range c.Choices {
					text += ch.Text + ch.Delta.Content
				}
				if c.Usage != nil {
					usage, usageAt = &c, i
					usages++
				}
			}
			if usage != nil {
				if len(usage.Choices) != 0 {
					t.Errorf("the usage chunk has choices: %s", evs[usageAt].data)
				}
				est, err := u.est.Estimate(tt.kind, []byte(tt.body))
				if err != nil {
					t.Fatal(err)
				}
				got := usage.Usage
				if got.PromptTokens != est.Usage.InputTokens {
					t.Errorf("prompt tokens %d, estimate %d", got.PromptTokens, est.Usage.InputTokens)
				}
				if want := u.est.CountText(est.Model, text); got.CompletionTokens != want || got.CompletionTokens > est.MaxOutputTokens {
					t.Errorf("completion tokens %d, the streamed text %q counts %d, maximum %d", got.CompletionTokens, text, want, est.MaxOutputTokens)
				}
				if got.TotalTokens != got.PromptTokens+got.CompletionTokens {
					t.Errorf("total tokens %d != %d + %d", got.TotalTokens, got.PromptTokens, got.CompletionTokens)
				}
			}
			if text == "" {
				t.Error("the stream carried no text")
			}
			switch {
			case !tt.wantUsage && usages != 0:
				t.Errorf("%d usage chunks, want none", usages)
			case tt.wantUsage && usages != 1:
				t.Errorf("%d usage chunks, want one", usages)
			case tt.wantUsage && usageAt != len(evs)-1:
				t.Errorf("the usage chunk is event %d of %d, want the last before [DONE]", usageAt, len(evs))
			}
		})
	}
}

// TestAnthropicStreamUsage checks that an Anthropic stream states its input
// in message_start and its output in message_delta, in the API's order of
// events.
func TestAnthropicStreamUsage(t *testing.T) {
	const body = `{"model":"claude-haiku-4-5","stream":true,"max_tokens":10,"system":"Be brief.","messages":[{"role":"user","content":"hello there"}]}`
	u := newUpstream(t, simulator.Config{})
	status, b := u.post(t, "/v1/messages", body)
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, b)
	}
	est, err := u.est.Estimate(costmodel.AnthropicMessages, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	evs := readEvents(t, b)
	var names []string
	var text string
	var in, out int64 = -1, -1
	for _, ev := range evs {
		names = append(names, ev.name)
		var e struct {
			Type    string `json:"type"`
			Message struct {
				Usage struct {
					InputTokens int64 `json:"input_tokens"`
				} `json:"usage"`
			} `json:"message"`
			Delta struct {
				Text string `json:"text"`
			} `json:"delta"`
			Usage struct {
				OutputTokens int64 `json:"output_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(ev.data), &e); err != nil {
			t.Fatalf("%s: %v", ev.name, err)
		}
		if e.Type != ev.name {
			t.Errorf("event %q carries type %q", ev.name, e.Type)
		}
		switch ev.name {
		case "message_start":
			in = e.Message.Usage.InputTokens
		case "content_block_delta":
			text += e.Delta.Text
		case "message_delta":
			out = e.Usage.OutputTokens
		}
	}
	if len(names) < 5 || names[0] != "message_start" || names[1] != "content_block_start" ||
		names[len(names)-3] != "content_block_stop" || names[len(names)-2] != "message_delta" || names[len(names)-1] != "message_stop" {
		t.Errorf("events in order %v", names)
	}
	if in != est.Usage.InputTokens {
		t.Errorf("message_start input_tokens %d, estimate %d", in, est.Usage.InputTokens)
	}
	if want := u.est.CountText("claude-haiku-4-5", text); out != want || out > 10 || out <= 0 {
		t.Errorf("message_delta output_tokens %d, the text %q counts %d, maximum 10", out, text, want)
	}
}

// apiError is an error body of either API: Anthropic's has type "error".
type apiError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// checkError checks an error answer's status and that its body has the
// shape of the API of path, with error.type wantType (empty: any type).
func checkError(t *testing.T, path string, status int, b []byte, wantStatus int, wantType string) {
	t.Helper()
	if status != wantStatus {
		t.Fatalf("status %d, want %d: %s", status, wantStatus, b)
	}
	var e apiError
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("error body is not JSON: %v: %s", err, b)
	}
	wantTop := ""
	if path == "/v1/messages" {
		wantTop = "error"
	}
	if e.Type != wantTop || e.Error.Type == "" || (wantType != "" && e.Error.Type != wantType) || e.Error.Message == "" {
		t.Errorf("error body %s, want type %q and error.type %q with a message", b, wantTop, wantType)
	}
}

var requests = []struct{ name, path, body string }{
	{"chat", "/v1/chat/completions", `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`},
	{"chat stream", "/v1/chat/completions", `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}`},
	{"completions", "/v1/completions", `{"model":"gpt-3.5-turbo-instruct","prompt":"hi"}`},
	{"embeddings", "/v1/embeddings", `{"model":"text-embedding-3-small","input":"hi"}`},
	{"responses", "/v1/responses", `{"model":"gpt-4o-mini","input":"hi"}`},
	{"anthropic", "/v1/messages", `{"model":"claude-haiku-4-5","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`},
	{"anthropic stream", "/v1/messages", `{"model":"claude-haiku-4-5","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`},
}

// TestErrorRate checks that ErrorRate 1 fails every request with a 500 in
// the shape of the API's error body.
func TestErrorRate(t *testing.T) {
	u := newUpstream(t, simulator.Config{ErrorRate: 1})
	for _, tt := range requests {
		t.Run(tt.name, func(t *testing.T) {
			status, b := u.post(t, tt.path, tt.body)
			// Anthropic's error types differ from OpenAI's; only the
			// shape of its error is checked here.
			wantType := "server_error"
			if tt.path == "/v1/messages" {
				wantType = ""
			}
			checkError(t, tt.path, status, b, http.StatusInternalServerError, wantType)
		})
	}
	t.Run("openai sdk", func(t *testing.T) {
		c := u.openai()
		_, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
			Model: "gpt-4o-mini", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		})
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusInternalServerError || apiErr.Type != "server_error" {
			t.Errorf("want an *openai.Error 500 server_error, got %v", err)
		}
	})
	t.Run("anthropic sdk", func(t *testing.T) {
		c := u.anthropic()
		_, err := c.Messages.New(t.Context(), anthropic.MessageNewParams{
			Model: "claude-haiku-4-5", MaxTokens: 5,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))},
		})
		var apiErr *anthropic.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusInternalServerError {
			t.Errorf("want an *anthropic.Error 500, got %v", err)
		}
	})
}

// TestErrorRateSeed checks that a fractional ErrorRate fails some requests
// and not others, and the same sequence for the same seed.
func TestErrorRateSeed(t *testing.T) {
	statuses := func(seed uint64) []int {
		u := newUpstream(t, simulator.Config{ErrorRate: 0.5, Seed: seed})
		var got []int
		for range 24 {
			status, _ := u.post(t, requests[0].path, requests[0].body)
			got = append(got, status)
		}
		return got
	}
	a, b := statuses(7), statuses(7)
	var failed int
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("seed 7 gave two sequences:\n%v\n%v", a, b)
		}
		if a[i] == http.StatusInternalServerError {
			failed++
		}
	}
	if failed == 0 || failed == len(a) {
		t.Errorf("error rate 0.5 failed %d of %d requests", failed, len(a))
	}
}

// TestMalformed checks that a body that is not valid JSON, or has a field
// of the wrong type, is a 400 in the API's error shape.
func TestMalformed(t *testing.T) {
	bodies := []struct{ name, body string }{
		{"truncated", `{"model":"gpt-4o-mini","messages":[`},
		{"not json", `hello`},
		{"wrong type", `{"model":42}`},
	}
	u := newUpstream(t, simulator.Config{})
	for _, path := range []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/messages"} {
		for _, tt := range bodies {
			t.Run(path+"/"+tt.name, func(t *testing.T) {
				status, b := u.post(t, path, tt.body)
				checkError(t, path, status, b, http.StatusBadRequest, "invalid_request_error")
			})
		}
	}
}

// TestModels checks the model list through the SDK.
func TestModels(t *testing.T) {
	u := newUpstream(t, simulator.Config{})
	c := u.openai()
	page, err := c.Models.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Data) == 0 || page.Data[0].ID == "" {
		t.Errorf("models %+v", page.Data)
	}
}

// TestLatency checks that Latency delays the answer by at least its length.
func TestLatency(t *testing.T) {
	const latency = 60 * time.Millisecond
	u := newUpstream(t, simulator.Config{Latency: latency})
	for _, tt := range []struct{ name, path, body string }{requests[0], requests[1], requests[5]} {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			status, b := u.post(t, tt.path, tt.body)
			if status != http.StatusOK {
				t.Fatalf("status %d: %s", status, b)
			}
			if d := time.Since(start); d < latency {
				t.Errorf("answered in %v, before the latency of %v", d, latency)
			}
		})
	}
}

// TestCancel checks that a client that goes away ends the handler while it
// waits: in the latency before the answer, or between streamed tokens.
func TestCancel(t *testing.T) {
	tests := []struct {
		name string
		cfg  simulator.Config
		body string
		// firstEvent: the client reads the stream's first event before it
		// cancels, so the handler is between tokens.
		firstEvent bool
	}{
		{"latency", simulator.Config{Latency: time.Hour}, requests[0].body, false},
		{"latency stream", simulator.Config{Latency: time.Hour}, requests[1].body, false},
		{"token interval", simulator.Config{TokenInterval: time.Hour},
			`{"model":"claude-haiku-4-5","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Estimator = newEstimator(t)
			sim := simulator.New(tt.cfg)
			entered, done := make(chan struct{}), make(chan struct{})
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				close(entered)
				defer close(done)
				sim.ServeHTTP(w, r)
			}))
			defer ts.Close()
			path := "/v1/chat/completions"
			if strings.Contains(tt.body, "claude") {
				path = "/v1/messages"
			}

			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+path, strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			errc := make(chan error, 1)
			go func() {
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					defer resp.Body.Close()
					if tt.firstEvent {
						line, rerr := bufio.NewReader(resp.Body).ReadString('\n')
						if rerr != nil || line != "event: message_start\n" {
							err = errors.New("first line " + line)
						} else {
							cancel()
						}
					}
					_, err = io.ReadAll(resp.Body)
				}
				errc <- err
			}()
			deadline := time.After(5 * time.Second)
			select {
			case <-entered:
			case <-deadline:
				t.Fatal("the request never reached the simulator")
			}
			if !tt.firstEvent {
				cancel()
			}
			select {
			case err := <-errc:
				if !errors.Is(err, context.Canceled) {
					t.Errorf("client error %v, want context.Canceled", err)
				}
			case <-deadline:
				t.Fatal("the client did not return after it cancelled")
			}
			select {
			case <-done:
			case <-deadline:
				t.Fatal("the simulator's handler still waits after the client went away")
			}
		})
	}
}
