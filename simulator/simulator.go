// Package simulator is an OpenAI- and Anthropic-compatible upstream for
// demos, load tests and CI, with a metered search API (GET /search) for
// the generic-upstream examples. Its replies are deterministic (derived from the
// request), and the usage it reports is counted with the same tokenizer
// and message-format rules as the real APIs, so that costgate's settlement
// can be checked against it exactly. It streams, and it can add latency and
// fail on purpose.
package simulator

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/costgate/costgate/costmodel"
)

// Config tunes a Simulator. The zero value, with an Estimator, answers at
// once and never fails.
type Config struct {
	// Estimator counts tokens for the usage reports. Required.
	Estimator *costmodel.Estimator
	// Latency is added before the first byte of every answer.
	Latency time.Duration
	// TokenInterval is the pause between streamed tokens.
	TokenInterval time.Duration
	// ErrorRate is the fraction of requests, 0 to 1, answered with a 500.
	ErrorRate float64
	// ReplyTokens is the length of a reply when the request sets no
	// maximum. Default 48.
	ReplyTokens int
	// Seed makes the error injection reproducible.
	Seed uint64
}

// Simulator is an http.Handler serving the simulated APIs. It is safe for
// concurrent use.
type Simulator struct {
	cfg Config
	mux *http.ServeMux
	mu  sync.Mutex
	rng *rand.Rand
}

// New returns a Simulator.
func New(cfg Config) *Simulator {
	if cfg.ReplyTokens <= 0 {
		cfg.ReplyTokens = 48
	}
	s := &Simulator{cfg: cfg, mux: http.NewServeMux(), rng: rand.New(rand.NewPCG(cfg.Seed, 0x5eed))}
	s.mux.HandleFunc("POST /v1/chat/completions", s.handle(costmodel.ChatCompletions))
	s.mux.HandleFunc("POST /v1/completions", s.handle(costmodel.Completions))
	s.mux.HandleFunc("POST /v1/embeddings", s.handle(costmodel.Embeddings))
	s.mux.HandleFunc("POST /v1/responses", s.handle(costmodel.Responses))
	s.mux.HandleFunc("POST /v1/messages", s.handle(costmodel.AnthropicMessages))
	s.mux.HandleFunc("GET /search", s.search)
	s.mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []map[string]string{
			{"id": "gpt-4o-mini", "object": "model", "owned_by": "simulator"},
		}})
	})
	return s
}

// ServeHTTP answers the simulated APIs' routes.
func (s *Simulator) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// request is what the simulator reads from any of the APIs' bodies.
type request struct {
	Model               string `json:"model"`
	Stream              bool   `json:"stream"`
	MaxTokens           int    `json:"max_tokens"`
	MaxCompletionTokens int    `json:"max_completion_tokens"`
	MaxOutputTokens     int    `json:"max_output_tokens"`
	StreamOptions       struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

func (s *Simulator) failNow() bool {
	if s.cfg.ErrorRate <= 0 {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rng.Float64() < s.cfg.ErrorRate
}

func (s *Simulator) handle(kind costmodel.Kind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
		if err != nil {
			writeError(w, kind, http.StatusBadRequest, "invalid_request_error", err.Error())
			return
		}
		var req request
		if err := json.Unmarshal(body, &req); err != nil {
			writeError(w, kind, http.StatusBadRequest, "invalid_request_error", "invalid JSON: "+err.Error())
			return
		}
		est, err := s.cfg.Estimator.Estimate(kind, body)
		if err != nil {
			writeError(w, kind, http.StatusBadRequest, "invalid_request_error", err.Error())
			return
		}
		if s.cfg.Latency > 0 {
			select {
			case <-time.After(s.cfg.Latency):
			case <-r.Context().Done():
				return
			}
		}
		if s.failNow() {
			typ := "server_error"
			if kind == costmodel.AnthropicMessages {
				typ = "api_error" // Anthropic's type for its 500s
			}
			writeError(w, kind, http.StatusInternalServerError, typ, "simulated upstream failure")
			return
		}
		prompt := est.Usage.InputTokens
		if kind == costmodel.Embeddings {
			writeJSON(w, http.StatusOK, map[string]any{
				"object": "list", "model": req.Model,
				"data":  []map[string]any{{"object": "embedding", "index": 0, "embedding": embedding(body)}},
				"usage": map[string]int64{"prompt_tokens": prompt, "total_tokens": prompt},
			})
			return
		}
		limit := s.cfg.ReplyTokens
		for _, m := range []int{req.MaxTokens, req.MaxCompletionTokens, req.MaxOutputTokens} {
			if m > 0 {
				limit = min(limit, m)
			}
		}
		words := s.reply(req.Model, body, limit)
		completion := s.cfg.Estimator.CountText(req.Model, strings.Join(words, ""))
		id := fmt.Sprintf("sim-%016x", hash(body))
		if req.Stream {
			s.stream(w, r, kind, id, req, words, prompt, completion)
			return
		}
		text := strings.Join(words, "")
		writeJSON(w, http.StatusOK, final(kind, id, req.Model, text, prompt, completion))
	}
}

// reply returns the reply's pieces (each a word with its leading space),
// at most limit tokens long when joined.
func (s *Simulator) reply(model string, body []byte, limit int) []string {
	h := hash(body)
	words := make([]string, 0, limit)
	for i := 0; i < limit; i++ {
		words = append(words, " "+vocabulary[(h+uint64(i)*2654435761)%uint64(len(vocabulary))])
	}
	// Every vocabulary word is one token with a leading space in both
	// encodings; trim in case a model's encoding merges differently.
	for len(words) > 0 && s.cfg.Estimator.CountText(model, strings.Join(words, "")) > int64(limit) {
		words = words[:len(words)-1]
	}
	return words
}

func final(kind costmodel.Kind, id, model, text string, prompt, completion int64) any {
	switch kind {
	case costmodel.AnthropicMessages:
		return map[string]any{
			"id": id, "type": "message", "role": "assistant", "model": model,
			"content":     []map[string]any{{"type": "text", "text": text}},
			"stop_reason": "end_turn",
			"usage":       map[string]int64{"input_tokens": prompt, "output_tokens": completion},
		}
	case costmodel.Responses:
		return map[string]any{
			"id": id, "object": "response", "model": model, "status": "completed",
			"output": []map[string]any{{"type": "message", "role": "assistant",
				"content": []map[string]any{{"type": "output_text", "text": text}}}},
			"usage": map[string]int64{"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion},
		}
	case costmodel.Completions:
		return map[string]any{
			"id": id, "object": "text_completion", "created": 0, "model": model,
			"choices": []map[string]any{{"index": 0, "text": text, "finish_reason": "length"}},
			"usage":   usage(prompt, completion),
		}
	}
	return map[string]any{
		"id": id, "object": "chat.completion", "created": 0, "model": model,
		"choices": []map[string]any{{"index": 0, "finish_reason": "stop",
			"message": map[string]any{"role": "assistant", "content": text}}},
		"usage": usage(prompt, completion),
	}
}

func usage(prompt, completion int64) map[string]int64 {
	return map[string]int64{"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
}

func writeError(w http.ResponseWriter, kind costmodel.Kind, status int, typ, msg string) {
	if kind == costmodel.AnthropicMessages {
		writeJSON(w, status, map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": msg}})
		return
	}
	writeJSON(w, status, map[string]any{"error": map[string]string{"type": typ, "message": msg}})
}

func hash(b []byte) uint64 {
	h := fnv.New64a()
	h.Write(b)
	return h.Sum64()
}

func embedding(body []byte) []float32 {
	h := hash(body)
	v := make([]float32, 8)
	for i := range v {
		v[i] = float32((h>>(i*8))&0xff)/255 - 0.5
	}
	return v
}

// vocabulary holds common English words that are one token each, with a
// leading space, in cl100k_base and o200k_base.
var vocabulary = []string{
	"the", "cost", "of", "a", "request", "is", "known", "before", "it", "runs",
	"and", "every", "token", "counts", "toward", "your", "limit", "so", "we", "plan",
	"for", "time", "with", "care", "this", "answer", "comes", "from", "simulator", "today",
}

// search is a metered search API: GET /search?q=QUERY&num=N&page=P returns
// N results (10 by default, at most 50) for the query, deterministically,
// and says how many in the X-Results-Returned header, as metered APIs do.
func (s *Simulator) search(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query().Get("q")
	if q == "" {
		writeJSON(w, http.StatusBadRequest, map[string]any{"error": map[string]string{"message": "q is required"}})
		return
	}
	num := 10
	if v := r.URL.Query().Get("num"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			writeJSON(w, http.StatusBadRequest, map[string]any{"error": map[string]string{"message": "num must be a positive integer"}})
			return
		}
		num = min(n, 50)
	}
	page, _ := strconv.Atoi(r.URL.Query().Get("page"))
	page = max(page, 1)
	h := hash([]byte(q))
	results := make([]map[string]any, num)
	for i := range results {
		rank := (page-1)*num + i + 1
		word := vocabulary[(h+uint64(rank))%uint64(len(vocabulary))]
		results[i] = map[string]any{"rank": rank, "title": fmt.Sprintf("%s: result %d about %s", q, rank, word),
			"url": fmt.Sprintf("https://example.com/%x/%d", h, rank)}
	}
	w.Header().Set("X-Results-Returned", strconv.Itoa(num))
	writeJSON(w, http.StatusOK, map[string]any{"query": q, "page": page, "results": results})
}
