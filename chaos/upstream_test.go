package chaos_test

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/costgate/costgate/costmodel"
)

// bill is what the upstream billed for one request, keyed by the
// X-Request-Id costgate forwarded.
type bill struct {
	ID     string
	Path   string
	Model  string
	Stream bool
	// Usage is what the upstream charges: for an answer served whole, the
	// usage it drew and reported; for a stream cut short, the prompt and the
	// words it wrote before it saw the cut.
	Usage costmodel.Usage
	// Reported is set once the usage report went out in full (the JSON
	// body, or the stream's final usage event).
	Reported bool
	// Cut is set when the stream ended before its end.
	Cut bool
	// Done is set when the handler returned.
	Done bool
}

// upstream is an OpenAI- and Anthropic-compatible server whose answers
// carry usage drawn at random, unlike the simulator whose usage equals the
// estimate. It records, per request id, what it billed, so that each
// ledger entry can be checked against it. It is safe for concurrent use.
//
// Every reply word is one token in o200k_base and cl100k_base, so that a
// stream's text counts as many tokens as words were written.
type upstream struct {
	srv *httptest.Server
	est *costmodel.Estimator

	// tokenInterval is the pause before each streamed word, unless the
	// request has the header X-Chaos-Burst.
	tokenInterval time.Duration
	// tail is how long a stream stays open after its last event ([DONE]
	// or message_stop) before the handler returns, as a real upstream may
	// take to close.
	tail time.Duration
	// hold, when set, is called before the answer; it may block (a slow
	// upstream). It must return when the request's context ends.
	hold func(r *http.Request)

	mu      sync.Mutex
	rng     *rand.Rand
	bills   map[string]*bill
	noID    int
	groups  map[string]*gauge
	traffic atomic.Int64
}

// gauge counts the requests of one X-Chaos-Group in flight at the
// upstream, and the most ever seen at once.
type gauge struct {
	now, max atomic.Int64
}

func (g *gauge) enter() {
	n := g.now.Add(1)
	for {
		m := g.max.Load()
		if n <= m || g.max.CompareAndSwap(m, n) {
			return
		}
	}
}

func (g *gauge) leave() { g.now.Add(-1) }

func newUpstream(t *testing.T, seed uint64) *upstream {
	t.Helper()
	est, err := costmodel.NewEstimator(costmodel.Config{})
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{est: est, rng: rand.New(rand.NewPCG(seed, 0xc4a05)), bills: map[string]*bill{}, groups: map[string]*gauge{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", u.handle(costmodel.ChatCompletions))
	mux.HandleFunc("POST /v1/embeddings", u.handle(costmodel.Embeddings))
	mux.HandleFunc("POST /v1/messages", u.handle(costmodel.AnthropicMessages))
	u.srv = httptest.NewServer(mux)
	t.Cleanup(u.srv.Close)
	return u
}

// group returns the gauge of one X-Chaos-Group.
func (u *upstream) group(name string) *gauge {
	u.mu.Lock()
	defer u.mu.Unlock()
	g := u.groups[name]
	if g == nil {
		g = &gauge{}
		u.groups[name] = g
	}
	return g
}

// snapshot returns a copy of every bill, by request id, and the number of
// requests that came without an X-Request-Id.
func (u *upstream) snapshot() (map[string]bill, int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make(map[string]bill, len(u.bills))
	for k, b := range u.bills {
		out[k] = *b
	}
	return out, u.noID
}

// waitDone waits until every request the upstream received has returned.
func (u *upstream) waitDone(t *testing.T, within time.Duration) {
	t.Helper()
	waitFor(t, within, "the upstream's handlers to return", func() bool {
		u.mu.Lock()
		defer u.mu.Unlock()
		for _, b := range u.bills {
			if !b.Done {
				return false
			}
		}
		return true
	})
}

func (u *upstream) intn(lo, hi int64) int64 {
	if hi <= lo {
		return lo
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	return lo + u.rng.Int64N(hi-lo+1)
}

type upstreamRequest struct {
	Model               string `json:"model"`
	Stream              bool   `json:"stream"`
	MaxTokens           int64  `json:"max_tokens"`
	MaxCompletionTokens int64  `json:"max_completion_tokens"`
	StreamOptions       struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

func (u *upstream) handle(kind costmodel.Kind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		u.traffic.Add(1)
		g := u.group(r.Header.Get("X-Chaos-Group"))
		g.enter()
		defer g.leave()
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		var req upstreamRequest
		if err := json.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		est, err := u.est.Estimate(kind, body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		id := r.Header.Get("X-Request-Id")
		b := &bill{ID: id, Path: r.URL.Path, Model: req.Model, Stream: req.Stream}
		u.mu.Lock()
		if id == "" {
			u.noID++
		} else {
			u.bills[id] = b
		}
		u.mu.Unlock()
		defer func() {
			u.mu.Lock()
			b.Done = true
			u.mu.Unlock()
		}()
		if u.hold != nil {
			u.hold(r)
			if r.Context().Err() != nil {
				return
			}
		}

		// Draw the usage. A stream's prompt is the exact count (the
		// tokenizer of the OpenAI encodings is exact), since a stream cut
		// before its report leaves costgate nothing else to charge it by;
		// every other answer reports a prompt up to 30% off the count.
		exact := est.Usage.InputTokens
		prompt := exact
		if !req.Stream {
			prompt = u.intn(max(1, exact*7/10), exact*13/10+1)
		}
		maxOut := max(req.MaxTokens, req.MaxCompletionTokens)
		if maxOut <= 0 {
			maxOut = 32
		}
		words := u.intn(1, maxOut)
		var use costmodel.Usage
		use.InputTokens = prompt
		switch kind {
		case costmodel.Embeddings:
			words = 0
		case costmodel.AnthropicMessages:
			use.CachedInputTokens = u.intn(0, prompt/2)
			use.CacheWriteTokens = u.intn(0, (prompt-use.CachedInputTokens)/2)
		default:
			use.CachedInputTokens = u.intn(0, prompt)
		}
		use.OutputTokens = words
		if strings.HasPrefix(req.Model, "o") {
			// Reasoning tokens are part of the output and of max_tokens,
			// but never streamed as text.
			use.ReasoningTokens = u.intn(0, maxOut-words)
			use.OutputTokens += use.ReasoningTokens
		}
		id = "up-" + id
		if req.Stream {
			u.stream(w, r, kind, b, req, use, words)
			return
		}
		u.mu.Lock()
		b.Usage = use
		u.mu.Unlock()
		writeJSON(w, answer(kind, id, req.Model, reply(words), use))
		u.mu.Lock()
		b.Reported = r.Context().Err() == nil
		u.mu.Unlock()
	}
}

// stream answers as server-sent events, one word per event, and bills the
// words it wrote until it saw the client go.
func (u *upstream) stream(w http.ResponseWriter, r *http.Request, kind costmodel.Kind, b *bill, req upstreamRequest, use costmodel.Usage, words int64) {
	flusher := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	billed := use
	billed.OutputTokens = use.ReasoningTokens // reasoning comes before the text
	setBill := func(cut bool) {
		u.mu.Lock()
		b.Usage, b.Cut = billed, cut
		u.mu.Unlock()
	}
	setBill(false)
	send := func(event string, v any) bool {
		data, _ := json.Marshal(v)
		if event != "" {
			fmt.Fprintf(w, "event: %s\n", event)
		}
		fmt.Fprintf(w, "data: %s\n\n", data)
		flusher.Flush()
		return r.Context().Err() == nil
	}
	burst := r.Header.Get("X-Chaos-Burst") != "" // no pause between words
	pause := func() bool {
		if u.tokenInterval <= 0 || burst {
			return r.Context().Err() == nil
		}
		tm := time.NewTimer(u.tokenInterval)
		defer tm.Stop()
		select {
		case <-tm.C:
			return true
		case <-r.Context().Done():
			return false
		}
	}
	id := "up-" + b.ID
	if kind == costmodel.AnthropicMessages {
		if !send("message_start", map[string]any{"type": "message_start", "message": map[string]any{
			"id": id, "type": "message", "role": "assistant", "model": req.Model, "content": []any{},
			"usage": anthropicUsage(use, 1)}}) {
			setBill(true)
			return
		}
		send("content_block_start", map[string]any{"type": "content_block_start", "index": 0,
			"content_block": map[string]string{"type": "text", "text": ""}})
	}
	for i := range words {
		if !pause() {
			setBill(true)
			return
		}
		var ok bool
		if kind == costmodel.AnthropicMessages {
			ok = send("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0,
				"delta": map[string]string{"type": "text_delta", "text": word(i)}})
		} else {
			ok = send("", chunk(id, req.Model, word(i), nil))
		}
		// A word handed to the connection is billed, whether or not the
		// client stayed to read it.
		billed.OutputTokens++
		setBill(false)
		if !ok {
			setBill(true)
			return
		}
	}
	if kind == costmodel.AnthropicMessages {
		send("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
		ok := send("message_delta", map[string]any{"type": "message_delta",
			"delta": map[string]any{"stop_reason": "end_turn"}, "usage": map[string]int64{"output_tokens": use.OutputTokens}})
		billed = use
		setBill(!ok)
		if ok && send("message_stop", map[string]any{"type": "message_stop"}) {
			u.mu.Lock()
			b.Reported = true
			u.mu.Unlock()
		}
		u.closeLate(r)
		return
	}
	if !send("", chunk(id, req.Model, "", "stop")) {
		setBill(true)
		return
	}
	billed = use
	setBill(false)
	if !req.StreamOptions.IncludeUsage {
		fmt.Fprint(w, "data: [DONE]\n\n")
		flusher.Flush()
		return
	}
	ok := send("", map[string]any{"id": id, "object": "chat.completion.chunk", "created": 0, "model": req.Model,
		"choices": []any{}, "usage": openaiUsage(use)})
	fmt.Fprint(w, "data: [DONE]\n\n")
	flusher.Flush()
	u.mu.Lock()
	b.Reported = ok && r.Context().Err() == nil
	b.Cut = !b.Reported
	u.mu.Unlock()
	u.closeLate(r)
}

// closeLate waits tail, or until the request ends, before a stream's
// handler returns.
func (u *upstream) closeLate(r *http.Request) {
	if u.tail <= 0 {
		return
	}
	tm := time.NewTimer(u.tail)
	defer tm.Stop()
	select {
	case <-tm.C:
	case <-r.Context().Done():
	}
}

func chunk(id, model, delta string, finish any) map[string]any {
	return map[string]any{"id": id, "object": "chat.completion.chunk", "created": 0, "model": model,
		"choices": []any{map[string]any{"index": 0, "finish_reason": finish, "delta": map[string]string{"content": delta}}}}
}

func openaiUsage(u costmodel.Usage) map[string]any {
	return map[string]any{
		"prompt_tokens": u.InputTokens, "completion_tokens": u.OutputTokens, "total_tokens": u.InputTokens + u.OutputTokens,
		"prompt_tokens_details":     map[string]int64{"cached_tokens": u.CachedInputTokens},
		"completion_tokens_details": map[string]int64{"reasoning_tokens": u.ReasoningTokens},
	}
}

// anthropicUsage reports u as Anthropic does: input_tokens excludes the
// tokens read from and written to the cache.
func anthropicUsage(u costmodel.Usage, output int64) map[string]int64 {
	return map[string]int64{
		"input_tokens":                u.InputTokens - u.CachedInputTokens - u.CacheWriteTokens,
		"cache_read_input_tokens":     u.CachedInputTokens,
		"cache_creation_input_tokens": u.CacheWriteTokens,
		"output_tokens":               output,
	}
}

func answer(kind costmodel.Kind, id, model, text string, u costmodel.Usage) any {
	switch kind {
	case costmodel.Embeddings:
		return map[string]any{"object": "list", "model": model,
			"data":  []map[string]any{{"object": "embedding", "index": 0, "embedding": []float32{0.1, -0.2, 0.3}}},
			"usage": map[string]int64{"prompt_tokens": u.InputTokens, "total_tokens": u.InputTokens}}
	case costmodel.AnthropicMessages:
		return map[string]any{"id": id, "type": "message", "role": "assistant", "model": model,
			"content": []map[string]any{{"type": "text", "text": text}}, "stop_reason": "end_turn",
			"usage": anthropicUsage(u, u.OutputTokens)}
	}
	return map[string]any{"id": id, "object": "chat.completion", "created": 0, "model": model,
		"choices": []map[string]any{{"index": 0, "finish_reason": "stop",
			"message": map[string]any{"role": "assistant", "content": text}}},
		"usage": openaiUsage(u)}
}

func writeJSON(w http.ResponseWriter, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}

func reply(words int64) string {
	var sb strings.Builder
	for i := range words {
		sb.WriteString(word(i))
	}
	return sb.String()
}

func word(i int64) string { return " " + vocabulary[i%int64(len(vocabulary))] }

// vocabulary holds English words that are one token each, with a leading
// space, in cl100k_base and o200k_base (the simulator's list).
var vocabulary = []string{
	"the", "cost", "of", "a", "request", "is", "known", "before", "it", "runs",
	"and", "every", "token", "counts", "toward", "your", "limit", "so", "we", "plan",
	"for", "time", "with", "care", "this", "answer", "comes", "from", "simulator", "today",
}
